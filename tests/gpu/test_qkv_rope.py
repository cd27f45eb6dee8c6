"""The q|k|v GEMV that rotates q and k and stores k and v in the KV cache itself (wgsl/gemv_rope_on.wgsl,
kernels_qkv_rope; GemvTuning.ROPE): word for word what the stacked GEMV then rope_kv write (q, k, v and
both caches; on Dawn, where NVIDIA contracts the rotation into fma otherwise, within rounding), over a
paged cache with rows of two sequences and a padding row, partial rotary, rope factors, a mixed Q4_K /
Q6_K stack and batches of 1..9 rows; the lowering drops the rope_kv dispatch of a llama layer, keeps it
where the epilogue does not apply (NEOX, QK-norms), and decode logits are bit for bit those of the
unfused graph."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from infr import fusion
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_qkv_rope as KQR
from infr.gpu import tuning
from infr.gpu.runtime import read, run, storage

from test_gate_up_q8 import tiny_256
from test_quant_kernels import make_weight  # tests/gpu is on sys.path (pytest's prepend import mode)
from test_tint import _Recorder, _tint_errors, tint  # noqa: F401  tint: Dawn's Null device (skips without wgpudawn)


@pytest.fixture(autouse=True)
def rope_on():
    """GemvTuning.ROPE on (the default; INFR_GEMV_ROPE=0 turns it off); tests of the old path set 0."""
    with tuning.override(gemv=replace(tuning.current().gemv, ROPE=1)):
        yield


BS = 16  # cache block size: the rows' positions cross blocks


def _paging(gpu, positions, slots, n_live: int, blocks_per_seq: int, n_blocks: int, rng):
    """Rows at `positions` of sequence `slots` (the first n_live live), each slot's blocks a shuffled
    set of the pool's: cache rows out of order."""
    table = rng.permutation(n_blocks).astype(np.uint32)[: 2 * blocks_per_seq]
    return KS.Paging(storage(gpu, KS.pack_state(int(positions[0]), n_live)),
                     storage(gpu, KS.pack_rows(positions, slots)), storage(gpu, table), BS, blocks_per_seq)


def _both(gpu, kernels, types, n_heads, kv_heads, hd, vd, n_rot, T, factors: bool, seed: int):
    """[q, k, v, k cache, v cache] (u32 words) from the stacked GEMV then rope_kv, and from the fused GEMV."""
    rng = np.random.default_rng(seed)
    K = 256
    sizes = [n_heads * hd, kv_heads * hd, kv_heads * vd]
    ts = [make_weight(q, n, K, rng) for q, n in zip(types, sizes)]
    chunks = KM.upload_stacked(gpu, ts, label="qkv")
    x = storage(gpu, rng.standard_normal((T, K)).astype(np.float32))
    n_live = max(T - 1, 1)  # the last row of a batch of several is padding
    positions = (np.arange(T) * 7 + 3) % 40 + 1
    slots = np.arange(T) % 2
    blocks_per_seq, n_blocks = 4, 9
    pg = _paging(gpu, positions, slots, n_live, blocks_per_seq, n_blocks, rng)
    ff = storage(gpu, rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)) if factors else None
    kc0 = rng.standard_normal((n_blocks * BS, kv_heads, hd)).astype(np.float16).view(np.uint32)
    vc0 = rng.standard_normal((n_blocks * BS, kv_heads, vd)).astype(np.float16).view(np.uint32)
    out = []
    for fused in (False, True):
        ys = [storage(gpu, np.full((T, n), np.nan, np.float32)) for n in sizes]
        kc, vc = storage(gpu, kc0), storage(gpu, vc0)
        if fused:
            rope = KQR.StackRope(kc, vc, pg, n_heads, kv_heads, hd, vd, n_rot, 5e5, 0.5, ff)
            ds = KM.stacked_dispatches(kernels, ts, chunks, x, ys, None, T, rope=rope)
            assert len(ds) == 2 and "_stacked_rope_kv " in ds[1].label
        else:
            ds = KM.stacked_dispatches(kernels, ts, chunks, x, ys, None, T)
            ds.append(KA.rope_kv_dispatch(kernels, *ys, kc, vc, pg, n_heads, kv_heads, hd, vd, n_rot, 5e5, 0.5,
                                          "norm", T, factors=ff))
        run(gpu, ds)
        # live rows only: rope_kv leaves a padding row's q and k as the GEMV wrote them, the fused kernel turns them
        words = [read(gpu, y, np.uint32, count=T * n).reshape(T, n)[:n_live] for y, n in zip(ys, sizes)]
        out.append(words + [read(gpu, kc, np.uint32), read(gpu, vc, np.uint32)])
    return out, kc0, vc0


def _assert_same(gpu, out, kc0, vc0) -> None:
    """The same bits as the stacked GEMV then rope_kv, but on Dawn: there q, k and the k cache are the
    same products in another kernel, which NVIDIA's compiler contracts into fma otherwise (q words 1 to 55
    f32 steps apart where x cos - y sin cancels): within 2^-20 of each row's largest value, and the k
    cache within one f16 step of the same. v and its cache pass through unrotated: the same bits."""
    want, got = out
    assert not np.isnan(want[0].view(np.float32)).any()
    assert (want[3] != kc0.reshape(-1)).any() and (want[4] != vc0.reshape(-1)).any()  # the live rows were stored
    rotated = (("q", 0), ("k", 1), ("k cache", 3))
    for name, i in (("v", 2), ("v cache", 4)) + (() if gpu.dawn else rotated):
        np.testing.assert_array_equal(got[i], want[i], err_msg=name)
    if gpu.dawn:
        for name, i in rotated[:2]:
            g, w = got[i].view(np.float32), want[i].view(np.float32)
            assert (np.abs(g - w) <= 2.0**-20 * np.abs(w).max(axis=-1, keepdims=True)).all(), name
        g, w = (x.view(np.float16).astype(np.float32) for x in (got[3], want[3]))
        np.testing.assert_allclose(g, w, rtol=2.0**-10, atol=2.0**-20 * float(np.abs(w).max()) + 2.0**-24,
                                   err_msg="k cache")


@pytest.mark.parametrize("T", [1, 2, 5, 9])  # one token a workgroup, several, and a ragged last group
def test_fused_rope_store_equals_rope_kv(gpu, kernels, T):
    _assert_same(gpu, *_both(gpu, kernels, (Q.Q4_K, Q.Q4_K, Q.Q6_K), 4, 2, 64, 64, 64, T, False, T))


@pytest.mark.parametrize("case", [
    dict(n_heads=6, kv_heads=3, hd=64, vd=48, n_rot=32),  # partial rotary, v narrower than k
    dict(n_heads=4, kv_heads=1, hd=128, vd=128, n_rot=128, factors=True),  # llama 3's rope factors
])
def test_fused_rope_store_shapes(gpu, kernels, case):
    c = {"factors": False, **case}
    _assert_same(gpu, *_both(gpu, kernels, (Q.Q8_0, Q.Q8_0, Q.Q8_0), c["n_heads"], c["kv_heads"], c["hd"], c["vd"],
                        c["n_rot"], 3, c["factors"], c["hd"]))


def test_takes_norm_rope_only(gpu):
    assert KQR.takes(gpu, "norm", 32, 8, 128, 128, 128)
    assert not KQR.takes(gpu, "neox", 32, 8, 128, 128, 128)  # a pair's rows half a head apart
    assert not KQR.takes(gpu, "norm", 32, 8, 128, 128, 127)
    assert not KQR.takes(gpu, "norm", 2, 1, 640, 640, 640)  # past rope_kv's 512 dims
    with tuning.override(gemv=replace(tuning.current().gemv, ROPE=0)):
        assert not KQR.takes(gpu, "norm", 32, 8, 128, 128, 128)


def test_takes_only_where_the_kept_rows_fit():
    """A tuning whose reduction fills a 16 KiB workgroup (R 2, 8 tokens, no subgroups) leaves no room
    for the kept rows there: rope_kv stays; with 32 KiB it fits."""
    from types import SimpleNamespace

    with tuning.override(gemv=replace(tuning.current().gemv, ROPE=1, R=2, NT=8, SG=0)):
        for size, fits in ((16384, False), (32768, True)):
            dev = SimpleNamespace(limits={"max-storage-buffers-per-shader-stage": 16,
                                          "max-compute-workgroup-storage-size": size})
            assert KQR.takes(dev, "norm", 32, 8, 128, 128, 128) == fits


MODELS = {  # preset, weight type: 256 wide (tiny_256), so every matrix takes the int8 GEMV
    "llama-q4_k_m": ("tiny-llama", "Q4_K_M"),  # a mixed stack (Q6_K v) in some layers
    "llama-q8_0": ("tiny-llama", "Q8_0"),
    "qwen2": ("tiny-qwen2", "Q8_0"),  # NEOX and biases: the group, but rope_kv stays
    "qwen3": ("tiny-qwen3", "Q8_0"),  # QK-norms: no such group
}


@pytest.mark.parametrize("name", list(MODELS))
def test_decode_drops_rope_kv_with_the_same_logits(tmp_path, gpu, name):
    """A llama layer's step loses its rope_kv dispatch (the stacked GEMV rotates and stores), other
    families keep theirs; logits of a 4-row prompt and of a decode step are bit for bit those of the
    unfused graph."""
    from infr.gpu.backend import GPUBackend

    gf, plan = tiny_256(tmp_path, name, *MODELS[name])
    n = plan.spec.n_layers
    kinds = [g.kind for g in plan.groups]
    fusing = name.startswith("llama")
    assert kinds.count("qkv_rope_store") == (0 if name == "qwen3" else n), kinds
    got = {}
    for on in (0, 1):
        with tuning.override(gemv=replace(tuning.current().gemv, ROPE=on)):
            be = GPUBackend(gf, plan, 64, dev=gpu)
            labels = [d.label for d in be._multi_step(1, False).dispatches]
            fused = sum(lb.split()[0].endswith(("_stacked_rope_kv", "_stacked_rope_kv_norm")) for lb in labels)
            assert fused == (on * n if fusing else 0), labels
            assert sum(lb.startswith("rope_kv") for lb in labels) == n - fused, labels
            rows = be.forward([1, 17, 42, 99], 0)  # 4 rows: several tokens a GEMV workgroup
            step = be.forward([3], 4)
            got[on] = (rows, step)
    for a, b in zip(got[0], got[1]):
        np.testing.assert_array_equal(np.asarray(b).view(np.uint32), np.asarray(a).view(np.uint32))


def test_group_is_the_stack_and_its_store():
    """fusion.groups: q, k, v then rope(q), rope(k) and the store of exactly those buffers; a store of
    other buffers leaves the stack a qkv group."""
    from infr.models.spec import RopeSpec, RopeStyle
    from infr.ops import MatMul, Rope, StoreKV

    r = RopeSpec(RopeStyle.NORM, 1e4, 64)
    mms = [MatMul(d, "h", f"w{d}") for d in ("q", "k", "v")]
    store = [Rope("q", 4, 64, r), Rope("k", 2, 64, r), StoreKV(0, "k", "v")]
    (g,) = fusion.groups(mms + store)
    assert g.kind == "qkv_rope_store" and g.stack() == tuple(mms)
    other = [Rope("q", 4, 64, r), Rope("k2", 2, 64, r), StoreKV(0, "k2", "v")]
    assert [g.kind for g in fusion.groups(mms + other)] == ["qkv", "rope_store"]


def test_rope_stacks_pass_tint(gpu, tint):  # noqa: F811
    """The rotating stack in the forms the engine asks for (one type and mixed, 1..8 tokens a
    workgroup) compiles under Tint (tests/gpu/test_tint.py)."""
    asked: set = set()
    for types in (("q4_k",) * 3, ("q4_k", "q4_k", "q6_k"), ("q8_0",) * 3):
        for T in (1, 2, 4, 8):
            KM.gemv_pipeline(_Recorder(gpu, asked), types, split=True, T=T, rope={"BS": 16})
    assert len(asked) == 3 * 4
    errors = _tint_errors(tint, asked)
    assert not errors, errors
