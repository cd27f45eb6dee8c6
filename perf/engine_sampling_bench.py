"""One sequence through the engine (the scheduler's multi-step decode), greedy against llama.cpp's
default sampling (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05) drawn on the device, then a
profile of 32 sampled tokens: what the GPU sampler costs per token.

    source .gpu/setup.sh && python3 perf/engine_sampling_bench.py synth:llama-3.2-1b

Each mode runs twice (the first warms graphs and pipelines): a 139-token prompt, 128 tokens.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr import bench  # noqa: E402
from infr.engine import Model  # noqa: E402
from infr.gpu import profile  # noqa: E402
from infr.sampling import SamplingParams  # noqa: E402
from infr.scheduler import Request  # noqa: E402


def main() -> None:
    model = Model(bench.model_path(sys.argv[1] if len(sys.argv) > 1 else "synth:llama-3.2-1b"), n_ctx=1024,
                  backend="gpu", parallel=4)
    prompt = list(range(100, 239))

    def run(p: SamplingParams, n: int = 128) -> float:
        r = model.engine.submit(Request(list(prompt), p, max_new=n, ignore_eos=True))
        t0 = time.perf_counter()
        model.engine.run_until(lambda: r.done)
        assert r.error is None, r.error
        return n / (time.perf_counter() - t0)

    greedy = SamplingParams(temperature=0)
    sampled = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    for p in (greedy, sampled, greedy, sampled):
        print(f"temperature {p.temperature}: {run(p):.1f} t/s (128 tokens, prefill included)")
    with profile.profile() as pr:
        run(sampled, 32)
    print(pr.result.table())


if __name__ == "__main__":
    main()
