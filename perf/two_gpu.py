"""The two-GPU run (issue 18): what a second GPU buys infr, in one JSON.

    source .gpu/setup.sh && python3 perf/two_gpu.py --out $OUT/two-gpu.json     # the two-H200 machine

1. One GPU: the 8B Q4_K_M-mix synthetic model (synth:llama-3.1-8b), infr.bench's pp512 and tg128
   (a warm-up dropped, --reps timed) and the greedy tokens (--greedy, 32) after a fixed 16-token prompt.
2. Layer split: the same with `--split-mode layer --tensor-split 1,1`; records tg128 split/one and
   whether the greedy tokens are identical. Bars: tg128 >= 0.9x one GPU, the same tokens.
3. Two replicas: `infr cluster` serving the 1B (synth:llama-3.2-1b) with --replicas 2 --num-gpus 1
   (one GPU each) against --replicas 1: aggregate generated tokens/s at --streams (32,64) concurrent
   streams, measured by perf/serve_throughput.py's client. Bar: two >= 1.8x one at 32 streams.
   Needs ray (pip install -e ".[cluster]"); without it part 3 records {"error": "ray not installed"}.

Bars are reported as booleans, never asserted. With one adapter (lavapipe here) the split runs as
two devices of it and the replicas share it, as infr itself does: a smoke run, not a measurement:

    python perf/two_gpu.py --model-8b synth:tiny-llama --model-1b synth:tiny-llama --backend gpu \\
        --tokens 8 --prompt 32 --greedy 8 --reps 1 --streams 2,4 --out /tmp/two-gpu.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(HERE))  # serve_throughput, the sibling script whose load generator part 3 reuses

from infr import bench  # noqa: E402  (the checkout's infr, put on the path above)
from infr.split import SplitOptions  # noqa: E402

PROMPT_LEN = 16


def fixed_prompt(n_vocab: int, n: int = PROMPT_LEN) -> list[int]:
    """The same token ids for every configuration (a synth model has no meaningful text)."""
    return [(7 + 131 * i) % n_vocab for i in range(n)]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def adapters(backend: str) -> dict:
    """The distinct adapters infr would split over or give replicas (gpu_adapters), by name."""
    from infr.gpu.device import gpu_adapters, list_adapters

    flavor = "dawn" if backend == "dawn" else "wgpu"
    try:
        listed = list_adapters(flavor)
        return {"flavor": flavor, "adapters": [f"{listed[i].info.get('device', '?')} "
                                               f"({listed[i].info.get('backend_type', '?')})"
                                               for i in gpu_adapters(flavor)]}
    except Exception as e:  # no adapter at all: the CPU backend may still run parts 1 and 2
        return {"flavor": flavor, "error": repr(e)}


def engine_run(path: Path, backend: str, split: SplitOptions | None, args) -> dict:
    """infr.bench's tests in-process (its own functions, so the numbers mean what its tables do),
    then the greedy tokens of the fixed prompt through the same engine."""
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    tests = [bench.Test(n_prompt=args.prompt), bench.Test(n_gen=args.tokens)]
    n_ctx = max(max(t.n_ctx for t in tests), PROMPT_LEN + args.greedy + 1)
    model, load_s = bench.load_model(path, backend, n_ctx, split=split)
    try:
        out = {"backend": model.backend_name, **bench.backend_info(model.backend, model.backend_name),
               **bench.split_info(split or SplitOptions()), "load_seconds": round(load_s, 3)}
        for test in tests:
            s = bench.stats(test, bench.time_test(model, test, args.reps))
            out[test.name] = {k: s[k] for k in ("avg_ts", "stddev_ts", "samples_ts")}
            print(f"  {test.name}: {s['avg_ts']:.2f} t/s", file=sys.stderr)
        prompt = fixed_prompt(model.spec.n_vocab)
        req = Request(prompt, SamplingParams(temperature=0.0), max_new=args.greedy, ignore_eos=True)
        model.engine.submit(req)
        model.engine.run_until(lambda: req.done)
        out["greedy"] = {"prompt": prompt, "tokens": list(req.output), "finish_reason": req.finish_reason}
        return out
    finally:
        del model
        gc.collect()  # the weights' buffers go before the next configuration loads


def part_split(args, backend: str) -> dict:
    path = bench.model_path(args.model_8b)
    res: dict = {"model": args.model_8b, "file": path.name}
    for key, split in (("one_gpu", None), ("layer_split", SplitOptions.read("layer", "1,1"))):
        print(f"{key}: {args.model_8b}", file=sys.stderr)
        try:
            res[key] = engine_run(path, backend, split, args)
        except Exception as e:  # keep what the other configuration measured
            res[key] = {"error": repr(e)}
    one, two, tg = res["one_gpu"], res["layer_split"], f"tg{args.tokens}"
    r = ratio(two.get(tg, {}).get("avg_ts"), one.get(tg, {}).get("avg_ts"))
    same = "greedy" in one and "greedy" in two and one["greedy"]["tokens"] == two["greedy"]["tokens"]
    res[f"{tg}_ratio_split_over_one"] = r
    res[f"pp{args.prompt}_ratio_split_over_one"] = ratio(two.get(f"pp{args.prompt}", {}).get("avg_ts"),
                                                        one.get(f"pp{args.prompt}", {}).get("avg_ts"))
    res["greedy_identical"] = same
    res["bars"] = {"tg_at_least_0.9x": r is not None and r >= 0.9, "same_greedy_tokens": same}
    return res


def part_replicas(args, backend: str, streams: list[int]) -> dict:
    if importlib.util.find_spec("ray") is None:
        return {"error": "ray not installed"}
    import serve_throughput as st

    path = bench.model_path(args.model_1b)
    parallel = args.parallel or max(streams)
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    res: dict = {"model": args.model_1b, "file": path.name, "parallel_per_replica": parallel, "ctx": args.ctx,
                 "tokens_per_stream": args.tokens, "sampling": dict(st.SAMPLING)}
    for n in (1, 2):
        port = st._port()
        # the client sends model "m": serve the file under that id (the ingress routes by it strictly)
        cmd = [sys.executable, "-m", "infr", "cluster", f"m={path}", "--replicas", str(n), "--num-gpus", "1",
               "--backend", backend, "--parallel", str(parallel), "--ctx", str(args.ctx),
               "--kv-size", str(args.ctx * parallel), "--port", str(port), "--drain", "5"]
        key = f"replicas_{n}"
        print(f"{key}: infr cluster --replicas {n} --num-gpus 1 --backend {backend}", file=sys.stderr)
        try:
            # starts it, waits for /health, warms it, runs the rounds, stops it with SIGTERM
            log = logs / f"two-gpu-cluster-{n}.log"
            res[key] = {"command": " ".join(cmd[2:]), "log": str(log),
                        "rounds": st.measure(cmd, f"http://127.0.0.1:{port}", streams, args.tokens, log)}
        except (Exception, SystemExit) as e:  # st._wait exits with the server's log tail
            res[key] = {"error": str(e)[-3000:]}
    agg = {k: {r["streams"]: r["aggregate_tps"] for r in res[k].get("rounds", [])}
           for k in ("replicas_1", "replicas_2")}
    res["ratio_two_over_one"] = {str(s): ratio(agg["replicas_2"].get(s), agg["replicas_1"].get(s)) for s in streams}
    at = 32 if 32 in streams else streams[0]  # the bar is at 32; a smoke run's first count stands in
    bar = res["ratio_two_over_one"].get(str(at))
    res["bars"] = {f"two_at_least_1.8x_at_{at}_streams": bar is not None and bar >= 1.8}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="auto", help="auto|gpu|dawn (every part; default auto)")
    ap.add_argument("--model-8b", default="synth:llama-3.1-8b", help="parts 1 and 2's model")
    ap.add_argument("--model-1b", default="synth:llama-3.2-1b", help="part 3's model")
    ap.add_argument("--tokens", type=int, default=128, help="tgN of parts 1-2; tokens per stream in part 3")
    ap.add_argument("--prompt", type=int, default=512, help="ppN of parts 1-2")
    ap.add_argument("--greedy", type=int, default=32, help="greedy tokens after the fixed 16-token prompt")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of each bench test")
    ap.add_argument("--streams", default="32,64", help="concurrent streams of part 3")
    ap.add_argument("--parallel", type=int, default=0, help="sequences per replica (default: the most streams)")
    ap.add_argument("--ctx", type=int, default=512, help="context per sequence of part 3's replicas")
    ap.add_argument("--skip-split", action="store_true", help="skip parts 1 and 2")
    ap.add_argument("--skip-replicas", action="store_true", help="skip part 3")
    ap.add_argument("--out", type=Path, default=None, help="default $OUT/two-gpu.json, else perf/two-gpu.json")
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    out = args.out or Path(os.environ.get("OUT") or HERE) / "two-gpu.json"
    from infr.backends import choose_backend

    backend, note = choose_backend(args.backend)  # once, so every part runs the same one
    result = {"command": " ".join(["python3", "perf/two_gpu.py"] + sys.argv[1:]),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
              "build_commit": bench.build_info()[0], "backend": backend, "backend_note": note,
              **adapters(backend)}
    if len(result.get("adapters", [])) < 2:
        result["note"] = "fewer than two adapters: the split runs as devices of one adapter, the replicas share it"

    def save() -> None:  # after every part: a later part's failure keeps the earlier numbers
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")

    t0 = time.perf_counter()
    if not args.skip_split:
        result["split"] = part_split(args, backend)
        save()
    if not args.skip_replicas:
        result["replicas"] = part_replicas(args, backend, streams)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    save()
    print(json.dumps(result, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
