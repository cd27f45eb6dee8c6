"""`python -m infr.bench`: prompt processing and generation speed, llama-bench style.

    python -m infr.bench -m smollm2 -p 512 -n 128 -r 3
    python -m infr.bench -m synth:llama-8b -p 512 -n 128 -d 0,4096 -pg 512,128 --backend gpu -o json

Tests follow llama-bench: `-p N` times one prefill of N tokens (ppN); `-n N`
times N greedy decode steps (tgN); `-pg P,N` times a P-token prompt then N
generated tokens, t/s over P+N (ppP+tgN); `-d D` first fills the KV cache with
D tokens, untimed, and runs every test after them ("pp512 @ d4096"). Lists are
comma-separated or ranges (`first-last`, `first-last+step`, `first-last*mult`).
A warm-up run of each test is dropped; `-r` repetitions are timed. Output
(`-o md|csv|json|jsonl`) has llama-bench's columns and keys, so its tooling
reads it. Token ids are random (speed does not depend on them): models need no
tokenizer. `-m synth:PRESET[:TYPE]` (presets of infr.synth, or short names such
as llama-8b, llama-1b) writes a random-weight GGUF of a real shape once into
infr's cache; TYPE is a llama-quantize file type with its per-tensor mix
(Q4_K_M, the default, Q5_K_M, Q6_K, Q8_0, Q4_0, IQ4_XS, ...).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infr.backends import BACKENDS, GPU_BACKENDS
from infr.errors import InfrError
from infr.split import SplitOptions

# short names for synth presets
SYNTH_ALIASES = {
    "llama-1b": "llama-3.2-1b", "llama3-1b": "llama-3.2-1b", "llama-3-1b": "llama-3.2-1b",
    "llama-8b": "llama-3.1-8b", "llama3-8b": "llama-3.1-8b", "llama-3-8b": "llama-3.1-8b",
    "qwen3-0.6b": "qwen3-0.6b", "qwen2.5-0.5b": "qwen2.5-0.5b", "qwen2-0.5b": "qwen2.5-0.5b",
    "gemma3-270m": "gemma3-270m", "gemma-270m": "gemma3-270m",
}

# llama-bench's keys, in its order, that infr fills; infr's own keys follow them
FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_threads", "type_k", "type_v", "n_gpu_layers",
    "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
    "samples_ns", "samples_ts",
)
# kv_*: the KV pools' sizes and the most blocks in use at once over the model's tests; kv_window_*: the
# sliding-window layers' pool (0 without such layers), whose blocks go back once past the window
INFR_FIELDS = ("infr_backend", "device", "load_seconds", "command", "kv_blocks", "kv_blocks_peak",
               "kv_window_blocks", "kv_window_blocks_peak", "n_cpu_moe", "split_mode", "tensor_split")


@dataclass(frozen=True)
class Test:
    n_prompt: int = 0
    n_gen: int = 0
    n_depth: int = 0

    @property
    def name(self) -> str:
        if self.n_prompt and self.n_gen:
            base = f"pp{self.n_prompt}+tg{self.n_gen}"
        else:
            base = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return base + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def n_tokens(self) -> int:
        return self.n_prompt + self.n_gen

    @property
    def n_ctx(self) -> int:
        return self.n_depth + self.n_prompt + self.n_gen + 1


# --- models ------------------------------------------------------------------------------------


def synth_path(preset: str, wtype: str | None = None) -> Path:
    """The cached random-weight GGUF of a synth preset (written on first use), the Q4_K_M mix unless wtype."""
    from infr import synth
    from infr.offline import cache_dir

    preset = SYNTH_ALIASES.get(preset, preset)
    if preset not in synth.PRESETS:
        known = sorted(set(synth.PRESETS) | set(SYNTH_ALIASES))
        raise InfrError(f"unknown synthetic preset {preset!r}; known: {', '.join(known)}")
    try:
        spec = synth.preset(preset, tokenizer="gpt2", weight_type=wtype or synth.DEFAULT_MIX)
        spec.validate()
    except ValueError as e:
        raise InfrError(str(e)) from None
    out = cache_dir().parent / "synth" / f"{preset}-{spec.weight_type}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        synth.write_gguf(spec, tmp)
        os.replace(tmp, out)
    return out


def model_path(ref: str) -> Path:
    """A .gguf path, an offline name, a Hugging Face ref, or synth:PRESET[:TYPE]."""
    if ref.startswith("synth:"):
        _, preset, *rest = ref.split(":")
        return synth_path(preset, rest[0] if rest else None)
    from infr.store import resolve

    return resolve(ref)


def load_model(path: Path, backend: str, n_ctx: int, cpu_moe: int = 0, split=None):
    """(Model, load seconds): the engine every test runs through (infr/engine.py); `cpu_moe`: the
    experts of the first cpu_moe MoE layers on the CPU; `split`: infr.split.SplitOptions."""
    from infr.backends import choose_backend
    from infr.engine import Model

    name, note = choose_backend(backend)
    if note:
        print(f"infr: {note}", file=sys.stderr)
    t0 = time.perf_counter()
    model = Model(path, n_ctx=n_ctx, backend=name, cpu_moe=cpu_moe, split=split)
    return model, time.perf_counter() - t0


# --- timing ------------------------------------------------------------------------------------


def time_test(model, test: Test, reps: int, warmup: bool = True, seed: int = 0) -> list[int]:
    """Nanoseconds of each timed repetition, through the engine's one decode loop. The depth is
    prefilled once, untimed, and every repetition's prompt follows it, so the prefix cache holds
    the depth (whole KV blocks of it; llama-bench restores its cache the same way). pp: prompt
    submitted -> its first token; tg: first token -> n_gen more; pp+tg: submitted -> the last one.
    Greedy, end-of-generation ignored, as llama-bench runs."""
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    rng = np.random.default_rng(seed)
    eng, n_vocab = model.engine, model.spec.n_vocab
    greedy = SamplingParams(temperature=0.0)
    depth = rng.integers(0, n_vocab, test.n_depth).tolist()
    if depth:
        eng.submit(req := Request(depth + [0], greedy, max_new=1, ignore_eos=True))
        eng.run_until(lambda: req.done)
    samples = []
    for rep in range(reps + int(warmup)):
        ids = rng.integers(0, n_vocab, max(test.n_prompt, 1)).tolist()
        req = Request(depth + ids, greedy, max_new=1 + test.n_gen if test.n_gen else 1, ignore_eos=True)
        eng.submit(req)
        eng.run_until(lambda: req.done)
        if req.finish_reason != "length":
            raise InfrError(f"the benchmark request ended with {req.finish_reason}: {req.error or ''}")
        if test.n_prompt and test.n_gen:
            ns = req.t_done - req.t_submit
        elif test.n_prompt:
            ns = req.t_first - req.t_submit
        else:
            ns = req.t_done - req.t_first
        if rep >= int(warmup):
            samples.append(int(ns * 1e9))
    return samples


def run_test(model, n_prompt: int, n_gen: int, reps: int, seed: int = 0, n_depth: int = 0) -> list[float]:
    """Tokens per second of each repetition (older callers' interface)."""
    test = Test(n_prompt, n_gen, n_depth)
    return [test.n_tokens * 1e9 / ns for ns in time_test(model, test, reps, seed=seed)]


def stats(test: Test, samples_ns: list[int]) -> dict:
    """llama-bench's statistics: mean and sample stddev of ns and of t/s."""
    ts = [test.n_tokens * 1e9 / ns for ns in samples_ns]
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    return {
        "avg_ns": int(statistics.fmean(samples_ns)), "stddev_ns": int(sd(samples_ns)),
        "avg_ts": statistics.fmean(ts), "stddev_ts": sd(ts),
        "samples_ns": list(samples_ns), "samples_ts": ts,
    }


# --- metadata ----------------------------------------------------------------------------------


def build_info() -> tuple[str, int]:
    """(build_commit, build_number): the git commit of this checkout when there is one."""
    from infr import __version__

    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
        commit = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return (f"infr-{__version__}" + (f"-{commit}" if commit else "")), 0


def cpu_info() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ftype_name(value) -> str:
    """llama.cpp's file type names: Q4_1, Q4_K - Medium, all F32."""
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(value)).name
    except (TypeError, ValueError):
        return "?"
    if name.startswith("ALL_"):
        return "all " + name[4:]
    name = name.removeprefix("MOSTLY_")
    for suffix, word in (("_XS", "Extra Small"), ("_S", "Small"), ("_M", "Medium"), ("_L", "Large")):
        if "_K" in name and name.endswith(suffix) and not name.endswith("_K"):
            return f"{name[: -len(suffix)]} - {word}"
    return name


def _human(n: float, units=((1e9, "B"), (1e6, "M"), (1e3, "K"))) -> str:
    for scale, unit in units:
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))


def model_info(path: Path, gf, plan) -> dict:
    n_params = gf.param_count()
    size_label = gf.get("general.size_label") or _human(n_params)
    return {
        "model_filename": str(path),
        "model_type": f"{plan.spec.arch} {size_label} {ftype_name(gf.get('general.file_type'))}",
        "model_size": sum(t.nbytes for t in gf.tensors.values()),  # tensor bytes, as llama.cpp counts
        "model_n_params": n_params,
    }


def kv_info(model) -> dict:
    """The KV pools' blocks and the peak in use so far (full layers; sliding-window layers)."""
    win = model.window_pool
    return {"kv_blocks": model.pool.n_blocks, "kv_blocks_peak": model.pool.peak,
            "kv_window_blocks": win.n_blocks if win is not None else 0,
            "kv_window_blocks_peak": win.peak if win is not None else 0}


def backend_info(be, backend: str) -> dict:
    gpu = backend in GPU_BACKENDS
    dev = getattr(getattr(be, "dev", None), "name", "")
    return {
        "gpu_info": dev if gpu else "",
        "backends": "WebGPU" if gpu else "CPU",
        "n_threads": 1 if gpu else (os.cpu_count() or 1),
        "type_k": "f16", "type_v": "f16",
        "n_gpu_layers": 99 if gpu else 0,
        "infr_backend": backend,
        "device": dev if gpu else cpu_info(),
    }


# --- the command -------------------------------------------------------------------------------


def parse_ints(values: list[str] | None, default: list[int]) -> list[int]:
    """llama-bench's value lists: repeated flags, commas, first-last[+step|*mult]."""
    if not values:
        return list(default)
    out = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "-" in part[1:]:
                    first, rest = part.split("-", 1)
                    op = "+" if "+" in rest else ("*" if "*" in rest else None)
                    last, step = (rest.split(op) if op else (rest, "1"))
                    a, b, s = int(first), int(last), int(step)
                    if s <= (1 if op == "*" else 0):
                        raise ValueError
                    while a <= b:
                        out.append(a)
                        a = a * s if op == "*" else a + s
                else:
                    out.append(int(part))
            except ValueError:
                raise InfrError(f"bad value {part!r}: expected N, N,M or first-last[+step|*mult]") from None
            if out and out[-1] < 0:
                raise InfrError(f"values must be >= 0, got {out[-1]}")
    return out


def parse_pg(values: list[str] | None) -> list[tuple[int, int]]:
    out = []
    for value in values or []:
        parts = value.split(",")
        if len(parts) != 2:
            raise InfrError(f"-pg takes PP,TG, got {value!r}")
        try:
            out.append((int(parts[0]), int(parts[1])))
        except ValueError:
            raise InfrError(f"-pg takes PP,TG, got {value!r}") from None
    return out


def tests_for(prompts: list[int], gens: list[int], pgs: list[tuple[int, int]], depths: list[int]) -> list[Test]:
    """llama-bench's order: per depth, the pp tests, the tg tests, then the pp+tg ones."""
    out = []
    for d in depths:
        out += [Test(p, 0, d) for p in prompts if p]
        out += [Test(0, n, d) for n in gens if n]
        out += [Test(p, n, d) for p, n in pgs if p or n]
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m infr.bench", description=__doc__.split("\n\n")[0],
                                 epilog="Semantics follow llama-bench; see the module docstring.")
    ap.add_argument("-m", "--model", action="append", default=None,
                    help="path, offline name, Hugging Face ref or synth:PRESET[:TYPE], TYPE a llama-quantize "
                         "mix, Q4_K_M by default (repeatable)")
    ap.add_argument("-p", "--n-prompt", action="append", help="prompt sizes (default 512; 0 skips)")
    ap.add_argument("-n", "--n-gen", action="append", help="generation lengths (default 128; 0 skips)")
    ap.add_argument("-pg", action="append", metavar="PP,TG", help="prompt then generation, t/s over both")
    ap.add_argument("-d", "--n-depth", action="append", help="context depth filled before each test (default 0)")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--no-warmup", action="store_true", help="time every run (no warm-up run is dropped)")
    ap.add_argument("--backend", default="auto", choices=list(BACKENDS))
    ap.add_argument("-ncmoe", "--cpu-moe", type=int, default=None,
                    help="experts of the first N MoE layers on the CPU, as llama-bench's -ncmoe (env INFR_CPU_MOE)")
    ap.add_argument("-sm", "--split-mode", default=None, choices=["none", "layer", "row"],
                    help="one model across GPUs: none or layer, as llama-bench's -sm (env INFR_SPLIT_MODE)")
    ap.add_argument("-ts", "--tensor-split", default=None, metavar="TS0/TS1/..",
                    help="each GPU's share of the layers, as llama-bench's -ts (3/1 or 3,1; implies -sm layer) "
                         "(env INFR_TENSOR_SPLIT)")
    ap.add_argument("-o", "--output", default="md", choices=["md", "csv", "json", "jsonl"])
    ap.add_argument("--save", type=Path, help="also write the JSON results to this file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        results = bench(args, argv)
    except InfrError as e:
        print(f"infr: error: {e}", file=sys.stderr)
        return 1
    print(render(results, args.output))
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def bench(args, argv: list[str] | None = None) -> list[dict]:
    if args.repetitions < 1:
        raise InfrError(f"-r must be >= 1, got {args.repetitions}")
    tests = tests_for(parse_ints(args.n_prompt, [512]), parse_ints(args.n_gen, [128]), parse_pg(args.pg),
                      parse_ints(args.n_depth, [0]))
    if not tests:
        raise InfrError("no test to run: every -p, -n and -pg is 0")
    cpu_moe = cpu_moe_option(getattr(args, "cpu_moe", None))
    split = SplitOptions.read(getattr(args, "split_mode", None), getattr(args, "tensor_split", None))
    build_commit, build_number = build_info()
    command = " ".join(["python", "-m", "infr.bench"] + list(sys.argv[1:] if argv is None else argv))
    results = []
    for ref in args.model or ["smollm2"]:
        path = model_path(ref)
        model, load_s = load_model(path, args.backend, max(t.n_ctx for t in tests), cpu_moe, split)
        common = {"build_commit": build_commit, "build_number": build_number, "cpu_info": cpu_info(),
                  **model_info(path, model.gguf, model.plan), **backend_info(model.backend, model.backend_name),
                  "load_seconds": round(load_s, 3), "command": command, "n_cpu_moe": cpu_moe,
                  **split_info(split)}
        for test in tests:
            samples = time_test(model, test, args.repetitions, warmup=not args.no_warmup)
            record = {**common, "n_prompt": test.n_prompt, "n_gen": test.n_gen, "n_depth": test.n_depth,
                      "test_time": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                      **stats(test, samples), **kv_info(model)}
            results.append({k: record[k] for k in FIELDS + INFR_FIELDS})
            print(f"infr: {path.name} {test.name}: {record['avg_ts']:.2f} t/s", file=sys.stderr)
        del model
    return results


def split_info(split) -> dict:
    """llama-bench's split_mode and tensor_split keys (its "0.75/0.25" form: each device's fraction)."""
    props = split.tensor_split if split.layered and split.tensor_split else ()
    total = sum(props)
    return {"split_mode": split.mode, "tensor_split": "/".join(f"{p / total:.2f}" for p in props) or "0.00"}


def cpu_moe_option(flag: int | None) -> int:
    """--cpu-moe, else INFR_CPU_MOE, else 0."""
    value = flag
    if value is None and os.environ.get("INFR_CPU_MOE") not in (None, ""):
        try:
            value = int(os.environ["INFR_CPU_MOE"])
        except ValueError:
            raise InfrError(f"INFR_CPU_MOE={os.environ['INFR_CPU_MOE']!r} is not a valid int") from None
    value = value or 0
    if value < 0:
        raise InfrError(f"--cpu-moe must be >= 0, got {value}")
    return value


# --- output ------------------------------------------------------------------------------------


def test_name(r: dict) -> str:
    return Test(r["n_prompt"], r["n_gen"], r.get("n_depth", 0)).name


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def markdown(results: list[dict]) -> str:
    """llama-bench's table: ngl for a GPU backend, threads for the CPU one."""
    gpu = any(r["backends"] != "CPU" for r in results)
    head = ["model", "size", "params", "backend", "ngl" if gpu else "threads", "test", "t/s"]
    right = {"size", "params", "ngl", "threads", "test", "t/s"}
    rows = [[r["model_type"], _size(r["model_size"]), _params(r["model_n_params"]), r["backends"],
             str(r["n_gpu_layers"] if gpu else r["n_threads"]), test_name(r),
             f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"] for r in results]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(head)]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if h in right else c.ljust(w)
                                 for c, w, h in zip(cells, widths, head)) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if h in right else "-" * w for w, h in zip(widths, head)) + " |"
    out = [line(head), rule] + [line(row) for row in rows]
    if results:
        out.append("")
        last = {r["model_filename"]: r for r in results if "kv_blocks" in r}  # each model's peaks after its tests
        for name, r in last.items():
            kv = f"KV blocks: {r['kv_blocks_peak']} of {r['kv_blocks']} at most in use"
            if r["kv_window_blocks"]:
                kv += f"; sliding-window layers {r['kv_window_blocks_peak']} of {r['kv_window_blocks']}"
            out.append(f"{Path(name).name}: {kv}")
        out.append(f"build: {results[0]['build_commit']} ({results[0]['build_number']})")
    return "\n".join(out)


def render(results: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(results, indent=2)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in results)
    if fmt == "csv":  # like llama-bench: every value quoted, no sample lists
        keys = [k for k in (results[0] if results else FIELDS) if not k.startswith("samples_")]
        buf = io.StringIO()
        w = csv.DictWriter(buf, keys, quoting=csv.QUOTE_ALL, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(results)
        return buf.getvalue().rstrip("\n")
    return markdown(results)


if __name__ == "__main__":
    raise SystemExit(main())
