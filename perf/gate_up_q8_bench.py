"""The GEMV's gate||up pair rounding its own output (wgsl/gemv_q8_on.wgsl) against the pair then quantize_q8.

    source .gpu/setup.sh && python3 perf/gate_up_q8_bench.py --flavor dawn --out $OUT/gate-up-q8.json
    python3 perf/gate_up_q8_bench.py --scale 16 --T 1,2 --types q4_k --out /tmp/g.json   # lavapipe smoke run

Per type (gate and up of one type; "Q4_K_M": the mix's Q4_K pair), shape (N x K: the 8B's
14336x4096, qwen35-4b's 9216x2560, gemma4-e2b's 6144x1536) and batch T, three timings:
`pair` (the unfused pair alone, 8 teams a workgroup), `pair+quant` (it and the quantize_q8 of its
output: what INFR_GEMV_Q8=0 runs), `fused` (the pair writing its output rounded too, 32
teams a workgroup: what a decode step runs by default; this script turns it on whatever the environment says). Each measurement encodes --reps sequences in one pass, rotating
over copies of the weights (>= 256 MB, / scale^2, past L2), timed from the host (perf/timing.py):
µs per sequence and weight GB/s. --scale s divides N and K by s (K kept whole 256-value blocks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["INFR_GEMV_Q8"] = "1"  # the rounding pair (the default) whatever the environment says

from gemm_bench import random_rows  # perf/ is on sys.path (the script's directory)
from timing import seconds_per_rep

from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_q8 as KQ
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, storage

SHAPES = [("8B", 14336, 4096), ("qwen35-4b", 9216, 2560), ("gemma4-e2b", 6144, 1536)]
BUDGET = 256 << 20


class _Tensor:
    def __init__(self, q, N: int, K: int, raw: np.ndarray):
        self.qtype, self.shape, self.raw, self.name = q, (N, K), raw, f"{q.name}_{N}x{K}"


def measure(dev, kern, q, N: int, K: int, T: int, reps: int, budget: int, rng) -> dict:
    words = np.zeros((T, KQ.words(K)), np.uint32)  # random rounded rows: q bytes, each block's (d, d * sum q)
    words[:, : K // 4] = rng.integers(0, 1 << 32, (T, K // 4), dtype=np.uint64).astype(np.uint32)
    words[:, K // 4 :] = np.full((T, K // 16), 0.01, np.float32).view(np.uint32)
    xq = storage(dev, words)
    y, yq = storage(dev, 4 * T * N), storage(dev, 4 * T * KQ.words(N))
    nbytes = 2 * N * KM.row_bytes(q, K)
    pair, quant, fused, bufs = [], [], [], []
    for _ in range(max(1, -(-budget // nbytes))):
        ts = [_Tensor(q, N, K, random_rows(rng, q, N, K)) for _ in range(2)]
        cg, cu = KM.upload_weight(dev, ts[0]), KM.upload_weight(dev, ts[1])
        ds = KM.gate_up_dispatches(kern, ts[0], ts[1], cg, cu, None, y, "silu", T, xq=xq)
        pair.append(ds)
        quant.append(ds + [KQ.quantize_dispatch(kern, y, N, T, into=yq)[0]])
        if KM.pair_rounds(dev, N, cg, T):
            fused.append(KM.gate_up_dispatches(kern, ts[0], ts[1], cg, cu, None, y, "silu", T, xq=xq, yq=yq))
        bufs += [c[0] for c in cg + cu]
    row = {"type": q.name, "N": N, "K": K, "T": T, "bytes": nbytes, "copies": len(pair)}
    for name, groups in (("pair", pair), ("pair+quant", quant), ("fused", fused)):
        if groups:
            us = seconds_per_rep(dev, groups, reps, y) * 1e6
            row[name] = {"us": us, "gbps": nbytes / us / 1e3}
    for b in bufs:
        b.destroy()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="q4_k,q6_k,q8_0,q5_k,q4_0,iq4_xs")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--T", default="1,4", help="batch sizes (tokens), a comma list")
    ap.add_argument("--scale", type=int, default=1, help="divide N and K by this (a small run)")
    ap.add_argument("--reps", type=int, default=0, help="sequences per timed pass (default 100, 10 with --scale)")
    ap.add_argument("--flavor", default="wgpu", help="WebGPU implementation: wgpu or dawn (the Dawn tier)")
    ap.add_argument("--out", required=True, help="JSON path")
    args = ap.parse_args()
    dev = get_device(flavor=args.flavor)
    kern = Kernels(dev)
    s = args.scale
    reps = args.reps or (100 if s == 1 else 10)
    out = {"adapter": dev.name, "flavor": args.flavor, "date": dt.date.today().isoformat(),
           "command": " ".join(sys.argv), "tuning": str(KM.GemvTuning.for_device(dev)), "scale": s, "reps": reps,
           "results": []}
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for name in args.types.split(","):
        q = KM.as_qtype(name)
        for label, N, K in SHAPES:
            if label not in args.shapes.split(","):
                continue
            Ns, Ks = max(64, N // s // 64 * 64), max(256, K // s // 256 * 256)
            for T in (int(t) for t in args.T.split(",")):
                row = {"shape": label, **measure(dev, kern, q, Ns, Ks, T, reps, BUDGET // (s * s), rng)}
                out["results"].append(row)
                cells = "  ".join(f"{k} {row[k]['us']:7.1f} us {row[k]['gbps']:6.0f} GB/s"
                                  for k in ("pair", "pair+quant", "fused") if k in row)
                print(f"{q.name:6} {label:10} {Ns}x{Ks} T={T}: {cells}", flush=True)
    out["seconds"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
