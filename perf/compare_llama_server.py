"""Side by side on one machine: infr's GPU backend and llama.cpp's llama-server
on the same synthetic GGUFs (real shapes, random Q4_K blocks).

    source .gpu/setup.sh && python3 perf/compare_llama_server.py llama-3.2-1b:Q4_K llama-3.1-8b:Q4_K

For each model: infr pp512 / tg128 (python -m infr.bench semantics, warm-up
dropped) and llama-server's own timings for a 512-token prompt and 128
generated tokens (ignore_eos, greedy, no prompt cache), 3 repetitions each.
Writes one JSON to $OUT (or perf/) with the adapter, the commands and the date.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr import bench  # noqa: E402

REPS = 3
PP = int(os.environ.get("COMPARE_PP", 512))  # smaller only for a local smoke run
TG = int(os.environ.get("COMPARE_TG", 128))


def infr_side(path: Path, n_vocab_hint: int | None = None) -> dict:
    gf, plan, be, backend, load_s = bench.load_backend(path, "gpu", PP + TG + 16)
    pp = bench.run_test(be, plan.spec.n_vocab, PP, 0, REPS)
    tg = bench.run_test(be, plan.spec.n_vocab, 0, TG, REPS)
    # Host cost of encoding one decode step (no submit): the part pipelining must hide.
    step = be._decode_step()
    enc = be.dev.device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    t0 = time.perf_counter()
    step.encode(cpass, times=20)
    host_us = (time.perf_counter() - t0) / 20 * 1e6
    cpass.end()
    enc.finish()
    # Where the GPU time goes: the decode step with every dispatch, then with
    # the weight matmuls alone (the rest's cost is the difference).
    from infr.gpu.runtime import Recording

    def gpu_ms(rec: Recording, n: int = 32) -> float:
        enc = be.dev.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        rec.encode(cp, times=n)
        cp.end()
        t0 = time.perf_counter()
        be.dev.device.queue.submit([enc.finish()])
        be.dev.device.queue.read_buffer(be.state, 0, 16)  # waits for the GPU
        return (time.perf_counter() - t0) / n * 1e3

    be.forward([1], 0)
    gemv_only = Recording([d for d in step.dispatches if d.label.startswith(("gemv", "matmul"))])
    split = {"step_ms": gpu_ms(step), "matmuls_only_ms": gpu_ms(gemv_only), "n_matmul_dispatches": len(gemv_only)}
    return {
        "gpu_time_split": split,
        "backend": backend,
        "adapter": be.dev.name,
        "load_seconds": load_s,
        "pipeline_compile_seconds": be.kern.compile_seconds,
        "vram_bytes": be.vram,
        "file_bytes": gf.file_size,
        "dispatches_per_token": len(step),
        "host_encode_us_per_token": host_us,
        "pp512": {"avg_ts": statistics.fmean(pp), "stddev_ts": statistics.stdev(pp), "samples_ts": pp},
        "tg128": {"avg_ts": statistics.fmean(tg), "stddev_ts": statistics.stdev(tg), "samples_ts": tg},
        "weights_gb_per_s_at_tg": gf.file_size * statistics.fmean(tg) / 1e9,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"llama-server {e.code}: {e.read()[:500]!r}") from None


def llama_side(path: Path, n_vocab: int) -> dict:
    server = os.environ.get("LLAMA_SERVER")
    if not server:
        return {"error": "LLAMA_SERVER not set"}
    port = _free_port()
    cmd = [server, "-m", str(path), "-ngl", "999", "-c", "2048", "--port", str(port), "--host", "127.0.0.1",
           "-np", "1"]
    log = open("/tmp/llama-server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                tail = Path("/tmp/llama-server.log").read_text()[-3000:]
                return {"error": f"llama-server not ready (exit {proc.poll()})", "log_tail": tail}
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        rng = np.random.default_rng(0)
        pp, tg = [], []
        for rep in range(REPS + 1):
            prompt = rng.integers(16, n_vocab, PP).tolist()
            out = _post(f"http://127.0.0.1:{port}/completion", {
                "prompt": prompt, "n_predict": TG, "ignore_eos": True, "temperature": 0,
                "cache_prompt": False, "samplers": ["top_k"], "top_k": 1,
            })
            t = out["timings"]
            if rep:  # the first run warms up
                pp.append(t["prompt_per_second"])
                tg.append(t["predicted_per_second"])
        return {
            "command": " ".join(cmd),
            "pp512": {"avg_ts": statistics.fmean(pp), "samples_ts": pp},
            "tg128": {"avg_ts": statistics.fmean(tg), "samples_ts": tg},
            "prompt_n": t["prompt_n"],
            "predicted_n": t["predicted_n"],
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main() -> None:
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent)
    results = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "command": " ".join(["python3"] + sys.argv),
        "models": {},
    }
    for ref in sys.argv[1:]:
        t0 = time.perf_counter()
        path = bench.model_path("synth:" + ref)
        gen_s = time.perf_counter() - t0
        from infr.gguf_file import open_gguf

        n_vocab = open_gguf(path).tensor("token_embd.weight").shape[0]
        entry = {"file": path.name, "synth_seconds": gen_s}
        # COMPARE_LANES="32,64" also measures GEMV variants (INFR_GEMV_LANES); the first is "infr".
        for i, lanes in enumerate(os.environ.get("COMPARE_LANES", "32").split(",")):
            os.environ["INFR_GEMV_LANES"] = lanes
            key = "infr" if i == 0 else f"infr_lanes{lanes}"
            try:
                entry[key] = infr_side(path)
            except Exception as e:  # report and go on to llama.cpp
                entry[key] = {"error": repr(e)}
        print(json.dumps({ref: entry}, indent=1), flush=True)
        try:
            entry["llama_server"] = llama_side(path, n_vocab)
        except Exception as e:  # keep infr's numbers
            entry["llama_server"] = {"error": repr(e)}
        i, l_ = entry["infr"], entry["llama_server"]
        if "tg128" in i and "tg128" in l_:
            entry["ratio_tg128"] = i["tg128"]["avg_ts"] / l_["tg128"]["avg_ts"]
            entry["ratio_pp512"] = i["pp512"]["avg_ts"] / l_["pp512"]["avg_ts"]
        results["models"][ref] = entry
        print(json.dumps({ref: entry}, indent=1), flush=True)
        (out_dir / "h200-compare.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
