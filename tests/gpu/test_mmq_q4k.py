"""The int8 GEMM on 8-bit activations (wgsl/gemm_mmq.wgsl, infr/gpu/kernels_mmq.py)
with Q4_K weights against the CPU reference, its tiles and its tuning knobs
(the other types: test_mmq_types.py).

Weights come from test_quant_kernels.make_weight (valid random Q4_K blocks),
the oracle is gguf's dequantizer with float64 matmuls of the activations
rounded to 8 bits per 32 values (infr.numerics.quantize_q8), and the kernel
reads them rounded by the quantize kernel, as in the backend. Shapes are odd
on purpose: N = 200 / 72 / 75 not a multiple of the row tile, T = 1 / 17 /
70 not a multiple of the token tile, K one to five blocks; every epilogue
(bias, residual add, q|k|v split, gate||up with SiLU and GELU), weights in
row chunks, several tile shapes, and a synthetic model prefilled through the
backend with the kernel on.
"""

from __future__ import annotations

import numpy as np
import pytest
from closeness import assert_follows_greedy, assert_logits_close, rounds_activations
from gguf import GGMLQuantizationType as Q
from test_quant_kernels import make_weight, reference  # tests/gpu is on sys.path (prepend import mode)

from infr.cpu import ops as F
from infr.numerics import quantize_q8
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_q8 as KQ
from infr.gpu import tuning
from infr.gpu.runtime import read, run, storage
from infr.models.spec import Activation

TOL = 1e-5  # of |W[r]| * |x[t]|: the GEMV's integer sums, f32 sums of blocks in another order

# Tile shapes compiled and checked here (BN, BT, RM, RT, SUB, PREFETCH, UNCHECKED; SUB 0: chosen by
# the device's memory): every SUB and PREFETCH mode, row and token swizzles on and off (BN / RM and
# BT / RT multiples of 8 or not), the module with and without wgpu's runtime checks.
TILES = [(64, 64, 4, 4, 0, 0, 0), (64, 32, 4, 2, 8, 0, 0), (128, 64, 4, 8, 0, 0, 0), (32, 64, 2, 4, 8, 0, 0),
         (128, 64, 8, 4, 2, 1, 0), (64, 128, 4, 8, 2, 1, 0), (128, 128, 8, 8, 2, 0, 0), (64, 64, 4, 4, 2, 2, 1),
         (128, 32, 4, 4, 0, 2, 1), (32, 64, 8, 4, 0, 0, 1), (64, 32, 4, 8, 0, 1, 0)]


def _tile(gpu, spec):
    return KMQ.MmqTile(*spec).resolved(gpu) if spec else None


def _rounded(kernels, gpu, x: np.ndarray):
    """x [T, K] rounded on the GPU (kernels_q8): the run's first dispatch and its output."""
    T, K = x.shape
    return KQ.quantize_dispatch(kernels, storage(gpu, x), K, T)


def _want(t, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W @ x[t] of the reference, and the per-entry error scale |x[t]| * |W[n]|."""
    W = reference(t)
    xi = quantize_q8(x).astype(np.float64)
    return xi @ W.T, np.linalg.norm(xi, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :]


def _check(name: str, got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> None:
    assert not np.isnan(got).any(), "some outputs were never written"
    err = float(np.max(np.abs(got - want) / scale))
    print(f"\n[max error] {name}: {err:.3g} (tolerance {TOL:.3g})")
    assert err < TOL


# (N, K, T, bias, resid)
SHAPES = [(200, 512, 17, False, False), (72, 256, 70, True, True), (200, 1280, 1, True, False), (75, 768, 33, False, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}-K{s[1]}-T{s[2]}")
def test_mmq_matches_reference(gpu, kernels, shape):
    N, K, T, has_bias, has_resid = shape
    rng = np.random.default_rng([N, K, T])
    t = make_weight(Q.Q4_K, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if has_bias else None
    resid = rng.standard_normal((T, N)).astype(np.float32) if has_resid else None
    y = storage(gpu, np.full((T, N), np.nan, np.float32))  # NaN: an output never written shows up
    quant, xq = _rounded(kernels, gpu, x)
    ds = KMQ.mmq_dispatches(kernels, t, KM.upload_weight(gpu, t), xq, y, storage(gpu, bias) if has_bias else None, T,
                            resid=storage(gpu, resid) if has_resid else None)
    tile = KMQ.device_tuning(gpu).tile_for(gpu, Q.Q4_K, N, T)
    assert [d.groups for d in ds] == [(-(-N // tile.BN), -(-T // tile.BT), 1)]
    run(gpu, [quant] + ds)
    want, scale = _want(t, x)
    want = want + (bias if has_bias else 0) + (resid if has_resid else 0)
    _check(f"mmq N={N} K={K} T={T}", read(gpu, y, count=T * N).reshape(T, N), want, scale)


@pytest.mark.parametrize("spec", TILES, ids=lambda s: "x".join(map(str, s)))
def test_mmq_tile_shapes(gpu, kernels, spec):
    """Each tile shape on a plain product and a gate||up pair, both with edge tiles."""
    tun = _tile(gpu, spec)
    rng = np.random.default_rng(list(spec))
    N, K, T = 130, 512, 37
    t, tu = make_weight(Q.Q4_K, N, K, rng), make_weight(Q.Q4_K, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32) * 0.1  # gate sums of a few units: silu stays finite
    quant, xq = _rounded(kernels, gpu, x)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    y2 = storage(gpu, np.full((T, N), np.nan, np.float32))
    cg, cu = KM.upload_weight(gpu, t), KM.upload_weight(gpu, tu)
    ds = KMQ.mmq_dispatches(kernels, t, cg, xq, y, None, T, tile=tun)
    ds += KMQ.gate_up_dispatches(kernels, t, tu, cg, cu, xq, y2, "silu", T, tile=tun)
    run(gpu, [quant] + ds)
    want, scale = _want(t, x)
    _check(f"mmq tile {tun}", read(gpu, y, count=T * N).reshape(T, N), want, scale)
    up, _ = _want(tu, x)
    ref = F.gated_act(want, up, Activation.SILU)
    got = read(gpu, y2, count=T * N).reshape(T, N)
    np.testing.assert_allclose(got, ref, atol=TOL * np.abs(ref).max(), rtol=0)


def test_mmq_token_tiles_first(gpu, kernels):
    """Workgroups numbered token tiles first (INFR_GEMM_TOKENS_FIRST: the token tiles of a row tile run
    together and share its weight reads in the cache): a plain product and a gate||up pair over three
    row tiles and two token tiles come out the same bits as in grid order, within the bound."""
    rng = np.random.default_rng(9)
    N, K, T = 130, 512, 37
    t, tu = make_weight(Q.Q4_K, N, K, rng), make_weight(Q.Q4_K, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32) * 0.1
    tile = _tile(gpu, (64, 32, 4, 2, 8, 0, 0))
    cg, cu = KM.upload_weight(gpu, t), KM.upload_weight(gpu, tu)
    outs = {}
    for first in (0, 1):
        with tuning.override(gemm_tokens_first=first):
            quant, xq = _rounded(kernels, gpu, x)
            y = storage(gpu, np.full((T, N), np.nan, np.float32))
            y2 = storage(gpu, np.full((T, N), np.nan, np.float32))
            ds = KMQ.mmq_dispatches(kernels, t, cg, xq, y, None, T, tile=tile)
            ds += KMQ.gate_up_dispatches(kernels, t, tu, cg, cu, xq, y2, "silu", T, tile=tile)
            assert [d.groups for d in ds] == [(3, 2, 1), (5, 2, 1)]
            run(gpu, [quant] + ds)
            outs[first] = (read(gpu, y, count=T * N).reshape(T, N), read(gpu, y2, count=T * N).reshape(T, N))
    want, scale = _want(t, x)
    _check("mmq token tiles first", outs[1][0], want, scale)
    for got, ref in zip(outs[1], outs[0]):
        np.testing.assert_array_equal(got, ref)


def test_mmq_chunked_weight_and_stride(gpu, kernels):
    """A weight in row chunks (a forced small binding limit): one dispatch per
    chunk, each writing its own columns of y rows wider than N, with bias and
    the residual add; nothing written past N."""
    rng = np.random.default_rng(5)
    N, K, T = 150, 512, 21
    t = make_weight(Q.Q4_K, N, K, rng)
    chunks = KM.upload_weight(gpu, t, max_binding=KM.binding_for_rows(45, KM.row_bytes(Q.Q4_K, K)))
    assert [(r0, n) for _, r0, n in chunks] == [(0, 45), (45, 45), (90, 45), (135, 15)]
    ys = N + 13
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    resid = rng.standard_normal((T, ys)).astype(np.float32)
    y = storage(gpu, np.full((T, ys), -7.0, np.float32))
    quant, xq = _rounded(kernels, gpu, x)
    ds = KMQ.mmq_dispatches(kernels, t, chunks, xq, y, storage(gpu, bias), T, resid=storage(gpu, resid), y_stride=ys)
    assert len(ds) == len(chunks)
    run(gpu, [quant] + ds)
    got = read(gpu, y, count=T * ys).reshape(T, ys)
    assert np.all(got[:, N:] == -7.0), "wrote past N in a row of y"
    want, scale = _want(t, x)
    _check("mmq chunked", got[:, :N], want + bias + resid[:, :N], scale)


@pytest.mark.parametrize("sizes,T", [((96, 40, 40), 19), ((200, 72), 70)])
def test_mmq_stacked_split(gpu, kernels, sizes, T):
    """q|k|v (or two matrices) stacked in one buffer, one dispatch writing each
    matrix's rows to its own output, with the stacked bias."""
    rng = np.random.default_rng(len(sizes) + T)
    K = 256
    ts = [make_weight(Q.Q4_K, n, K, rng) for n in sizes]
    chunks = KM.upload_stacked(gpu, ts, label="qkv")
    bias = rng.standard_normal(sum(sizes)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    outs = [storage(gpu, np.full((T, n), np.nan, np.float32)) for n in sizes]
    quant, xq = _rounded(kernels, gpu, x)
    ds = KMQ.stacked_dispatches(kernels, ts, chunks, xq, outs, storage(gpu, bias), T)
    assert len(ds) == 1
    run(gpu, [quant] + ds)
    first = 0
    for t, yb, n in zip(ts, outs, sizes):
        want, scale = _want(t, x)
        _check(f"mmq stacked rows {first}..{first + n}", read(gpu, yb, count=T * n).reshape(T, n),
               want + bias[first : first + n], scale)
        first += n


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("N,T,chunk_rows", [(75, 17, None), (200, 70, 80)])
def test_mmq_gate_up(gpu, kernels, act, N, T, chunk_rows):
    """act(Wg x) * (Wu x) in one kernel, whole or in row chunks (80 rows: 3 chunks)."""
    rng = np.random.default_rng([N, T, len(act)])
    K = 768
    wg, wu = make_weight(Q.Q4_K, N, K, rng), make_weight(Q.Q4_K, N, K, rng)
    limit = None if chunk_rows is None else KM.binding_for_rows(chunk_rows, KM.row_bytes(Q.Q4_K, K))
    cg, cu = KM.upload_weight(gpu, wg, max_binding=limit), KM.upload_weight(gpu, wu, max_binding=limit)
    assert len(cg) == (1 if chunk_rows is None else -(-N // chunk_rows))
    x = rng.standard_normal((T, K)).astype(np.float32) * 0.1  # gate sums of a few units: silu stays finite
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    quant, xq = _rounded(kernels, gpu, x)
    ds = KMQ.gate_up_dispatches(kernels, wg, wu, cg, cu, xq, y, act, T)
    assert ds is not None and len(ds) == len(cg)
    run(gpu, [quant] + ds)
    g, _ = _want(wg, x)
    u, _ = _want(wu, x)
    ref = F.gated_act(g, u, Activation(act))
    got = read(gpu, y, count=T * N).reshape(T, N)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, atol=TOL * np.abs(ref).max(), rtol=0)


def test_mmq_gate_up_refuses_mixed_types(gpu, kernels):
    rng = np.random.default_rng(1)
    wg, wu = make_weight(Q.Q4_K, 8, 256, rng), make_weight(Q.Q8_0, 8, 256, rng)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    assert KMQ.gate_up_dispatches(kernels, wg, wu, cg, cu, cg[0][0], cu[0][0], "silu", 32) is None


def test_tile_follows_the_grid(kernels):
    """The first tile that still gives MIN_GROUPS workgroups (8B shapes), else the one giving most."""
    tuning = KMQ.MmqTuning.from_env({})
    tile = lambda *a, **kw: (lambda t: (t.BN, t.BT))(tuning.tile_for(kernels.dev, Q.Q4_K, *a, **kw))
    assert tile(4096, 512) == (128, 64)  # 32 x 8 workgroups
    assert tile(4096, 128) == (64, 32)   # 128 x 64 would give 64 workgroups, 64 x 64 128
    assert tile(14336, 128, pair=True) == (128, 64)  # 64 output rows a tile: 224 x 2
    assert tile(576, 16) == (64, 32)     # none reaches MIN_GROUPS: the most workgroups
    pinned = KMQ.MmqTuning.from_env({"INFR_MMQ_BN": "64", "INFR_MMQ_RM": "4", "INFR_MMQ_RT": "4"})
    t = pinned.tile_for(kernels.dev, Q.Q4_K, 4096, 512)
    assert (t.BN, t.BT, t.RM, t.RT) == (64, 64, 4, 4)  # the environment's tile, whatever the grid
    listed = KMQ.MmqTuning.from_env({"INFR_MMQ_TILES": "64,64,4,4 32,32,2,2", "INFR_MMQ_TILES_Q6_K": "64,128,4,8,0,1"})
    assert (lambda t: (t.BN, t.BT))(listed.tile_for(kernels.dev, Q.Q4_K, 4096, 512)) == (64, 64)
    t6 = listed.tile_for(kernels.dev, Q.Q6_K, 4096, 512)  # that type's own list
    assert (t6.BN, t6.BT, t6.PREFETCH) == (64, 128, 1)


def test_expert_tile_by_pairs_an_expert(kernels):
    """Grouped expert products: with INFR_MMQ_EXPERT_FEW set, at most expert_few_max_t pairs an
    expert (a 512-token prompt over the 30B's 128 experts, top 8: 32) take its first fitting tile,
    gate||up and down alike (one grouping pass); more pairs an expert (2048 tokens: 128) the grid
    rule over all the pairs, as every product does by default."""
    few = KMQ.MmqTuning.from_env({"INFR_MMQ_EXPERT_FEW": "128,32,4,4 64,16,4,2"})
    t = few.expert_tile_for(kernels.dev, Q.Q4_K, 768, 512 * 8, 128, pair=True)
    assert (t.BN, t.BT, t.RM, t.RT) == (128, 32, 4, 4)
    assert few.expert_tile_for(kernels.dev, Q.Q6_K, 2048, 512 * 8, 128).BT == 32
    many = few.expert_tile_for(kernels.dev, Q.Q4_K, 768, 2048 * 8, 128, pair=True)
    assert many == few.tile_for(kernels.dev, Q.Q4_K, 768, 2048 * 8, pair=True) and many.BT == 64
    for default in (KMQ.MmqTuning.from_env({}), KMQ.MmqTuning.from_env({"INFR_MMQ_EXPERT_FEW": "none"})):
        assert default.expert_tile_for(kernels.dev, Q.Q4_K, 768, 512 * 8, 128, pair=True) == \
            default.tile_for(kernels.dev, Q.Q4_K, 768, 512 * 8, pair=True)


def test_mmq_selection_and_tuning_env(gpu):
    rng = np.random.default_rng(2)
    q4, q2 = make_weight(Q.Q4_K, 4, 256, rng), make_weight(Q.Q2_K, 4, 256, rng)
    narrow = make_weight(Q.Q8_0, 4, 96, rng)

    class _GPU:  # a GPU adapter's selection (no driver needed)
        is_cpu = False

    class _CPU:
        is_cpu = True

    m = KMQ.MMQ_MIN_T
    g, c = _GPU(), _CPU()
    for d in (g, c):
        KMQ.set_tuning(d, KMQ.MmqTuning.from_env({}))
    assert KMQ.use_mmq(m, g, q4) and not KMQ.use_mmq(m - 1, g, q4) and not KMQ.use_mmq(1, g, q4)
    assert not KMQ.use_mmq(m, g, q2)  # no reader for Q2_K: it keeps its kernels
    assert not KMQ.use_mmq(m, g, narrow)  # K is not whole 256-value groups (quantize_q8's layout)
    assert KMQ.use_mmq(m, c, q4) and not KMQ.use_mmq(m - 1, c, q4)  # lavapipe: faster than its f32 GEMM
    KMQ.set_tuning(c, KMQ.MmqTuning.from_env({"INFR_MMQ_MIN_T": "4"}))
    KMQ.set_tuning(g, KMQ.MmqTuning.from_env({"INFR_MMQ_MIN_T": "0"}))
    assert KMQ.use_mmq(4, c, q4) and not KMQ.use_mmq(3, c, q4)
    assert not KMQ.use_mmq(128, g, q4)

    class _Small:  # WebGPU's default 16 KB of workgroup memory: the 128-row tile at SUB 2
        limits = {"max-compute-workgroup-storage-size": 16384, "max-compute-invocations-per-workgroup": 256}

    small = KMQ.MmqTuning.from_env({}).tile_for(_Small(), Q.Q4_K, 4096, 512)
    assert (small.BN, small.SUB) == (128, 2) and small.shared_bytes() <= 16384
    default = KMQ.MmqTuning.from_env({}).tiles[0]
    assert (default.BN, default.BT, default.RM, default.RT) == (128, 64, 4, 8)
    env = {"INFR_MMQ_BN": "64", "INFR_MMQ_BT": "32", "INFR_MMQ_RM": "4", "INFR_MMQ_RT": "4", "INFR_MMQ_PREFETCH": "1",
           "INFR_MMQ_UNCHECKED": "1"}
    t = KMQ.MmqTuning.from_env(env).tile_for(gpu, Q.Q4_K, 4096, 512)
    assert (t.BN, t.BT, t.RM, t.RT, t.PREFETCH, t.UNCHECKED) == (64, 32, 4, 4, 1, 1)
    assert t.shared_bytes() <= gpu.limits["max-compute-workgroup-storage-size"]
    with pytest.raises(ValueError):  # 64 rows are not whole blocks of 3
        KMQ.MmqTuning.from_env({**env, "INFR_MMQ_RM": "3"}).tiles[0].resolved(gpu)


def test_tuning_is_read_once(gpu, tune, monkeypatch):
    """The environment is read once (infr.gpu.tuning), not at each graph build; a device
    may be given a tuning of its own (benchmarks, tests)."""
    class _Dev:
        limits = gpu.limits

    dev = _Dev()
    tune(INFR_MMQ_MIN_T="5")
    assert KMQ.min_tokens(dev) == 5
    monkeypatch.setenv("INFR_MMQ_MIN_T", "50")  # not read again
    assert KMQ.min_tokens(dev) == 5 and KMQ.device_tuning(dev) is KMQ.device_tuning(dev)
    old = KMQ.set_tuning(dev, KMQ.MmqTuning.from_env({"INFR_MMQ_MIN_T": "7"}))
    assert old is None and KMQ.min_tokens(dev) == 7 and KMQ.min_tokens(None) == 5
    KMQ.set_tuning(dev, None)  # the process's again, until it is read again
    assert KMQ.min_tokens(dev) == 5
    tune()
    assert KMQ.min_tokens(dev) == 50


@pytest.fixture
def small_batches(gpu):
    """The kernel on from 8 tokens on the test device, for the test's duration."""
    old = KMQ.set_tuning(gpu, KMQ.MmqTuning(min_t=8))
    yield
    KMQ.set_tuning(gpu, old)


def test_prefill_through_mmq(tmp_path, gpu, small_batches):
    """With the kernel on for small batches, a prompt prefilled in one batch
    runs every weight matmul of a Q4_K model through it (stacked q|k|v, gate||up,
    residual epilogues, the head) and gives the CPU reference's logits and
    greedy continuation, and the logits of token-by-token decode (the GEMV)."""
    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    spec = synth.preset("tiny-llama", n_embd=256, n_ff=512, n_heads=4, n_kv_heads=2, head_dim=64, weight_type="Q4_K")
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "tiny-llama.gguf"))
    plan = build_plan(build_spec(gf))
    gpu_be, cpu_be = GPUBackend(gf, plan, 64, dev=gpu), CPUBackend(gf, plan, 64)
    prompt = [1, 17, 42, 99, 3, 250, 7, 7, 180, 64, 5, 33, 201]  # 13 tokens: a partial token tile
    T = len(prompt)
    body, head, _ = gpu_be._graph(T, T)
    labels = [d.label for d in body.dispatches + head.dispatches]
    weight_ops = [lb for lb in labels if lb.startswith(("gemm_", "gemv_", "matmul_", "mmq_"))]
    # every Q4_K matrix through the new kernel: no Q4_K GEMV or f32 GEMM left in the batch graph
    assert not any(lb.startswith(("gemv_q4_k", "gemm_q4_k", "matmul_q4_k")) for lb in weight_ops), weight_ops
    assert sum(lb.startswith("mmq_q4_k ") for lb in weight_ops) >= 2 * plan.spec.n_layers, weight_ops  # o, down
    assert sum("mmq_q4_k_stacked" in lb for lb in labels) == plan.spec.n_layers
    assert sum("mmq_q4_k_gate_up" in lb for lb in labels) == plan.spec.n_layers
    assert not any(lb.startswith("mmq_") for lb in (d.label for d in gpu_be._multi_step(1, False).dispatches))

    batch = gpu_be.forward(prompt, 0, n_logits=T)
    q8 = rounds_activations(gf, plan)
    assert_logits_close(batch, cpu_be.forward(prompt, 0, n_logits=T), q8)
    steps = np.stack([gpu_be.forward([tok], i)[-1] for i, tok in enumerate(prompt)])
    assert_logits_close(steps, batch, q8)
    assert (steps.argmax(-1) == batch.argmax(-1)).all()

    # The greedy continuation: the reference follows the GPU's tokens (this model has near-ties of
    # 0.025 at steps 4 and 5, which f32 sums in another order may pick either way).
    first = int(np.argmax(gpu_be.forward(prompt, 0)[-1]))
    got = [first] + gpu_be.decode_greedy(first, T, 7)
    assert_follows_greedy(cpu_be, prompt, got)
    assert len(set(got)) > 2  # a real chain, not one token repeated
