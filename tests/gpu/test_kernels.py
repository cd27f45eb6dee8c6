"""The small WGSL kernels against the CPU reference (infr/cpu/ops.py).

Shapes are deliberately odd (widths that are not multiples of the workgroup,
partial rotary dims, GQA ratios 1/3/7, windows smaller than the context).
Tolerances are derived from the arithmetic each kernel does, and every test
prints the max error it measured (`pytest -s` shows them).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infr.cpu import ops as F
from infr.gpu import kernels_misc as M
from infr.gpu.runtime import Kernels, read, run, storage
from infr.models.spec import Activation, RopeSpec, RopeStyle


def _buf(gpu, arr: np.ndarray):
    return storage(gpu, np.ascontiguousarray(arr))


def _state(gpu, start: int, T: int):
    """One sequence of T rows from `start` in a contiguous cache (slot 0, identity block table)."""
    return M.single_sequence(gpu, start, T, start + T)


def _report(name: str, err: float, tol: float) -> None:
    print(f"\n[max error] {name}: {err:.3g} (tolerance {tol:.3g})")


# --- rmsnorm ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "width,group,T,eps",
    [
        (1000, None, 1, 1e-6), (1000, None, 5, 1e-5), (577, None, 5, 1e-6),
        (5 * 72, 72, 5, 1e-6), (3 * 256, 256, 1, 1e-6),  # QK-norm: one group per head
    ],
)
def test_rmsnorm(gpu, kernels, width, group, T, eps):
    rng = np.random.default_rng(width + T)
    x = (rng.standard_normal((T, width)) * rng.uniform(0.1, 30, (T, 1))).astype(np.float32)
    g = rng.uniform(0.5, 2.0, group or width).astype(np.float32)
    y = storage(gpu, T * width * 4)
    run(gpu, [M.rmsnorm_dispatch(kernels, _buf(gpu, x), _buf(gpu, g), y, width, group, eps, T)])
    got = read(gpu, y, count=T * width).reshape(T, width)
    want = F.rms_norm(x, g, eps, group)
    # f32 sums in a different order: a few ulps of each output.
    err = float(np.max(np.abs(got - want) / (np.abs(want) + 1e-30)))
    _report(f"rmsnorm w={width} group={group} T={T} (relative)", err, 2e-6)
    assert err < 2e-6


# --- rope ------------------------------------------------------------------------------------


def _rope_case(gpu, kernels, style, theta, with_factors, start, T, n_heads=3, head_dim=64, n_rot=64, freq_scale=1.0):
    rng = np.random.default_rng(int(theta) % 1000 + start + T)
    x = rng.standard_normal((T, n_heads * head_dim)).astype(np.float32)
    factors = rng.uniform(1.0, 40.0, n_rot // 2).astype(np.float32) if with_factors else None
    xb = _buf(gpu, x)
    fb = _buf(gpu, factors) if with_factors else None
    d = M.rope_dispatch(
        kernels, xb, _state(gpu, start, T), n_heads, head_dim, n_rot, theta, freq_scale, style, T, factors=fb
    )
    run(gpu, [d])
    got = read(gpu, xb, count=x.size).reshape(x.shape)
    spec = RopeSpec(RopeStyle(style), theta, n_rot, freq_scale)
    pos = np.arange(start, start + T)
    want = F.rope(x, n_heads, head_dim, F.rope_angles(pos, spec, factors), spec.style)
    return x, got, want


# The angle is computed in f32: the inverse frequency is good to about an ulp
# (its f32 rounding alone is up to 3e-8 * pos rad of angle) and pos * inv_freq is
# rounded to f32, so the angle error grows like pos * a few 2^-24 (measured on
# lavapipe: at most 5.9e-8 * pos rad, 2.1e-4 at 4k, 1.8e-3 at 32k; the bound
# leaves room for other drivers' log2). An angle error e moves each value of a
# rotated pair (a, b) by at most |(a, b)| * e; sin/cos of the reduced angle add ~1e-7.
ANGLE_ERR_PER_POS = 1.5e-7


def _assert_rope_close(name, x, got, want, style, n_heads, head_dim, n_rot, max_pos):
    T = x.shape[0]
    xs = x.reshape(T, n_heads, head_dim)
    half = n_rot // 2
    if style == "norm":
        a, b = xs[..., 0:n_rot:2], xs[..., 1:n_rot:2]
    else:
        a, b = xs[..., :half], xs[..., half:n_rot]
    norm = np.sqrt(a.astype(np.float64) ** 2 + b.astype(np.float64) ** 2)
    tol_pair = norm * (ANGLE_ERR_PER_POS * max_pos + 1e-6) + 1e-6
    err = np.abs(got - want).reshape(T, n_heads, head_dim).astype(np.float64)
    if style == "norm":
        excess = np.maximum(err[..., 0:n_rot:2], err[..., 1:n_rot:2]) - tol_pair
    else:
        excess = np.maximum(err[..., :half], err[..., half:n_rot]) - tol_pair
    _report(f"{name} (abs; pairwise tolerance up to {tol_pair.max():.3g})", float(err.max()), float(tol_pair.max()))
    assert excess.max() <= 0
    assert np.array_equal(got.reshape(T, n_heads, head_dim)[..., n_rot:], xs[..., n_rot:])  # unrotated dims


@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize("theta", [1e4, 1e6])
@pytest.mark.parametrize("with_factors", [False, True])
@pytest.mark.parametrize("start,T", [(0, 5), (3998, 1), (4093, 5)])
def test_rope(gpu, kernels, style, theta, with_factors, start, T):
    x, got, want = _rope_case(gpu, kernels, style, theta, with_factors, start, T)
    name = f"rope {style} theta={theta:g} factors={with_factors} pos={start}+{T}"
    _assert_rope_close(name, x, got, want, style, 3, 64, 64, start + T)


@pytest.mark.parametrize("style", ["norm", "neox"])
def test_rope_partial_rotation_and_freq_scale(gpu, kernels, style):
    # gemma/neox-style partial rotary dims: dims >= n_rot must come back untouched.
    x, got, want = _rope_case(
        gpu, kernels, style, 1e4, False, 1200, 5, n_heads=5, head_dim=96, n_rot=32, freq_scale=0.25
    )
    _assert_rope_close(f"rope {style} n_rot=32/96 freq_scale=0.25", x, got, want, style, 5, 96, 32, 1205)


@pytest.mark.parametrize("style", ["norm", "neox"])
def test_rope_long_positions(gpu, kernels, style):
    # Near 32k the f32 angle carries ~3e-3 rad of error: the same per-position bound holds.
    x, got, want = _rope_case(gpu, kernels, style, 1e4, False, 32760, 5, head_dim=128, n_rot=128)
    _assert_rope_close(f"rope {style} pos=32760+5", x, got, want, style, 3, 128, 128, 32765)


# --- kv_store --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kv_heads,head_dim,v_head_dim,start,T", [(3, 64, 64, 7, 5), (1, 256, 256, 40, 1), (2, 96, 48, 0, 5)]
)
def test_kv_store_round_trip(gpu, kernels, kv_heads, head_dim, v_head_dim, start, T):
    ctx = 48
    rng = np.random.default_rng(head_dim + start)
    k = (rng.standard_normal((T, kv_heads * head_dim)) * 3).astype(np.float32)
    v = (rng.standard_normal((T, kv_heads * v_head_dim)) * 3).astype(np.float32)
    # Pre-fill the caches so we also see that nothing outside the batch's rows is touched.
    kc0 = rng.standard_normal((ctx, kv_heads, head_dim)).astype(np.float16)
    vc0 = rng.standard_normal((ctx, kv_heads, v_head_dim)).astype(np.float16)
    kcb, vcb = _buf(gpu, kc0.view(np.uint32)), _buf(gpu, vc0.view(np.uint32))
    d = M.kv_store_dispatch(
        kernels, _buf(gpu, k), _buf(gpu, v), kcb, vcb, _state(gpu, start, T), kv_heads, head_dim, v_head_dim, T
    )
    run(gpu, [d])
    kc = read(gpu, kcb, np.uint32, kc0.size // 2).view(np.float16).reshape(kc0.shape)
    vc = read(gpu, vcb, np.uint32, vc0.size // 2).view(np.float16).reshape(vc0.shape)
    want_k, want_v = kc0.copy(), vc0.copy()
    want_k[start : start + T] = k.reshape(T, kv_heads, head_dim)  # numpy's f32 -> f16 is round-to-nearest-even
    want_v[start : start + T] = v.reshape(T, kv_heads, v_head_dim)
    assert np.array_equal(kc.view(np.uint16), want_k.view(np.uint16))
    assert np.array_equal(vc.view(np.uint16), want_v.view(np.uint16))


# --- attention -------------------------------------------------------------------------------

ATTN_CASES = {
    # name: (n_heads, kv_heads, head_dim, v_head_dim, start, T, window, softcap)
    "decode_gqa7_d64": (7, 1, 64, 64, 600, 1, None, None),
    "decode_gqa3_d256_window_softcap": (6, 2, 256, 256, 603, 1, 128, 5.0),
    "prefill_mha_d64_softcap": (2, 2, 64, 64, 0, 5, None, 5.0),
    "prefill_gqa3_d256_window": (6, 2, 256, 256, 37, 5, 16, None),
    "prefill_gqa7_d64_window3": (7, 1, 64, 64, 0, 5, 3, None),
    "prefill_gqa2_dk96_dv64_late": (4, 2, 96, 64, 700, 5, None, None),
}


@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_attention(gpu, kernels, case):
    n_heads, kv_heads, hd, vd, start, T, window, softcap = ATTN_CASES[case]
    ctx = start + T + 3
    rng = np.random.default_rng(len(case) * 31 + start)
    # Scores spread over a few units (and beyond the softcap) so the softmax is neither flat nor one-hot.
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    kc = rng.standard_normal((ctx, kv_heads, hd)).astype(np.float16)
    vc = rng.standard_normal((ctx, kv_heads, vd)).astype(np.float16)
    scale = 1.0 / np.sqrt(hd)
    out = storage(gpu, T * n_heads * vd * 4)
    d = M.attention_dispatch(
        kernels, _buf(gpu, q), _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32)), out,
        _state(gpu, start, T), n_heads, kv_heads, hd, vd, scale, window, softcap, T,
    )
    run(gpu, [d])
    got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
    pos = np.arange(start, start + T)
    want = F.attention(q, kc, vc, pos, start + T, n_heads, scale, window, softcap)
    e = np.abs(got - want)
    # Same f16 q, K, V and f16 probabilities as the reference; only the f32 summation
    # order differs. Now and then that tips a probability sitting on an f16 rounding
    # boundary to the neighbouring f16 value, one f16 ulp <= 2^-10 * p away. Even if
    # every probability tipped, sum_j 2^-10 * p_j * |v_j| <= 2^-10 * max|v| since the
    # probabilities sum to 1. A tipped probability moves a whole output row, so the
    # typical output is checked through the median: skipping the f16 rounding of q or
    # of p puts it near 6e-5 on these shapes, doing it puts it at f32 noise.
    tol = 2.0**-10 * float(np.abs(vc.astype(np.float32)).max()) + 1e-5
    _report(f"attention {case} (median {np.median(e):.3g})", float(e.max()), tol)
    assert e.max() <= tol
    assert np.median(e) <= 2e-6


def test_attention_after_kv_store_matches_cpu_backend_flow(gpu, kernels):
    # The decode flow as the backends run it: store this token's K/V at state[0], then attend.
    n_heads, kv_heads, hd, start, T, ctx = 6, 2, 64, 9, 5, 32
    rng = np.random.default_rng(5)
    kc = np.zeros((ctx, kv_heads, hd), np.float16)
    vc = np.zeros((ctx, kv_heads, hd), np.float16)
    kc[:start] = rng.standard_normal((start, kv_heads, hd))
    vc[:start] = rng.standard_normal((start, kv_heads, hd))
    k = rng.standard_normal((T, kv_heads * hd)).astype(np.float32)
    v = rng.standard_normal((T, kv_heads * hd)).astype(np.float32)
    q = (rng.standard_normal((T, n_heads * hd)) * 2).astype(np.float32)
    kcb, vcb, state = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32)), _state(gpu, start, T)
    out = storage(gpu, T * n_heads * hd * 4)
    run(gpu, [
        M.kv_store_dispatch(kernels, _buf(gpu, k), _buf(gpu, v), kcb, vcb, state, kv_heads, hd, hd, T),
        M.attention_dispatch(
            kernels, _buf(gpu, q), kcb, vcb, out, state, n_heads, kv_heads, hd, hd, 0.125, None, None, T
        ),
    ])
    kc[start : start + T] = k.reshape(T, kv_heads, hd)
    vc[start : start + T] = v.reshape(T, kv_heads, hd)
    want = F.attention(q, kc, vc, np.arange(start, start + T), start + T, n_heads, 0.125, None, None)
    got = read(gpu, out, count=want.size).reshape(want.shape)
    e = np.abs(got - want)
    tol = 2.0**-10 * float(np.abs(vc.astype(np.float32)).max()) + 1e-5  # as in test_attention
    _report(f"kv_store + attention (median {np.median(e):.3g})", float(e.max()), tol)
    assert e.max() <= tol
    assert np.median(e) <= 2e-6


# --- elementwise -----------------------------------------------------------------------------


def _acts(rng, n):
    # Spread wide enough to hit exp overflow (silu) and tanh saturation (gelu).
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[:6] = [-120.0, -30.0, -1e-4, 0.0, 30.0, 120.0]
    return x


@pytest.mark.parametrize("act", [Activation.SILU, Activation.GELU])
@pytest.mark.parametrize("T,width", [(1, 1001), (5, 1001)])
def test_gated(gpu, kernels, act, T, width):
    rng = np.random.default_rng(T * width)
    n = T * width
    g, u = _acts(rng, n), rng.standard_normal(n).astype(np.float32)
    y = storage(gpu, n * 4)
    run(gpu, [M.gated_dispatch(kernels, _buf(gpu, g), _buf(gpu, u), y, n, act)])
    got = read(gpu, y, count=n)
    with np.errstate(over="ignore"):  # the reference's exp(120) overflows on purpose (silu -> -0)
        want = F.gated_act(g, u, act)
    # exp / tanh differ by a few ulps between numpy and the driver: absolute on |act(g)*u|.
    err = float(np.max(np.abs(got - want) / (np.abs(u) * np.maximum(np.abs(g), 1.0))))
    _report(f"gated_{act.value} n={n} (relative to |g|*|u|)", err, 1e-6)
    assert np.all(np.isfinite(got))
    assert err <= 1e-6


def test_add(gpu, kernels):
    rng = np.random.default_rng(3)
    n = 5 * 999
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    y = storage(gpu, n * 4)
    run(gpu, [M.add_dispatch(kernels, _buf(gpu, a), _buf(gpu, b), y, n)])
    assert np.array_equal(read(gpu, y, count=n), a + b)  # one correctly rounded add each


@pytest.mark.parametrize("cap", [30.0, 0.7])
def test_softcap(gpu, kernels, cap):
    rng = np.random.default_rng(int(cap * 10))
    n = 3 * 1001
    x = (rng.standard_normal(n) * 40).astype(np.float32)
    x[:3] = [1e4, -1e4, 0.0]
    xb = _buf(gpu, x)
    run(gpu, [M.softcap_dispatch(kernels, xb, n, cap)])
    got = read(gpu, xb, count=n)
    want = np.tanh(x / cap) * np.float32(cap)
    err = float(np.abs(got - want).max() / cap)
    _report(f"softcap cap={cap} (relative to cap)", err, 1e-6)
    assert err <= 1e-6


def test_elementwise_grid_folds_past_dimension_limit(gpu):
    # A device that allows only 3 groups per dimension: the helper folds the
    # 20 groups into (3, 7) and the kernel must still cover every index once.
    tiny = Kernels(dataclasses.replace(gpu, limits={**gpu.limits, "max-compute-workgroups-per-dimension": 3}))
    rng = np.random.default_rng(11)
    n = 20 * 256 - 17
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    y = storage(gpu, n * 4 + 64)
    d = M.add_dispatch(tiny, _buf(gpu, a), _buf(gpu, b), y, n)
    assert d.groups == (3, 7, 1)
    run(gpu, [d])
    assert np.array_equal(read(gpu, y, count=n), a + b)
    assert np.all(read(gpu, y)[n:] == 0)  # nothing written past n


# --- argmax ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [5, 1000, 2048, 2049, 262147])
def test_argmax(gpu, kernels, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) - 50).astype(np.float32)  # all negative
    for tie in (False, True):
        if tie:  # the max twice, the later copy in a lower-numbered invocation's slice
            i, j = sorted(rng.choice(n, 2, replace=False))
            x[i] = x[j] = x.max() + 1
        out = storage(gpu, 16)
        run(gpu, M.argmax_dispatches(kernels, _buf(gpu, x), out, n))
        assert int(read(gpu, out, np.uint32, 1)[0]) == int(np.argmax(x))
