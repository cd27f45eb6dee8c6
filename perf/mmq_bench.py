"""The int8 GEMM (wgsl/gemm_mmq.wgsl, "mmq") against the batched GEMV on Llama-3.1-8B prefill shapes.

    source .gpu/setup.sh && python3 perf/mmq_bench.py --out perf/h200/mmq-bench.json        # T = 512
    python3 perf/mmq_bench.py --sweep "64,64,4,4,8 128,32,4,4,4 64,32,4,2,8" --out mmq.json
    python3 perf/mmq_bench.py --scale 16 --T 70 --out /tmp/mmq.json                           # lavapipe smoke run

Shapes (N x K): q/o 4096x4096, gate||up 14336x4096 (the fused pair: two
matrices, act(gate) * up), down 4096x14336 (with the fused residual add) and
q|k|v 6144x4096 (4096 + 1024 + 1024 rows stacked, one dispatch). --scale s
divides N and K by s (K kept whole 256-value blocks). Both kernels read the
same rounded activations (one quantize, not timed) and random valid Q4_K
blocks; each measurement encodes --reps products in one pass, rotating over
copies of the weights (> 200 MB in all) so L2 does not hold them, timed from
the host (timing.seconds_per_rep): ms per product and TFLOP/s (2 T N K per
matrix). --sweep "BN,BT,RM,RT,SUB[,PREFETCH] ..." times each tile setting (SUB 0: the
largest that fits), the default being the first of kernels_mmq.TILES.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import random_rows  # perf/ is on sys.path (the script's directory)
from gguf import GGMLQuantizationType as Q
from timing import seconds_per_rep

from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_q8 as KQ
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, storage

SHAPES = [  # (label, N, K, kind, stacked row counts)
    ("8B q/o", 4096, 4096, "plain", None),
    ("8B gate+up", 14336, 4096, "pair", None),
    ("8B down", 4096, 14336, "resid", None),
    ("8B qkv", 6144, 4096, "stacked", (4096, 1024, 1024)),
]


class _Tensor:
    def __init__(self, N: int, K: int, raw: np.ndarray, name: str):
        self.qtype, self.shape, self.raw, self.name = Q.Q4_K, (N, K), raw, name


def _scaled(n: int, s: int, block: int) -> int:
    return max(block, n // s // block * block)


def build(dev, kern, label, N, K, kind, parts, T, tuning, copies, rng):
    """(mmq dispatch groups, GEMV dispatch groups, f32 GEMM dispatch groups, output buffer)."""
    # Rounded activations: random q bytes, each 32-value block's (d, d * sum q) small floats.
    words = np.zeros((T, KQ.words(K)), np.uint32)
    words[:, : K // 4] = rng.integers(0, 1 << 32, (T, K // 4), dtype=np.uint64).astype(np.uint32)
    words[:, K // 4 :] = np.full((T, K // 16), 0.01, np.float32).view(np.uint32)
    xq = storage(dev, words)
    x = storage(dev, rng.standard_normal((T, K), dtype=np.float32))  # the f32 GEMM's input
    y = storage(dev, 4 * T * N)
    mmq, gemv, gemm = [], [], []
    for _ in range(copies):
        if kind == "stacked":
            ts = [_Tensor(n, K, random_rows(rng, Q.Q4_K, n, K), f"{label}{i}") for i, n in enumerate(parts)]
            chunks = KM.upload_stacked(dev, ts, label=label)
            ys = [storage(dev, 4 * T * n) for n in parts]
            mmq.append(KMQ.stacked_dispatches(kern, ts, chunks, xq, ys, None, T, tile=tuning))
            gemv.append(KM.stacked_dispatches(kern, ts, chunks, xq, ys, None, T, xq=xq))
            gemm.append(KG.stacked_gemm_dispatches(kern, ts, chunks, x, ys, None, T))
        elif kind == "pair":
            tg = _Tensor(N, K, random_rows(rng, Q.Q4_K, N, K), "gate")
            tu = _Tensor(N, K, random_rows(rng, Q.Q4_K, N, K), "up")
            cg, cu = KM.upload_weight(dev, tg), KM.upload_weight(dev, tu)
            mmq.append(KMQ.gate_up_dispatches(kern, tg, tu, cg, cu, xq, y, "silu", T, tile=tuning))
            gemv.append(KM.gate_up_dispatches(kern, tg, tu, cg, cu, xq, y, "silu", T, xq=xq))
            # the f32 GEMM has no fused pair: gate and up products only (no activation dispatch)
            gemm.append(KG.gemm_dispatches(kern, tg, cg, x, y, None, T) + KG.gemm_dispatches(kern, tu, cu, x, y, None, T))
        else:
            t = _Tensor(N, K, random_rows(rng, Q.Q4_K, N, K), label)
            chunks = KM.upload_weight(dev, t)
            resid = storage(dev, 4 * T * N) if kind == "resid" else None
            mmq.append(KMQ.mmq_dispatches(kern, t, chunks, xq, y, None, T, resid=resid, tile=tuning))
            gemv.append(KM.matmul_dispatches(kern, t, chunks, xq, y, None, T, resid=resid, xq=xq))
            gemm.append(KG.gemm_dispatches(kern, t, chunks, x, y, None, T, resid=resid))
    return mmq, gemv, gemm, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512, help="tokens per batch")
    ap.add_argument("--scale", type=int, default=1, help="divide N and K by this (a small run on lavapipe)")
    ap.add_argument("--reps", type=int, default=0, help="products per timed pass (default 20, 2 when scaled)")
    ap.add_argument("--sweep", default="", help='tile settings "BN,BT,RM,RT,SUB[,PREFETCH] ..." (default: MmqTuning)')
    ap.add_argument("--no-gemv", action="store_true", help="time the new kernel only")
    ap.add_argument("--gemm", action="store_true", help="also time the f32 GEMM (kernels_gemm: lavapipe's batch kernel)")
    ap.add_argument("--out", required=True, help="where the JSON goes")
    args = ap.parse_args()
    dev = get_device()
    kern = Kernels(dev)
    reps = args.reps or (2 if args.scale > 1 else 20)
    tunings = [KMQ.MmqTile.parse(s).resolved(dev) for s in args.sweep.split()] or [
        KMQ.device_tuning(dev).tiles[0].resolved(dev)]
    out = {"adapter": dev.name, "date": dt.date.today().isoformat(), "command": " ".join(sys.argv), "T": args.T,
           "scale": args.scale, "reps": reps, "results": []}
    rng = np.random.default_rng(0)
    for label, N, K, kind, parts in SHAPES:
        if args.scale > 1:
            N, K = _scaled(N, args.scale, 64), _scaled(K, args.scale, 256)
            parts = parts and tuple(_scaled(n, args.scale, 16) for n in parts)
            N = sum(parts) if parts else N
        nbytes = N * KM.row_bytes(Q.Q4_K, K) * (2 if kind == "pair" else 1)
        copies = 1 if args.scale > 1 else max(1, min(4, -(-200_000_000 // nbytes)))
        flops = 2 * args.T * N * K * (2 if kind == "pair" else 1)
        gemv_ms = gemm_ms = None
        for i, tun in enumerate(tunings):
            mmq, gemv, gemm, y = build(dev, kern, label, N, K, kind, parts, args.T, tun, copies, rng)
            sec = seconds_per_rep(dev, mmq, reps, y, best_of=1 if args.scale > 1 else 3)
            if i == 0 and not args.no_gemv:
                gemv_ms = seconds_per_rep(dev, gemv, reps, y, best_of=1 if args.scale > 1 else 3) * 1e3
            if i == 0 and args.gemm:
                gemm_ms = seconds_per_rep(dev, gemm, reps, y, best_of=1 if args.scale > 1 else 3) * 1e3
            r = {"shape": label, "N": N, "K": K, "T": args.T, "kind": kind,
                 "tuning": {"BN": tun.BN, "BT": tun.BT, "RM": tun.RM, "RT": tun.RT, "SUB": tun.SUB, "PREFETCH": tun.PREFETCH},
                 "mmq_ms": sec * 1e3, "mmq_tflops": flops / sec / 1e12,
                 "gemv_ms": gemv_ms, "gemv_tflops": flops / (gemv_ms / 1e3) / 1e12 if gemv_ms else None,
                 "gemm_f32_ms": gemm_ms}
            out["results"].append(r)
            g = f"  gemv {gemv_ms:.3f} ms {r['gemv_tflops']:.3g} TFLOP/s" if gemv_ms else ""
            g += f"  f32 gemm {gemm_ms:.3f} ms" if gemm_ms else ""
            print(f"{label:11} {N}x{K} T={args.T} {kind:7} mmq {tun.BN}x{tun.BT}/{tun.RM}x{tun.RT}/{tun.SUB}{'p' if tun.PREFETCH else ''}: "
                  f"{r['mmq_ms']:.3f} ms {r['mmq_tflops']:.3g} TFLOP/s{g}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
