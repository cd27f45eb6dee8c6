"""Side by side on one machine: infr's GPU backend and llama.cpp's llama-server
on the same synthetic GGUFs (real shapes, random weights in llama-quantize's mixes).

    source .gpu/setup.sh && python3 perf/compare_llama_server.py llama-3.2-1b llama-3.1-8b
    python3 perf/compare_llama_server.py llama-3.1-8b:Q6_K llama-3.1-8b:Q8_0 llama-3.1-8b:IQ4_XS

Each argument is PRESET[:TYPE] (infr.bench's synth names); TYPE is a
llama-quantize file type with its per-tensor mix, Q4_K_M when left out (Q5_K_M,
Q6_K, Q8_0, Q4_0, IQ4_XS, ...; NAME-pure for one type everywhere). No
arguments: llama-3.2-1b and llama-3.1-8b at Q4_K_M. Every name is checked
before the first model is written.

For each model, both engines run the same tests (infr.bench semantics, a
warm-up dropped, 3 repetitions): pp512, tg128, then tg64 and pp4 after 4096
tokens of context (the multi-turn shape). llama-server is driven by
infr.llamacpp (token-id prompts, ignore_eos, greedy, its own `timings`).
Knobs: LLAMA_SERVER (else llama-server on PATH), COMPARE_PP, COMPARE_TG,
COMPARE_DEPTH (0 drops the deep tests), COMPARE_DEPTH_PP, COMPARE_DEPTH_TG,
COMPARE_REPS, COMPARE_GEMV="2,2;1,1,1" (also GEMV tunings R,U[,NT]: INFR_GEMV_R / _U / _NT;
an empty first entry keeps the defaults), COMPARE_BACKENDS="gpu,dawn" (infr's backends: the first
is "infr", each other "infr_NAME" with its "ratios_NAME"; default gpu).
Writes one JSON to $OUT (or perf/) with the adapter, the commands and the date.
`infr compare MODEL` is the same comparison for any model and backend.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr import bench, llamacpp, synth
from infr.compare import workloads
from infr.gguf_file import open_gguf
from infr.gpu import tuning as TU

REPS = int(os.environ.get("COMPARE_REPS", "3"))
PP = int(os.environ.get("COMPARE_PP", "512"))  # smaller only for a local smoke run
TG = int(os.environ.get("COMPARE_TG", "128"))
DEPTH = int(os.environ.get("COMPARE_DEPTH", "4096"))
DEPTH_PP = int(os.environ.get("COMPARE_DEPTH_PP", "4"))
DEPTH_TG = int(os.environ.get("COMPARE_DEPTH_TG", "64"))
TESTS = workloads(PP, TG, DEPTH, DEPTH_PP, DEPTH_TG)
N_CTX = max(t.n_ctx for t in TESTS) + 16
DEFAULT_MODELS = ["llama-3.2-1b", "llama-3.1-8b"]


def check_ref(ref: str) -> str | None:
    """Why PRESET[:TYPE] names no synth model, or None (nothing is written)."""
    name, _, wtype = ref.partition(":")
    try:
        synth.preset(bench.SYNTH_ALIASES.get(name, name), weight_type=wtype or synth.DEFAULT_MIX).validate()
    except (KeyError, ValueError) as e:
        return f"{ref}: {e.args[0]}"
    return None


def tensor_types(path: Path) -> dict:
    """How many tensors of each type the file holds: the mix that was measured."""
    counts: dict[str, int] = {}
    for t in open_gguf(path).tensors.values():
        counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
    return dict(sorted(counts.items()))


def gpu_diagnostics(be) -> dict:
    """What the GPU side holds after the run (where its time goes: INFR_PROFILE with infr.bench)."""
    return {"vram_bytes": be.vram, "pipeline_compile_seconds": be.kern.compile_seconds,
            "max_storage_binding_bytes": be.dev.max_binding}


BACKENDS = os.environ.get("COMPARE_BACKENDS", "gpu").split(",")


def infr_side(path: Path, backend: str = "gpu") -> dict:
    model, load_s = bench.load_model(path, backend, N_CTX)
    gf, be = model.gguf, model.backend
    out = {"backend": model.backend_name, "adapter": be.dev.name, "load_seconds": load_s, "file_bytes": gf.file_size}
    for test in TESTS:
        out[test.name] = bench.stats(test, bench.time_test(model, test, REPS))
    try:
        out.update(gpu_diagnostics(be))
    except Exception as e:  # diagnostics lean on backend internals: keep the timings regardless
        out["diagnostics_error"] = repr(e)
    tg = f"tg{TG}"
    if tg in out:
        out["weights_gb_per_s_at_tg"] = gf.file_size * out[tg]["avg_ts"] / 1e9
    return out


def llama_side(path: Path) -> dict:
    llama = llamacpp.find("server")
    if llama is None:
        return {"error": "LLAMA_SERVER not set and no llama-server on PATH"}
    try:
        got = llamacpp.run(llama, path, TESTS, REPS, gpu=True, n_ctx=N_CTX)
    except llamacpp.LlamaError as e:
        return {"error": str(e)}
    return {"command": got["command"], "version": llama.version(), **got["results"]}


def main() -> None:
    refs = sys.argv[1:] or DEFAULT_MODELS
    errors = [e for e in map(check_ref, refs) if e]
    if errors:
        sys.exit("compare_llama_server: " + "; ".join(errors))
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent)
    results = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "command": " ".join(["python3"] + sys.argv),
        "tests": [t.name for t in TESTS],
        "models": {},
    }
    for ref in refs:
        t0 = time.perf_counter()
        path = bench.model_path("synth:" + ref)
        entry = {"file": path.name, "synth_seconds": time.perf_counter() - t0, "tensor_types": tensor_types(path)}
        # COMPARE_GEMV="2,2;1,1,1" also measures GEMV tunings (INFR_GEMV_R, _U, _NT); the first is "infr".
        for i, tuning in enumerate(os.environ.get("COMPARE_GEMV", "").split(";")):
            if tuning:
                os.environ.update(zip(("INFR_GEMV_R", "INFR_GEMV_U", "INFR_GEMV_NT"), tuning.split(",")))
                TU.reload()  # the kernels read the knobs once
            key = "infr" if i == 0 else f"infr_gemv{tuning.replace(',', '_')}"
            for j, backend in enumerate(BACKENDS):
                name = key if j == 0 else f"{key}_{backend}"
                try:
                    entry[name] = infr_side(path, backend)
                except Exception as e:  # report and go on to llama.cpp
                    entry[name] = {"error": repr(e)}
        print(json.dumps({ref: entry}, indent=1), flush=True)
        try:
            entry["llama_server"] = llama_side(path)
        except Exception as e:  # keep infr's numbers
            entry["llama_server"] = {"error": repr(e)}
        ours, theirs = entry["infr"], entry["llama_server"]
        entry["ratios"] = {t.name: ours[t.name]["avg_ts"] / theirs[t.name]["avg_ts"]
                           for t in TESTS if t.name in ours and t.name in theirs}
        for name, ratio in entry["ratios"].items():
            if "@" not in name:
                entry[f"ratio_{name}"] = ratio  # ratio_pp512, ratio_tg128 as before
        for backend in BACKENDS[1:]:
            ours = entry.get(f"infr_{backend}", {})
            entry[f"ratios_{backend}"] = {t.name: ours[t.name]["avg_ts"] / theirs[t.name]["avg_ts"]
                                          for t in TESTS if t.name in ours and t.name in theirs}
        results["models"][ref] = entry
        print(json.dumps({ref: entry}, indent=1), flush=True)
        (out_dir / "h200-compare.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
