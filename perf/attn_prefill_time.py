"""Prefill attention: attn_tiled (old) against attn_tiled2 (new) at T = 512, one
sequence from position 0, on whatever adapter is present.

    python3 perf/attn_prefill_time.py                # T=512, the three shapes below
    python3 perf/attn_prefill_time.py --T 64 --reps 3   # a smoke run on lavapipe
    python3 perf/attn_prefill_time.py --sweep       # also attn_tiled2's other tilings (M, QPI, KPI)
    python3 perf/attn_prefill_time.py --flavor dawn # through Dawn (wgpudawn) instead of wgpu-native
    python3 perf/attn_prefill_time.py --wide        # head dim 512 (Gemma 4's full layers): attn_tiled and
                                                    # attn_tiled2 (where it fits) against the one-pass kernel
    python3 perf/attn_prefill_time.py --mma --flavor dawn  # attn_mma (the tensor cores) against attn_tiled2,
                                                    # at its tilings (M, BK), the 1B's 64-dim heads too

H100 80GB, 2026-12-05 (old / new µs): through Dawn 347 / 224 (8B), 345 / 223 (Qwen3-30B-A3B),
398 / 245 (16/8 x 256); through wgpu-native 1047 / 2458 (8B), hence attn_tiled2 is the default on Dawn only.

Shapes (query heads, kv heads, head dim): Llama-3.1-8B (32, 8, 128), Qwen3-30B-A3B
(32, 4, 128), Gemma-like (16, 8, 256). Each kernel is built through infr's own
dispatch machinery (kernels_attention.tiled_dispatch), warmed up, then REPS calls are
encoded in one compute pass and the submit is timed to a read-back (perf/timing.py,
best of 3): µs per call = per layer. The outputs of the two kernels are compared too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import seconds_per_rep

from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_misc as KS
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, read, run, storage

SHAPES = [(32, 8, 128), (32, 4, 128), (16, 8, 256)]
# attn_tiled2 tilings (M slots, QPI slots an invocation, KPI keys an invocation) for --sweep; those
# past the adapter's workgroup memory are left out (64,4,4 needs 41 KiB: NVIDIA's 48 KiB, not lavapipe's 32)
SWEEP = [(64, 4, 2), (64, 4, 4), (32, 4, 4), (64, 8, 2), (32, 2, 2), (32, 4, 2), (128, 8, 2), (16, 2, 2), (16, 4, 2),
         (16, 1, 2), (16, 2, 4), (32, 2, 4)]


def _start(a, columns: str):
    """The device, its kernels and the random source; the header lines printed."""
    dev = get_device(flavor=a.flavor)
    print(f"adapter: {dev.name} ({a.flavor}); T={a.T} from position 0, {a.reps} calls a pass, best of 3")
    print(f"{'shape (H/Hkv x D)':<20} {columns}")
    return dev, Kernels(dev), np.random.default_rng(0)


def _inputs(dev, rng, T: int, n_heads: int, kv_heads: int, hd: int, n_out: int = 2):
    """Random f16 K and V caches of T keys, T rows of q, n_out outputs, one sequence from position 0."""
    kc = storage(dev, rng.standard_normal((T, kv_heads, hd)).astype(np.float16).view(np.uint32))
    vc = storage(dev, rng.standard_normal((T, kv_heads, hd)).astype(np.float16).view(np.uint32))
    q = storage(dev, (rng.standard_normal(T * n_heads * hd) * 2).astype(np.float32))
    outs = [storage(dev, T * n_heads * hd * 4) for _ in range(n_out)]
    return kc, vc, q, outs, KS.single_sequence(dev, 0, T, T)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="also time attn_tiled2's other tilings that fit")
    ap.add_argument("--flavor", default="wgpu", help="wgpu (wgpu-native, naga) or dawn (wgpudawn, Tint)")
    ap.add_argument("--wide", action="store_true", help="head dim 512: attn_tiled against the one-pass kernel")
    ap.add_argument("--mma", action="store_true", help="attn_mma at its tilings against attn_tiled2")
    a = ap.parse_args()
    if a.wide:
        return wide(a)
    if a.mma:
        return mma(a)
    dev, kern, rng = _start(a, f"{'old µs':>9} {'new µs':>9} {'old/new':>8} {'new TFLOP/s':>12} {'max |diff|':>11}")
    T = a.T
    for n_heads, kv_heads, hd in SHAPES:
        kc, vc, q, outs, pg = _inputs(dev, rng, T, n_heads, kv_heads, hd)
        args = (n_heads, kv_heads, hd, hd, 1.0 / np.sqrt(hd), None, None, T)
        us, got = [], []
        for i, kernel in enumerate((1, 2)):  # 2: attn_tiled2 at its default tiling, also where not the default kernel
            d = KA.tiled_dispatch(kern, q, kc, vc, outs[i], pg, *args, kernel=kernel)
            run(dev, [d])  # compile and warm up
            got.append(read(dev, outs[i], count=T * n_heads * hd))
            us.append(seconds_per_rep(dev, [[d]], a.reps, outs[i]) * 1e6)
        # causal: T(T+1)/2 scores a head; 2 FLOPs a MAC in q.k and in p.V (the old and new kernels
        # both compute q.k twice, counted once: the useful work)
        flops = n_heads * T * (T + 1) / 2 * hd * 2 * 2
        diff = float(np.abs(got[0] - got[1]).max())
        t = KA.tiled2_shape(n_heads, kv_heads, hd, hd, KA.default_tiling(kern, hd, hd), T=T)
        print(f"{f'{n_heads}/{kv_heads} x {hd}':<20} {us[0]:>9.1f} {us[1]:>9.1f} {us[0] / us[1]:>7.2f}x "
              f"{flops / us[1] / 1e6:>12.2f} {diff:>11.3g}   (M={t.M} HG={t.HG} QPI={t.QPI} KPI={t.KPI})")
        if a.sweep:
            mem = int(dev.limits.get("max-compute-workgroup-storage-size", 16384))
            for tiling in SWEEP:
                t = KA.tiled2_shape(n_heads, kv_heads, hd, hd, tiling)
                if t.workgroup_bytes(hd, hd) > mem or t.WG > 1024:
                    continue
                d = KA.tiled_dispatch(kern, q, kc, vc, outs[1], pg, *args, kernel=2, tiling=tiling)
                run(dev, [d])
                diff = float(np.abs(got[0] - read(dev, outs[1], count=T * n_heads * hd)).max())
                u = seconds_per_rep(dev, [[d]], a.reps, outs[1]) * 1e6
                print(f"{'  tiling M,QPI,KPI':<20} {'':>9} {u:>9.1f} {us[0] / u:>7.2f}x {flops / u / 1e6:>12.2f} "
                      f"{diff:>11.3g}   (M={t.M} HG={t.HG} QPI={t.QPI} KPI={t.KPI}, WG {t.WG}, "
                      f"{t.workgroup_bytes(hd, hd)} B)")


MMA_TILINGS = [(64, 32), (32, 32), (128, 32), (64, 64), (32, 64), (16, 32)]  # attn_mma's (M slots, BK keys)


def mma(a) -> None:
    """attn_mma (kernels_attn_mma) at each tiling that fits against attn_tiled2's default, µs a layer, and
    max |diff| against attn_tiled2's output."""
    from infr.gpu import kernels_attn_mma as KAM

    dev, kern, rng = _start(a, f"{'tiled2 µs':>10} {'M,BK':>8} {'mma µs':>9} {'tiled2/mma':>11} {'max |diff|':>11}")
    T = a.T
    for n_heads, kv_heads, hd in [(32, 8, 64)] + SHAPES:
        kc, vc, q, outs, pg = _inputs(dev, rng, T, n_heads, kv_heads, hd)
        args = (n_heads, kv_heads, hd, hd, 1.0 / np.sqrt(hd), None, None, T)
        d = KA.tiled_dispatch(kern, q, kc, vc, outs[0], pg, *args, kernel=2,
                              tiling=KA.default_tiling(kern, hd, hd))
        run(dev, [d])
        ref = read(dev, outs[0], count=T * n_heads * hd)
        seconds_per_rep(dev, [[d]], a.reps, outs[0])  # a first timing read ~3x slow on the H100 (stop 42)
        base = seconds_per_rep(dev, [[d]], a.reps, outs[0]) * 1e6
        for tiling in MMA_TILINGS:
            if not KAM.takes(dev, hd, hd, KAM.shape(n_heads, kv_heads, tiling)):
                continue
            d = KA.tiled_dispatch(kern, q, kc, vc, outs[1], pg, *args, kernel=3, tiling=tiling)
            run(dev, [d])
            diff = float(np.abs(ref - read(dev, outs[1], count=T * n_heads * hd)).max())
            u = seconds_per_rep(dev, [[d]], a.reps, outs[1]) * 1e6
            print(f"{f'{n_heads}/{kv_heads} x {hd}':<20} {base:>10.1f} {'%d,%d' % tiling:>8} {u:>9.1f} "
                  f"{base / u:>10.2f}x {diff:>11.3g}", flush=True)


WIDE = [(8, 1, 512), (16, 2, 512)]  # Gemma 4 E2B's and 26B-A4B's full-attention layers


def wide(a) -> None:
    """Head dim 512: the one-pass kernel (the lowering's choice there unless INFR_ATTN_WIDE=1) against
    attn_tiled's 8-row blocks and attn_tiled2's 16 or 8 slots (where the device's workgroup memory holds
    them: 50 / 42 KiB), from position 0 (causal), µs a layer; max |diff| against the one-pass kernel."""
    dev, kern, rng = _start(a, f"{'one-pass µs':>12} {'attn_tiled µs':>14} {'attn_tiled2 µs':>15} {'max |diff|':>11}")
    T = a.T
    for n_heads, kv_heads, hd in WIDE:
        kc, vc, q, outs, pg = _inputs(dev, rng, T, n_heads, kv_heads, hd, n_out=3)
        args = (n_heads, kv_heads, hd, hd, 1.0 / np.sqrt(hd), None, None, T)
        ds = [KS.attention_dispatch(kern, q, kc, vc, outs[0], pg, *args),
              KA.tiled_dispatch(kern, q, kc, vc, outs[1], pg, *args, kernel=1)]
        tiling = KA.default_tiling(kern, hd, hd)  # attn_tiled2's 16 or 8 slots, where they fit
        if tiling is not None:
            ds.append(KA.tiled_dispatch(kern, q, kc, vc, outs[2], pg, *args, kernel=2, tiling=tiling))
        us, got = [], []
        for d, o in zip(ds, outs):
            run(dev, [d])
            got.append(read(dev, o, count=T * n_heads * hd))
            us.append(seconds_per_rep(dev, [[d]], a.reps, o) * 1e6)
        diff = max(float(np.abs(got[0] - g).max()) for g in got[1:])
        t2 = f"{us[2]:>15.1f}" if tiling else f"{'(no room)':>15}"
        print(f"{f'{n_heads}/{kv_heads} x {hd}':<20} {us[0]:>12.1f} {us[1]:>14.1f} {t2} {diff:>11.3g}"
              + (f"   (attn_tiled2 M,QPI,KPI = {tiling})" if tiling else ""))


if __name__ == "__main__":
    main()
