"""The engine: a loaded model and sessions that prefill, decode and generate.

`Model` ties the store, the family spec, the plan, the tokenizer, the chat
template and a backend together. A `Session` owns the KV cache position and
keeps the longest common prefix between calls, so a follow-up chat turn
prefills only its new tokens.
"""

from __future__ import annotations

import os
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from infr.backends import choose_backend, make_backend
from infr.chat import ChatTemplate
from infr.errors import InfrError
from infr.gguf_file import GGUFFile, open_gguf
from infr.models import build_spec
from infr.models.spec import ModelSpec
from infr.plan import Plan, build_plan
from infr.sampling import Sampler, SamplingParams
from infr.tokenizer import Tokenizer



@dataclass
class Stats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    reused_tokens: int = 0
    gpu_loop: dict | None = None  # the GPU-resident loop's numbers (infr/gpu/decode.py), when it ran

    def line(self) -> str:
        def rate(n: int, s: float) -> str:
            return f"{n / s:.1f} tok/s" if s > 0 and n else "- tok/s"

        return (
            f"prompt: {self.prompt_tokens} tokens ({self.reused_tokens} reused), "
            f"{rate(self.prompt_tokens - self.reused_tokens, self.prompt_seconds)} | "
            f"generated: {self.generated_tokens} tokens, {rate(self.generated_tokens, self.generate_seconds)}"
        )


class Model:
    def __init__(self, path: str | os.PathLike[str], n_ctx: int = 4096, backend: str = "auto", progress=None):
        self.path = Path(path)
        self.gguf: GGUFFile = open_gguf(self.path)
        self.spec: ModelSpec = build_spec(self.gguf)
        self.plan: Plan = build_plan(self.spec)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        tok = self.tokenizer
        self.template = ChatTemplate.from_gguf(
            self.gguf,
            bos_token=tok.piece(tok.bos_id) if tok.bos_id is not None else "",
            eos_token=tok.piece(tok.eos_id) if tok.eos_id is not None else "",
        )
        if n_ctx <= 0:
            raise InfrError(f"context size must be positive, got {n_ctx}")
        self.n_ctx = n_ctx
        self.backend_name, self.backend_note = choose_backend(backend)
        # progress(stage, done, total): load progress, e.g. infr.notebook.tqdm_progress()
        self.backend = make_backend(self.backend_name, self.gguf, self.plan, n_ctx, progress=progress)

    def session(self) -> "Session":
        return Session(self)


@dataclass
class Session:
    model: Model
    tokens: list[int] = field(default_factory=list)  # what the KV cache holds, in order
    stats: Stats = field(default_factory=Stats)

    def reset(self) -> None:
        self.tokens = []

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Bring the cache to exactly `ids`; returns the last position's logits."""
        if not ids:
            raise InfrError("empty prompt: nothing to run")
        n_ctx = self.model.n_ctx
        if len(ids) > n_ctx:
            raise InfrError(f"prompt has {len(ids)} tokens but the context holds {n_ctx} (use --ctx)")
        keep = common_prefix(self.tokens, ids)
        keep = min(keep, len(ids) - 1)  # at least one token runs, to produce logits
        t0 = time.perf_counter()
        logits = self.model.backend.forward(ids[keep:], keep)[-1]
        self.stats.prompt_seconds += time.perf_counter() - t0
        self.stats.prompt_tokens += len(ids)
        self.stats.reused_tokens += keep
        self.tokens = list(ids)
        return logits

    def decode(self, token: int) -> np.ndarray:
        """Append one token; returns its logits."""
        logits = self.model.backend.forward([token], len(self.tokens))[-1]
        self.tokens.append(token)
        return logits

    def generate(
        self, prompt: list[int], params: SamplingParams | None = None, max_new: int = 256
    ) -> Iterator[int]:
        """Yield sampled tokens until end-of-generation, max_new or a full context."""
        params = (params or SamplingParams()).validate()
        sampler = Sampler(params, self.model.spec.n_vocab)
        self.stats = Stats()
        logits = self.prefill(prompt)
        t0 = time.perf_counter()
        try:
            if hasattr(self.model.backend, "decode_stream") and self.model.backend.can_sample(params):
                yield from self._generate_resident(logits, params, max_new)  # sampled on the GPU
                return
            for i in range(max_new):
                token = sampler.sample(logits, self.tokens)
                if self.model.tokenizer.is_eog(token):
                    return
                self.stats.generated_tokens += 1
                yield token
                if len(self.tokens) >= self.model.n_ctx or i == max_new - 1:
                    return
                logits = self.decode(token)
        finally:
            self.stats.generate_seconds += time.perf_counter() - t0

    def _generate_resident(self, logits: np.ndarray, params: SamplingParams, max_new: int) -> Iterator[int]:
        """generate() on the GPU-resident loop (infr/gpu/decode.py), with the host loop's
        rule for `tokens`: a token joins them once the model has run it (all but the last of n)."""
        n = min(max_new, self.model.n_ctx - len(self.tokens) + 1)
        last = None
        with closing(self.model.backend.decode_stream(logits, self.tokens, n, params)) as stream:
            try:
                for j, token in enumerate(stream):
                    if self.model.tokenizer.is_eog(token):
                        break
                    if last is not None:
                        self.tokens.append(last[0])
                    self.stats.generated_tokens += 1
                    yield token
                    last = (token, j)
            finally:
                self.stats.gpu_loop = self.model.backend.resident().last
        if last is not None and last[1] < n - 1:
            self.tokens.append(last[0])


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (the KV cache reuse rule)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

