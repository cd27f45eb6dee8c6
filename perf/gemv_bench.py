"""GEMV bandwidth of the Q4_K int8 GEMV (wgsl/gemv.wgsl) across shapes and tunings (every type: gemv_types_bench.py).

    source .gpu/setup.sh && python3 perf/gemv_bench.py            # the Llama 1B / 8B shapes
    GEMV_VARIANTS="1,1,32 2,2,32" python3 perf/gemv_bench.py   # R,U,SG (kernels_matmul.GemvTuning)

Each measurement encodes 200 one-token dispatches in one pass, rotating over
enough copies of the matrix (> 300 MB) that it cannot sit in L2, and times the
submit from the host: µs per GEMV (launch included, with the quantization of
its activations, a second small dispatch) and weight GB/s.
Writes gemv-bench.json to $OUT (or perf/).
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

from infr.gpu import tuning
from infr.gpu import kernels_matmul as KM
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, storage

SHAPES = [] if os.environ.get("GEMV_SMALL") else [  # (N, K, label)
    (4096, 4096, "8B q/o"), (1024, 4096, "8B k/v"), (14336, 4096, "8B gate/up"), (4096, 14336, "8B down"),
    (128256, 4096, "8B head"), (2048, 2048, "1B q/o"), (512, 2048, "1B k/v"), (8192, 2048, "1B gate/up"),
    (2048, 8192, "1B down"), (128256, 2048, "1B head"),
]
if os.environ.get("GEMV_SMALL"):  # a smoke run on lavapipe
    SHAPES = [(256, 512, "small"), (512, 256, "small gate/up")]
REPS = 200


class _Tensor:
    """The two attributes matmul_dispatches reads from a GGUF tensor."""

    def __init__(self, N: int, K: int):
        self.qtype, self.shape, self.name = Q.Q4_K, (N, K), f"w{N}x{K}"


def random_q4_k(rng, N: int, K: int) -> np.ndarray:
    """Random Q4_K rows whose f16 scales are small and finite."""
    blocks = rng.integers(0, 256, (N, K // 256, 144), dtype=np.uint8)
    blocks[:, :, 0:4] = np.full((N, K // 256, 2), 0.01, np.float16).view(np.uint8)  # d, dmin
    return blocks.reshape(N, -1)


def measure(dev, kern, N: int, K: int, pair: bool = False) -> dict:
    rng = np.random.default_rng(0)
    rb = KM.row_bytes(Q.Q4_K, K)
    copies = max(2, -(-300_000_000 // (N * rb * (2 if pair else 1))))
    raw = random_q4_k(rng, N, K)
    t = _Tensor(N, K)
    x = storage(dev, rng.standard_normal(K).astype(np.float32))
    y = storage(dev, 4 * N)
    groups = []  # per copy: the activations' quantization, then the GEMV
    for _ in range(copies):
        buf = storage(dev, raw.reshape(-1))
        chunks = [(buf, 0, N)]
        if pair:
            groups.append(KM.gate_up_dispatches(kern, t, t, chunks, chunks, x, y, "silu", 1))
        else:
            groups.append(KM.matmul_dispatches(kern, t, chunks, x, y, None, 1))
    us = seconds_per_rep(dev, groups, REPS, y) * 1e6
    nbytes = N * rb * (2 if pair else 1)
    return {"N": N, "K": K, "pair": pair, "us": us, "gbps": nbytes / us / 1e3}


def main() -> None:
    dev = get_device()
    variants = os.environ.get("GEMV_VARIANTS", "1,1,32 2,1,32 1,2,32 2,2,32 4,1,32").split()
    out = {"adapter": dev.name, "date": dt.date.today().isoformat(), "command": "python3 perf/gemv_bench.py",
           "variants": os.environ.get("GEMV_VARIANTS", ""), "results": []}
    for v in variants:
        R, U, SG = (int(s) for s in v.split(","))
        os.environ.update(INFR_GEMV_R=str(R), INFR_GEMV_U=str(U), INFR_GEMV_SG=str(SG))
        tuning.reload()  # the kernels read the knobs once
        kern = Kernels(dev)  # a fresh pipeline cache per tuning
        rows = []
        for N, K, label in SHAPES:
            rows.append({"shape": label, **measure(dev, kern, N, K)})
            if "gate/up" in label:
                rows.append({"shape": label + " fused pair", **measure(dev, kern, N, K, pair=True)})
        print(f"R={R} U={U} SG={SG}: " + "  ".join(f"{r['shape']} {r['us']:.1f}us {r['gbps']:.0f}GB/s" for r in rows),
              flush=True)
        out["results"].append({"R": R, "U": U, "SG": SG, "rows": rows})
    Path(os.environ.get("OUT") or Path(__file__).parent, "gemv-bench.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
