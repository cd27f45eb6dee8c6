"""`python -m infr.bench`: prompt processing and generation speed, llama-bench style.

    python -m infr.bench -m smollm2 -p 512 -n 128 -r 3
    python -m infr.bench -m synth:llama-3.2-1b:Q4_K -p 512 -n 128 --backend gpu -o json

`-p N` times one prefill of N tokens (pp t/s); `-n N` times N greedy decode
steps after a one-token prompt (tg t/s). A warm-up run of each test is
excluded; results are mean ± stddev over `-r` repetitions. Token ids are
random (speed does not depend on them), so models need no tokenizer.
`synth:PRESET:TYPE` writes a random-weight GGUF of a real shape once
(infr.synth) into infr's cache.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from infr.errors import InfrError


def model_path(ref: str) -> Path:
    if ref.startswith("synth:"):
        from infr import synth
        from infr.offline import cache_dir

        _, preset, *rest = ref.split(":")
        wtype = rest[0] if rest else None
        if preset not in synth.PRESETS:
            raise InfrError(f"unknown synthetic preset {preset!r}; known: {', '.join(sorted(synth.PRESETS))}")
        spec = synth.preset(preset, tokenizer="gpt2", **({"weight_type": wtype} if wtype else {}))
        out = cache_dir().parent / "synth" / f"{preset}-{spec.weight_type}.gguf"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".tmp")
            synth.write_gguf(spec, tmp)
            os.replace(tmp, out)
        return out
    from infr.store import resolve

    return resolve(ref)


def load_backend(path: Path, backend: str, n_ctx: int):
    from infr.backends import choose_backend, make_backend
    from infr.gguf_file import open_gguf
    from infr.models import build_spec
    from infr.plan import build_plan

    gf = open_gguf(path)
    plan = build_plan(build_spec(gf))
    name, note = choose_backend(backend)
    if note:
        print(f"infr: {note}", file=sys.stderr)
    t0 = time.perf_counter()
    be = make_backend(name, gf, plan, n_ctx)
    return gf, plan, be, name, time.perf_counter() - t0


def decode_greedy(be, token: int, start: int, n: int) -> list[int]:
    """n greedy steps; the GPU backend keeps tokens on the device."""
    if hasattr(be, "decode_greedy"):
        return be.decode_greedy(token, start, n)
    out = []
    for i in range(n):
        token = int(np.argmax(be.forward([token], start + i)[-1]))
        out.append(token)
    return out


def run_test(be, n_vocab: int, n_prompt: int, n_gen: int, reps: int, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    samples = []
    for rep in range(reps + 1):  # the first run warms up and is dropped
        ids = rng.integers(0, n_vocab, size=max(n_prompt, 1)).tolist()
        if n_prompt:
            t0 = time.perf_counter()
            be.forward(ids, 0)
            seconds = time.perf_counter() - t0
            rate = n_prompt / seconds
        else:
            be.forward(ids[:1], 0)
            t0 = time.perf_counter()
            decode_greedy(be, ids[0], 1, n_gen)
            seconds = time.perf_counter() - t0
            rate = n_gen / seconds
        if rep:
            samples.append(rate)
    return samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infr.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", default=None, help="path, offline name or synth:PRESET:TYPE")
    ap.add_argument("-p", "--n-prompt", default="512", help="prompt sizes, comma-separated (0 to skip)")
    ap.add_argument("-n", "--n-gen", default="128", help="generation lengths, comma-separated (0 to skip)")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu"])
    ap.add_argument("-o", "--output", default="md", choices=["md", "json"])
    ap.add_argument("--save", type=Path, help="also write the JSON results to this file")
    args = ap.parse_args(argv)
    try:
        results = bench(args)
    except InfrError as e:
        print(f"infr: error: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(results, indent=1))
    else:
        print(markdown(results))
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def bench(args) -> list[dict]:
    results = []
    prompts = [int(x) for x in str(args.n_prompt).split(",") if x.strip()]
    gens = [int(x) for x in str(args.n_gen).split(",") if x.strip()]
    for ref in args.model or ["smollm2"]:
        path = model_path(ref)
        n_ctx = max(prompts + [0]) + max(gens + [0]) + 16
        gf, plan, be, backend, load_s = load_backend(path, args.backend, n_ctx)
        common = {
            "model_filename": str(path),
            "model_type": f"{plan.spec.arch} {gf.get('general.size_label', '')}".strip(),
            "model_size": gf.file_size,
            "model_n_params": gf.param_count(),
            "backends": backend,
            "device": getattr(getattr(be, "dev", None), "name", platform.processor() or platform.machine()),
            "load_seconds": round(load_s, 3),
            "command": " ".join([sys.executable.rsplit("/", 1)[-1], "-m", "infr.bench"] + sys.argv[1:]),
            "test_time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        tests = [(p, 0) for p in prompts if p] + [(0, n) for n in gens if n]
        for n_prompt, n_gen in tests:
            samples = run_test(be, plan.spec.n_vocab, n_prompt, n_gen, args.repetitions)
            results.append({
                **common,
                "n_prompt": n_prompt,
                "n_gen": n_gen,
                "avg_ts": statistics.fmean(samples),
                "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                "samples_ts": samples,
            })
            print(f"infr: {path.name} {'pp' if n_prompt else 'tg'}{n_prompt or n_gen}: "
                  f"{results[-1]['avg_ts']:.2f} t/s", file=sys.stderr)
    return results


def markdown(results: list[dict]) -> str:
    rows = ["| model | size | params | backend | test | t/s |", "| --- | ---: | ---: | --- | ---: | ---: |"]
    for r in results:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        rows.append(
            f"| {r['model_type']} | {r['model_size'] / 2**20:.2f} MiB | {r['model_n_params'] / 1e6:.2f} M | "
            f"{r['backends']} | {test} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
