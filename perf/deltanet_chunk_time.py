"""The DeltaNet delta rule of a prompt batch, token-serial (wgsl/deltanet_rule.wgsl) against chunked
(wgsl/deltanet_chunk_*.wgsl), on the qwen35-4b shape (16 K-heads, 32 V-heads, d_k = d_v = 128), one
slot from position 0, on whatever adapter is present:

    python perf/deltanet_chunk_time.py                 # T = 512, 24 reps (a layer each) per pass
    DN_T=8,16,32,64,128 python perf/deltanet_chunk_time.py   # where the chunked path starts to win (CHUNK_ROWS)
    DN_T=2048 DN_SLOTS=4 python perf/deltanet_chunk_time.py
    DN_SMALL=1 python perf/deltanet_chunk_time.py      # a smoke run (lavapipe): T = 64, 2 reps
    INFR_DEVICE=N / --backend-less: the adapter as infr picks it; DN_FLAVOR=dawn for Dawn

Each path is timed as rule_dispatches builds it (qknorm, the rule or the chunked passes, the gated
norm) and alone (the rule, or index + intra + state): reps of it encoded in one compute pass, from
submit to a read of the output (perf/timing.py), best of 3 after a warm-up. Prints us per layer and
the outputs' largest difference (the two paths must agree). With DN_SLOTS > 1 the rows are split
over that many slots, each slot's rows contiguous.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import seconds_per_rep

from infr.gpu import kernels_deltanet as KDN
from infr.gpu import kernels_misc as KS
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, read, run, storage
from infr.models.spec import DeltaNetSpec

SMALL = bool(os.environ.get("DN_SMALL"))
TS = [int(t) for t in (os.environ.get("DN_T") or ("64" if SMALL else "512")).split(",")]
SLOTS = int(os.environ.get("DN_SLOTS") or 1)
REPS = 2 if SMALL else int(os.environ.get("DN_REPS") or 24)
F32 = np.float32


def main() -> None:
    dev = get_device(flavor=os.environ.get("DN_FLAVOR", "wgpu"))
    k = Kernels(dev)
    for T in TS:
        time_rows(dev, k, T)


def time_rows(dev, k, T: int) -> None:
    m = DeltaNetSpec(16, 32, 128, 128, 4)  # qwen35-4b's DeltaNet layers
    H = m.n_v_heads
    rng = np.random.default_rng(0)
    per = -(-T // SLOTS)
    slots = np.minimum(np.arange(T) // per, SLOTS - 1)
    pos = np.arange(T) - np.searchsorted(slots, slots)  # each slot from position 0
    live = storage(dev, KS.pack_state(0, T))
    rows = storage(dev, KS.pack_rows(pos, slots))
    u_host = rng.standard_normal((T, m.conv_dim)).astype(F32)
    u = storage(dev, u_host)
    beta = storage(dev, rng.standard_normal((T, H)).astype(F32))
    alpha = storage(dev, (3 * rng.standard_normal((T, H))).astype(F32))
    z = storage(dev, rng.standard_normal((T, H * m.d_v)).astype(F32))
    consts = storage(dev, np.concatenate([rng.standard_normal(H), -np.exp(rng.standard_normal(H)),
                                          1 + 0.1 * rng.standard_normal(m.d_v)]).astype(F32))
    rstate = storage(dev, 4 * SLOTS * m.state_floats)
    scratch = tuple(storage(dev, n) for n in KDN.chunk_scratch_sizes(m, SLOTS, T))
    print(f"{dev.info.get('device', '?')} ({dev.flavor}): qwen35-4b DeltaNet, T = {T}, {SLOTS} slot(s), "
          f"{REPS} reps a pass")
    outs = {}
    for name, chunk in (("token-serial", False), ("chunked", True)):
        o = storage(dev, 4 * T * H * m.d_v)
        dst = storage(dev, 4 * T * H * m.d_v)
        ds = KDN.rule_dispatches(k, u, beta, alpha, z, consts, live, rows, rstate, o, dst, m, 1e-6, SLOTS, T,
                                 chunk=chunk, scratch=scratch)
        # qknorm normalises u in place (idempotent after the first pass); the rule alone follows it
        core = [d for d in ds if not d.label.startswith(("deltanet_qknorm", "deltanet_norm"))]
        run(dev, ds)
        outs[name] = read(dev, dst, F32, T * H * m.d_v)
        full = seconds_per_rep(dev, [ds], REPS, dst)
        alone = seconds_per_rep(dev, [core], REPS, o)
        print(f"  {name:13s} {alone * 1e6:9.1f} us a layer alone ({', '.join(d.label for d in core)}); "
              f"{full * 1e6:9.1f} us with qknorm and the norm")
        if len(core) > 1:  # each pass alone (its inputs stand from the run above): where the time goes
            print("      " + "; ".join(f"{d.label.split()[0]} {seconds_per_rep(dev, [[d]], REPS, o) * 1e6:.1f} us"
                                     for d in core))
        dev.device.queue.write_buffer(u, 0, u_host)
    a, b = outs["token-serial"], outs["chunked"]
    print(f"  largest difference of the outputs: {np.abs(a - b).max() / np.abs(a).max():.2e} of the largest value")


if __name__ == "__main__":
    main()
