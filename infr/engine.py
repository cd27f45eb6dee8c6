"""The engine: a loaded model, its KV pool and scheduler, and sessions.

`Model` ties the store, the family spec, the plan, the tokenizer, the chat
template and a backend together, and owns the one decode loop: a
`Scheduler` (infr/scheduler.py) over a `BlockPool` (infr/kvpool.py) that
batches every running sequence into one backend `step(batch)`. `infr serve`
runs it on an engine thread; a `Session` (`infr run`, notebooks, tools)
drives it on the caller's thread. A follow-up chat turn prefills only what
the prefix cache does not hold.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from infr.backends import choose_backend, make_backend, step_rows
from infr.kvpool import BLOCK_SIZE, BlockPool, KVBudget
from infr.chat import ChatTemplate
from infr import checkpoints as ckpt
from infr.errors import InfrError
from infr.gguf_file import GGUFFile, open_gguf
from infr.models import build_spec
from infr.models.spec import ModelSpec
from infr.plan import Plan, bind, build_plan
from infr.sampling import SamplingParams
from infr.scheduler import Request, Scheduler
from infr.split import SplitOptions
from infr.tokenizer import Tokenizer



@dataclass
class Stats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    reused_tokens: int = 0

    def line(self) -> str:
        def rate(n: int, s: float) -> str:
            return f"{n / s:.1f} tok/s" if s > 0 and n else "- tok/s"

        return (
            f"prompt: {self.prompt_tokens} tokens ({self.reused_tokens} reused), "
            f"{rate(self.prompt_tokens - self.reused_tokens, self.prompt_seconds)} | "
            f"generated: {self.generated_tokens} tokens, {rate(self.generated_tokens, self.generate_seconds)}"
        )


class Model:
    """A loaded model. `parallel`: sequences the engine runs at once; `kv_tokens`: the KV pool's
    capacity in tokens (default: n_ctx for each of them), or a kvpool.KVBudget (a fraction of the
    memory free after the weights); `batch_tokens`: rows per step at most; `cpu_moe`: the experts of the
    first cpu_moe MoE layers stay in host memory and run on the CPU (llama.cpp's --n-cpu-moe).
    A recurrent model (qwen35) keeps snapshots of its state for prefix reuse (infr/checkpoints.py):
    `checkpoints` of them at most (default checkpoints.PER_SEQUENCE per parallel sequence; 0: none,
    every prompt computed from position 0), taken every `checkpoint_every` blocks of a prompt (default
    checkpoints.EVERY_TOKENS) and at its last block boundary. A model with sliding-window layers
    (gemma3, gemma4) pins their last window at the same points instead (checkpoints.WindowCheckpoints;
    default checkpoints.SWA_PER_SEQUENCE per parallel sequence, llama-server's --swa-checkpoints; 0:
    a prefix is reused only while the window pool still caches its window). `split`: one model across
    several GPUs (infr/split.py: `--split-mode layer --tensor-split 1,1`)."""

    def __init__(self, path: str | os.PathLike[str], n_ctx: int = 4096, backend: str = "auto", progress=None,
                 parallel: int = 1, kv_tokens: int | None = None, batch_tokens: int = 512, cpu_moe: int = 0,
                 checkpoints: int | None = None, checkpoint_every: int | None = None,
                 split: SplitOptions | None = None):
        self.path = Path(path)
        self.gguf: GGUFFile = open_gguf(self.path)
        self.spec: ModelSpec = build_spec(self.gguf)
        # Bound to the file: a damaged file fails here, with the tensor's name; each matmul's numerics set.
        self.plan: Plan = bind(build_plan(self.spec), self.gguf)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        tok = self.tokenizer
        self.template = ChatTemplate.from_gguf(
            self.gguf,
            bos_token=tok.piece(tok.bos_id) if tok.bos_id is not None else "",
            eos_token=tok.piece(tok.eos_id) if tok.eos_id is not None else "",
        )
        if n_ctx <= 0:
            raise InfrError(f"context size must be positive, got {n_ctx}")
        if parallel < 1:
            raise InfrError(f"parallel must be at least 1, got {parallel}")
        if cpu_moe < 0:
            raise InfrError(f"cpu_moe must be 0 or more MoE layers, got {cpu_moe}")
        self.n_ctx = n_ctx
        kv_tokens = kv_tokens if kv_tokens is not None else n_ctx * parallel
        if isinstance(kv_tokens, KVBudget):  # a fraction of free memory: the backend sizes it after the weights
            kv = kv_tokens
        else:
            if kv_tokens < min(n_ctx, BLOCK_SIZE):
                raise InfrError(f"a KV cache of {kv_tokens} tokens is too small (at least {min(n_ctx, BLOCK_SIZE)})")
            kv = -(-kv_tokens // BLOCK_SIZE)
        self.backend_name, self.backend_note = choose_backend(backend)
        # A budget past what the backend's step holds is cut to it (llama-server's -b past -ub runs in
        # ubatches; here a step is one ubatch), and said, rather than failing every request of a large step.
        self.batch_note = ""
        if batch_tokens > (rows := step_rows(self.backend_name)):
            self.batch_note = f"{batch_tokens} tokens per step asked; the {self.backend_name} backend runs at most {rows}"
            batch_tokens = rows
        self.batch_tokens = batch_tokens
        # progress(stage, done, total): load progress, e.g. infr.notebook.tqdm_progress()
        self.backend = make_backend(self.backend_name, self.gguf, self.plan, n_ctx, progress=progress,
                                    kv_blocks=kv, max_seqs=parallel, batch_tokens=batch_tokens, cpu_moe=cpu_moe,
                                    split=split)
        self.kv_note = kv.note if isinstance(kv, KVBudget) else ""  # how a fraction was sized
        self.pool = BlockPool(self.backend.n_blocks if isinstance(kv, KVBudget) else kv, BLOCK_SIZE)
        # Sliding-window layers: a pool of their own, sized by the backend for the windows of `parallel`
        # sequences; the engine gives their blocks back as they fall out of the window (infr/kvseq.py).
        self.window_pool = BlockPool(self.backend.n_window_blocks, BLOCK_SIZE) if self.plan.window else None
        self.checkpoints = None
        if self.plan.recurrent:
            n = ckpt.PER_SEQUENCE * parallel if checkpoints is None else checkpoints
            per = self.plan.recurrent_bytes_per_sequence
            every = checkpoint_every if checkpoint_every is not None else max(1, ckpt.EVERY_TOKENS // BLOCK_SIZE)
            self.checkpoints = ckpt.Checkpoints(self.backend, per, n * per, BLOCK_SIZE, every)
        self.window_checkpoints = None
        if self.window_pool is not None:
            n = ckpt.SWA_PER_SEQUENCE * parallel if checkpoints is None else checkpoints
            every = checkpoint_every if checkpoint_every is not None else max(1, ckpt.EVERY_TOKENS // BLOCK_SIZE)
            self.window_checkpoints = ckpt.WindowCheckpoints(self.window_pool, self.plan.window, n, every,
                                                             self.plan.kv_bytes_per_token(True))
        self.engine = Scheduler(self.backend, self.pool, n_ctx, tok.is_eog, self.spec.n_vocab,
                                parallel=parallel, batch_tokens=batch_tokens, window_pool=self.window_pool,
                                window=self.plan.window, recurrent=bool(self.plan.recurrent),
                                checkpoints=self.checkpoints, window_checkpoints=self.window_checkpoints)

    def session(self) -> "Session":
        return Session(self)


@dataclass
class Session:
    """One conversation on the model's engine, driven from the caller's thread."""

    model: Model
    tokens: list[int] = field(default_factory=list)  # the sequence so far, in order
    stats: Stats = field(default_factory=Stats)
    _held: Request | None = None  # the sequence prefill() / decode() extend

    def reset(self) -> None:
        self._drop()
        self.tokens = []

    def _drop(self) -> None:
        if self._held is not None:
            self.model.engine.release(self._held)
            self._held = None

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Bring the sequence to exactly `ids`; returns the last position's logits."""
        if not ids:
            raise InfrError("empty prompt: nothing to run")
        n_ctx = self.model.n_ctx
        if len(ids) > n_ctx:
            raise InfrError(f"prompt has {len(ids)} tokens but the context holds {n_ctx} (use --ctx)")
        eng = self.model.engine
        t0 = time.perf_counter()
        if self._held is None:
            self._held = eng.submit(Request(list(ids), SamplingParams(temperature=0.0), max_new=1 << 30,
                                            want_logits=True, hold=True))
            reused = None
        else:
            eng.resume(self._held, list(ids))
            reused = self._held.computed
        eng.run_until(lambda: self._held.held or self._held.done)
        self._check(self._held)
        self.stats.prompt_seconds += time.perf_counter() - t0
        self.stats.prompt_tokens += len(ids)
        self.stats.reused_tokens += self._held.cached_tokens if reused is None else reused
        self.tokens = list(ids)
        return self._held.last_logits

    def decode(self, token: int) -> np.ndarray:
        """Append one token; returns its logits."""
        if self._held is None:
            raise InfrError("decode() needs a prefill() first")
        return self.prefill(self.tokens + [int(token)])

    def generate(
        self, prompt: list[int], params: SamplingParams | None = None, max_new: int = 256
    ) -> Iterator[int]:
        """Yield sampled tokens until end-of-generation, max_new or a full context."""
        params = (params or SamplingParams()).validate()
        self._drop()
        self.stats = Stats()
        if not prompt:
            raise InfrError("empty prompt: nothing to run")
        if len(prompt) > self.model.n_ctx:
            raise InfrError(f"prompt has {len(prompt)} tokens but the context holds {self.model.n_ctx} (use --ctx)")
        if max_new <= 0:
            return
        eng = self.model.engine
        out: list[int] = []
        req = Request(list(prompt), params, max_new=max_new, on_token=lambda t, _: out.append(t) and False)
        t0 = time.perf_counter()
        eng.submit(req)
        sent = 0
        try:
            while True:
                if sent < len(out):
                    if self.stats.prompt_seconds == 0.0:
                        self.stats.prompt_seconds = time.perf_counter() - t0
                        t0 = time.perf_counter()
                    sent += 1
                    self.stats.generated_tokens += 1
                    yield out[sent - 1]
                    continue
                if req.done:
                    break
                eng.run_until(lambda: req.done or len(out) > sent)
            self._check(req)
        finally:
            if not req.done:
                eng.cancel(req)
                eng.step()  # frees its blocks now
            self.stats.generate_seconds += time.perf_counter() - t0
            self.stats.prompt_tokens = len(prompt)
            self.stats.reused_tokens = req.cached_tokens or 0
            self.tokens = list(prompt) + out[:sent]  # the conversation as the caller got it

    @staticmethod
    def _check(req: Request) -> None:
        if req.finish_reason == "error":
            raise InfrError(req.error or "generation failed")


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (the KV cache reuse rule)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
