"""qwen35 (gated DeltaNet + gated attention) on the GPU backend (infr/gpu/kernels_deltanet.py)
against the CPU reference (infr/cpu/deltanet.py, infr/cpu/kinds.py) and llama.cpp's fixtures.

Kernels on odd shapes: the [q | gate] head split and the sigmoid output gate; the DeltaNet mixer
with H_v != H_k (6 over 2 and over 3 K-heads), d_k not a power of two, several slots at different
positions interleaved in one batch, a prompt of more than 64 rows, then a second batch going on
from the states the first left (and their read-back equal to the reference's). End to end:
tiny-qwen35 in F32 and Q8_0 follows the reference, batched equals alone through the engine,
a checkpoint saved after a prefix and loaded back continues as if never interrupted, and the F32
files match llama.cpp's probabilities within test_qwen35_exact's bound on the GPU.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.cpu.deltanet import RecurrentStore, deltanet_forward
from infr.engine import Model
from infr.errors import InfrError
from infr.gguf_file import open_gguf
from infr.gpu import kernels_deltanet as KDN
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_q8 as KQ
from infr.gpu.backend import GPUBackend
from infr.gpu.runtime import read, run, storage
from infr.models import build_spec
from infr.models.spec import DeltaNetSpec
from infr.plan import build_plan
from infr.sampling import SamplingParams
from infr.scheduler import Request
from tests.closeness import assert_gpu_follows_cpu, assert_logits_close
from tests.engine_runs import greedy_outputs
from tests.test_moe_exact import assert_close, decode, rows
from tests.test_qwen35_exact import DATA, MAX_DP, models  # noqa: F401 (fixture)

F32 = np.float32
TINY = synth.PRESETS["tiny-qwen35"]


def _sigmoid(x):
    return F32(1) / (F32(1) + np.exp(-x))


# --- gated attention

def test_head_slice_and_sigmoid_mul(gpu, kernels):
    rng = np.random.default_rng(1)
    T, H, D = 7, 3, 10
    qg = rng.standard_normal((T, H * 2 * D)).astype(F32)
    src = storage(gpu, qg)
    outs = [storage(gpu, np.full(T * H * D, np.nan, F32)) for _ in range(2)]
    run(gpu, [KDN.head_slice_dispatch(kernels, src, outs[p], H, D, p, T) for p in (0, 1)])
    for p in (0, 1):
        want = qg.reshape(T, H, 2 * D)[:, :, p * D:(p + 1) * D].reshape(T, H * D)
        np.testing.assert_array_equal(read(gpu, outs[p], F32, T * H * D).reshape(T, H * D), want)
    x, g = rng.standard_normal(T * 5).astype(F32), (4 * rng.standard_normal(T * 5)).astype(F32)
    y = storage(gpu, T * 5 * 4)
    run(gpu, [KDN.sigmoid_mul_dispatch(kernels, storage(gpu, x), storage(gpu, g), y, T * 5)])
    np.testing.assert_allclose(read(gpu, y, F32, T * 5), x * _sigmoid(g), rtol=2e-6, atol=1e-7)


# --- the DeltaNet mixer's kernels

class _Mixer:
    """One DeltaNet layer's kernels over buffers of their own (max_seqs slots), fed batches of
    (positions, slots) rows, beside the CPU reference's store."""

    def __init__(self, gpu, kernels, m: DeltaNetSpec, max_seqs: int, rng, T_max: int):
        self.gpu, self.k, self.m, self.max_seqs, self.rng = gpu, kernels, m, max_seqs, rng
        H = m.n_v_heads
        self.conv_w = (0.5 * rng.standard_normal((m.conv_dim, m.d_conv))).astype(F32)
        self.dt_bias = rng.standard_normal(H).astype(F32)
        self.a = -np.exp(rng.standard_normal(H)).astype(F32)
        self.norm = (1 + 0.1 * rng.standard_normal(m.d_v)).astype(F32)
        self.eps = 1e-6
        self.rstate = storage(gpu, np.full(max_seqs * m.state_floats, np.nan, F32))  # never cleared: pos 0 resets
        self.conv = storage(gpu, self.conv_w)
        self.consts = storage(gpu, np.concatenate([self.dt_bias, self.a, self.norm]))
        self.u = storage(gpu, 4 * T_max * m.conv_dim)
        self.o = storage(gpu, 4 * T_max * H * m.d_v)
        self.store = RecurrentStore({0: m})

    def step(self, pos, slots, rounded: bool = False):
        m, gpu, k, rng = self.m, self.gpu, self.k, self.rng
        T, H = len(pos), m.n_v_heads
        qkv = rng.standard_normal((T, m.conv_dim)).astype(F32)
        z = rng.standard_normal((T, H * m.d_v)).astype(F32)
        beta, alpha = rng.standard_normal((T, H)).astype(F32), (3 * rng.standard_normal((T, H))).astype(F32)
        pg = KS.Paging(storage(gpu, KS.pack_state(int(pos[0]), T)), storage(gpu, KS.pack_rows(pos, slots)),
                       storage(gpu, np.zeros(4, np.uint32)))
        dst = storage(gpu, np.full(T * H * m.d_v, np.nan, F32))
        K = H * m.d_v
        xq = storage(gpu, 4 * T * KQ.words(K)) if rounded else None
        run(gpu, [KDN.conv_dispatch(k, storage(gpu, qkv), self.conv, pg.state, pg.rows, self.rstate, self.u, m),
                  *KDN.rule_dispatches(k, self.u, storage(gpu, beta), storage(gpu, alpha), storage(gpu, z),
                                       self.consts, pg.state, pg.rows, self.rstate, self.o, dst, m, self.eps,
                                       self.max_seqs, T, xq)])
        if rounded:  # the norm kernel's rounded copy is quantize_q8's of its output, word for word
            d, want_q = KQ.quantize_dispatch(k, dst, K, T, into=storage(gpu, 4 * T * KQ.words(K)))
            run(gpu, [d])
            np.testing.assert_array_equal(read(gpu, xq, np.uint32), read(gpu, want_q, np.uint32))
        want = deltanet_forward(m, qkv, z, beta, alpha, np.asarray(pos), np.asarray(slots), self.store, 0,
                                self.conv_w, self.dt_bias, self.a, self.norm, self.eps)
        return read(gpu, dst, F32, T * H * m.d_v).reshape(T, -1), want

    def states(self, slot: int):
        m = self.m
        raw = read(self.gpu, self.rstate, F32)[slot * m.state_floats:(slot + 1) * m.state_floats]
        k = (m.d_conv - 1) * m.conv_dim
        return raw[:k].reshape(m.d_conv - 1, m.conv_dim), raw[k:].reshape(m.n_v_heads, m.d_k, m.d_v)


def _interleave(runs: list[tuple[int, int, int]]):
    """Rows of several slots' runs (slot, first position, count), mixed in batch order, each slot's in
    position order."""
    pos, slots = [], []
    left = {s: list(range(p0, p0 + n)) for s, p0, n in runs}
    while any(left.values()):
        for s in left:
            for _ in range(2 if s % 2 else 1):
                if left[s]:
                    pos.append(left[s].pop(0))
                    slots.append(s)
    return np.array(pos), np.array(slots)


@pytest.mark.parametrize("m", [DeltaNetSpec(2, 6, 12, 12, 4), DeltaNetSpec(3, 6, 16, 16, 4),
                               DeltaNetSpec(1, 2, 5, 5, 3), DeltaNetSpec(1, 2, 128, 128, 4)],
                         ids=["hv6-hk2-dk12", "hv6-hk3-dk16", "hv2-hk1-dk5-conv3", "hv2-hk1-dk128"])
def test_deltanet_kernels_equal_the_reference(gpu, kernels, m, monkeypatch):
    monkeypatch.setattr(KDN, "CHUNK_ROWS", 1 << 30)  # the token-serial rule (the chunked one: test_deltanet_chunk_gpu.py)
    rng = np.random.default_rng(m.d_k)
    mix = _Mixer(gpu, kernels, m, 5, rng, 128)
    # a prompt of 70 rows in slot 3 beside two shorter ones, interleaved
    pos, slots = _interleave([(3, 0, 70), (0, 0, 9), (4, 0, 1)])
    got, want = mix.step(pos, slots)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    # they go on from where they stand (decode rows, a short chunk), slot 1 starts, slot 4 starts over
    pos, slots = _interleave([(0, 9, 1), (3, 70, 3), (1, 0, 4), (4, 0, 2)])
    got, want = mix.step(pos, slots, rounded=KS.can_round_output(m.n_v_heads, m.d_v))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    for s, at in ((0, 10), (1, 4), (3, 73), (4, 2)):  # the states read back: the reference's
        conv, S = mix.states(s)
        ref = mix.store.take(s, 0, at)
        np.testing.assert_allclose(conv, ref.conv, rtol=0, atol=1e-6)
        np.testing.assert_allclose(S, ref.S, rtol=0, atol=2e-4 * np.abs(ref.S).max())


# --- the model on the GPU backend

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("q35gpu")
    return {w: synth.write_gguf(replace(TINY, weight_type=w), d / f"q35-{w}.gguf") for w in ("F32", "Q8_0")}


def _pair(path, n_ctx=256):
    gf = open_gguf(path)
    plan = build_plan(build_spec(gf))
    return GPUBackend(gf, plan, n_ctx), CPUBackend(gf, plan, n_ctx)


@pytest.mark.parametrize("weights", ["F32", "Q8_0"])
def test_tiny_qwen35_follows_the_cpu_reference(gpu, files, weights):
    g, c = _pair(files[weights])
    assert g.plan.recurrent and g.multi_step > 1  # the engine's multi-step decode runs recurrent models too
    prompt = np.random.default_rng(0).integers(0, TINY.n_vocab, 90).tolist()  # > 64 rows in one batch
    q8 = weights != "F32"
    assert_logits_close(g.forward(prompt, 0, n_logits=64), c.forward(prompt, 0, n_logits=64), q8)
    # one-token steps on from there (the state carried between calls)
    for i, t in enumerate((5, 17, 300)):
        assert_logits_close(g.forward([t], 90 + i), c.forward([t], 90 + i), q8)
    # greedy decode (decode_steps: tokens and the state kept on the GPU for every step)
    assert_gpu_follows_cpu(g, c, prompt, 8)


def test_the_norm_writes_the_rounded_copy_the_output_projection_reads(gpu, tmp_path):
    """With 4 V-heads of 64 (256 values a row) the DeltaNet's norm kernel also writes its output
    rounded for ssm_out's int8 GEMV: no quantize dispatch in between, and the model still follows
    the CPU reference."""
    spec = replace(TINY, ssm_state=64, weight_type="Q8_0", name="tiny-qwen35-d64")
    g, c = _pair(synth.write_gguf(spec, tmp_path / "q35-d64.gguf"))
    labels = [d.label.split()[0] for d in g._multi_step(1, False).dispatches]
    after = [labels[i + 1] for i, lb in enumerate(labels) if lb == "deltanet_norm"]
    assert after and all(lb.startswith("gemv_q8_0") for lb in after), after
    prompt = np.random.default_rng(5).integers(0, TINY.n_vocab, 40).tolist()
    assert_logits_close(g.forward(prompt, 0, n_logits=8), c.forward(prompt, 0, n_logits=8), True)
    assert_gpu_follows_cpu(g, c, prompt, 6)


def test_batched_equals_alone_and_the_cpu_reference(gpu, files):
    prompts = [list(range(1, 10)), list(range(5, 75)), [1, 2, 3], list(range(100, 130))]
    go = partial(greedy_outputs, max_new=6)

    on_gpu = Model(files["F32"], n_ctx=128, backend="gpu", parallel=len(prompts))
    on_cpu = Model(files["F32"], n_ctx=128, backend="cpu", parallel=len(prompts))
    together = go(on_gpu, prompts)
    assert on_gpu.engine.stats.max_rows >= len(prompts)  # the requests shared steps
    alone = [go(on_gpu, [p])[0] for p in prompts]
    assert together == alone == go(on_cpu, prompts)


def test_the_engine_restores_a_gpu_checkpoint_for_a_shared_prefix(gpu, files):
    """The engine's prefix reuse (infr/checkpoints.py) through the GPU backend's save_state/load_state:
    a request sharing two blocks with an earlier one restores the snapshot there, prefills only the
    rest, and gives the tokens of a cold run (no prefix cache) and of the CPU reference."""
    greedy = SamplingParams(temperature=0.0)
    rng = np.random.default_rng(11)
    shared = rng.integers(0, TINY.n_vocab, 80).tolist()
    a, b = shared + rng.integers(0, TINY.n_vocab, 20).tolist(), shared + rng.integers(0, TINY.n_vocab, 15).tolist()

    def go(model, p, **kw):
        r = model.engine.submit(Request(list(p), greedy, max_new=8, ignore_eos=True, **kw))
        model.engine.run_until(lambda: r.done)
        assert r.finish_reason == "length", r.error
        return r

    model = Model(files["F32"], n_ctx=160, backend="gpu", checkpoint_every=1)
    assert go(model, a).cached_tokens == 0
    rows = model.engine.stats.prefill_rows
    rb = go(model, b)
    assert rb.cached_tokens == 64 and model.checkpoints.restored == 1
    assert model.engine.stats.prefill_rows - rows == len(b) - 64
    cold = Model(files["F32"], n_ctx=160, backend="gpu", checkpoints=0)
    assert rb.output == go(cold, b, cache_prompt=False).output
    assert rb.output == go(Model(files["F32"], n_ctx=160, backend="cpu", checkpoints=0), b).output
    # Greedy tokens of a tiny random model can survive a wrong state; the states themselves cannot.
    # The cold run's 95 rows take the chunked rule, the restored run's 31 the token-serial one: their
    # sums round apart by ~1e-5 of the values after a few layers; a wrong state is off by O(1).
    for layer, (conv, S) in model.backend.recurrent.read(0).items():
        want_conv, want_S = cold.backend.recurrent.read(0)[layer]
        np.testing.assert_allclose(conv, want_conv, rtol=0, atol=1e-4 * np.abs(want_conv).max())
        np.testing.assert_allclose(S, want_S, rtol=0, atol=1e-4 * np.abs(want_S).max())


def test_checkpoint_saved_and_loaded_continues_as_uninterrupted(gpu, files):
    """save_state after a prefix, another sequence through the slot (its KV in other blocks: the
    checkpoint is the recurrent state alone, the engine keeps the blocks), load_state, go on."""
    gf = open_gguf(files["F32"])
    plan = build_plan(build_spec(gf))
    prompt = np.random.default_rng(3).integers(0, TINY.n_vocab, 20).tolist()
    n = len(prompt)

    def backend():
        g = GPUBackend(gf, plan, 128, kv_blocks=8)
        per = g.blocks_per_seq
        return g, np.arange(per), np.arange(per, 2 * per)

    def greedy(g, table, first, k):
        out, t = [], first
        for i in range(k):
            t = int(np.argmax(g.run_rows([t], [n + i], [0], table)[-1]))
            out.append(t)
        return out

    g, A, B = backend()
    first = int(np.argmax(g.run_rows(prompt, np.arange(n), np.zeros(n), A)[-1]))
    want = greedy(g, A, first, 6)

    g, A, B = backend()
    assert int(np.argmax(g.run_rows(prompt, np.arange(n), np.zeros(n), A)[-1])) == first
    saved = g.recurrent.read(0)
    snap = g.save_state(0)
    g.run_rows(list(range(40, 70)), np.arange(30), np.zeros(30), B)  # another sequence in slot 0
    assert not all(np.array_equal(saved[la][1], S) for la, (_, S) in g.recurrent.read(0).items())
    with pytest.raises(InfrError, match="cannot skip or rewind"):  # the state stands at 30, not 20
        g.run_rows([first], [n], [0], A)
    g.load_state(0, snap, n)
    for la, (conv, S) in g.recurrent.read(0).items():
        np.testing.assert_array_equal(conv, saved[la][0])
        np.testing.assert_array_equal(S, saved[la][1])
    assert greedy(g, A, first, 6) == want
    # slot 0's snapshot loaded into slot 2, whose table is the prefix's blocks
    g.load_state(2, snap, n)
    logits = g.run_rows([first], [n], [2], np.concatenate([B, B, A]))
    assert int(np.argmax(logits[-1])) == want[0]


def test_rows_that_skip_positions_are_refused(gpu, files):
    g, _ = _pair(files["F32"], 64)
    g.forward([1, 2, 3], 0)
    with pytest.raises(InfrError, match="stands at position 3"):
        g.forward([4], 5)
    table = np.arange(2 * g.blocks_per_seq) % g.n_blocks
    with pytest.raises(InfrError, match="not consecutive positions"):
        g.run_rows([1, 2, 3], [0, 2, 1], [1, 1, 1], table)


# --- against llama.cpp (tests/fixtures/qwen35.json), F32 as test_moe_exact_gpu runs the MoE files

F32_KEYS = sorted(k for k, m in DATA["models"].items() if m["weight_type"] == "F32")


def _gpu(path, n_ctx: int) -> GPUBackend:
    gf = open_gguf(path)
    return GPUBackend(gf, build_plan(build_spec(gf)), n_ctx)


def test_the_f32_files_are_covered():
    """Every family the fixture holds runs on the GPU too (qwen35, the recurrent_layers key, qwen35moe)."""
    presets = {m["preset"] for m in DATA["models"].values()}
    assert F32_KEYS and {DATA["models"][k]["preset"] for k in F32_KEYS} == presets
    assert {"tiny-qwen35", "tiny-qwen35-rl", "tiny-qwen35moe"} <= presets


@pytest.mark.parametrize("key", F32_KEYS)
def test_teacher_forced_batch_matches_llamacpp_on_the_gpu(gpu, models, key):  # noqa: F811
    m = DATA["models"][key]
    want = rows(m["teacher"], m["n_vocab"])
    got = _gpu(models(key), DATA["n_ctx"]).forward(m["teacher"]["ids"], 0, n_logits=len(want))
    assert_close(key, got, want, bound=MAX_DP)


@pytest.mark.parametrize("key", F32_KEYS)
def test_greedy_decode_matches_llamacpp_on_the_gpu(gpu, models, key):  # noqa: F811
    m = DATA["models"][key]
    g = m["generate"]
    got = decode(_gpu(models(key), DATA["n_ctx"]), g["ids"], g["tokens"])
    assert_close(key, got, rows(g, m["n_vocab"]), g["tokens"], MAX_DP)
