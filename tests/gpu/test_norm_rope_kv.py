"""QK-norm fused into rope_kv (fusion.py's norm_rope_store): one dispatch gives the floats of the
unfused ops it replaces — the rmsnorm dispatch per head of q, k (and Gemma 4's v), then rope_kv —
word for word: q, k and v in place and both caches, with the norms before the rotation (gemma,
qwen3) or after it (llama4), weighted or weightless, at the head dims the families use."""

from __future__ import annotations

import numpy as np
import pytest

from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_misc as M
from infr.gpu.runtime import read, run, storage


def _buf(gpu, arr: np.ndarray):
    return storage(gpu, np.ascontiguousarray(arr))


@pytest.mark.parametrize(
    "n_heads,kv_heads,hd,vd,n_rot,which,style,after",
    [(8, 2, 128, 128, 128, "qk", "neox", False),  # qwen3 / qwen3moe
     (4, 1, 256, 256, 256, "qkv", "neox", False),  # gemma4 sliding layers: v normalised too
     (4, 2, 512, 512, 128, "qkv", "neox", False),  # gemma4 global layers: partial rotary, 512 dims
     (6, 3, 64, 48, 32, "k", "norm", False),  # one norm alone, v narrower than k
     (4, 4, 96, 96, 96, "qk-", "norm", False),  # "-": weightless (ones bound)
     (8, 2, 128, 128, 128, "qk-", "norm", True),  # llama4: weightless, after the rope
     (8, 2, 128, 128, 64, "qk", "neox", True),
     (6, 3, 64, 48, 32, "k", "norm", True)],
)
def test_fused_norms_equal_the_unfused_ops(gpu, kernels, n_heads, kv_heads, hd, vd, n_rot, which, style, after):
    rng = np.random.default_rng(hd + len(which))
    start, T, eps = 37, 5, 1e-6
    ctx = start + T + 3
    q = (rng.standard_normal((T, n_heads * hd)) * 4).astype(np.float32)
    k = (rng.standard_normal((T, kv_heads * hd)) * 4).astype(np.float32)
    v = (rng.standard_normal((T, kv_heads * vd)) * 4).astype(np.float32)
    kc0 = rng.standard_normal((ctx, kv_heads, hd)).astype(np.float16)
    vc0 = rng.standard_normal((ctx, kv_heads, vd)).astype(np.float16)
    weightless = which.endswith("-")
    w = {n: np.ones(d, np.float32) if weightless else rng.uniform(0.5, 1.5, d).astype(np.float32)
         for n, d in (("q", hd), ("k", hd), ("v", vd)) if n in which}

    def fresh():
        return ({"q": _buf(gpu, q), "k": _buf(gpu, k), "v": _buf(gpu, v)},
                _buf(gpu, kc0.view(np.uint32)), _buf(gpu, vc0.view(np.uint32)))

    def rope(bufs, kcb, vcb, norms=None, rot=n_rot):
        return KA.rope_kv_dispatch(kernels, bufs["q"], bufs["k"], bufs["v"], kcb, vcb,
                                   M.single_sequence(gpu, start, T, ctx), n_heads, kv_heads, hd, vd, rot, 1e4,
                                   1.0, style, T, norms=norms)

    def norm(bufs, name):  # into a new buffer, as the lowering's target() gives the unfused op
        width = {"q": n_heads * hd, "k": kv_heads * hd, "v": kv_heads * vd}[name]
        group = vd if name == "v" else hd
        src, bufs[name] = bufs[name], storage(gpu, 4 * T * width)
        return M.rmsnorm_dispatch(kernels, src, _buf(gpu, w[name]), bufs[name], width, group, eps, T)

    bufs, kcb, vcb = fresh()  # the unfused ops, in the plan's order
    if after:  # rope, the norms, then the store (rope_kv rotating nothing: n_rot 0)
        run(gpu, [rope(bufs, kcb, vcb)])
        run(gpu, [norm(bufs, n) for n in w])
        run(gpu, [rope(bufs, kcb, vcb, rot=0)])
    else:
        run(gpu, [norm(bufs, n) for n in w])
        run(gpu, [rope(bufs, kcb, vcb)])
    want = [read(gpu, bufs[n], np.uint32) for n in "qkv"] + [read(gpu, b, np.uint32) for b in (kcb, vcb)]

    bufs, kcb, vcb = fresh()
    hn = KA.HeadNorms(*(_buf(gpu, w[n]) if n in w else None for n in "qkv"), eps=eps, after=after)
    run(gpu, [rope(bufs, kcb, vcb, hn)])
    got = [read(gpu, bufs[n], np.uint32) for n in "qkv"] + [read(gpu, b, np.uint32) for b in (kcb, vcb)]
    for name, g, x in zip(("q", "k", "v", "k cache", "v cache"), got, want):
        changed = int((g != x).sum())
        print(f"\n[fused norms] {which} hd={hd} {'after' if after else 'before'}: {name} words differing {changed}")
        np.testing.assert_array_equal(g, x, err_msg=name)
    # the norms did act: q or k is not what rope alone leaves
    bufs, kcb, vcb = fresh()
    run(gpu, [rope(bufs, kcb, vcb)])
    assert not all(np.array_equal(read(gpu, bufs[n], np.uint32), g) for n, g in zip("qkv", got))
