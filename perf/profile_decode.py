"""Per-kernel GPU time of greedy decode on synthetic GGUFs (real shapes, random blocks).

    source .gpu/setup.sh && python3 perf/profile_decode.py llama-3.1-8b:Q4_K llama-3.2-1b:Q4_K

For each model: a 1-token prompt, 16 warm-up steps, then PROFILE_TG (128)
greedy decode steps on the GPU-resident loop under infr.gpu.profile. Prints
the per-kernel table (GEMV rows with their GB/s) and writes one JSON per model
to $OUT (or perf/) with the adapter, the command and the date.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr import bench  # noqa: E402
from infr.gpu import profile  # noqa: E402

TG = int(os.environ.get("PROFILE_TG", 128))


def one(ref: str, out_dir: Path) -> dict:
    preset, qtype = ref.split(":")
    path = bench.synth_path(preset, qtype)  # shared with perf/compare_llama_server.py
    gf, plan, be, backend, load_s = bench.load_backend(path, "gpu", TG + 64)
    be.forward([1], 0)
    be.decode_greedy(1, 1, 16)
    with profile.profile() as p:
        t0 = time.perf_counter()
        be.decode_greedy(1, 1, TG)
        wall = time.perf_counter() - t0
    res = p.result
    print(f"## {ref} on {be.dev.name}: {TG} tokens, {TG / wall:.1f} tok/s while profiled, "
          f"{len(be._decode_step())} dispatches/token")
    print(res.table())
    record = {
        "model": ref, "adapter": be.dev.name, "date": dt.date.today().isoformat(),
        "command": "python3 perf/profile_decode.py " + " ".join(sys.argv[1:]),
        "dispatches_per_token": len(be._decode_step()), "tokens": TG, "profiled_tok_s": TG / wall,
        "load_seconds": load_s, "pipeline_compile_seconds": be.kern.compile_seconds,
        "profile": res.to_json(),
    }
    (out_dir / f"profile-{preset}-{qtype}.json").write_text(json.dumps(record, indent=1))
    return record


def main() -> None:
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent)
    for ref in sys.argv[1:] or ["llama-3.2-1b:Q4_K"]:
        one(ref, out_dir)


if __name__ == "__main__":
    main()
