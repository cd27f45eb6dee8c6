"""Greedy requests through a Model's engine: the batched-equals-alone tests' runs."""

from __future__ import annotations

from infr.sampling import SamplingParams
from infr.scheduler import Request

GREEDY = SamplingParams(temperature=0.0)


def greedy_outputs(model, prompts, max_new: int, **kw) -> list[list[int]]:
    """Each prompt's max_new greedy tokens (the end token ignored), all submitted at once."""
    reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=max_new, ignore_eos=True, **kw)) for p in prompts]
    model.engine.run_until(lambda: all(r.done for r in reqs))
    assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
    return [r.output for r in reqs]
