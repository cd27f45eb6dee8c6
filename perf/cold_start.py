"""Cold start of `infr run` on the CPU backend: whole processes, best of N.

    python perf/cold_start.py                      # the three offline models, best of 2
    python perf/cold_start.py -m smollm2-135m -r 3 --save perf/cold-start-DATE.json

Each run is a fresh `python -m infr run MODEL "Hi" --raw --max-new 1 --backend cpu`
of the checkout this script sits in, timed from just before the process is
spawned: `total` to its exit, `first_token` to the first byte it writes on
stdout (with --raw stdout holds only generated text, flushed per token), and
`loaded` is the CLI's own "loaded ... in X s" line. `cpu` is the child's user +
system time, which moves less than wall time when other work shares the cores;
the 1-minute load average is recorded beside each run for that reason. Of the
cpu time, `sys` is mostly the first touch of fresh memory (the float32 weights).

Model files must be fetched already. Two things of this VM shape the numbers:
it hands freed memory back to its host (free page reporting) a few seconds after
it is freed, and memory the host must back afresh costs 1-3 s of system time per
GB; and it pages out memory unused for about a minute (DAMON), the model file's
page cache included, and reads from disk at ~100 MB/s. So each run waits `--gap`
seconds (default 5) first, long enough that it cannot reuse the memory the run
before freed, after reading the model file through so that it is cached: a cold
process with the file in the page cache, the usual meaning of a CLI's cold start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")
BARS = {"smollm2-135m": (2.0, 1.0), "qwen2.5-coder-0.5b": (3.0, None), "gemma3-270m": (3.0, None)}
_LOADED = re.compile(r"infr: loaded .* in ([0-9.]+)s")


def command(model: str) -> list[str]:
    return [sys.executable, "-m", "infr", "run", model, "Hi", "--raw", "--max-new", "1", "--backend", "cpu"]


def run_once(model: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    first: list[float] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(command(model), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    out = b""
    while chunk := proc.stdout.read1(4096):
        if not first:
            first.append(time.perf_counter() - t0)
        out += chunk
    proc.wait()
    total = time.perf_counter() - t0
    reader.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stderr = err[0].decode("utf-8", "replace")
    if proc.returncode != 0:
        raise SystemExit(f"{model}: exit {proc.returncode}\n{stderr}")
    loaded = _LOADED.search(stderr)
    return {
        "total_s": round(total, 3),
        "first_token_s": round(first[0], 3) if first else None,
        "loaded_s": float(loaded.group(1)) if loaded else None,
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3),
        "user_s": round(after.ru_utime - before.ru_utime, 3),
        "sys_s": round(after.ru_stime - before.ru_stime, 3),  # mostly first touches of fresh memory
        "load_avg_1m": round(load, 2),
        "stdout": out.decode("utf-8", "replace"),
    }


def warm_file(path: Path) -> None:
    """Read the model file through, so it is in the page cache (DAMON may have paged it out)."""
    buf = bytearray(1 << 22)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def machine() -> dict:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "python": platform.python_version()}


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", help="offline model name (repeatable); default: all three")
    ap.add_argument("-r", "--runs", type=int, default=2, help="runs per model; the best is reported")
    ap.add_argument("--gap", type=float, default=5.0, help="seconds to wait before each run")
    ap.add_argument("--save", type=Path, help="write the results here (JSON)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from infr import offline

    models = args.model or list(MODELS)
    for m in models:
        offline.ensure(m)  # fetched before timing, never during
    results = {}
    for m in models:
        runs = []
        for _ in range(args.runs):
            warm_file(offline.ensure(m))
            time.sleep(args.gap)
            runs.append(run_once(m))
            r = runs[-1]
            print(f"{m}: total {r['total_s']:.2f} s, first token {r['first_token_s']:.2f} s, "
                  f"loaded {r['loaded_s']} s, cpu {r['user_s']:.2f} user + {r['sys_s']:.2f} sys, "
                  f"load {r['load_avg_1m']}", file=sys.stderr)
        best = {k: min(r[k] for r in runs) for k in ("total_s", "first_token_s", "cpu_s", "user_s", "sys_s")}
        results[m] = {"best": best, "bars": dict(zip(("total_s", "first_token_s"), BARS.get(m, (None, None)))),
                      "runs": runs}
    print(f"{'model':22} {'total s':>8} {'1st token s':>12} {'user s':>7} {'sys s':>7}  (best of {args.runs})")
    for m, r in results.items():
        b = r["best"]
        print(f"{m:22} {b['total_s']:8.2f} {b['first_token_s']:12.2f} {b['user_s']:7.2f} {b['sys_s']:7.2f}")
    if args.save:
        doc = {
            "benchmark": "cold start",
            "command": " ".join(["python", *command("MODEL")[1:]]),
            "script": "python perf/cold_start.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "machine": machine(),
            "runs_per_model": args.runs,
            "gap_s": args.gap,
            "results": results,
        }
        args.save.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.save}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
