"""The int8 GEMM (wgsl/gemm_mmq.wgsl, "mmq") per weight type and tile on Llama-3.1-8B prefill shapes.

    source .gpu/setup.sh && python3 perf/mmq_bench.py --types all --sweep default --out perf/h200/mmq-sweep.json
    python3 perf/mmq_bench.py --types Q4_K,Q6_K --sweep "128,64,4,8 128,64,4,8,2,1" --gemv --out mmq.json
    python3 perf/mmq_bench.py --types Q4_K,Q6_K --scale 16 --T 70 --out /tmp/mmq.json     # lavapipe smoke run

Shapes (N x K): q/o 4096x4096, gate||up 14336x4096 (the fused pair: two
matrices, act(gate) * up), down 4096x14336 (with the fused residual add) and
q|k|v 6144x4096 (4096 + 1024 + 1024 rows stacked, one dispatch), and k/v 1024x4096 (one alone: a
Q6_K v beside Q4_K q and k); --shapes picks some (qo,gateup,down,qkv,kv; default all but kv). --scale s divides N and K by s (K kept
whole 256-value groups). Every (type, tile, shape) is timed: the kernel
reads random rounded activations (no quantize dispatch) and random valid
blocks, built once per type and shape; each measurement encodes --reps
products in one pass, rotating over copies of the weights (> 128 MB in all,
twice the H200's L2), timed from the host (timing.seconds_per_rep). The
rate is TOPS: int8 multiply-adds x 2 per second (2 T N K per matrix).

--sweep: "auto" (default: the tile kernels_mmq.MmqTuning picks for each
shape), "default" (SWEEP, below: the tiles worth trying on an H200), or a
list "BN,BT,RM,RT[,SUB[,PREFETCH[,UNCHECKED]]] ..." (kernels_mmq.MmqTile;
SUB 0: the largest that fits). Tiles that do not fit the device are
reported and skipped. --max-seconds (default 220) stops the sweep there and
lists what was left: the whole default sweep of every type is sized to end
inside 4 minutes on the H200. The JSON (--out) holds every measurement and,
per type, each tile's TOPS per shape and the tile with the least total time.
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

from gemm_bench import random_rows  # perf/ is on sys.path (the script's directory)
from gguf import GGMLQuantizationType as Q
from timing import seconds_per_rep

from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_q8 as KQ
from infr.gpu.device import get_device
from infr.gpu.runtime import Kernels, storage

SHAPES = [  # (key, label, N, K, kind, stacked row counts)
    ("qo", "8B q/o", 4096, 4096, "plain", None),
    ("gateup", "8B gate+up", 14336, 4096, "pair", None),
    ("down", "8B down", 4096, 14336, "resid", None),
    ("qkv", "8B qkv", 6144, 4096, "stacked", (4096, 1024, 1024)),
    ("kv", "8B k/v", 1024, 4096, "plain", None),  # k or v alone: where v's type differs from q's (the Q4_K_M mix)
]

# The tiles a full H200 sweep tries (each fits 48 KB of workgroup memory): 256 invocations with
# 32 sums each in both orientations, smaller and larger tiles, SUB 2 / 4 / 8, both double-buffered
# modes, and the default tile without wgpu's runtime checks.
SWEEP = "128,64,4,8 128,64,8,4 64,128,4,8 64,64,4,4 128,128,8,8,2 128,64,4,8,2,1 128,64,4,8,2,2 64,64,4,4,4,1 128,64,4,8,0,0,1"


class _Tensor:
    def __init__(self, q: Q, N: int, K: int, raw: np.ndarray, name: str):
        self.qtype, self.shape, self.raw, self.name = q, (N, K), raw, name


def _scaled(n: int, s: int, block: int) -> int:
    return max(block, n // s // block * block)


class Case:
    """One type on one shape: weights (copies), rounded activations and outputs on the device."""

    def __init__(self, dev, q: Q, key, label, N, K, kind, parts, T, copies, rng):
        self.q, self.key, self.label, self.N, self.K, self.kind, self.parts, self.T = q, key, label, N, K, kind, parts, T
        # Rounded activations: random q bytes, each 32-value block's (d, d * sum q) small floats.
        words = np.zeros((T, KQ.words(K)), np.uint32)
        words[:, : K // 4] = rng.integers(0, 1 << 32, (T, K // 4), dtype=np.uint64).astype(np.uint32)
        words[:, K // 4 :] = np.full((T, K // 16), 0.01, np.float32).view(np.uint32)
        self.xq = storage(dev, words)
        self.y = storage(dev, 4 * T * N)
        self.resid = storage(dev, 4 * T * N) if kind == "resid" else None
        self.ys = [storage(dev, 4 * T * n) for n in parts] if parts else None
        self.weights = []  # per copy: (tensors, chunks)
        for _ in range(copies):
            if kind == "stacked":
                ts = [_Tensor(q, n, K, random_rows(rng, q, n, K), f"{label}{i}") for i, n in enumerate(parts)]
                self.weights.append((ts, [KM.upload_stacked(dev, ts, label=label)]))
            elif kind == "pair":
                ts = [_Tensor(q, N, K, random_rows(rng, q, N, K), n) for n in ("gate", "up")]
                self.weights.append((ts, [KM.upload_weight(dev, t) for t in ts]))
            else:
                t = _Tensor(q, N, K, random_rows(rng, q, N, K), label)
                self.weights.append(([t], [KM.upload_weight(dev, t)]))

    @property
    def ops(self) -> int:
        return 2 * self.T * self.N * self.K * (2 if self.kind == "pair" else 1)

    def mmq(self, kern, tile) -> list[list]:
        x = self.xq
        out = []
        for ts, cs in self.weights:
            if self.kind == "stacked":
                out.append(KMQ.stacked_dispatches(kern, ts, cs[0], x, self.ys, None, self.T, tile=tile))
            elif self.kind == "pair":
                out.append(KMQ.gate_up_dispatches(kern, ts[0], ts[1], cs[0], cs[1], x, self.y, "silu", self.T,
                                                  tile=tile))
            else:
                out.append(KMQ.mmq_dispatches(kern, ts[0], cs[0], x, self.y, None, self.T, resid=self.resid,
                                              tile=tile))
        return out

    def gemv(self, kern) -> list[list] | None:
        """The batched GEMV (the kernels a batch runs without mmq); a pair as two
        plain GEMVs where the type has no fused one; None for a stack it cannot run."""
        x = storage(kern.dev, np.full((self.T, self.K), 0.01, np.float32))
        out = []
        for ts, cs in self.weights:
            if self.kind == "pair" and KM.can_fuse_gate_up(ts[0], ts[1], cs[0], cs[1]):
                ds = KM.gate_up_dispatches(kern, ts[0], ts[1], cs[0], cs[1], x, self.y, "silu", self.T, xq=self.xq)
            elif self.kind == "stacked":
                if not KM.can_stack(ts, kern.dev.max_binding):
                    return None
                ds = KM.stacked_dispatches(kern, ts, cs[0], x, self.ys, None, self.T, xq=self.xq)
            else:
                ds = [d for t, c in zip(ts, cs)
                      for d in KM.matmul_dispatches(kern, t, c, x, self.y, None, self.T, resid=self.resid, xq=self.xq)]
            out.append(ds)
        return out

    def gemm(self, kern) -> list[list]:
        """The f32 GEMM (kernels_gemm: the batch kernel of CPU adapters without mmq)."""
        x = storage(kern.dev, np.full((self.T, self.K), 0.01, np.float32))
        out = []
        for ts, cs in self.weights:
            if self.kind == "stacked":
                out.append(KG.stacked_gemm_dispatches(kern, ts, cs[0], x, self.ys, None, self.T))
            else:
                out.append([d for t, c in zip(ts, cs) for d in
                            KG.gemm_dispatches(kern, t, c, x, self.y, None, self.T, resid=self.resid)])
        return out


def _types(spec: str) -> list[Q]:
    if spec == "all":
        return list(KMQ.READERS)
    qs = [Q[s.strip().upper()] for s in spec.split(",")]
    bad = [q.name for q in qs if q not in KMQ.READERS]
    if bad:
        raise SystemExit(f"no mmq reader for {', '.join(bad)}; readers: {', '.join(q.name for q in KMQ.READERS)}")
    return qs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K", help='comma list of weight types, or "all" (every mmq reader)')
    ap.add_argument("--sweep", default="auto", help='"auto", "default" (SWEEP) or "BN,BT,RM,RT[,SUB[,PREFETCH[,UNCHECKED]]] ..."')
    ap.add_argument("--shapes", default="qo,gateup,down,qkv", help="which 8B shapes (qo, gateup, down, qkv, kv)")
    ap.add_argument("--T", type=int, default=512, help="tokens per batch")
    ap.add_argument("--scale", type=int, default=1, help="divide N and K by this (a small run on lavapipe)")
    ap.add_argument("--reps", type=int, default=0, help="products per timed pass (default 10; 2 when scaled)")
    ap.add_argument("--best-of", type=int, default=0, help="timed passes per measurement (default 2; 1 when scaled)")
    ap.add_argument("--max-seconds", type=float, default=220.0, help="stop the sweep after this long (partial JSON)")
    ap.add_argument("--gemv", action="store_true", help="also time the batched GEMV once per type and shape")
    ap.add_argument("--gemm", action="store_true", help="also time the f32 GEMM (kernels_gemm: lavapipe's batch kernel)")
    ap.add_argument("--flavor", default="wgpu", help="WebGPU implementation: wgpu or dawn (the Dawn tier)")
    ap.add_argument("--mma", default="", help='tensor-core tiles (Dawn; kernels_mma.MmaTile) '
                                             '"BN,BT,SUB,SGR,SGT[,PAD[,XC[,WC[,KP[,VW]]]]] ..." '
                                             'timed instead of --sweep\'s, or "auto" (the tile the engine picks)')
    ap.add_argument("--mma-phases", default="", help='"convert" or "products": time one part of the tensor-core '
                                                     'kernel alone (its results are wrong)')
    ap.add_argument("--out", required=True, help="where the JSON goes")
    args = ap.parse_args()
    t_start = time.perf_counter()
    dev = get_device(flavor=args.flavor)
    kern = Kernels(dev)
    small = args.scale > 1
    reps = args.reps or (2 if small else 10)
    best_of = args.best_of or (1 if small else 2)
    sweep = SWEEP if args.sweep == "default" else args.sweep
    tiles = None if sweep == "auto" else [KMQ.MmqTile.parse(s) for s in sweep.split()]
    if args.mma_phases:
        KMA.PHASES = tuple(args.mma_phases.split(","))
    if args.mma and args.mma != "auto":
        tiles = [KMA.MmaTile.parse(s) for s in args.mma.split()]
    types = _types(args.types)
    keys = args.shapes.split(",")
    out = {"adapter": dev.name, "date": dt.date.today().isoformat(), "command": " ".join(sys.argv), "T": args.T,
           "scale": args.scale, "reps": reps, "best_of": best_of, "results": [], "skipped": [], "summary": {}}
    rng = np.random.default_rng(0)

    def save() -> None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))

    timed_out = False
    for q in types:
        if time.perf_counter() - t_start > args.max_seconds:
            timed_out = True
            out["skipped"].append({"type": q.name, "shape": "all", "tile": "all"})
            continue
        cases = []
        for key, label, N, K, kind, parts in SHAPES:
            if key not in keys:
                continue
            if small:
                N, K = _scaled(N, args.scale, 64), _scaled(K, args.scale, 256)
                parts = parts and tuple(_scaled(n, args.scale, 16) for n in parts)
                N = sum(parts) if parts else N
            nbytes = N * KM.row_bytes(q, K) * (2 if kind == "pair" else 1)
            copies = 1 if small else max(1, min(4, -(-128_000_000 // nbytes)))
            cases.append(Case(dev, q, key, label, N, K, kind, parts, args.T, copies, rng))
        for case in cases:
            for what, on in (("gemv", args.gemv), ("gemm", args.gemm)):
                groups = getattr(case, what)(kern) if on else None
                if groups is not None:
                    sec = seconds_per_rep(dev, groups, reps, case.y, best_of=best_of)
                    r = {"type": q.name, "shape": case.label, "N": case.N, "K": case.K, "T": args.T,
                         "kind": case.kind, "kernel": what, "ms": sec * 1e3, "tops": case.ops / sec / 1e12}
                    out["results"].append(r)
                    print(f"{q.name:6} {case.label:11} {case.N}x{case.K} {what}: {r['ms']:.3f} ms "
                          f"{r['tops']:.3g} TOPS", flush=True)
        for tile in tiles or [None]:
            for case in cases:
                if time.perf_counter() - t_start > args.max_seconds:
                    timed_out = True
                    out["skipped"].append({"type": q.name, "shape": case.label, "tile": tile.spec if tile else "auto"})
                    continue
                pair = case.kind == "pair"
                try:
                    if isinstance(tile, KMA.MmaTile):
                        if not (KMA.available(dev) and tile.fits(dev, KMQ.READERS[q], pair)):
                            raise ValueError(f"tensor-core tile {tile.spec} does not run here")
                        t = tile
                    else:
                        t = (tile.resolved(dev, KMQ.READERS[q]) if tile else
                             KMA.tile_for(dev, case.N, args.T, KMQ.READERS[q], pair, qtype=KM.wgsl_name(q)) if args.mma == "auto" else
                             KMQ.device_tuning(dev).tile_for(dev, q, case.N, args.T, pair))
                        if t is None:
                            raise ValueError("no tensor-core tile runs here")
                except ValueError as e:
                    spec = tile.spec if tile else "auto"
                    if case is cases[0]:
                        print(f"{q.name:6} tile {spec}: skipped ({e})", flush=True)
                    out["skipped"].append({"type": q.name, "shape": case.label, "tile": spec, "why": str(e)})
                    continue
                sec = seconds_per_rep(dev, case.mmq(kern, t), reps, case.y, best_of=best_of)
                r = {"type": q.name, "shape": case.label, "N": case.N, "K": case.K, "T": args.T, "kind": case.kind,
                     "kernel": "mmq", "tile": t.spec, "asked": tile.spec if tile else "auto",
                     "ms": sec * 1e3, "tops": case.ops / sec / 1e12}
                out["results"].append(r)
                print(f"{q.name:6} {case.label:11} {case.N}x{case.K} T={args.T} mmq {t.spec:18}: {r['ms']:.3f} ms "
                      f"{r['tops']:.3g} TOPS", flush=True)
        out["summary"][q.name] = _summary([r for r in out["results"] if r["type"] == q.name and r["kernel"] == "mmq"],
                                          len(cases))
        best = out["summary"][q.name].get("best")
        if best:
            print(f"{q.name:6} best tile {best['tile']}: {best['ms']:.3f} ms over the shapes, "
                  f"{best['tops']:.3g} TOPS", flush=True)
        save()
        del cases  # frees the type's weights before the next type's
    if timed_out:
        print(f"stopped at --max-seconds {args.max_seconds:g}: {len(out['skipped'])} measurements skipped", flush=True)
    out["seconds"] = time.perf_counter() - t_start
    save()
    _table(out["summary"], [c[1] for c in SHAPES if c[0] in keys])


def _table(summary: dict, labels: list[str]) -> None:
    """TOPS per type, tile and shape, the best tile of each type marked *."""
    print(f"\n{'type':6} {'tile':18} " + " ".join(f"{lb[3:]:>8}" for lb in labels) + "    all")
    for name, sm in summary.items():
        best = (sm.get("best") or {}).get("tile")
        for t in sm["tiles"]:
            cells = " ".join(f"{t['tops_by_shape'][lb]:8.3g}" if lb in t["tops_by_shape"] else f"{'-':>8}" for lb in labels)
            print(f"{name:6} {t['tile']:18} {cells} {t['tops']:6.3g}{' *' if t['tile'] == best else ''}")


def _summary(rows: list[dict], n_shapes: int) -> dict:
    """Per asked tile: TOPS per shape, total ms and TOPS over the shapes; `best`: the tile with
    the least total time among those measured on every shape."""
    by_tile: dict[str, dict] = {}
    for r in rows:
        e = by_tile.setdefault(r["asked"], {"tile": r["asked"], "tops": {}, "ms": 0.0, "ops": 0, "shapes": 0})
        e["tops"][r["shape"]] = r["tops"]
        e["ms"] += r["ms"]
        e["ops"] += r["tops"] * 1e12 * r["ms"] / 1e3
        e["shapes"] += 1
    tiles = []
    for e in by_tile.values():
        tiles.append({"tile": e["tile"], "tops_by_shape": e["tops"], "ms": e["ms"],
                      "tops": e["ops"] / (e["ms"] / 1e3) / 1e12 if e["ms"] else 0.0, "complete": e["shapes"] == n_shapes})
    complete = [t for t in tiles if t["complete"]]
    return {"tiles": tiles, "best": min(complete, key=lambda t: t["ms"]) if complete else None}


if __name__ == "__main__":
    main()
