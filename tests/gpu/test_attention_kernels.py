"""Split-K decode attention, tiled prefill attention and the fused RoPE + KV
store (infr/gpu/kernels_attention.py) against the CPU reference.

The split-K dispatches are built once for a context of n_ctx and then run at
several KV lengths by rewriting only the rows and state buffers, as the backend's
graphs are: lengths 1, chunk - 1, chunk, chunk + 1 and several chunks. Cache
rows past the current length hold NaN, so a kernel that reads a key it must
not see fails loudly. `pytest -s` prints each measured error.
"""

from __future__ import annotations

import numpy as np
import pytest

from infr.cpu import ops as F
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_attn_mma as KAM
from infr.gpu import kernels_misc as M
from infr.gpu.runtime import read, run, storage
from infr.models.spec import RopeSpec, RopeStyle


def _buf(gpu, arr: np.ndarray):
    return storage(gpu, np.ascontiguousarray(arr))


def _caches(rng, n_ctx, kv_heads, hd, vd):
    kc = rng.standard_normal((n_ctx, kv_heads, hd)).astype(np.float16)
    vc = rng.standard_normal((n_ctx, kv_heads, vd)).astype(np.float16)
    return kc, vc


def _poison_past(gpu, kcb, vcb, kc, vc, n_kv):
    """Cache rows >= n_kv become NaN on the GPU (the reference only reads [:n_kv])."""
    k2, v2 = kc.copy(), vc.copy()
    k2[n_kv:] = np.nan
    v2[n_kv:] = np.nan
    gpu.device.queue.write_buffer(kcb, 0, k2.view(np.uint32))
    gpu.device.queue.write_buffer(vcb, 0, v2.view(np.uint32))


def _tiled_name(kernels) -> str:
    """The tiled prefill kernel this adapter gets for 8 / 2 heads of 64 (attn_mma where Dawn has the tensor
    cores' subgroup matrices, else attn_tiled2 on Dawn, attn_tiled on wgpu-native)."""
    dawn = kernels is not None and kernels.dev.dawn
    if dawn and KAM.takes(kernels.dev, 64, 64, KAM.shape(8, 2)):
        return "attn_mma"
    return "attn_tiled2" if dawn else "attn_tiled"


def _check(name, got, want, vc, n_kv):
    # As tests/gpu/test_kernels.py test_attention: the same f16 q, K, V and f16
    # normalised probabilities as the reference, only the f32 summation order
    # differs; a probability on an f16 rounding boundary may tip by one f16 ulp
    # (<= 2^-10 p), which bounds the max error by 2^-10 max|v|; the typical
    # output stays at f32 noise (skipping either f16 rounding puts the median near 6e-5).
    e = np.abs(got - want)
    tol = 2.0**-10 * float(np.abs(vc[:n_kv].astype(np.float32)).max()) + 1e-5
    print(f"\n[max error] {name}: {e.max():.3g} (tolerance {tol:.3g}), median {np.median(e):.3g}")
    assert np.isfinite(got).all(), name
    assert e.max() <= tol, name
    assert np.median(e) <= 2e-6, name


# --- split-K decode -----------------------------------------------------------------------------

SPLIT_CASES = {
    # name: (n_heads, kv_heads, head_dim, v_head_dim, window, softcap, chunk, T)
    "mha_d64": (2, 2, 64, 64, None, None, 128, 1),
    "gqa4_d128": (8, 2, 128, 128, None, None, 128, 1),
    "gqa8_d64_softcap": (8, 1, 64, 64, None, 30.0, 128, 1),
    "gqa12_two_groups_d64": (12, 1, 64, 64, None, None, 128, 1),  # 6 heads per workgroup, 2 workgroups per kv head
    "gqa4_d256_window": (4, 1, 256, 256, 100, None, 128, 1),
    "gqa2_dk96_dv64_chunk256": (4, 2, 96, 64, None, 5.0, 256, 1),
    "gqa4_d64_T3_window": (8, 2, 64, 64, 150, None, 128, 3),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_split_k_decode(gpu, kernels, case):
    n_heads, kv_heads, hd, vd, window, softcap, chunk, T = SPLIT_CASES[case]
    n_ctx = 5 * chunk + 7
    rng = np.random.default_rng(len(case))
    kc, vc = _caches(rng, n_ctx, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    qb, out, pg = _buf(gpu, q), storage(gpu, T * n_heads * vd * 4), M.single_sequence(gpu, 0, T, n_ctx)
    scratch = KA.split_scratch(kernels, T, n_ctx, n_heads, vd, chunk=chunk)
    scale = 1.0 / np.sqrt(hd)
    # One workgroup per chunk (the default here: 6 chunks), and 2 per head group taking every other chunk.
    builds = {P: KA.split_dispatches(kernels, qb, kcb, vcb, out, pg, scratch, n_heads, kv_heads, hd, vd, scale,
                                     window, softcap, T, parallel=P) for P in (None, 2)}
    assert builds[None][0].groups[0] == scratch.max_chunks == 6 and builds[2][0].groups[0] == 2
    # KV lengths (of the last query): 1 .. several chunks; the dispatches are built once, only the rows change.
    for n_kv in sorted({T, chunk - 1, chunk, chunk + 1, 3 * chunk + 5, n_ctx}):
        start = n_kv - T
        _poison_past(gpu, kcb, vcb, kc, vc, n_kv)
        M.write_rows(gpu, pg, np.arange(start, n_kv), 0)
        want = F.attention(q, kc, vc, np.arange(start, n_kv), n_kv, n_heads, scale, window, softcap)
        for P, ds in builds.items():
            gpu.device.queue.write_buffer(out, 0, np.full(T * n_heads * vd, np.nan, np.float32))
            run(gpu, ds)
            got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
            _check(f"split-K {case} n_kv={n_kv} P={P}", got, want, vc, n_kv)


def test_one_pass_and_split_k_take_turns(gpu, kernels, tune):
    """Decode in a long context holds both kernels: the row's KV length in `rows`
    picks one each step (the other returns at once), and either answers right."""
    tune(INFR_ATTN_SPLIT_FROM="40", INFR_ATTN_ONE_PASS_CTX="0")
    n_heads, kv_heads, hd, vd, T, n_ctx = 8, 2, 64, 64, 1, 300
    rng = np.random.default_rng(5)
    kc, vc = _caches(rng, n_ctx, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    qb, out, pg = _buf(gpu, q), storage(gpu, T * n_heads * vd * 4), M.single_sequence(gpu, 0, T, n_ctx)
    scale = 1.0 / np.sqrt(hd)
    ds = KA.attention_dispatches(kernels, qb, kcb, vcb, out, pg, lambda: KA.split_scratch(kernels, T, n_ctx, n_heads, vd),
                                 n_heads, kv_heads, hd, vd, scale, None, None, T, n_ctx=n_ctx)
    assert [d.label.split()[0] for d in ds] == ["attention", "attn_scores", "attn_values", "attn_combine"]
    for n_kv in (1, 39, 40, 41, 250):  # one-pass up to 40 keys, split-K past them
        start = n_kv - T
        _poison_past(gpu, kcb, vcb, kc, vc, n_kv)
        M.write_rows(gpu, pg, np.arange(start, n_kv), 0)
        gpu.device.queue.write_buffer(out, 0, np.full(T * n_heads * vd, np.nan, np.float32))
        run(gpu, ds)
        got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
        want = F.attention(q, kc, vc, np.arange(start, n_kv), n_kv, n_heads, scale, None, None)
        _check(f"switch n_kv={n_kv}", got, want, vc, n_kv)


@pytest.mark.parametrize("path", ["one_pass", "split_k", "tiled"])
def test_rounded_output(gpu, kernels, tune, path):
    """With `xq`, the attention output also comes rounded to 8 bits for the o
    projection's Q4_K GEMV, word for word what a quantize dispatch of the
    output writes: from the one-pass kernel and split-K's combine themselves, and
    from a quantize dispatch after the tiled prefill kernel."""
    from infr.gpu import kernels_q8 as KQ

    tune(INFR_ATTN_SPLIT_FROM="40", INFR_ATTN_ONE_PASS_CTX="0")
    n_heads, kv_heads, hd, vd, n_ctx = 8, 2, 64, 64, 300
    T = 6 if path == "tiled" else 2
    K = n_heads * vd
    rng = np.random.default_rng(11)
    kc, vc = _caches(rng, n_ctx, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    qb, out, pg = _buf(gpu, q), storage(gpu, T * K * 4), M.single_sequence(gpu, 0, T, n_ctx)
    xq, ref = storage(gpu, 4 * T * KQ.words(K)), storage(gpu, 4 * T * KQ.words(K))
    ds = KA.attention_dispatches(kernels, qb, kcb, vcb, out, pg, lambda: KA.split_scratch(kernels, T, n_ctx, n_heads, vd),
                                 n_heads, kv_heads, hd, vd, 1.0 / np.sqrt(hd), None, None, T, n_ctx=n_ctx, xq=xq)
    labels = [d.label.split()[0] for d in ds]
    assert "quantize_q8" not in labels if path != "tiled" else labels == [_tiled_name(kernels), "quantize_q8"]
    n_kv = {"one_pass": 30, "split_k": 250, "tiled": 200}[path]  # one-pass up to 40 keys, split-K past them
    _poison_past(gpu, kcb, vcb, kc, vc, n_kv)
    M.write_rows(gpu, pg, np.arange(n_kv - T, n_kv), 0)
    run(gpu, ds)
    run(gpu, [KQ.quantize_dispatch(kernels, out, K, T, into=ref)[0]])
    got, want = (read(gpu, b, np.uint32, count=T * KQ.words(K)) for b in (xq, ref))
    assert np.isfinite(read(gpu, out, count=T * K)).all()
    assert np.count_nonzero(want[: K // 4]) > K // 8  # real rounded bytes, not an untouched buffer
    np.testing.assert_array_equal(got, want)


def test_split_k_chunk_choice():
    assert KA.chunk_size(4096) == 128
    assert KA.chunk_size(131072) == 128       # 1024 chunks
    assert KA.chunk_size(131073) == 256
    assert KA.chunk_size(10**6) == 512
    assert KA.split_parallel(1024, 8, 1) == 64  # the 8B shape at 131072: 512 workgroups
    assert KA.split_parallel(6, 8, 1) == 6
    assert KA.split_parallel(1024, 1, 4) == 128
    assert KA.heads_per_group(32, 8) == 4
    assert KA.heads_per_group(14, 2) == 7
    assert KA.heads_per_group(12, 1) == 6
    assert KA.heads_per_group(64, 2) == 8


# --- tiled prefill ------------------------------------------------------------------------------

TILED_CASES = {
    # name: (n_heads, kv_heads, head_dim, v_head_dim, start, T, window, softcap)
    "mha_d64_T37_late": (2, 2, 64, 64, 100, 37, None, None),
    "gqa4_d64_T37_from0_softcap": (8, 2, 64, 64, 0, 37, None, 20.0),
    "gqa8_d256_T37_window": (8, 1, 256, 256, 45, 37, 20, None),
    "gqa2_dk96_dv64_T17_window_softcap": (4, 2, 96, 64, 9, 17, 5, 5.0),
    "gqa4_d128_T16": (4, 1, 128, 128, 3, 16, None, None),
    # attn_tiled2's tilings: HG heads x 64 / HG rows (16 slots past dim 128), partial blocks
    "mha_d128_T70_from0": (2, 2, 128, 128, 0, 70, None, None),
    "gqa8_d128_T45_late": (16, 2, 128, 128, 61, 45, None, None),
    "gqa16_d64_T21_window": (16, 1, 64, 64, 30, 21, 33, None),  # two workgroups of 8 heads per kv head
    "gqa6_d128_T40": (12, 2, 128, 128, 5, 40, None, None),  # HG 2: three workgroups per kv head
    "gqa4_d256_T45_late_softcap": (8, 2, 256, 256, 77, 45, None, 30.0),
    "gqa1_d256_T19_window": (2, 2, 256, 256, 40, 19, 16, None),
    "gqa2_dk256_dv128_T33": (4, 2, 256, 128, 2, 33, None, None),
    # Gemma 4's full-attention layers: head dim 512 (attn_tiled's 8-row blocks; attn_tiled2's 8 or 16 slots
    # where the device has 42 / 50 KiB of workgroup memory)
    "gqa8_d512_T37_late": (8, 1, 512, 512, 40, 37, None, None),
    "gqa2_d512_T19_window_softcap": (4, 2, 512, 512, 20, 19, 16, 30.0),
}


def _skip_unless_mma(gpu, n_heads, kv_heads, hd, vd, tiling=None):
    if not KAM.takes(gpu, hd, vd, KAM.shape(n_heads, kv_heads, tiling)):
        pytest.skip(f"attn_mma does not run here for head dims {hd}/{vd} (it needs Dawn's f16 subgroup matrices, "
                    f"dims of whole 16-value matrices up to {KAM.MAX_DIM}, and its tiles in workgroup memory): "
                    "INFR_TEST_FLAVOR=dawn on NVIDIA runs it")


@pytest.mark.parametrize("kernel", [1, 2, 3])
@pytest.mark.parametrize("case", list(TILED_CASES))
def test_tiled_prefill(gpu, kernels, case, kernel):
    n_heads, kv_heads, hd, vd, start, T, window, softcap = TILED_CASES[case]
    if kernel == 3:
        _skip_unless_mma(gpu, n_heads, kv_heads, hd, vd)
    if kernel == 2:
        t = KA.tiled2_shape(n_heads, kv_heads, hd, vd, KA.default_tiling(kernels, hd, vd), T)
        if t.workgroup_bytes(hd, vd) > gpu.limits["max-compute-workgroup-storage-size"]:
            # head dim 512: attn_tiled2's smallest tiling needs 42 KiB; tiled_kernel takes attn_tiled here
            assert KA.tiled_kernel(kernels, n_heads, kv_heads, hd, vd, T=T) == 1
            pytest.skip(f"attn_tiled2 {t} needs {t.workgroup_bytes(hd, vd)} bytes of workgroup memory and this "
                        f"adapter has {gpu.limits['max-compute-workgroup-storage-size']}, so the engine never runs "
                        f"it here (attn_tiled instead, asserted above; this case's kernel-1 run checks that one); "
                        f"it runs where the device has 48 KiB (INFR_TEST_FLAVOR=dawn on NVIDIA)")
    n_kv = start + T
    n_ctx = n_kv + 20
    rng = np.random.default_rng(len(case) + start)
    kc, vc = _caches(rng, n_ctx, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    _poison_past(gpu, kcb, vcb, kc, vc, n_kv)
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    out = storage(gpu, T * n_heads * vd * 4)
    scale = 1.0 / np.sqrt(hd)
    d = KA.tiled_dispatch(kernels, _buf(gpu, q), kcb, vcb, out, M.single_sequence(gpu, start, T, n_ctx), n_heads,
                          kv_heads, hd, vd, scale, window, softcap, T, kernel=kernel)
    assert d.label.split()[0] == {1: "attn_tiled", 2: "attn_tiled2", 3: "attn_mma"}[kernel]
    run(gpu, [d])
    got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
    want = F.attention(q, kc, vc, np.arange(start, n_kv), n_kv, n_heads, scale, window, softcap)
    _check(f"tiled {case}", got, want, vc, n_kv)


# attn_tiled2's (M, QPI, KPI): the default at head dims <= 128 for long batches (the cases' short ones take
# (16, 2, 2)), and others INFR_ATTN_TILED2 may pick
TILINGS = [(64, 4, 2), (32, 4, 4), (64, 8, 2), (32, 2, 2), (16, 4, 2), (16, 2, 4)]


@pytest.mark.parametrize("tiling", TILINGS, ids=lambda t: "M{}q{}k{}".format(*t))
@pytest.mark.parametrize("case", ["mha_d128_T70_from0", "gqa8_d128_T45_late", "gqa16_d64_T21_window",
                                  "gqa2_dk96_dv64_T17_window_softcap", "gqa1_d256_T19_window"])
def test_tiled2_tilings(gpu, kernels, case, tiling):
    """attn_tiled2's other tilings (INFR_ATTN_TILED2, perf/attn_prefill_time.py --sweep) give the same results."""
    n_heads, kv_heads, hd, vd, start, T, window, softcap = TILED_CASES[case]
    t = KA.tiled2_shape(n_heads, kv_heads, hd, vd, tiling)
    if t.workgroup_bytes(hd, vd) > gpu.limits["max-compute-workgroup-storage-size"]:
        # tiled_kernel never picks a tiling past the device's workgroup memory (it falls back to
        # attn_tiled there), so on this adapter there is no kernel of this tiling to test
        pytest.skip(f"{t} needs {t.workgroup_bytes(hd, vd)} bytes of workgroup memory, more than this adapter's "
                    f"{gpu.limits['max-compute-workgroup-storage-size']}; never selected here, run where the device has that much")
    _run_tiling(gpu, kernels, case, 2, tiling)


def _run_tiling(gpu, kernels, case, kernel, tiling):
    """Tiled kernel `kernel` at `tiling` on TILED_CASES[case] against the reference."""
    n_heads, kv_heads, hd, vd, start, T, window, softcap = TILED_CASES[case]
    n_kv = start + T
    rng = np.random.default_rng(len(case) + start)
    kc, vc = _caches(rng, n_kv + 20, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    _poison_past(gpu, kcb, vcb, kc, vc, n_kv)
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    out = storage(gpu, T * n_heads * vd * 4)
    scale = 1.0 / np.sqrt(hd)
    d = KA.tiled_dispatch(kernels, _buf(gpu, q), kcb, vcb, out, M.single_sequence(gpu, start, T, n_kv + 20), n_heads,
                          kv_heads, hd, vd, scale, window, softcap, T, kernel=kernel, tiling=tiling)
    run(gpu, [d])
    got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
    want = F.attention(q, kc, vc, np.arange(start, n_kv), n_kv, n_heads, scale, window, softcap)
    _check(f"kernel {kernel} {tiling} {case}", got, want, vc, n_kv)


@pytest.mark.parametrize("tiling", [(32, 32), (128, 32), (64, 64)], ids=lambda t: "M{}k{}".format(*t))
@pytest.mark.parametrize("case", ["mha_d128_T70_from0", "gqa8_d128_T45_late", "gqa16_d64_T21_window",
                                  "gqa2_dk96_dv64_T17_window_softcap", "gqa4_d256_T45_late_softcap"])
def test_mma_tilings(gpu, kernels, case, tiling):
    """attn_mma's other tilings (INFR_ATTN_MMA) give the same results."""
    n_heads, kv_heads, hd, vd, start, T, window, softcap = TILED_CASES[case]
    _skip_unless_mma(gpu, n_heads, kv_heads, hd, vd, tiling)
    _run_tiling(gpu, kernels, case, 3, tiling)


def test_tiled_kernel_choice(gpu, kernels, tune):
    """attn_tiled2 on Dawn (faster there), attn_tiled on wgpu-native (attn_tiled2 is slower through
    naga on the H100); attn_mma only where asked (INFR_ATTN_TILED=3) and Dawn has the tensor cores;
    INFR_ATTN_TILED forces any; attn_tiled where attn_tiled2 does not fit."""
    mma = KAM.takes(gpu, 128, 128, KAM.shape(32, 8))
    assert KA.tiled_kernel(kernels, 32, 8, 128, 128) == (2 if gpu.dawn else 1)
    assert KA.tiled_kernel(kernels, 8, 1, 512, 512, T=512) != 3  # past its MAX_DIM
    tune(INFR_ATTN_TILED="2")
    assert KA.tiled_kernel(kernels, 32, 8, 128, 128) == 2
    assert KA.tiled_kernel(kernels, 32, 8, 128, 128, tiling=(128, 8, 2)) == 1  # 66 KiB of workgroup memory
    q, kc, vc, out = (storage(gpu, 4 * 2**16) for _ in range(4))
    ds = KA.attention_dispatches(kernels, q, kc, vc, out, M.single_sequence(gpu, 0, 37, 256), None, 4, 2, 64, 64,
                                 0.1, None, None, 37)
    assert [d.label.split()[0] for d in ds] == ["attn_tiled2"]
    tune(INFR_ATTN_TILED="3")
    assert KA.tiled_kernel(kernels, 32, 8, 128, 128) == (3 if mma else 1)
    tune(INFR_ATTN_TILED="1")
    assert KA.tiled_kernel(kernels, 32, 8, 128, 128) == 1
    tune(INFR_ATTN_TILED="2")  # head dim 512: attn_tiled2's 8 slots need 41664 bytes
    big = gpu.limits["max-compute-workgroup-storage-size"] >= KA.Tiled2(8, 1, 2, 2).workgroup_bytes(512, 512)
    assert KA.default_tiling(kernels, 512, 512) == ((8, 2, 2) if big else None) or gpu.limits[
        "max-compute-workgroup-storage-size"] >= KA.Tiled2(16, 1, 2, 2).workgroup_bytes(512, 512)
    assert KA.tiled_kernel(kernels, 8, 1, 512, 512, T=512) == (2 if big else 1)


def test_lowering_picks_the_kernel(gpu, kernels, monkeypatch, tune):
    q, kc, vc, out = (storage(gpu, 4 * 2**16) for _ in range(4))
    state = M.single_sequence(gpu, 0, 1, 256)
    scratch = lambda: KA.split_scratch(kernels, 1, 256, 4, 64)
    pick = lambda T, hd: [d.label.split()[0] for d in KA.attention_dispatches(
        kernels, q, kc, vc, out, state, scratch, 4, 2, hd, hd, 0.1, None, None, T)]
    both = ["attention", "attn_scores", "attn_values", "attn_combine"]  # no n_ctx: long; the length picks one
    assert pick(1, 64) == both
    assert pick(KA.SPLIT_MAX_T, 64) == both
    assert pick(KA.SPLIT_MAX_T + 1, 64) == [_tiled_name(kernels)]
    assert pick(37, 512) == ["attention"]  # head dim 512: the one-pass kernel unless INFR_ATTN_WIDE=1
    tune(INFR_ATTN_WIDE="1")
    tiled = KA.tiled_kernel(kernels, 4, 2, 512, 512, T=37)  # attn_tiled's 8-row blocks (26 KiB), attn_tiled2's 41 KiB
    assert tiled and pick(37, 512) == [{1: "attn_tiled", 2: "attn_tiled2"}[tiled]]
    small = dict(gpu.limits, **{"max-compute-workgroup-storage-size": KA.tiled_bytes(512, 512) - 1})
    monkeypatch.setattr(gpu, "limits", small)
    assert pick(37, 512) == ["attention"]  # past the device's workgroup memory: the one-pass kernel
    assert KA.tiled_kernel(kernels, 4, 2, 512, 512, T=37) == 0  # neither tiled kernel fits
    def labels(n_ctx):
        return [d.label.split()[0] for d in KA.attention_dispatches(
            kernels, q, kc, vc, out, state, scratch, 4, 2, 64, 64, 0.1, None, None, 1, n_ctx=n_ctx)]

    assert labels(KA.ONE_PASS_CTX) == ["attention"]  # a short context decodes in one pass
    assert labels(KA.ONE_PASS_CTX + 1) == ["attention", "attn_scores", "attn_values", "attn_combine"]


# --- RoPE + KV store ----------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize(
    "n_heads,kv_heads,hd,vd,n_rot,start,T,with_factors",
    [(6, 2, 64, 64, 64, 9, 5, False), (4, 1, 96, 48, 32, 1200, 3, True), (8, 8, 256, 256, 256, 4090, 1, False)],
)
def test_rope_kv_store(gpu, kernels, style, n_heads, kv_heads, hd, vd, n_rot, start, T, with_factors):
    rng = np.random.default_rng(hd + start)
    q = rng.standard_normal((T, n_heads * hd)).astype(np.float32)
    k = rng.standard_normal((T, kv_heads * hd)).astype(np.float32)
    v = (rng.standard_normal((T, kv_heads * vd)) * 3).astype(np.float32)
    factors = rng.uniform(1.0, 40.0, n_rot // 2).astype(np.float32) if with_factors else None
    ctx = start + T + 2
    kc0, vc0 = _caches(rng, ctx, kv_heads, hd, vd)
    qb, kb = _buf(gpu, q), _buf(gpu, k)
    kcb, vcb = _buf(gpu, kc0.view(np.uint32)), _buf(gpu, vc0.view(np.uint32))
    d = KA.rope_kv_dispatch(kernels, qb, kb, _buf(gpu, v), kcb, vcb, M.single_sequence(gpu, start, T, ctx), n_heads,
                            kv_heads, hd, vd, n_rot, 1e4, 1.0, style, T,
                            factors=_buf(gpu, factors) if with_factors else None)
    run(gpu, [d])
    got_q = read(gpu, qb, count=q.size).reshape(q.shape)
    got_k = read(gpu, kb, count=k.size).reshape(k.shape)
    kc = read(gpu, kcb, np.uint32, kc0.size // 2).view(np.float16).reshape(kc0.shape)
    vc = read(gpu, vcb, np.uint32, vc0.size // 2).view(np.float16).reshape(vc0.shape)

    spec = RopeSpec(RopeStyle(style), 1e4, n_rot, 1.0)
    angles = F.rope_angles(np.arange(start, start + T), spec, factors)
    for name, x, got, heads in (("q", q, got_q, n_heads), ("k", k, got_k, kv_heads)):
        want = F.rope(x, heads, hd, angles, spec.style)
        # The f32 angle's error grows like pos * a few 2^-24 (tests/gpu/test_kernels.py,
        # ANGLE_ERR_PER_POS): each value moves by at most |x| * that error.
        tol = float(np.abs(x).max()) * 2 * (1.5e-7 * (start + T) + 1e-6) + 1e-6
        err = float(np.abs(got - want).max())
        print(f"\n[max error] rope_kv {style} {name} hd={hd} pos={start}+{T}: {err:.3g} (tolerance {tol:.3g})")
        assert err <= tol
        xs, gs = x.reshape(T, heads, hd), got.reshape(T, heads, hd)
        assert np.array_equal(gs[..., n_rot:], xs[..., n_rot:])  # unrotated dims untouched
    # The cache holds exactly the f16 of the rotated k the kernel left in its buffer, and of v;
    # rows outside the batch keep their old contents.
    want_k, want_v = kc0.copy(), vc0.copy()
    want_k[start : start + T] = got_k.reshape(T, kv_heads, hd)
    want_v[start : start + T] = v.reshape(T, kv_heads, vd)
    assert np.array_equal(kc.view(np.uint16), want_k.view(np.uint16))
    assert np.array_equal(vc.view(np.uint16), want_v.view(np.uint16))


# --- end to end through the backend -------------------------------------------------------------


def test_backend_lowering_matches_cpu(tmp_path, gpu, tune):
    """tiny-gemma3 (sliding window 8, a global layer) on the GPU backend: the graphs use
    rope_kv, tiled prefill (T = 128, then 37 at position 128) and split-K decode past the
    first chunk (where the window leaves chunk 0 out), the one-pass kernel below 160 keys,
    and the logits follow the CPU reference."""
    tune(INFR_ATTN_SPLIT_FROM="160", INFR_ATTN_ONE_PASS_CTX="0")
    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    path = synth.write_gguf(synth.preset("tiny-gemma3"), tmp_path / "g.gguf")
    gf = open_gguf(path)
    plan = build_plan(build_spec(gf))
    n_ctx = 300
    gpu_be, cpu_be = GPUBackend(gf, plan, n_ctx, dev=gpu), CPUBackend(gf, plan, n_ctx)
    n = plan.spec.n_layers
    # One decode graph per span: one-pass attention for steps that see at most 160 keys, split-K past them.
    near, far = ([d.label.split()[0] for d in gpu_be._multi_step(1, f).dispatches] for f in (False, True))
    assert near.count("rope_kv_neox") == n and "rope_neox" not in near and "kv_store" not in near
    assert near.count("attention") == n and "attn_scores" not in near
    assert far.count("attn_scores") == far.count("attn_values") == far.count("attn_combine") == n
    assert "attention" not in far
    assert gpu_be.spans(150, 20) == [(False, 10), (True, 10)] and gpu_be.spans(170, 3) == [(True, 3)]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, plan.spec.n_vocab, 165).tolist()
    got = gpu_be.forward(ids, 0, n_logits=4)
    want = cpu_be.forward(ids, 0, n_logits=4)
    np.testing.assert_allclose(got, want, atol=5e-2 * np.abs(want).max(), rtol=0)
    tiled = [d.label.split()[0] for d in gpu_be._graph(37, 4)[0].dispatches]
    assert tiled.count(_tiled_name(gpu_be.kern)) == n
    for pos in (150, 165, 166):  # decode: one-pass, then split-K with keys in chunk 1 (and 0 for the global layer)
        assert gpu_be._far(pos, 1) == (pos >= 160)
        tok = int(np.argmax(want[-1]))
        want = cpu_be.forward([tok], pos)
        got = gpu_be.forward([tok], pos)
        np.testing.assert_allclose(got, want, atol=5e-2 * np.abs(want).max(), rtol=0)
        assert int(np.argmax(got[-1])) == int(np.argmax(want[-1]))
