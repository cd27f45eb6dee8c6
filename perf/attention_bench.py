"""Attention kernel timings: split-K decode and tiled prefill against the
one-workgroup-per-(head, token) kernel they replace.

    python3 perf/attention_bench.py                  # H200: 8B shape, decode at 512/4096/16384, prefill T=512
    ATTN_SMALL=1 python3 perf/attention_bench.py     # a smoke run in seconds on lavapipe
    INFR_ATTN_CHUNK=256 python3 perf/attention_bench.py   # another split-K chunk size

Shape: Llama-3.1-8B's attention (32 query heads, 8 kv heads, head_dim 128).
Each measurement encodes REPS calls in one compute pass, rotating over enough
copies of the KV cache (> 300 MB, like 32 layers' caches) that they cannot
sit in L2, and times the submit from the host: µs per call, launch included.
Decode calls include every dispatch of the lowering (split-K: scores, values,
combine). Prefill is T=512 queries at positions [depth, depth + 512).

The KV cache is paged (docs/gpu_kernels.md): "decode" and "prefill" run one
sequence over the identity block table (the numbers to hold against earlier
runs); "decode_scrambled" the same decode over a random permutation of the
blocks (the block-table reads should cost nothing); "batched_decode" one row
for each of R sequences at the same depth, their blocks interleaved, as a
batched decode step of the engine runs (split-K's grid grows with R).
Writes attention-bench.json to $OUT (or perf/).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import seconds_per_rep

from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_misc as KS
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, storage

SMALL = bool(os.environ.get("ATTN_SMALL"))
N_HEADS, KV_HEADS, HD = (8, 2, 64) if SMALL else (32, 8, 128)
DECODE_DEPTHS = [100, 300] if SMALL else [512, 4096, 16384]
PREFILL = [(37, 0), (37, 200)] if SMALL else [(512, 0), (512, 4096)]  # (T, depth)
BATCHED = ([4, 8], 300) if SMALL else ([8, 64], 4096)  # (rows R = sequences, depth)
BS = KS.BLOCK_SIZE
REPS = 4 if SMALL else 100
L2_BYTES = 2 * 2**20 if SMALL else 300 * 2**20


def _time(dev, dispatch_sets: list[list], sink) -> float:
    """µs per call: REPS calls in one pass, rotating over the sets (cache copies)."""
    return seconds_per_rep(dev, dispatch_sets, REPS, sink) * 1e6


def main() -> None:
    dev = get_device()
    kern = Kernels(dev)
    rng = np.random.default_rng(0)
    n_ctx = max(DECODE_DEPTHS + [d + T for T, d in PREFILL]) + 1
    cache_bytes = n_ctx * KV_HEADS * HD * 2
    copies = max(2, -(-L2_BYTES // (2 * cache_bytes)))
    kc = rng.standard_normal((n_ctx, KV_HEADS, HD)).astype(np.float16).view(np.uint32)
    vc = rng.standard_normal((n_ctx, KV_HEADS, HD)).astype(np.float16).view(np.uint32)
    caches = [(storage(dev, kc), storage(dev, vc)) for _ in range(copies)]
    T_max = max(T for T, _ in PREFILL)
    q = storage(dev, (rng.standard_normal(T_max * N_HEADS * HD) * 2).astype(np.float32))
    out = storage(dev, T_max * N_HEADS * HD * 4)
    pg = KS.single_sequence(dev, 0, T_max, n_ctx, BS)  # rows for the longest batch
    n_blocks = pg.blocks_per_seq
    scrambled = KS.Paging(pg.state, pg.rows, storage(dev, rng.permutation(n_blocks).astype(np.uint32)), BS,
                          n_blocks)
    scale = 1.0 / np.sqrt(HD)
    shape = (N_HEADS, KV_HEADS, HD, HD, scale, None, None)
    scratch = KA.split_scratch(kern, 1, n_ctx, N_HEADS, HD)
    res = {"adapter": dev.name, "date": dt.date.today().isoformat(), "small": SMALL, "n_ctx": n_ctx,
           "shape": {"n_heads": N_HEADS, "kv_heads": KV_HEADS, "head_dim": HD}, "chunk": scratch.chunk,
           "cache_copies": copies, "block_size": BS, "decode": [], "decode_scrambled": [], "prefill": [],
           "batched_decode": []}

    for key, paging in (("decode", pg), ("decode_scrambled", scrambled)):
        split = [KA.split_dispatches(kern, q, k, v, out, paging, scratch, *shape, 1) for k, v in caches]
        old = [[KS.attention_dispatch(kern, q, k, v, out, paging, *shape, 1)] for k, v in caches]
        for depth in DECODE_DEPTHS:
            KS.write_rows(dev, paging, [depth], [0])  # KV length depth + 1
            row = {"depth": depth, "split_k_us": _time(dev, split, out), "one_pass_us": _time(dev, old, out)}
            res[key].append(row)
            print(f"{key} d{depth}: split-K {row['split_k_us']:.1f} us (chunk {scratch.chunk}), "
                  f"one-pass {row['one_pass_us']:.1f} us", flush=True)
    for T, depth in PREFILL:
        KS.write_rows(dev, pg, np.arange(depth, depth + T), 0)
        tiled = [[KA.tiled_dispatch(kern, q, k, v, out, pg, *shape, T)] for k, v in caches]
        old_p = [[KS.attention_dispatch(kern, q, k, v, out, pg, *shape, T)] for k, v in caches]
        row = {"T": T, "depth": depth, "tiled_us": _time(dev, tiled, out), "one_pass_us": _time(dev, old_p, out)}
        res["prefill"].append(row)
        print(f"prefill T={T} d{depth}: tiled {row['tiled_us']:.1f} us, one-pass {row['one_pass_us']:.1f} us",
              flush=True)
    rows_list, depth = BATCHED
    for R in rows_list:
        res["batched_decode"].append(_batched(dev, kern, rng, R, depth, scale))
    Path(os.environ.get("OUT") or Path(__file__).parent, "attention-bench.json").write_text(json.dumps(res, indent=1))


def _batched(dev, kern, rng, R: int, depth: int, scale: float) -> dict:
    """One decode row for each of R sequences at `depth`, blocks of all of them interleaved in one pool."""
    bps = -(-(depth + 1) // BS)
    n_blocks = R * bps
    table = rng.permutation(n_blocks).astype(np.uint32)  # slot s: entries [s * bps, (s + 1) * bps)
    rows = n_blocks * BS
    kc = storage(dev, rows * KV_HEADS * HD * 2)  # contents do not change the time; zeros are finite
    vc = storage(dev, rows * KV_HEADS * HD * 2)
    pg = KS.Paging(storage(dev, KS.pack_state(depth, R)), storage(dev, KS.pack_rows([depth] * R, np.arange(R))),
                   storage(dev, table), BS, bps)
    q = storage(dev, (rng.standard_normal(R * N_HEADS * HD) * 2).astype(np.float32))
    out = storage(dev, R * N_HEADS * HD * 4)
    shape = (N_HEADS, KV_HEADS, HD, HD, scale, None, None, R)
    scratch = KA.split_scratch(kern, R, bps * BS, N_HEADS, HD)
    split = [KA.split_dispatches(kern, q, kc, vc, out, pg, scratch, *shape)]
    one = [[KS.attention_dispatch(kern, q, kc, vc, out, pg, *shape)]]
    row = {"rows": R, "depth": depth, "split_k_us": _time(dev, split, out), "one_pass_us": _time(dev, one, out),
           "split_k_grid": list(split[0][0].groups)}
    print(f"batched decode R={R} d{depth}: split-K {row['split_k_us']:.1f} us (grid {row['split_k_grid']}), "
          f"one-pass {row['one_pass_us']:.1f} us", flush=True)
    return row


if __name__ == "__main__":
    main()
