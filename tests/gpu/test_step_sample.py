"""Sampled output rows drawn on the GPU (infr/gpu/kernels_sample.StepSampling): in a step of
mixed rows each sampled row's token is the numpy twin's draw (infr/cpu/sample.py) from that
row's logits, with its own settings, seed, position, penalties and grammar mask; only token ids
come back. decode_steps draws the same tokens as one step at a time, and through the engine a
seeded sampled request gives the same text alone and batched with others."""

from __future__ import annotations

import numpy as np
import pytest

from infr import synth
from infr.batch import Batch, OutputRow
from infr.cpu import sample as ref
from infr.engine import Model
from infr.gguf_file import open_gguf
from infr.gpu.backend import GPUBackend
from infr.models import build_spec
from infr.plan import build_plan
from infr.sampling import SamplingParams, unpack_mask
from infr.scheduler import Request

VOCAB = 5003  # two sampler slices, the last part-filled
N_CTX, BS = 64, 32
PROMPTS = [[5, 9, 200, 4000, 17], [3, 1, 4], [1, 5, 9, 2, 6, 5, 3, 5, 8], [4999], [10, 20, 30, 40], [7, 7],
           [100, 2000, 3000, 4000, 5000, 11], [42, 43, 44]]
# One row each: the top_k path, top_p alone, min_p alone, no filter, greedy among them, top_k past
# the candidate path, penalties, and a grammar mask on a sampled row. Hot temperatures: the random
# weights' logits are flat, so the draws spread over many tokens.
PARAMS = [
    SamplingParams(temperature=1.5, top_k=40, top_p=0.95, min_p=0.0, seed=1),
    SamplingParams(temperature=2.0, top_k=0, top_p=0.9, min_p=0.0, seed=2),
    SamplingParams(temperature=1.7, top_k=0, top_p=1.0, min_p=0.3, seed=3),
    SamplingParams(temperature=3.0, top_k=0, top_p=1.0, min_p=0.0, seed=2**40 + 4),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=2.5, top_k=1500, top_p=0.97, min_p=0.001, seed=6),
    SamplingParams(temperature=1.2, top_k=50, top_p=1.0, min_p=0.0, repeat_penalty=3.0, frequency_penalty=2.0,
                   presence_penalty=1.0, repeat_last_n=8, seed=7),
    SamplingParams(temperature=1.5, top_k=0, top_p=0.99, min_p=0.0, seed=8),
]


@pytest.fixture(scope="module")
def backend(gpu, tmp_path_factory):
    spec = synth.preset("tiny-llama", n_vocab=VOCAB)
    gf = open_gguf(synth.write_gguf(spec, tmp_path_factory.mktemp("sample") / "tiny.gguf"))
    return GPUBackend(gf, build_plan(build_spec(gf)), N_CTX, dev=gpu, kv_blocks=len(PROMPTS) * (N_CTX // BS))


def _table(s: int) -> list[int]:
    per = N_CTX // BS
    return list(range(s * per, (s + 1) * per))


def _next(s: int) -> int:
    return (11 * s + 1) % VOCAB


def _batch(decode: bool, rows) -> Batch:
    """prefill: every prompt from position 0, its last row an output row; decode: one next
    token per sequence after its prompt, every row an output row. rows(i, history) -> OutputRow."""
    if decode:
        chunks = [(s, [_next(s)], len(p), _table(s), len(p)) for s, p in enumerate(PROMPTS)]
        hist = [p + [_next(s)] for s, p in enumerate(PROMPTS)]
        at = np.arange(len(PROMPTS))
    else:
        chunks = [(s, p, 0, _table(s), len(p)) for s, p in enumerate(PROMPTS)]
        hist = [list(p) for p in PROMPTS]
        at = np.cumsum([len(p) for p in PROMPTS]) - 1
    return Batch.build(chunks, [rows(int(r), i, hist[i]) for i, r in enumerate(at)])


@pytest.mark.parametrize("decode", [False, True])
def test_sampled_rows_are_the_twin_draws(backend, decode, monkeypatch):
    backend.step(_batch(False, lambda r, i, h: OutputRow(r, PARAMS[4])))  # the prompts' keys
    logits = backend.step(_batch(decode, lambda r, i, h: OutputRow(r, PARAMS[4], want_logits=True))).logits
    rng = np.random.default_rng(5)
    mask = np.packbits(rng.random(VOCAB) < 0.4, bitorder="little")
    masks = [None] * 7 + [mask]
    batch = _batch(decode, lambda r, i, h: OutputRow(r, PARAMS[i], history=h, mask=masks[i]))
    queue = backend.dev.device.queue
    reads, real = [], type(queue).read_buffer
    monkeypatch.setattr(type(queue), "read_buffer", lambda q, buf, *a, **kw: reads.append(buf.size) or real(q, buf, *a, **kw))
    got = backend.step(batch).tokens
    monkeypatch.undo()
    assert reads == [backend.step_tokens.size]  # the ids alone came back
    want = []
    for i, o in enumerate(batch.outputs):
        x = logits[i] if masks[i] is None else np.where(unpack_mask(mask, VOCAB), logits[i], -np.inf)
        want.append(ref.sample(x, o.params, o.params.seed or 0, int(batch.positions[o.row]) + 1, o.history))
    assert got == want
    assert unpack_mask(mask, VOCAB)[got[7]]
    # Reading back only ids: the same again, another seed moves the draws, greedy stays put.
    assert backend.step(batch).tokens == got
    reseeded = _batch(decode, lambda r, i, h: OutputRow(
        r, SamplingParams(**{**PARAMS[i].__dict__, "seed": (PARAMS[i].seed or 0) + 100}), history=h, mask=masks[i]))
    other = backend.step(reseeded).tokens
    assert other[4] == got[4] and sum(a != b for a, b in zip(other, got)) >= 4


def test_penalties_read_the_rows_own_history(backend):
    """The penalty row's window is the history the host wrote for its slot this step."""
    backend.step(_batch(False, lambda r, i, h: OutputRow(r, PARAMS[4])))
    logits = backend.step(_batch(True, lambda r, i, h: OutputRow(r, PARAMS[4], want_logits=True))).logits
    p = SamplingParams(temperature=0.7, top_k=20, top_p=1.0, min_p=0.0, repeat_penalty=50.0, repeat_last_n=64, seed=9)
    best = [int(np.argmax(logits[i])) for i in range(len(PROMPTS))]
    # Every row's history holds its own best token: the penalty pushes it out of the top_k set.
    batch = _batch(True, lambda r, i, h: OutputRow(r, p, history=h[:-1] + [best[i], h[-1]]))
    got = backend.step(batch).tokens
    for i, o in enumerate(batch.outputs):
        assert got[i] == ref.sample(logits[i], p, 9, int(batch.positions[o.row]) + 1, o.history)
        assert got[i] != best[i]


def test_decode_steps_draw_what_single_steps_draw(backend):
    backend.step(_batch(False, lambda r, i, h: OutputRow(r, PARAMS[4])))
    rows = [PARAMS[i] for i in (0, 1, 4, 3)]  # sampled on both paths, and a greedy row among them
    start = [_next(s) for s in range(len(rows))]

    def decode(tokens, k):
        chunks = [(s, [t], len(PROMPTS[s]) + k, _table(s), len(PROMPTS[s])) for s, t in enumerate(tokens)]
        return Batch.build(chunks, [OutputRow(s, p) for s, p in enumerate(rows)])

    many = list(backend.decode_steps(decode(start, 0), 6, per_submit=4))
    one, tokens = [], start
    for k in range(6):
        tokens = backend.step(decode(tokens, k)).tokens
        one.append(tokens)
    assert many == one
    assert len({tuple(col) for col in zip(*many)}) > 1  # the sampled rows moved


def test_seeded_requests_alone_equal_batched(gpu, tmp_path_factory):
    """Through the engine: no host sampler on the GPU (the draw hashes the request's seed and
    each token's position), so a seeded request's text is the same alone and sharing steps,
    multi-step decode included; an unseeded request gets a seed of its own."""
    path = synth.write_gguf(synth.preset("tiny-llama", tokenizer="gpt2"), tmp_path_factory.mktemp("seeded") / "t.gguf")
    model = Model(path, n_ctx=128, backend="gpu", parallel=4)
    prompts = [[40, 50, 60, 70], [41, 42], [43, 44, 45, 46, 47], [48]]
    params = [SamplingParams(temperature=1.4, top_k=40, seed=21), SamplingParams(temperature=1.1, top_p=0.9, seed=22),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.8, min_p=0.1, seed=23)]

    def run(which):
        reqs = [model.engine.submit(Request(list(prompts[i]), params[i], max_new=20, ignore_eos=True)) for i in which]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.error is None and r.sampler is None for r in reqs)
        return [r.output for r in reqs]

    together = run(range(4))
    assert model.engine.stats.max_rows >= 4
    alone = [run([i])[0] for i in range(4)]
    assert together == alone
    assert len(set(together[0])) > 3  # sampled: not one token over and over
    free = model.engine.submit(Request([40, 50], SamplingParams(temperature=1.0), max_new=2, ignore_eos=True))
    model.engine.run_until(lambda: free.done)
    assert free.params.seed is not None and free.sampler is None
