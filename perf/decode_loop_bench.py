"""The GPU-resident decode loop's cost per token: dispatches, host encode / submit /
wait microseconds and wall time, greedy and with llama.cpp's default sampling.

    python perf/decode_loop_bench.py [MODEL] [-n 32] [--per-submit 4] [--depth 3]

MODEL: a .gguf path or an offline name (default smollm2-135m). On lavapipe the
work runs inside submit, so there `submit` is GPU time, not host time.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from infr.engine import Model
from infr.sampling import SamplingParams
from infr.store import resolve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--per-submit", type=int, default=None)
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=1024)
    a = ap.parse_args()
    model = Model(resolve(a.model), n_ctx=a.ctx, backend="gpu")
    be = model.backend
    prompt = model.tokenizer.encode("Once upon a time, in a small village by the sea,", add_special=True)
    logits = be.forward(prompt, 0)[-1]
    rows = []
    for name, params in (("greedy", SamplingParams(temperature=0)), ("default sampling", SamplingParams(seed=1))):
        list(be.decode_stream(logits, prompt, 4, params, per_submit=a.per_submit, depth=a.depth))  # warm-up
        t0 = time.perf_counter()
        n = len(list(be.decode_stream(logits, prompt, a.n, params, per_submit=a.per_submit, depth=a.depth)))
        wall = time.perf_counter() - t0
        s = be.resident().last
        rows.append({
            "mode": name, "tokens": n, "dispatches_per_token": s["dispatches_per_token"],
            "host_encode_us_per_token": round(s["encode_s"] / n * 1e6, 1),
            "submit_us_per_token": round(s["submit_s"] / n * 1e6, 1),
            "wait_us_per_token": round(s["wait_s"] / n * 1e6, 1),
            "wall_ms_per_token": round(wall / n * 1e3, 2), "submits": s["submits"],
        })
    print(json.dumps({"model": model.path.name, "device": be.dev.name, "graph_dispatches": be.dispatches_per_token,
                      "rows": rows}, indent=1))
    assert np.isfinite(logits).all()


if __name__ == "__main__":
    main()
