"""One stream's decode rate (as bench's tg128) after prompts of 1, 139 and 400 tokens, best of 3.

    source .gpu/setup.sh && INFR_ATTN_SPLIT_FROM=256 python3 perf/decode_by_position.py llama-3.1-8b dawn

Served streams decode at positions past their ~139-token prompts while `infr.bench` tg128 starts
at 1, so this says how much of the gap between them is the decode attention's cost per key.
Requests go through the engine (greedy, max_new 129, ignore_eos, no prefix cache); the rate is
128 / (time of the last token - time of the first). Prints one line: p1=… p139=… p400=… t/s.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr.bench import load_model, synth_path  # noqa: E402
from infr.sampling import SamplingParams  # noqa: E402
from infr.scheduler import Request  # noqa: E402


def main(ref: str, backend: str) -> None:
    model, _ = load_model(synth_path(ref), backend, 4096)
    eng = model.engine
    greedy = SamplingParams(temperature=0.0)
    rng = np.random.default_rng(0)

    def one(plen: int) -> float:
        req = Request(rng.integers(0, model.spec.n_vocab, plen).tolist(), greedy, max_new=129, ignore_eos=True,
                      cache_prompt=False)
        eng.submit(req)
        eng.run_until(lambda: req.done)
        return 128 / (req.t_done - req.t_first)

    one(1), one(139)  # warm-up: the graphs of both shapes
    print(" ".join(f"p{p}={max(one(p) for _ in range(3)):.1f}" for p in (1, 139, 400)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
