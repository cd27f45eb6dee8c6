"""Decoding with tokens kept on the GPU (GPUBackend.decode_steps) on SmolLM2: greedy equals the
CPU reference, across the near and far attention graphs too; seeded sampling drawn on the GPU is
reproducible and equals the numpy twin driven token by token; Session.generate stops at end of
generation with the tokens it yielded; `infr run --backend gpu` streams."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from closeness import assert_logits_close, assert_same_top1, rounds_activations
from infr.batch import Batch, OutputRow
from infr.cpu import sample as ref
from infr.cpu.backend import CPUBackend
from infr.engine import Model
from infr.gguf_file import open_gguf
from infr.gpu.backend import GPUBackend
from infr.models import build_spec
from infr.plan import build_plan
from infr.sampling import SamplingParams
from infr.tokenizer import Tokenizer

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _cases() -> list[dict]:
    return json.loads((FIXTURES / "generation_smollm2-135m.json").read_text())["cases"]


@pytest.fixture(scope="module")
def backends(gpu, smollm2_path):
    gf = open_gguf(smollm2_path)
    plan = build_plan(build_spec(gf))
    return GPUBackend(gf, plan, 160, dev=gpu), CPUBackend(gf, plan, 160)


IDENTITY = list(range(5))  # slot 0's blocks in order, as forward() uses them (a context of 160)


def _one_row(token: int, pos: int, params: SamplingParams, history=()) -> Batch:
    """A decode row of slot 0 over the identity block table forward() uses."""
    return Batch.build([(0, [token], pos, IDENTITY, pos)], [OutputRow(0, params, history=history)])


def test_greedy_decode_equals_cpu(backends):
    gpu_be, cpu_be = backends
    prompt = _cases()[0]["prompt_ids"]
    first = int(np.argmax(gpu_be.forward(prompt, 0)[-1]))
    resident = [first] + gpu_be.decode_greedy(first, len(prompt), 7, per_submit=3)
    token, want = int(np.argmax(cpu_be.forward(prompt, 0)[-1])), []
    for i in range(8):
        want.append(token)
        token = int(np.argmax(cpu_be.forward([token], len(prompt) + i)[-1]))
    assert resident == want


def test_decode_crosses_from_near_to_far_graphs(gpu, smollm2_path, tune):
    """A context long enough for both attention forms: the host runs each step's
    token in the near graph (one-pass attention) up to split_from keys and in the
    far one (split-K) past them, within one submit too, and the tokens stay the
    CPU reference's (decode_greedy, the streaming loop and forward alike)."""
    tune(INFR_ATTN_SPLIT_FROM="40", INFR_ATTN_ONE_PASS_CTX="64")
    gf = open_gguf(smollm2_path)
    plan = build_plan(build_spec(gf))
    gpu_be, cpu_be = GPUBackend(gf, plan, 96, dev=gpu), CPUBackend(gf, plan, 96)
    near, far = ([d.label.split()[0] for d in gpu_be._multi_step(1, f).dispatches] for f in (False, True))
    assert "attention" in near and "attn_scores" not in near
    assert "attn_scores" in far and "attention" not in far
    prompt = _cases()[0]["prompt_ids"][:30]
    token, want = int(np.argmax(cpu_be.forward(prompt, 0)[-1])), []
    for i in range(20):  # tokens at positions 30 .. 49: past 40 keys at position 39
        want.append(token)
        token = int(np.argmax(cpu_be.forward([token], len(prompt) + i)[-1]))
    logits = gpu_be.forward(prompt, 0)[-1]
    first = int(np.argmax(logits))
    assert [first] + gpu_be.decode_greedy(first, len(prompt), 19, per_submit=4) == want
    stepped, tok = [], first
    for i in range(20):  # forward() itself picks the graph from the position
        stepped.append(tok)
        tok = int(np.argmax(gpu_be.forward([tok], len(prompt) + i)[-1]))
    assert stepped == want


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.3, top_k=0, top_p=0.98, min_p=0.0, seed=11),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.02, seed=2**33 + 5),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.02, repeat_penalty=1.5, frequency_penalty=0.3,
                   repeat_last_n=32, seed=2**33 + 5),
])
def test_seeded_sampling_equals_reference_sampler(backends, params):
    """The first token from the prompt's step, the rest by decode_steps (tokens kept on the GPU) or,
    with penalties (their window comes from the host), one step each."""
    from infr.numerics import has_penalties

    gpu_be, _ = backends
    prompt = _cases()[2]["prompt_ids"]  # a chat prompt: a spread-out next-token distribution
    logits = gpu_be.forward(prompt, 0)[-1]
    P = len(prompt)

    def draw(p: SamplingParams, per_submit: int) -> list[int]:
        gpu_be.forward(prompt, 0)
        chunks = [(0, prompt, 0, IDENTITY, P)]
        first = gpu_be.step(Batch.build(chunks, [OutputRow(P - 1, p, history=prompt)])).tokens[0]
        if not has_penalties(p):
            return [first] + [t[0] for t in gpu_be.decode_steps(_one_row(first, P, p), 5, per_submit=per_submit)]
        out = [first]
        for j in range(5):
            out.append(gpu_be.step(_one_row(out[-1], P + j, p, prompt + out)).tokens[0])
        return out

    a, b = draw(params, 2), draw(params, 4)
    assert a == b  # same seed, same tokens, however the steps are batched
    # The numpy twin, fed the same backend's logits token by token.
    ctx, x, want = list(prompt), logits, []
    for j in range(6):
        token = ref.sample(x, params, params.seed, len(ctx), ctx)
        want.append(token)
        if j < 5:
            x = gpu_be.forward([token], len(ctx))[-1]
            ctx.append(token)
    assert a == want
    assert draw(SamplingParams(**{**params.__dict__, "seed": 12}), 4) != a  # the seed matters


@pytest.fixture(scope="module")
def model(gpu, smollm2_path):
    return Model(smollm2_path, n_ctx=256, backend="gpu")


def test_generate_stops_at_eog_with_the_yielded_tokens(model, monkeypatch):
    monkeypatch.setattr(model.backend, "multi_step", 4)  # greedy steps run 4 at a time, past the end token
    tok = model.tokenizer
    text = model.template.render([{"role": "user", "content": "What is the capital of Japan?"}],
                                 add_generation_prompt=True)
    prompt = tok.encode(text, add_special=True, parse_special=True)
    session = model.session()
    out = list(session.generate(prompt, SamplingParams(temperature=0), max_new=48))
    assert 0 < len(out) < 48 and "Tokyo" in tok.decode(out)
    assert session.tokens == prompt + out  # every yielded token was run, the end token was not kept
    assert session.stats.generated_tokens == len(out)
    be = model.backend
    assert tok.is_eog(int(np.argmax(be.forward([out[-1]], len(session.tokens) - 1)[-1])))
    # The cache holds what the tokens say: a follow-up reuses it and matches a fresh run.
    follow = session.tokens + tok.encode(" Yes", add_special=False)
    reused = session.prefill(follow)
    bs = model.pool.block_size  # the prefix cache keeps whole blocks of what was run
    assert session.stats.reused_tokens == (len(prompt) + len(out)) // bs * bs
    # Decode steps (the GEMV) wrote the generated tokens' KV, one prefill (the tiled mmq) writes it
    # here: with 8-bit activations (SmolLM2's Q4_1) the two differ by rounding jumps (tests/closeness.py),
    # not by misplaced keys. Measured on lavapipe: RMS 0.32 of logits of RMS 4.7 (6.8 %); all-GEMV or
    # all-mmq runs (INFR_MMQ_MIN_T=0 / 2) give equal logits, and a misplaced key moves them by ~100 %.
    fresh = be.forward(follow, 0)[-1]
    q8 = rounds_activations(model.gguf, model.plan)
    assert_logits_close(reused, fresh, q8, rms_frac=0.1)
    assert_same_top1(reused[None], fresh[None], q8)
    # A caller that stops early: the session holds what it was given, and the engine frees the rest.
    session = model.session()
    gen = session.generate(prompt, SamplingParams(temperature=0), max_new=48)
    first = [next(gen) for _ in range(3)]
    gen.close()
    assert first == out[:3] and session.tokens == prompt + out[:3]
    assert model.pool.used == 0 and not model.engine.running
    # max_new reached.
    session = model.session()
    assert list(session.generate(prompt, SamplingParams(temperature=0), max_new=4)) == out[:4]
    assert session.tokens == prompt + out[:4]


def test_infr_run_gpu_streams(smollm2_path, gpu):
    case = next(c for c in _cases() if c["kind"] == "raw")
    tok = Tokenizer.from_gguf(open_gguf(smollm2_path))
    expected = tok.decode(case["tokens"][:16], skip_special=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "infr", "run", str(smollm2_path), case["text"], "--raw", "--temp", "0",
         "--max-new", "28", "--backend", "gpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        first = proc.stdout.read1(1 << 16)  # the first text, as soon as it is written
        running = proc.poll() is None
        rest, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert first and running  # text arrived while tokens were still being generated
    out = (first + rest).decode()
    assert out.startswith(expected)
    err = err.decode()
    assert "on gpu" in err and "generated: 28 tokens" in err
