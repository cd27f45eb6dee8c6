"""The grouped expert products of a MoE prompt batch (kernels_moe's MUL_MAT_ID path) per tile: the
int8 GEMM's expert tiles against the tensor cores' (gemm_mma.wgsl, INFR_MMA_EXPERTS), on one layer
of a real model's shape, without writing its GGUF (a 17 GB file takes minutes on a fresh machine).

    source .gpu/setup.sh && python3 perf/moe_grouped_time.py --flavor dawn --model qwen3-30b-a3b --T 512
    python3 perf/moe_grouped_time.py --model gemma4-26b-a4b --T 512 --mmq "128,64,4,8 64,32,4,4" --mma ""
    python3 perf/moe_grouped_time.py --scale 8 --T 64 --mma ""        # lavapipe smoke run

Per layer: gate||up (the pair: silu, or gemma4's table GELU; for gemma4 also "gate+up", the two
halves as plain products, as the engine ran them before stop 31, without its gated_gelu_f16 pass) from the rounded rows, and down from the rounded activations, over T tokens x n_used pairs
routed uniformly at random (each expert's share about T n_used / E pairs). Random valid blocks in the
model's Q4_K_M-mix types; the grouping dispatch runs once before the timed products. Each tile is
timed over --reps repetitions in one pass (perf/timing.seconds_per_rep); the rate is TOPS, 2 x
multiply-adds of the pairs' products per second. --mmq / --mma: tile lists ("auto": the engine's
pick, also inside a list; "": none).
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

from infr.errors import UnsupportedError
from infr.gguf_file import Tensor
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_moe as KMoE
from infr.gpu import kernels_q8 as KQ
from infr.gpu import tuning as TU
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, run, storage
from infr.models.spec import Activation

# (n_embd, expert hidden, experts, used, gate_up type, down type, fused gate_up bank, table GELU)
MODELS = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, Q.Q4_K, Q.Q6_K, False, False),
    "gemma4-26b-a4b": (2816, 704, 128, 8, Q.Q4_K, Q.Q5_0, True, True),
}


def _bank(rng, q, E: int, N: int, K: int) -> Tensor:
    return Tensor(f"bank_{q.name.lower()}", q, (E, N, K), random_rows(rng, q, E * N, K))


def _tiles(spec: str, parse, auto):
    return [auto if s == "auto" else parse(s) for s in spec.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flavor", default="wgpu", help="wgpu or dawn")
    ap.add_argument("--model", default="qwen3-30b-a3b", choices=list(MODELS))
    ap.add_argument("--T", type=int, default=512, help="tokens in the batch")
    ap.add_argument("--scale", type=int, default=1, help="divide the widths by this (lavapipe smoke runs)")
    ap.add_argument("--mmq", default="auto", help="int8 tiles 'BN,BT,RM,RT[,...] ...', auto or ''")
    ap.add_argument("--mma", default="auto", help="tensor-core tiles 'BN,BT,SUB,SGR,SGT ...', auto or ''")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    dev = get_device(flavor=args.flavor)
    kern = Kernels(dev)
    n_embd, H, E, k, q_up, q_down, fused, table = MODELS[args.model]
    unit = max(64, KM.block_shape(q_down)[0])  # the down rows' blocks, whole 64s for the q8 rows
    n_embd, H = max(256, n_embd // args.scale // 256 * 256), max(unit, H // args.scale // unit * unit)
    T, A = args.T, args.T * k
    rng = np.random.default_rng(0)
    banks = {"gate_up": _bank(rng, q_up, E, 2 * H, n_embd)} if fused else {
        "gate": _bank(rng, q_up, E, H, n_embd), "up": _bank(rng, q_up, E, H, n_embd)}
    banks["down"] = _bank(rng, q_down, E, n_embd, H)
    chunks = {name: KMoE.upload_bank(dev, t) for name, t in banks.items()}
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).reshape(-1).astype(np.uint32)
    ids_buf = storage(dev, ids)
    x = rng.standard_normal((T, n_embd)).astype(np.float32)
    act = rng.standard_normal((A, H)).astype(np.float32) * 0.1
    dq, xq = KQ.quantize_dispatch(kern, storage(dev, x), n_embd, T, into=storage(dev, 4 * T * KQ.words(n_embd)))
    da, aq = KQ.quantize_dispatch(kern, storage(dev, act), H, A, into=storage(dev, 4 * A * KQ.words(H)))
    run(dev, [dq, da])
    y_up, y_down = storage(dev, 4 * A * H), storage(dev, 4 * A * n_embd)
    counts = np.bincount(ids, minlength=E)
    print(f"{args.model} / {args.scale}: T = {T}, {A} pairs, per expert mean {counts.mean():.1f} "
          f"max {counts.max()}; {dev.name}", flush=True)

    mma_on = KMA.available(dev)
    out = {"command": " ".join(sys.argv), "adapter": dev.name, "date": dt.datetime.now(dt.timezone.utc).isoformat(),
           "model": args.model, "scale": args.scale, "T": T, "pairs": A, "results": []}

    def products(tile, which: str) -> tuple[list, int]:
        """The dispatches of one product kind on `tile` (grouping included), and its multiply-adds."""
        sc = KMoE.Scratch(dev)
        g = KMoE.Groups(sc, E, A, tile.BT)
        ds = [KMoE.group_dispatch(kern, ids_buf, g, E, A)]
        if which == "down":
            ds += KMoE.grouped_matmul(kern, q_down, H, n_embd, chunks["down"], aq, y_down, A, g, tile)
            return ds, A * n_embd * H
        if which == "gate+up":  # gate and up apart, each half of the fused bank
            for h in (0, 1):
                ds += KMoE.grouped_matmul(kern, q_up, n_embd, H, chunks["gate_up"], xq, y_up, A, g, tile, x_div=k,
                                          half=h)
        else:
            ds += KMoE.grouped_matmul(kern, q_up, n_embd, H, chunks["gate_up" if fused else "gate"], xq, y_up, A,
                                      g, tile, x_div=k, act=Activation.GELU_F16 if table else Activation.SILU,
                                      chunks2=None if fused else chunks["up"], fused=fused)
        return ds, 2 * A * H * n_embd

    kinds = [("int8", KMQ.MmqTile.parse, args.mmq)] + ([("mma", KMA.MmaTile.parse, args.mma)] if mma_on else [])
    for which in ("gate_up",) + (("gate+up",) if table else ()) + ("down",):
        pair = which == "gate_up"
        for kind, parse, spec in kinds:
            if not spec:
                continue
            N = n_embd if which == "down" else H
            if kind == "int8":
                auto = KMQ.device_tuning(dev).expert_tile_for(dev, q_down if which == "down" else q_up, N, A, E, pair)
            else:
                t = TU.current().mma  # the expert tiles as kernels_mma.expert_tile_for takes them, whether or not on
                qn = KM.wgsl_name(q_down if which == "down" else q_up)
                auto = t.for_experts().tile_for(dev, N, -(-A // E), 0, pair, qtype=qn)
            for tile in _tiles(spec, parse, auto):
                if tile is None:
                    continue
                try:
                    ds, macs = products(tile, which)
                except (ValueError, RuntimeError, UnsupportedError) as e:  # a tile this device cannot hold
                    print(f"  {which:8} {kind} {tile.spec}: skipped ({e})", flush=True)
                    continue
                sec = seconds_per_rep(dev, [ds], args.reps, y_down if which == "down" else y_up)
                r = {"product": which, "kernel": kind, "tile": tile.spec, "ms": sec * 1e3, "tops": 2 * macs / sec / 1e12}
                out["results"].append(r)
                print(f"  {which:8} {kind:4} {tile.spec:22} {r['ms']:8.3f} ms  {r['tops']:6.3g} TOPS", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
