"""The int8 GEMM (wgsl/gemm_mmq.wgsl) with each block reader but Q4_K's
(test_mmq_q4k.py) against quantize_q8(x) @ dequantize(W).T.

Weights are test_quant_kernels.make_weight's (valid random blocks), the
oracle gguf's dequantizer in float64 times x rounded by infr.numerics.quantize_q8,
and the kernel reads x rounded by the quantize kernel, as in the backend. The
oracle does not depend on which types the backend rounds activations for
(numerics.Q8_ACTIVATIONS). Shapes are odd: N not a multiple of the row tile,
T = 33 / 70 not a multiple of the token tile, K of one to three 256-value
groups (so 34- / 18- / 22- / 210-byte blocks start at both 0 and 2 mod 4),
with bias, the residual add, the q|k|v split and gate||up, each on a tile of
its own (the PREFETCH modes 0, 1, 2).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from test_quant_kernels import make_weight, reference  # tests/gpu is on sys.path (prepend import mode)

from infr import numerics
from infr.cpu import ops as F
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import read, run, storage
from infr.models.spec import Activation

TOL = 1e-5  # of |W[r]| * |x[t]|: exact integer sums per 32 values, f32 scales and sums in another order

TYPES = [Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q5_K, Q.Q4_0, Q.Q4_1, Q.Q5_1, Q.IQ4_NL, Q.IQ4_XS]
PLAIN, PAIR, SPLIT = KMQ.MmqTile(128, 64, 4, 8), KMQ.MmqTile(64, 64, 4, 4, 0, 1), KMQ.MmqTile(64, 32, 4, 2, 0, 2)


def _ids(types):
    return [q.name.lower() for q in types]


def _want(t, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W @ x[t] with x rounded as the reference rounds it, and the error scale |x[t]| * |W[n]|."""
    W = reference(t)
    xi = numerics.quantize_q8(x).astype(np.float64)
    return xi @ W.T, np.linalg.norm(xi, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :]


def _check(name: str, got: np.ndarray, want: np.ndarray, scale: np.ndarray, tol: float = TOL) -> None:
    """|got - want| below tol of the error scale everywhere, and every output written."""
    assert not np.isnan(got).any(), "some outputs were never written"
    err = float(np.max(np.abs(got - want) / scale))
    print(f"\n[max error] {name}: {err:.3g} (tolerance {tol:.3g})")
    assert err < tol


def _nan(gpu, T: int, N: int):
    return storage(gpu, np.full((T, N), np.nan, np.float32))  # NaN: an output never written shows up


@pytest.mark.parametrize("qtype", TYPES, ids=_ids(TYPES))
def test_type_matches_reference(gpu, kernels, qtype):
    """One run per type: a plain product with bias and the residual add (T = 33,
    128 x 64 tile), gate||up with GELU (T = 70, PREFETCH 1) and a q|k|v stack
    with its bias (T = 70, PREFETCH 2)."""
    rng = np.random.default_rng([int(qtype), 7])
    ds = []
    # plain: N = 75, K = 768, T = 33
    N, K, T = 75, 768, 33
    t = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    resid = rng.standard_normal((T, N)).astype(np.float32)
    y = _nan(gpu, T, N)
    quant, xq = KQ.quantize_dispatch(kernels, storage(gpu, x), K, T, into=storage(gpu, 4 * T * KQ.words(K)))
    ds += [quant] + KMQ.mmq_dispatches(kernels, t, KM.upload_weight(gpu, t), xq, y, storage(gpu, bias), T,
                                       resid=storage(gpu, resid), tile=PLAIN)
    # gate||up: N = 72, K = 512, T = 70
    Np, Kp, Tp = 72, 512, 70
    wg, wu = make_weight(qtype, Np, Kp, rng), make_weight(qtype, Np, Kp, rng)
    xp = rng.standard_normal((Tp, Kp)).astype(np.float32) * 0.1  # gate sums of a few units
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    yp = _nan(gpu, Tp, Np)
    quant, xqp = KQ.quantize_dispatch(kernels, storage(gpu, xp), Kp, Tp, into=storage(gpu, 4 * Tp * KQ.words(Kp)))
    pair = KMQ.gate_up_dispatches(kernels, wg, wu, cg, cu, xqp, yp, "gelu", Tp, tile=PAIR)
    assert pair is not None and len(pair) == 1
    ds += [quant] + pair
    # q|k|v: 40 + 24 + 24 rows, K = 256, T = 70
    sizes, Ks = (40, 24, 24), 256
    ts = [make_weight(qtype, n, Ks, rng) for n in sizes]
    sbias = rng.standard_normal(sum(sizes)).astype(np.float32)
    xs = rng.standard_normal((Tp, Ks)).astype(np.float32)
    outs = [_nan(gpu, Tp, n) for n in sizes]
    quant, xqs = KQ.quantize_dispatch(kernels, storage(gpu, xs), Ks, Tp, into=storage(gpu, 4 * Tp * KQ.words(Ks)))
    ds += [quant] + KMQ.stacked_dispatches(kernels, ts, KM.upload_stacked(gpu, ts, label="qkv"), xqs, outs,
                                           storage(gpu, sbias), Tp, tile=SPLIT)
    run(gpu, ds)

    name = qtype.name
    want, scale = _want(t, x)
    _check(f"{name} plain N={N} K={K} T={T}", read(gpu, y, count=T * N).reshape(T, N), want + bias + resid, scale)
    g, _ = _want(wg, xp)
    u, _ = _want(wu, xp)
    ref = F.gated_act(g, u, Activation.GELU)
    got = read(gpu, yp, count=Tp * Np).reshape(Tp, Np)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, atol=TOL * np.abs(ref).max(), rtol=0)
    first = 0
    for tw, yb, n in zip(ts, outs, sizes):
        want, scale = _want(tw, xs)
        _check(f"{name} stacked rows {first}..{first + n}", read(gpu, yb, count=Tp * n).reshape(Tp, n),
               want + sbias[first : first + n], scale)
        first += n


# Q6_K tiles: every SUB, PREFETCH mode and swizzle setting, with and without wgpu's runtime checks.
Q6K_TILES = [(32, 64, 2, 4, 8, 0, 1), (128, 64, 8, 4, 2, 1, 0), (64, 32, 4, 8, 4, 2, 0), (32, 64, 8, 4, 0, 2, 1)]


@pytest.mark.parametrize("spec", Q6K_TILES, ids=lambda s: "x".join(map(str, s)))
def test_q6k_tile_shapes(gpu, kernels, spec):
    """Q6_K (the Q4_K_M mix's ffn_down) on each tile: one 256-value group per row
    (T = 37 tokens), then three (rows 630 bytes: every other row 2 mod 4)."""
    tile = KMQ.MmqTile(*spec).resolved(gpu)
    rng = np.random.default_rng(list(spec))
    ds, checks = [], []
    for N, K, T in ((130, 256, 37), (70, 768, 33)):
        t = make_weight(Q.Q6_K, N, K, rng)
        x = rng.standard_normal((T, K)).astype(np.float32)
        y = _nan(gpu, T, N)
        quant, xq = KQ.quantize_dispatch(kernels, storage(gpu, x), K, T, into=storage(gpu, 4 * T * KQ.words(K)))
        ds += [quant] + KMQ.mmq_dispatches(kernels, t, KM.upload_weight(gpu, t), xq, y, None, T, tile=tile)
        checks.append((t, x, y, N, K, T))
    run(gpu, ds)
    for t, x, y, N, K, T in checks:
        want, scale = _want(t, x)
        _check(f"Q6_K tile {tile.spec} N={N} K={K}", read(gpu, y, count=T * N).reshape(T, N), want, scale)


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q8_0], ids=_ids([Q.Q6_K, Q.Q8_0]))
def test_chunked_weight_and_stride(gpu, kernels, qtype):
    """A weight in row chunks (each its own buffer, from row 0 again): one dispatch
    per chunk writing its columns of y rows wider than N, nothing past N."""
    rng = np.random.default_rng(int(qtype))
    N, K, T = 150, 768, 21
    t = make_weight(qtype, N, K, rng)
    chunks = KM.upload_weight(gpu, t, max_binding=KM.binding_for_rows(45, KM.row_bytes(qtype, K)))
    assert [(r0, n) for _, r0, n in chunks] == [(0, 45), (45, 45), (90, 45), (135, 15)]
    ys = N + 13
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    y = storage(gpu, np.full((T, ys), -7.0, np.float32))
    quant, xq = KQ.quantize_dispatch(kernels, storage(gpu, x), K, T, into=storage(gpu, 4 * T * KQ.words(K)))
    ds = KMQ.mmq_dispatches(kernels, t, chunks, xq, y, storage(gpu, bias), T, y_stride=ys, tile=PLAIN)
    assert len(ds) == len(chunks)
    run(gpu, [quant] + ds)
    got = read(gpu, y, count=T * ys).reshape(T, ys)
    assert np.all(got[:, N:] == -7.0), "wrote past N in a row of y"
    want, scale = _want(t, x)
    _check(f"{qtype.name} chunked", got[:, :N], want + bias, scale)


def test_selection_follows_the_rounding_rule(gpu):
    """use_mmq takes a type with a reader exactly when the reference rounds its
    activations (numerics.takes_q8), from min_t tokens; gate||up pairs of two
    types, and stacks of two types, are refused."""
    rng = np.random.default_rng(3)
    tuning = KMQ.device_tuning(gpu)
    for q in [Q.Q4_K] + TYPES:
        t = make_weight(q, 4, 256, rng)
        assert KMQ.use_mmq(max(tuning.min_t, 32), gpu, t) == numerics.takes_q8(q), q.name
        assert not KMQ.use_mmq(tuning.min_t - 1, gpu, t)
    a, b = make_weight(Q.Q6_K, 8, 256, rng), make_weight(Q.Q8_0, 8, 256, rng)
    ca, cb = KM.upload_weight(gpu, a), KM.upload_weight(gpu, b)
    assert KMQ.gate_up_dispatches(None, a, b, ca, cb, None, None, "silu", 64) is None
    with pytest.raises(ValueError):
        KMQ.stacked_dispatches(None, [a, b], ca, None, [None, None], None, 64)


def test_q4_k_m_mix_prefill_through_mmq(tmp_path, gpu, monkeypatch):
    """The Q4_K_M mix (one layer's ffn_down and attn_v, and the head, in Q6_K) with
    Q6_K's activations rounded (kept in numerics.Q8_ACTIVATIONS for this test
    whatever the set holds): a prompt prefilled in one batch runs every Q4_K and
    Q6_K matmul through mmq (ffn_down with its residual add, attn_v out of the
    mixed q|k|v stack, the head) and gives the CPU reference's logits."""
    from closeness import assert_logits_close

    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    monkeypatch.setattr(numerics, "Q8_ACTIVATIONS", numerics.Q8_ACTIVATIONS | {Q.Q6_K})
    old = KMQ.set_tuning(gpu, KMQ.MmqTuning(min_t=8))  # small batches through the kernel too
    try:
        spec = synth.preset("tiny-llama", n_embd=256, n_ff=512, n_heads=4, n_kv_heads=2, head_dim=64,
                            weight_type="Q4_K_M")
        gf = open_gguf(synth.write_gguf(spec, tmp_path / "tiny-q4_k_m.gguf"))
        plan = build_plan(build_spec(gf))
        q6 = [n for n in gf.tensors if gf.tensor(n).qtype == Q.Q6_K]
        assert any("ffn_down" in n for n in q6) and "output.weight" in q6
        gpu_be, cpu_be = GPUBackend(gf, plan, 64, dev=gpu), CPUBackend(gf, plan, 64)
        prompt = [1, 17, 42, 99, 3, 250, 7, 7, 180, 64, 5, 33, 201]
        T = len(prompt)
        body, head, _ = gpu_be._graph(T, T)
        labels = [d.label for d in body.dispatches + head.dispatches]
        assert not any(lb.startswith(("gemv_", "matmul_", "gemm_")) for lb in labels), labels
        assert sum(lb.startswith("mmq_q6_k ") for lb in labels) == len(q6), labels
        assert_logits_close(gpu_be.forward(prompt, 0, n_logits=T), cpu_be.forward(prompt, 0, n_logits=T), True)
    finally:
        KMQ.set_tuning(gpu, old)


ODD_K = [Q.Q8_0, Q.Q5_0, Q.Q4_0]


@pytest.mark.parametrize("qtype", ODD_K, ids=_ids(ODD_K))
def test_rows_not_whole_256s(gpu, kernels, qtype):
    """32-value block types with rows of 704 (Gemma 4 26B's experts) and 2112 (its dense FFN down):
    the tile stages 2 sub-blocks at a time instead of the resolved SUB, which would skip the tail."""
    rng = np.random.default_rng([int(qtype), 704])
    for K, T in ((704, 33), (2112, 20), (640, 17)):  # and Gemma 3 270m's width: 4 sub-blocks a stage
        N = 70
        t = make_weight(qtype, N, K, rng)
        assert KMQ.applies(t)
        tile = PLAIN.resolved(gpu)
        assert tile.fit_k(K).SUB == (2 if K != 640 else min(4, tile.SUB)) and tile.fit_k(1024).SUB == tile.SUB
        x = rng.standard_normal((T, K)).astype(np.float32)
        y = _nan(gpu, T, N)
        quant, xq = KQ.quantize_dispatch(kernels, storage(gpu, x), K, T, into=storage(gpu, 4 * T * KQ.words(K)))
        run(gpu, [quant] + KMQ.mmq_dispatches(kernels, t, KM.upload_weight(gpu, t), xq, y, None, T, tile=PLAIN))
        want, scale = _want(t, x)
        _check(f"{qtype.name} K={K}", read(gpu, y, np.float32, T * N).reshape(T, N), want, scale)
    assert not KMQ.applies(make_weight(qtype, 4, 736, rng))  # 23 blocks of 32: no whole 64s

