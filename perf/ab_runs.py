"""A/B runs of `python -m infr.bench`: variants (an environment, or another tree of the code) taken in turn,
round after round, so that a slow minute of the machine falls on all of them; each run's samples and best.

    # here, once: the code of an earlier commit as a tree of its own (the device machine has no git)
    python3 perf/ab_runs.py snapshot 22c7d62 .ab/base
    # there (source .gpu/setup.sh && ...; carry .ab):
    python3 perf/ab_runs.py run synth:llama-3.1-8b -p 512 --rounds 2 \\
        --variant base=@.ab/base --variant tree= --variant vw0=INFR_MMA_VW=0,INFR_MMA_DIRECT_FEW=0 \\
        --variant am=INFR_ATTN_TILED=3,INFR_ATTN_MMA=16,32 --out $OUT/ab.json

A variant is NAME=SPEC: SPEC empty (this tree as it is), KEY=VALUE[,KEY=VALUE...] (this tree with those variables
set; a part without `=` continues the value before it, so INFR_ATTN_MMA=16,32 is one setting), or @DIR (the tree
in DIR: the bench runs there, so `-m infr.bench` imports DIR's infr first). Each run is
`python3 -m infr.bench -m MODEL -p P -n N -r R --backend B -o jsonl` in its own process (its pipelines built anew,
as a user's), with a time limit. Prints one line a test of a run, `MODEL TEST samples... best B [NAME]`, and with
--out the lines as JSON with the command and the date, written after every run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE_PARTS = ["infr", "wgsl", "perf", "pyproject.toml"]  # what a snapshot holds: the code the bench runs


def snapshot(rev: str, dest: Path) -> None:
    """The tree of commit `rev` (TREE_PARTS of it) written into dest, replacing what was there."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, *TREE_PARTS],
                          check=True, capture_output=True).stdout
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12 on
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)
    print(f"{rev} -> {dest}")


def parse_variant(text: str) -> tuple[str, dict, Path]:
    """NAME=SPEC -> (name, environment additions, directory to run in)."""
    name, sep, spec = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant wants NAME=SPEC, got {text!r}")
    if spec.startswith("@"):
        where = Path(spec[1:])
        if not (where / "infr").is_dir():
            raise SystemExit(f"variant {name}: {where} holds no infr package (perf/ab_runs.py snapshot REV DIR)")
        return name, {}, where.resolve()
    env: dict = {}
    key = None
    for part in filter(None, spec.split(",")):
        k, eq, value = part.partition("=")
        if eq and k.isidentifier():
            key, env[k] = k, value
        elif key is not None:  # a comma inside a value (INFR_MMA_TILES, INFR_ATTN_MMA=16,32)
            env[key] += "," + part
        else:
            raise SystemExit(f"variant {name}: {part!r} is not KEY=VALUE")
    return name, env, ROOT


def bench(model: str, a, name: str, env: dict, where: Path) -> list[dict]:
    """One run of the bench for a variant: each test's samples (t/s; pp P and tg N where both are asked), or the
    error's last lines."""
    cmd = [sys.executable, "-m", "infr.bench", "-m", model, "-p", str(a.p), "-n", str(a.n), "-r", str(a.r),
           "--backend", a.backend, "-o", "jsonl"]
    test = "+".join(t for t in (f"pp{a.p}" if a.p else "", f"tg{a.n}" if a.n else "") if t)
    try:
        done = subprocess.run(cmd, cwd=where, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return [{"variant": name, "model": model, "test": test, "error": f"over {a.timeout} s"}]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not rows:
        return [{"variant": name, "model": model, "test": test,
                 "error": " | ".join(done.stderr.strip().splitlines()[-3:]) or f"exit {done.returncode}"}]
    out = []
    for row in rows:  # llama-bench's keys: a prompt test has n_gen 0, a generation test n_prompt 0
        samples = [float(x) for x in row.get("samples_ts") or []]
        out.append({"variant": name, "model": model,
                    "test": f"pp{row['n_prompt']}" if row.get("n_prompt") else f"tg{row.get('n_gen')}",
                    "samples": samples, "best": max(samples, default=0.0)})
    return out


def run(a) -> None:
    variants = [parse_variant(v) for v in a.variant]
    lines: list[dict] = []
    head = {"command": " ".join(sys.argv), "date": dt.datetime.now().isoformat(timespec="seconds"),
            "variants": a.variant}
    for _ in range(a.rounds):
        for model in a.models:
            for name, env, where in variants:
                for r in bench(model, a, name, env, where):
                    lines.append(r)
                    shown = (" ".join(f"{x:.1f}" for x in r["samples"]) + f" best {r['best']:.1f}" if "samples" in r
                             else f"error: {r['error']}")
                    print(f"{Path(model).name} {r['test']} {shown} [{name}]", flush=True)
                if a.out:  # after every run: a call cut off by its time limit keeps what it measured
                    Path(a.out).write_text(json.dumps({**head, "runs": lines}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("snapshot", help="write commit REV's code into DIR (here, where git is)")
    s.add_argument("rev")
    s.add_argument("dest", type=Path)
    r = sub.add_parser("run", help="the variants' bench runs in turn")
    r.add_argument("models", nargs="+", help="what infr.bench -m takes (synth:PRESET[:TYPE] or a path)")
    r.add_argument("-p", type=int, default=512)
    r.add_argument("-n", type=int, default=0)
    r.add_argument("-r", type=int, default=3, help="samples a run")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--backend", default="dawn")
    r.add_argument("--timeout", type=float, default=240.0, help="seconds a run may take")
    r.add_argument("--variant", action="append", required=True, help="NAME=SPEC (module docstring); repeat")
    r.add_argument("--out", help="the runs as JSON")
    a = ap.parse_args()
    if a.what == "snapshot":
        snapshot(a.rev, a.dest)
    else:
        run(a)


if __name__ == "__main__":
    main()
