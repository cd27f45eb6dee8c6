"""Grammar masks of greedy output rows applied on the GPU (infr/gpu/kernels_mask.py): a step's
tokens equal the host's masking of the same logits (infr.sampling.host_sample) and the CPU
reference's, and a step without masked greedy rows encodes and uploads nothing of it."""

from __future__ import annotations

import numpy as np
import pytest

from infr import synth
from infr.batch import Batch, OutputRow
from infr.cpu.backend import CPUBackend
from infr.engine import Model
from infr.gguf_file import open_gguf
from infr.gpu import backend as gpu_backend
from infr.gpu.backend import GPUBackend
from infr.gpu.kernels_mask import pack_mask
from infr.models import build_spec
from infr.plan import build_plan
from infr.sampling import Sampler, SamplingParams, host_sample, unpack_mask
from infr.scheduler import Request

VOCAB = 5003  # three argmax slices; a mask's last word is part-filled
N_CTX, BS = 64, 32
PROMPTS = [[5, 9, 200, 4000, 17], [3, 1, 4], [1, 5, 9, 2, 6, 5, 3, 5, 8], [4999], [10, 20, 30, 40], [7, 7],
           [100, 2000, 3000, 4000, 5000, 11], [42, 43, 44]]
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8, seed=3)


@pytest.fixture(scope="module")
def backends(gpu, tmp_path_factory):
    spec = synth.preset("tiny-llama", n_vocab=VOCAB)
    gf = open_gguf(synth.write_gguf(spec, tmp_path_factory.mktemp("mask") / "tiny.gguf"))
    plan = build_plan(build_spec(gf))
    n_blocks = len(PROMPTS) * (N_CTX // BS)
    return GPUBackend(gf, plan, N_CTX, dev=gpu, kv_blocks=n_blocks), CPUBackend(gf, plan, N_CTX, kv_blocks=n_blocks)


def _table(s: int) -> list[int]:
    per = N_CTX // BS
    return list(range(s * per, (s + 1) * per))


def _prefill(outputs) -> Batch:
    """Every prompt from position 0, the last row of each an output row (rows not contiguous)."""
    return Batch.build([(s, p, 0, _table(s), len(p)) for s, p in enumerate(PROMPTS)], outputs(
        np.cumsum([len(p) for p in PROMPTS]) - 1))


def _decode(outputs) -> Batch:
    """One next token per sequence after its prompt: every row an output row, in order."""
    return Batch.build([(s, [(11 * s + 1) % VOCAB], len(p), _table(s), len(p)) for s, p in enumerate(PROMPTS)],
                       outputs(np.arange(len(PROMPTS))))


def _masks(ref: np.ndarray, rng) -> list[np.ndarray | None]:
    """A mask per output row: random (longer than the vocabulary, bits past it set), one token,
    the unmasked argmax disallowed, none, shorter than the vocabulary, none, allowing nothing,
    and random on a sampled row."""
    nbytes = -(-VOCAB // 8)

    def bits(allowed: np.ndarray) -> np.ndarray:
        return np.packbits(allowed, bitorder="little")

    random_long = rng.integers(0, 256, nbytes + 5, dtype=np.uint8)
    one = np.zeros(VOCAB, bool)
    one[int(rng.integers(VOCAB))] = True
    no_best = rng.random(VOCAB) < 0.3
    no_best[int(np.argmax(ref[2]))] = False
    short = bits(rng.random(3000) < 0.1)
    return [random_long, bits(one), bits(no_best), None, short, None, np.zeros(nbytes, np.uint8),
            bits(rng.random(VOCAB) < 0.5)]


def _rows(rows, masks=None, want_logits=False) -> list[OutputRow]:
    out = []
    for i, r in enumerate(rows):
        sampled = i == len(rows) - 1
        params = SAMPLED if sampled else GREEDY
        out.append(OutputRow(int(r), params, sampler=Sampler(params, VOCAB) if sampled else None,
                             mask=None if masks is None else masks[i], want_logits=want_logits))
    return out


@pytest.mark.parametrize("shape", [_prefill, _decode])
def test_masked_greedy_rows_match_host_masking(backends, shape):
    gpu, cpu = backends
    # The decode batch reads the prompts' keys: prefill first (on both backends) whichever runs.
    gpu.step(_prefill(_rows))
    cpu.step(_prefill(_rows))
    ref = gpu.step(shape(lambda rows: _rows(rows, want_logits=True)))  # unmasked logits, host path
    logits = np.stack([ref.logits[i] for i in range(len(PROMPTS))])
    masks = _masks(logits, np.random.default_rng(len(shape.__name__)))
    assert np.argmax(logits[2]) != np.argmax(np.where(unpack_mask(masks[2], VOCAB), logits[2], -np.inf))

    uploads = gpu._masks().uploads
    got = gpu.step(shape(lambda rows: _rows(rows, masks))).tokens
    want = [host_sample(o, logits[i]) for i, o in enumerate(_rows(range(len(PROMPTS)), masks))]
    assert got == want
    assert gpu._masks().uploads == uploads + 1  # one write for the step's masks
    for i, m in enumerate(masks):
        if m is not None and m.any():
            assert unpack_mask(m, VOCAB)[got[i]], i  # every masked token allowed
    assert got[6] == 0  # a mask allowing nothing: the host's argmax of all -inf, as before

    # The CPU reference masks on the host: the same tokens where its logits leave a clear winner.
    cpu_ref = cpu.step(shape(lambda rows: _rows(rows, want_logits=True)))
    cpu_got = cpu.step(shape(lambda rows: _rows(rows, masks))).tokens
    compared = 0
    for i, m in enumerate(masks[:-1]):
        x = cpu_ref.logits[i] if m is None else np.where(unpack_mask(m, VOCAB), cpu_ref.logits[i], -np.inf)
        top2 = np.sort(x)[-2:]
        if m is not None and not m.any():
            assert cpu_got[i] == got[i] == 0
        elif top2[1] - top2[0] > 1e-3:
            assert cpu_got[i] == got[i], i
            compared += 1
    assert compared >= 4  # most rows: the margin only skips near-ties


def test_no_masked_greedy_row_no_mask_dispatch(backends, monkeypatch):
    gpu, _ = backends
    labels: list[list[str]] = []
    real = gpu_backend._encode

    def encode(enc, rec, timer=None):
        labels.append([d.label for d in rec.dispatches])
        real(enc, rec, timer)

    monkeypatch.setattr(gpu_backend, "_encode", encode)
    gpu.step(_prefill(_rows))
    masks = _masks(np.zeros((len(PROMPTS), VOCAB), np.float32), np.random.default_rng(1))

    def encoded(outputs) -> list[str]:
        labels.clear()
        gpu.step(_decode(outputs))
        return [name for rec in labels for name in rec]

    uploads = gpu._masks().uploads
    plain = encoded(_rows)
    assert not any(name.startswith("step_mask") for name in plain)
    # Masks only on rows the host takes (sampled, logits wanted, allowing nothing): nothing either.
    only_host = [None] * 6 + [np.zeros_like(masks[6]), masks[7]]
    assert encoded(lambda rows: _rows(rows, only_host)) == plain
    with_logits = encoded(lambda rows: _rows(rows, masks, want_logits=True))
    assert with_logits == plain and gpu._masks().uploads == uploads
    # Greedy masked rows: one mask dispatch over them, just before the argmax.
    masked = encoded(lambda rows: _rows(rows, masks))
    extra = [name for name in masked if name not in plain]
    assert extra == [f"step_mask {VOCAB}x4"]  # rows 0, 1, 2 and 4 (row 6 allows nothing)
    assert masked.index(extra[0]) == next(i for i, name in enumerate(masked) if name.startswith("argmax")) - 1
    assert gpu._masks().uploads == uploads + 1


@pytest.mark.parametrize("n", [1, 31, 32, 33, 4999, VOCAB])
def test_packed_words_hold_the_host_bits(n):
    rng = np.random.default_rng(n)
    for nbytes in (0, 1, n // 8, -(-n // 8), -(-n // 8) + 9):
        mask = rng.integers(0, 256, nbytes, dtype=np.uint8)
        words = pack_mask(mask, n)
        assert words.dtype == np.dtype("<u4") and words.size == -(-n // 32)
        got = ((words[np.arange(n) // 32] >> (np.arange(n) % 32).astype(np.uint32)) & 1).astype(bool)
        assert np.array_equal(got, unpack_mask(mask, n))
        assert not (words[-1] >> (n % 32) if n % 32 else 0)  # no bit past n


# No strings: the synthetic gpt2 vocabulary's end-of-text token is '"'.
SCHEMA = {"type": "array", "items": {"type": "integer"}, "minItems": 2}


def test_json_schema_requests_through_the_engine(gpu, tmp_path_factory):
    """llguidance's masks (infr/serve/grammar.py) on requests sharing steps with an unconstrained
    one: the GPU engine gives the CPU reference's tokens, the masks applied on the GPU."""
    from infr.serve.grammar import Grammars

    path = synth.write_gguf(synth.preset("tiny-llama", tokenizer="gpt2"), tmp_path_factory.mktemp("json") / "t.gguf")
    prompts = [[40, 50, 60, 70], [41, 42], [43, 44, 45, 46, 47]]

    def run(backend: str):
        model = Model(path, n_ctx=128, backend=backend, parallel=len(prompts))
        grammars = Grammars(model.tokenizer, model.spec.n_vocab)
        cons = [grammars.json_matcher(SCHEMA), None, grammars.json_matcher(SCHEMA)]

        def request(prompt, con):
            if con is None:
                return Request(list(prompt), GREEDY, max_new=12, ignore_eos=True)
            return Request(list(prompt), GREEDY, max_new=40, mask=con.bitmask,
                           on_token=lambda t, _logits: con.consume(t) or con.done)

        reqs = [model.engine.submit(request(p, c)) for p, c in zip(prompts, cons)]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.error is None for r in reqs), [r.error for r in reqs]
        return model, [r.output for r in reqs]

    on_gpu, got = run("gpu")
    _, want = run("cpu")
    assert got == want
    assert on_gpu.engine.stats.max_rows >= len(prompts)  # the requests shared steps
    assert on_gpu.backend._masks().uploads >= 10  # the constrained rows' masks went to the GPU
    text = on_gpu.tokenizer.decode(got[0])
    assert text.startswith("[") and set(text) <= set("[]-,0123456789"), text  # the schema's array
