"""Throughput of the tiled GEMM (wgsl/gemm.wgsl) on the Llama 3.1 8B prefill shapes.

    source .gpu/setup.sh && python3 perf/gemm_bench.py          # Q4_K, T = 512, the 8B shapes
    GEMM_TYPES=q4_k,q6_k,q8_0,f16 GEMM_T=128 python3 perf/gemm_bench.py
    GEMM_SMALL=1 python3 perf/gemm_bench.py                     # a smoke run (seconds, lavapipe)

Each measurement encodes REPS GEMMs y[T, N] = x[T, K] · W[N, K]^T in one
pass (rotating over copies of the weight when one copy is small, so L2 does
not hold it across reps) and times the submit to completion from the host:
ms per GEMM and GFLOP/s (2·T·N·K flops). The weights are random valid blocks.
A [T, N] output larger than one storage binding (the 128256-row head at
T = 512 on a 128 MiB limit) is computed in token slices, one dispatch set
per slice, all within the one timed GEMM. Writes gemm-bench.json to $OUT
(or perf/).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf import GGMLQuantizationType as Q
from timing import seconds_per_rep

from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_matmul as KM
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, storage

SMALL = bool(os.environ.get("GEMM_SMALL"))
SHAPES = [(256, 512, "small"), (300, 1024, "small odd N")] if SMALL else [  # (N, K, label)
    (4096, 4096, "8B q/o"), (14336, 4096, "8B gate/up"), (4096, 14336, "8B down"), (128256, 4096, "8B head"),
]
T = int(os.environ.get("GEMM_T") or (70 if SMALL else 512))
REPS = 2 if SMALL else 20
# Byte offsets of the f16 scale fields in one block (ggml's block structs): set to small finite values.
F16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q2_K: (80, 82), Q.Q3_K: (108,),
    Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,),
}


class _Tensor:
    def __init__(self, q: Q, N: int, K: int):
        self.qtype, self.shape, self.name = q, (N, K), f"w{N}x{K}"


def random_rows(rng, q: Q, N: int, K: int) -> np.ndarray:
    """[N, row_bytes] of random valid blocks (float types: random values)."""
    if q in (Q.F32, Q.F16, Q.BF16):
        v = rng.standard_normal((N, K), dtype=np.float32) * 0.05
        if q == Q.F32:
            return v.view(np.uint8)
        if q == Q.F16:
            return v.astype(np.float16).view(np.uint8)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    qk, nbytes = KM.block_shape(q)
    blocks = rng.integers(0, 256, (N, K // qk, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[q]:
        blocks[:, :, off : off + 2] = np.full((N, K // qk), 0.01, np.float16).view(np.uint8).reshape(N, K // qk, 2)
    return blocks.reshape(N, -1)


def measure(dev, kern, q: Q, N: int, K: int) -> dict:
    rng = np.random.default_rng(0)
    rb = KM.row_bytes(q, K)
    t = _Tensor(q, N, K)
    raw = random_rows(rng, q, N, K)
    copies = 1 if SMALL else max(1, min(4, -(-200_000_000 // (N * rb))))
    uploads = []
    for _ in range(copies):
        t.raw = raw
        uploads.append(KM.upload_weight(dev, t))
    x = storage(dev, rng.standard_normal((T, K), dtype=np.float32))
    slice_t = max(1, min(T, dev.max_binding // (4 * N)))  # tokens per output slice that fit one binding
    slice_t = slice_t // KG.BM * KG.BM or slice_t
    y = storage(dev, 4 * N * slice_t)
    groups = []
    for chunks in uploads:
        ds = []
        for t0 in range(0, T, slice_t):
            n = min(slice_t, T - t0)
            xv = x if t0 == 0 else storage(dev, rng.standard_normal((n, K), dtype=np.float32))
            ds += KG.gemm_dispatches(kern, q, chunks, xv, y, None, K, N, n)
        groups.append(ds)
    sec = seconds_per_rep(dev, groups, REPS, y, best_of=1 if SMALL else 3)
    return {"type": q.name, "N": N, "K": K, "T": T, "ms": sec * 1e3, "gflops": 2 * T * N * K / sec / 1e9,
            "weight_gbps": N * rb / sec / 1e9, "token_slices": -(-T // slice_t)}


def main() -> None:
    dev = get_device()
    kern = Kernels(dev)
    types = [KM.as_qtype(s) for s in os.environ.get("GEMM_TYPES", "q4_k" if not SMALL else "q4_k,q8_0").split(",")]
    out = {"adapter": dev.name, "date": dt.date.today().isoformat(), "command": "python3 perf/gemm_bench.py",
           "T": T, "small": SMALL, "results": []}
    for q in types:
        for N, K, label in SHAPES:
            r = {"shape": label, **measure(dev, kern, q, N, K)}
            out["results"].append(r)
            print(f"{q.name:6} {label:12} {N}x{K} T={T}: {r['ms']:.3f} ms  {r['gflops']:.4g} GFLOP/s", flush=True)
    Path(os.environ.get("OUT") or Path(__file__).parent, "gemm-bench.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
