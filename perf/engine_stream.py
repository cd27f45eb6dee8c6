"""One engine stream's decode rate (tg128, as infr.bench counts it) after prompts of 1, 139 and 400
tokens, best of 3: what `infr run` and one served stream see, without HTTP.

    source .gpu/setup.sh && python3 perf/engine_stream.py qwen35-4b dawn
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from infr.bench import load_model, synth_path
from infr.scheduler import Request
from infr.sampling import SamplingParams
ref, backend = sys.argv[1], sys.argv[2]
model, _ = load_model(synth_path(ref), backend, 4096)
eng = model.engine
g = SamplingParams(temperature=0.0)
rng = np.random.default_rng(0)
def one(plen):
    req = Request(rng.integers(0, model.spec.n_vocab, plen).tolist(), g, max_new=129, ignore_eos=True, cache_prompt=False)
    eng.submit(req); eng.run_until(lambda: req.done)
    return 128 / (req.t_done - req.t_first)
one(1); one(139)
print(" ".join(f"p{p}={max(one(p) for _ in range(3)):.1f}" for p in (1, 139, 400)), flush=True)
