"""Greedy requests through a Model's engine: the batched-equals-alone and prefix-reuse tests' runs."""

from __future__ import annotations

from infr.engine import Model
from infr.sampling import SamplingParams
from infr.scheduler import Request

GREEDY = SamplingParams(temperature=0.0)


def finished(model, prompts, max_new: int, **kw) -> list[Request]:
    """The prompts' greedy requests, submitted at once and run to their end, none failed."""
    reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=max_new, **kw)) for p in prompts]
    model.engine.run_until(lambda: all(r.done for r in reqs))
    assert all(r.finish_reason != "error" for r in reqs), [r.error for r in reqs]
    return reqs


def greedy_outputs(model, prompts, max_new: int, **kw) -> list[list[int]]:
    """Each prompt's max_new greedy tokens (the end token ignored), all submitted at once."""
    reqs = finished(model, prompts, max_new, ignore_eos=True, **kw)
    assert all(r.finish_reason == "length" for r in reqs), [r.finish_reason for r in reqs]
    return [r.output for r in reqs]


def cold_runs(path, n_ctx: int, max_new: int, **kw):
    """prompt -> its greedy tokens computed from position 0 alone (no prefix cache) on a CPU model
    that keeps no checkpoints, memoised: what every reuse of a prefix must give."""
    model = Model(path, n_ctx=n_ctx, backend="cpu", checkpoints=0)
    memo: dict = {}

    def get(prompt, max_new=max_new):
        key = (tuple(prompt), max_new)
        if key not in memo:
            (r,) = finished(model, [prompt], max_new, cache_prompt=False, **kw)
            assert r.cached_tokens == 0
            memo[key] = r.output
        return memo[key]
    return get
