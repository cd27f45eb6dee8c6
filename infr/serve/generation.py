"""One request's side of the engine: its stop strings, grammar and logprobs.

The engine (infr/scheduler.py) runs every request's rows in shared steps on
its own thread; `Tracker` turns each sampled token into text events for one
request as the engine hands it over, says when a stop string or a finished
grammar ends it, and sums up the outcome. Events go out through `emit` as
small dicts; the caller turns them into OpenAI chunks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from infr.sampling import SamplingParams, log_softmax, top_logprobs
from infr.scheduler import Request
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
    ignore_eos: bool = False
    keep_tokens: frozenset[int] = frozenset()  # special tokens whose text stays in the output
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class Outcome:
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    reused_tokens: int = 0
    completion_tokens: int = 0
    ttft: float = 0.0  # seconds from submission to the first sampled token
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


class Tracker:
    """Follows one job's tokens (on the engine thread) and finishes its text (on the caller's)."""

    def __init__(self, tokenizer, job: Job, emit: Callable[[dict], None]):
        self.tok, self.job, self.emit = tokenizer, job, emit
        self.stream = tokenizer.stream(skip_special=True, keep=job.keep_tokens)
        self.stops = StopFilter(job.stops)
        self.pending: list[dict] = []  # logprob entries of tokens whose text is still held back

    def request(self, on_done: Callable[[], None] | None = None) -> Request:
        job, con = self.job, self.job.constraint
        return Request(job.prompt + job.forced, job.params, max_new=job.max_tokens, on_token=self.on_token,
                       mask=con.bitmask if con is not None else None, want_logits=job.logprobs is not None,
                       cache_prompt=job.cache_prompt, ignore_eos=job.ignore_eos, on_done=on_done)

    def on_token(self, token: int, logits: np.ndarray | None) -> bool:
        """True ends the request: a stop string, a finished grammar, or the client left."""
        job, con = self.job, self.job.constraint
        if con is not None:
            con.consume(token)
        if job.logprobs is not None and logits is not None:
            self.pending.append(token_entry(self.tok, token, logits, log_softmax(logits), job.logprobs))
        text = self.stops.push(self.stream.push(token))
        if text or self.stops.hit is not None:
            self.emit({"text": text, "logprobs": self.pending})
            self.pending = []
        return self.stops.hit is not None or (con is not None and con.done) or job.cancel.is_set()

    def outcome(self, req: Request) -> tuple[Outcome, dict | None]:
        """After the request is done: what happened, and the held-back text's event (or None)."""
        out = Outcome(prompt_tokens=len(self.job.prompt), reused_tokens=req.cached_tokens or 0,
                      completion_tokens=len(req.output))
        out.cancelled = req.finish_reason == "cancelled" or self.job.cancel.is_set()
        out.finish_reason = "cancelled" if out.cancelled else req.finish_reason or "stop"
        if self.stops.hit is not None:
            out.finish_reason = "stop"
        if req.t_first is not None:
            out.ttft = req.t_first - req.t_submit
            out.gen_seconds = (req.t_done if req.t_done is not None else time.perf_counter()) - req.t_first
        tail = None
        if self.stops.hit is None and not out.cancelled:
            text = self.stops.push(self.stream.flush()) + self.stops.flush()
            if text or self.pending:
                tail = {"text": text, "logprobs": self.pending}
        return out, tail
