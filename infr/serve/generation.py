"""The token loop for one request on one slot, run in a worker thread.

Drives Session.prefill / Session.decode directly (not Session.generate) because the server
needs the logits: for logprobs, and to mask them for constrained decoding. Results go out
through `emit` as small dicts; the caller turns them into OpenAI chunks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from infr.engine import common_prefix
from infr.sampling import Sampler, SamplingParams, log_softmax, top_logprobs
from infr.serve.text import StopFilter


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stops: list[str] = field(default_factory=list)
    logprobs: int | None = None  # None: off; k >= 0: the chosen token plus k alternatives
    constraint: object | None = None  # grammar.Constraint
    forced: list[int] = field(default_factory=list)  # tokens the server writes before sampling
    cache_prompt: bool = True
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class Outcome:
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    reused_tokens: int = 0
    completion_tokens: int = 0
    ttft: float = 0.0  # seconds from start of work to the first sampled token
    gen_seconds: float = 0.0
    cancelled: bool = False


def token_entry(tok, token: int, logits: np.ndarray, lsm: np.ndarray, k: int) -> dict:
    raw = tok.token_to_bytes(token, special=True)
    entry = {"token": raw.decode("utf-8", errors="replace"), "logprob": float(lsm[token]), "bytes": list(raw)}
    entry["top_logprobs"] = []
    for tid, lp in top_logprobs(logits, k) if k > 0 else []:
        b = tok.token_to_bytes(tid, special=True)
        entry["top_logprobs"].append({"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)})
    return entry


def run(session, tokenizer, job: Job, emit: Callable[[dict], None]) -> Outcome:
    """Generate for `job` on `session`; calls emit({"text": str, "logprobs": [...]}) as text is
    released. Stops at EOG, a stop string, a finished grammar, max_tokens, a full context or
    `job.cancel`. The session's KV cache keeps prompt + output for the next request."""
    out = Outcome(prompt_tokens=len(job.prompt))
    n_ctx = session.model.n_ctx
    if job.cancel.is_set():  # the client left while the request waited for the backend
        out.cancelled, out.finish_reason = True, "cancelled"
        return out
    if not job.cache_prompt:
        session.reset()
    t0 = time.perf_counter()
    before = common_prefix(session.tokens, job.prompt + job.forced)
    logits = session.prefill(job.prompt + job.forced)
    out.reused_tokens = min(before, len(job.prompt) + len(job.forced) - 1)
    con = job.constraint
    sampler = Sampler(job.params, logits.shape[0])
    stream = tokenizer.stream(skip_special=True)
    stops = StopFilter(job.stops)
    pending: list[dict] = []  # logprob entries of tokens whose text is still held back
    t_first = None
    for i in range(job.max_tokens):
        if job.cancel.is_set():
            out.cancelled, out.finish_reason = True, "cancelled"
            break
        x = con.mask(logits) if con is not None else logits
        token = sampler.sample(x, session.tokens)
        if t_first is None:
            t_first = time.perf_counter()
            out.ttft = t_first - t0
        if tokenizer.is_eog(token):
            out.finish_reason = "stop"
            break
        out.completion_tokens += 1
        if con is not None:
            con.consume(token)
        if job.logprobs is not None:
            pending.append(token_entry(tokenizer, token, logits, log_softmax(logits), job.logprobs))
        text = stops.push(stream.push(token))
        if text or stops.hit is not None:
            emit({"text": text, "logprobs": pending})
            pending = []
        if stops.hit is not None:
            out.finish_reason = "stop"
            break
        if con is not None and con.done:
            out.finish_reason = "stop"
            break
        if len(session.tokens) + 1 >= n_ctx or i == job.max_tokens - 1:
            out.finish_reason = "length"
            break
        logits = session.decode(token)
    else:
        out.finish_reason = "length"
    if stops.hit is None and not out.cancelled:
        tail = stops.push(stream.flush()) + stops.flush()
        if tail or pending:
            emit({"text": tail, "logprobs": pending})
    if t_first is not None:
        out.gen_seconds = time.perf_counter() - t_first
    return out
