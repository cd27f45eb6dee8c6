"""Where a served stream's decode rate goes, in-process (no HTTP): one stream's tg128 rate as
python -m infr.bench measures it (first token -> 128 more, greedy, end-of-generation ignored),
after a 1-token and a 139-token prompt (perf/serve_throughput.py's prompts are ~139 tokens with a
synth tokenizer), bare and with the server's per-token work (serve.generation.Tracker), and with
a second Python thread taking the GIL in short bursts as an event loop does.

    source .gpu/setup.sh && python3 perf/stream_gap.py llama-3.1-8b dawn
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr.bench import load_model, synth_path  # noqa: E402
from infr.sampling import SamplingParams  # noqa: E402
from infr.scheduler import Request  # noqa: E402
from infr.serve import generation  # noqa: E402


def main(ref: str, backend: str) -> None:
    model, _ = load_model(synth_path(ref), backend, 4096)
    eng, tok = model.engine, model.tokenizer
    greedy = SamplingParams(temperature=0.0)
    rng = np.random.default_rng(0)

    def one(prompt_len: int, tracked: bool) -> float:
        ids = rng.integers(0, model.spec.n_vocab, prompt_len).tolist()
        if tracked:
            job = generation.Job(prompt=ids, params=greedy, max_tokens=129, ignore_eos=True, cache_prompt=False)
            req = generation.Tracker(tok, job, lambda ev: None).request()
        else:
            req = Request(ids, greedy, max_new=129, ignore_eos=True, cache_prompt=False)
        eng.submit(req)
        eng.run_until(lambda: req.done)
        return 128 / (req.t_done - req.t_first)

    for tracked in (False, True):
        for plen in (1, 139):
            one(plen, tracked)
            print("tracker" if tracked else "bare", "prompt", plen, [round(one(plen, tracked), 1) for _ in range(3)],
                  flush=True)
    stop = threading.Event()

    def busy() -> None:  # holds the GIL ~0.3 ms at a time, as an event loop sending chunks might
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 0.0003:
                pass
            time.sleep(0.0002)

    threading.Thread(target=busy, daemon=True).start()
    print("bare + busy thread, prompt 139", [round(one(139, False), 1) for _ in range(3)], flush=True)
    stop.set()


if __name__ == "__main__":
    main(*sys.argv[1:3])
