"""Bandwidth of the int8 GEMV (wgsl/gemv.wgsl) for every type with a reader, on the Llama-3.1-8B decode shapes.

    source .gpu/setup.sh && python3 perf/gemv_types_bench.py --out perf/h200/gemv-types.json
    python3 perf/gemv_types_bench.py --types q6_k,q8_0 --f32 --out /tmp/g.json   # beside the f32 kernel
    python3 perf/gemv_types_bench.py --scale 16 --out /tmp/gemv-types.json         # lavapipe smoke run

Shapes (N x K, T = 1): q|k|v 6144x4096 (4096 + 1024 + 1024 rows stacked, one
dispatch), o 4096x4096, gate||up 2 x 14336x4096 (the fused pair, act(gate) *
up), down 4096x14336 (with the fused residual add), the head 128256x4096; and
the Q4_K_M layers' mixed q|k|v (Q4_K q, k, Q6_K v). --scale s divides N and K
by s (K kept whole 256-value blocks). Weights are random valid blocks, the
activations one rounded row (the quantize is not timed: each row is the GEMV
alone). Each measurement encodes --reps GEMVs in one pass, rotating over
copies of the weights (>= 256 MB in all, / scale^2, so L2 does not hold them), timed
from the host (perf/timing.py): µs per GEMV and weight GB/s. --f32 also times
the generic f32-activation kernel (wgsl/matmul.wgsl) on the plain shapes, the
path these types took before. INFR_GEMV_R / _U / _SG pick the tuning
(kernels_matmul.GemvTuning). Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import F16_FIELDS  # perf/ is on sys.path (the script's directory)
from gguf import GGMLQuantizationType as Q
from timing import seconds_per_rep

from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_q8 as KQ
from infr.gpu.device import get_device
from infr.gpu.runtime import Dispatch, Kernels, run, storage

SHAPES = [  # (label, N, K, kind, stacked rows)
    ("qkv", 6144, 4096, "stacked", (4096, 1024, 1024)),
    ("o", 4096, 4096, "plain", None),
    ("gate+up", 14336, 4096, "pair", None),
    ("down", 4096, 14336, "resid", None),
    ("head", 128256, 4096, "plain", None),
]
BUDGET = 256 << 20  # bytes of weight copies rotated through per measurement


class _Tensor:
    def __init__(self, q: Q, N: int, K: int, raw: np.ndarray):
        self.qtype, self.shape, self.raw, self.name = q, (N, K), raw, f"{q.name}_{N}x{K}"


def random_rows(pool: np.ndarray, q: Q, N: int, K: int) -> np.ndarray:
    """[N, row_bytes] of valid blocks: random bytes (a pool repeated: generating
    gigabytes would take longer than timing them), f16 scales set small and finite."""
    qk, nbytes = KM.block_shape(q)
    blocks = np.resize(pool, N * (K // qk) * nbytes).reshape(N, K // qk, nbytes)
    for off in F16_FIELDS[q]:
        blocks[:, :, off : off + 2] = np.array([0.01], np.float16).view(np.uint8)
    return blocks.reshape(N, -1)


def _scaled(n: int, s: int, block: int) -> int:
    return max(block, n // s // block * block)


def _f32_dispatch(kern, t, chunks, x, y, T: int) -> list[Dispatch]:
    """The generic kernel (wgsl/matmul.wgsl, f32 activations) the GEMV types took before."""
    q, (N, K) = KM.as_qtype(t.qtype), t.shape
    pipe = kern.pipeline("matmul", "main", QTYPE=KM.wgsl_name(q), WG=KM.MATMUL_WG, ROWS=KM.rows_per_workgroup(q))
    out = []
    for buf, row0, rows in chunks:
        p = storage(kern.dev, KM.params_matmul(K, rows, row0, KM.row_bytes(q, K), K, N, False, T), uniform=True)
        none = KM._no_bias(kern)
        bind = kern.bind(pipe, [p, buf, x, y, none, none])
        out.append(Dispatch(pipe, bind, (-(-rows // KM.rows_per_workgroup(q)), T, 1), f"matmul_{KM.wgsl_name(q)}"))
    return out


def measure(dev, kern, types, label, N, K, kind, parts, reps, rng, pool, budget: int, f32=False) -> dict:
    """One shape for one type (or, stacked, the types of its parts)."""
    T = 1
    xf = rng.standard_normal((T, K), dtype=np.float32)
    x = storage(dev, xf)
    quant, xq = KQ.quantize_dispatch(kern, x, K, T, into=storage(dev, 4 * T * KQ.words(K)))
    run(dev, [quant])
    y = storage(dev, 4 * T * N)
    resid = storage(dev, 4 * T * N)
    if kind == "stacked":
        tensors = [_Tensor(q, n, K, random_rows(pool, q, n, K)) for q, n in zip(types, parts)]
        nbytes = sum(n * KM.row_bytes(q, K) for q, n in zip(types, parts))
    elif kind == "pair":
        tensors = [_Tensor(types[0], N, K, random_rows(pool, types[0], N, K)) for _ in range(2)]
        nbytes = 2 * N * KM.row_bytes(types[0], K)
    else:
        tensors = [_Tensor(types[0], N, K, random_rows(pool, types[0], N, K))]
        nbytes = N * KM.row_bytes(types[0], K)
    copies = -(-budget // nbytes)  # one copy when it alone is the budget: far past L2 already
    groups, f32_groups, bufs = [], [], []
    for _ in range(copies):
        if kind == "stacked":
            chunks = KM.upload_stacked(dev, tensors, label=label)
            ys = [storage(dev, 4 * T * n) for n in parts]
            groups.append(KM.stacked_dispatches(kern, tensors, chunks, x, ys, None, T, xq=xq))
        elif kind == "pair":
            cg, cu = KM.upload_weight(dev, tensors[0]), KM.upload_weight(dev, tensors[1])
            chunks = cg + cu
            groups.append(KM.gate_up_dispatches(kern, tensors[0], tensors[1], cg, cu, x, y, "silu", T, xq=xq))
        else:
            chunks = KM.upload_weight(dev, tensors[0])
            groups.append(KM.matmul_dispatches(kern, tensors[0], chunks, x, y, None, T, xq=xq,
                                               resid=resid if kind == "resid" else None))
            if f32:
                f32_groups.append(_f32_dispatch(kern, tensors[0], chunks, x, y, T))
        bufs += [c[0] for c in chunks]
    row = {"N": N, "K": K, "kind": kind, "bytes": nbytes, "copies": copies, "kernel": groups[0][-1].label}
    us = seconds_per_rep(dev, groups, reps, y) * 1e6
    row.update(us=us, gbps=nbytes / us / 1e3)
    if f32_groups:
        us32 = seconds_per_rep(dev, f32_groups, reps, y) * 1e6
        row.update(f32_us=us32, f32_gbps=nbytes / us32 / 1e3)
    for b in bufs:
        b.destroy()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=",".join(q.name.lower() for q in sorted(KM.GEMV_FAMILY, key=int)))
    ap.add_argument("--scale", type=int, default=1, help="divide N and K by this (a small run)")
    ap.add_argument("--reps", type=int, default=0, help="GEMVs per timed pass (default 200, 20 with --scale)")
    ap.add_argument("--f32", action="store_true", help="also time the f32-activation matmul.wgsl (plain shapes)")
    ap.add_argument("--out", required=True, help="JSON path")
    args = ap.parse_args()
    dev = get_device()
    kern = Kernels(dev)
    reps = args.reps or (200 if args.scale == 1 else 20)
    types = [KM.as_qtype(n) for n in args.types.split(",")]
    t0 = time.perf_counter()
    out = {"adapter": dev.name, "date": dt.date.today().isoformat(), "command": " ".join(sys.argv),
           "tuning": str(KM.GemvTuning.for_device(dev)), "scale": args.scale, "reps": reps, "results": []}
    s = args.scale
    jobs = [((q,) * 3 if kind == "stacked" else (q,), q.name, lb, N, K, kind, parts)
            for q in types for lb, N, K, kind, parts in SHAPES]
    if Q.Q4_K in types and Q.Q6_K in types:
        jobs.append(((Q.Q4_K, Q.Q4_K, Q.Q6_K), "Q4_K_M", "qkv", 6144, 4096, "stacked", (4096, 1024, 1024)))
    rng = np.random.default_rng(0)
    pool = np.frombuffer(rng.bytes(1 << 24), np.uint8)
    for qs, name, lb, N, K, kind, parts in jobs:
        Ns, Ks = _scaled(N, s, 1), _scaled(K, s, 256)
        ps = tuple(_scaled(n, s, 1) for n in parts) if parts else None
        Ns = sum(ps) if ps else Ns
        row = {"type": name, "shape": lb,
               **measure(dev, kern, qs, lb, Ns, Ks, kind, ps, reps, rng, pool, BUDGET // (s * s), args.f32)}
        out["results"].append(row)
        f32 = f"  f32 kernel {row['f32_us']:8.1f} us {row['f32_gbps']:6.1f} GB/s" if "f32_us" in row else ""
        print(f"{name:7s} {lb:8s} {Ns:6d}x{Ks:<6d} {row['us']:8.1f} us {row['gbps']:6.1f} GB/s  {row['kernel']}{f32}",
              flush=True)
    out["seconds"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{out['seconds']:.0f} s, written {args.out}")


if __name__ == "__main__":
    main()
