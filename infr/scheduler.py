"""Iteration-level continuous batching over the KV pool.

Each step takes one decode row per running request plus prefill chunks of
the others under a token budget (chunked prefill), runs them in one backend
`step(batch)`, and hands every sampled token to its request. Requests are
admitted while there are free sequence slots and KV blocks; a request's
prompt first takes any full blocks an earlier request left with the same
prefix (infr/kvpool.py). When a step needs a block and none is free, the
latest-admitted request is preempted: its blocks are released (its full ones
stay cached) and it is recomputed later from its tokens so far, so its output
is unchanged. A cancelled request frees its blocks at the next step. Before
each step, the sliding-window layers' blocks that no scheduled row can see any
more go back to their pool (infr/kvseq.py); the last window before each prompt's last block
boundary stays pinned as a checkpoint, so a later request sharing that prefix (a follow-up
turn, an edited last message) can still take it (infr/checkpoints.py).
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from infr.batch import Batch, OutputRow
from infr.checkpoints import Checkpoints, WindowCheckpoints
from infr.errors import InfrError
from infr.kvpool import BlockPool, block_hashes
from infr.kvseq import KVCache, SeqBlocks
from infr.numerics import has_penalties
from infr.sampling import Sampler, SamplingParams

_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """One generation. The callbacks run on the engine's thread:
    - on_token(token, logits or None) after each sampled token that is not end-of-generation;
      returning True finishes the request (a stop string, a finished grammar);
    - mask() -> the grammar's uint8 token bitmask for the next token, or None."""

    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_new: int = 256
    on_token: Callable[[int, np.ndarray | None], bool] | None = None
    mask: Callable[[], np.ndarray | None] | None = None
    want_logits: bool = False
    cache_prompt: bool = True
    on_done: Callable[[], None] | None = None  # called once when it finishes (any reason)
    ignore_eos: bool = False  # end-of-generation tokens are kept like any other (benchmarks)
    hold: bool = False  # pause after each output row instead of appending its token (Session.prefill / decode)
    # --- the engine's
    id: int = field(default_factory=lambda: next(_ids))
    tokens: list[int] = field(default_factory=list)  # prompt + output: what the sequence holds or will
    output: list[int] = field(default_factory=list)
    computed: int = 0  # leading tokens whose KV is in the cache
    kv: SeqBlocks = field(default_factory=SeqBlocks)  # its KV blocks (tables per pool) and their hashes
    slot: int | None = None
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache at first admission
    finish_reason: str | None = None  # stop | length | cancelled | error
    error: str | None = None
    preemptions: int = 0
    sampler: Sampler | None = None
    cancelled: bool = False
    t_submit: float = 0.0
    t_first: float | None = None
    t_done: float | None = None
    held: bool = False  # paused with its slot and blocks, waiting for resume()
    checkpoint_at: int | None = None  # this step's chunk ends where its recurrent state is snapshot
    last_logits: np.ndarray | None = None
    done_event: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    steps: int = 0
    rows: int = 0  # rows run, summed over steps
    max_rows: int = 0
    decode_rows: int = 0
    prefill_rows: int = 0
    step_seconds: float = 0.0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    cancelled: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)  # rows per step -> steps (power-of-two buckets)

    def add_step(self, rows: int, decode: int, seconds: float) -> None:
        self.steps += 1
        self.rows += rows
        self.max_rows = max(self.max_rows, rows)
        self.decode_rows += decode
        self.prefill_rows += rows - decode
        self.step_seconds += seconds
        bucket = 1 << max(0, (rows - 1).bit_length())
        self.batch_sizes[bucket] = self.batch_sizes.get(bucket, 0) + 1


class Scheduler:
    """Owns the requests and the pool's bookkeeping; `step()` runs one batch on the backend."""

    def __init__(self, backend, pool: BlockPool, n_ctx: int, is_eog: Callable[[int], bool], n_vocab: int,
                 parallel: int = 1, batch_tokens: int = 512, window_pool: BlockPool | None = None,
                 window: int | None = None, recurrent: bool = False, checkpoints: Checkpoints | None = None,
                 window_checkpoints: WindowCheckpoints | None = None):
        """`window_pool`, `window`: where the model has sliding-window layers, the pool of their
        KV blocks and their window (infr/kvseq.py); None: every layer's KV is in `pool`.
        `recurrent`: the model has recurrent (DeltaNet) layers (Plan.recurrent); `checkpoints`:
        where their state is snapshot for prefix reuse (infr/checkpoints.py; None: no reuse);
        `window_checkpoints`: where the window layers' last window is pinned for prefix reuse
        past it (None: a prefix is reused only while the window pool still caches its window)."""
        if parallel < 1:
            raise InfrError(f"--parallel must be at least 1, got {parallel}")
        if batch_tokens < parallel:
            raise InfrError(f"the batch-token budget ({batch_tokens}) must be at least --parallel ({parallel})")
        self.backend, self.pool, self.n_ctx = backend, pool, n_ctx
        self.window_pool = window_pool
        self.kv = KVCache(pool, window_pool, window)
        # A model with recurrent layers (DeltaNet) keeps per sequence a state that its KV blocks cannot
        # restore nor rewind: a prefix is taken from the cache only up to a block boundary where a
        # checkpoint of the state was kept, and a sequence that does not go on exactly where it stands
        # restarts from such a checkpoint, else from position 0 (infr/checkpoints.py).
        self.recurrent = recurrent
        self.checkpoints = checkpoints if recurrent else None
        self.window_checkpoints = window_checkpoints if window_pool is not None else None
        self.is_eog, self.n_vocab = is_eog, n_vocab
        self.parallel, self.batch_tokens = parallel, batch_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(parallel - 1, -1, -1))
        self.held: list[Request] = []  # paused with their slots (Session.prefill / decode), oldest first
        self.stats = EngineStats()
        # warm_next's (rows, far) shapes: the decode steps' buckets (powers of two, the last at --parallel)
        buckets = [min(1 << b, parallel) for b in range((parallel - 1).bit_length() + 1)]
        self._cold = deque([(rows, far) for far in (False, True) for rows in buckets])
        self._inbox: deque[Request] = deque()
        self._lock = threading.Condition()

    # --- from any thread

    def submit(self, req: Request) -> Request:
        if not req.prompt:
            raise InfrError("empty prompt: nothing to run")
        if len(req.prompt) >= self.n_ctx:
            raise InfrError(f"prompt has {len(req.prompt)} tokens but the context holds {self.n_ctx} (use --ctx)")
        if any(not 0 <= t < self.n_vocab for t in req.prompt):
            raise InfrError(f"token id out of range 0..{self.n_vocab - 1}")
        req.params = req.params.validate()
        req.tokens = list(req.prompt)
        req.t_submit = time.perf_counter()
        if req.sampler is None and not (req.params.greedy and not has_penalties(req.params)):
            if not req.params.greedy and not req.want_logits and self.backend.samples(req.params):
                # The backend draws on the device from a hash of (seed, position): a seed of the
                # request's own, so a preempted and recomputed request draws the same tokens.
                if req.params.seed is None:
                    req.params = replace(req.params, seed=secrets.randbits(63))
            else:
                req.sampler = Sampler(req.params, self.n_vocab)
        with self._lock:
            self._inbox.append(req)
            self._lock.notify_all()
        return req

    def cancel(self, req: Request) -> None:
        """The request ends at the next step boundary; its blocks are freed then."""
        with self._lock:
            req.cancelled = True
            self._lock.notify_all()

    def wait_for_work(self, timeout: float | None = None) -> bool:
        with self._lock:
            if not (self._inbox or self.waiting or self.running):
                self._lock.wait(timeout)
            return bool(self._inbox or self.waiting or self.running)

    def wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    # --- the engine thread

    @property
    def busy(self) -> bool:
        return bool(self._inbox or self.waiting or self.running)

    def warm_next(self) -> bool:
        """While idle: build ahead the backend's greedy decode step for the next bucket of rows up
        to --parallel (one stream first, then 2, 4, ...; every bucket's near form before any far
        one), one shape a call, so that a stream arriving meanwhile waits for one recording at most;
        False once every shape is built."""
        if not self._cold:
            return False
        self.backend.warm(*self._cold.popleft())
        return bool(self._cold)

    def step(self) -> bool:
        """One scheduling iteration; False when there was nothing to run."""
        with self._lock:
            while self._inbox:
                self.waiting.append(self._inbox.popleft())
        self._drop_cancelled()
        if self._multi_step():
            return True
        chunks = self._schedule()
        if not chunks:
            return False
        outputs, owners = [], []
        row = 0
        for req, start, n in chunks:
            row += n
            if start + n == len(req.tokens):  # the chunk reaches the sequence's end: sample its next token
                try:
                    mask = req.mask() if req.mask is not None else None
                except Exception as e:  # a request's own fault ends that request alone
                    self._finish(req, "error", error=f"{type(e).__name__}: {e}")
                    mask = None
                outputs.append(OutputRow(row - 1, req.params, req.tokens, req.sampler, mask, req.want_logits))
                owners.append(req)
        batch = Batch.build([(r.slot, r.tokens[s:s + n], s, r.kv.full, len(r.prompt)) for r, s, n in chunks], outputs,
                            self._window_tables(r for r, _, _ in chunks))
        t0 = time.perf_counter()
        try:
            res = self.backend.step(batch)
        except Exception as e:  # the step's requests fail; the engine and the others go on
            for req, _, _ in chunks:
                self._finish(req, "error", error=f"{type(e).__name__}: {e}")
            raise
        self.stats.add_step(batch.rows, sum(1 for _, _, n in chunks if n == 1), time.perf_counter() - t0)
        for req, start, n in chunks:
            if not req.done:
                req.computed = start + n
                self.kv.register(req.kv, req.tokens, req.computed)
                if req.checkpoint_at == req.computed:  # before _accept: a request that ends frees its slot
                    self.checkpoints.save(req.kv.hashes[req.computed // self.pool.block_size - 1], req.slot)
                self._pin_windows(req, start, req.computed)
            req.checkpoint_at = None
        for i, req in enumerate(owners):
            if req.done:
                continue
            try:
                self._accept(req, int(res.tokens[i]), res.logits.get(i))
            except Exception as e:  # on_token failed: that request ends with the error
                self._finish(req, "error", error=f"{type(e).__name__}: {e}")
        return True

    def _pin_windows(self, req: Request, start: int, end: int) -> None:
        """Checkpoint the window layers' last window at each checkpoint position in start + 1 .. end
        (what this step's chunk of req computed, or a prefix it was admitted with): its blocks are
        all held until the next step's trim."""
        ck = self.window_checkpoints
        if ck is None:
            return
        bs = self.pool.block_size
        for p in ck.targets(start, min(len(req.prompt), len(req.tokens))):
            if p > end:
                break
            ck.save(req.kv.hashes[p // bs - 1], req.kv, p)

    def _multi_step(self) -> bool:
        """Several decode steps in one backend call (tokens stay on the device) when every running
        request is decoding, greedy or drawn by the device's sampler, with nothing to check per token
        and nobody waits: up to backend.multi_step steps, as many as the closest finish allows. The
        tokens come back a few steps at a time and are handed out as they come; a new request or a
        cancellation ends the call early: no more steps start, and those already running are kept
        (a recurrent model's state has taken them). A request that ends part-way (end-of-generation,
        a stop string) drops the rest of its tokens; the KV they wrote is past its end and goes with
        its blocks (and a recurrent slot is started over or restored by its next user)."""
        k = self.backend.multi_step
        run = self.running
        if k < 2 or self.waiting or not run or len(run) > 64:
            return False
        for r in run:
            if (len(r.tokens) - r.computed != 1 or r.hold or r.mask is not None or r.want_logits
                    or r.sampler is not None or has_penalties(r.params) or r.cancelled):
                return False
            k = min(k, r.max_new - len(r.output), self.n_ctx - len(r.tokens))
        if k < 2:
            return False
        run = sorted(run, key=lambda r: r.id)
        for r in run:
            self.kv.trim(r.kv, r.computed)
        for r in run:
            if not self._grow(r, r.computed + k):
                return False  # the normal step preempts as needed
        outputs = [OutputRow(i, r.params) for i, r in enumerate(run)]
        batch = Batch.build([(r.slot, r.tokens[-1:], r.computed, r.kv.full, len(r.prompt)) for r in run], outputs,
                            self._window_tables(run))
        try:
            steps = self.backend.decode_steps(batch, k, stop=lambda: bool(self._inbox) or any(r.cancelled for r in run))
        except Exception as e:
            for r in run:
                self._finish(r, "error", error=f"{type(e).__name__}: {e}")
            raise
        t0 = time.perf_counter()
        try:
            for tokens in steps:  # each step's tokens as the backend hands them over
                now = time.perf_counter()
                live = [r for r in run if not r.done]
                if not live:
                    break
                self.stats.add_step(len(live), len(live), now - t0)
                t0 = now
                for r, token in zip(run, tokens):
                    if r.done or r.cancelled:
                        continue
                    r.computed += 1
                    self.kv.register(r.kv, r.tokens, r.computed)
                    try:
                        self._accept(r, int(token), None)
                    except Exception as e:
                        self._finish(r, "error", error=f"{type(e).__name__}: {e}")
        except Exception as e:
            for r in run:
                if not r.done:
                    self._finish(r, "error", error=f"{type(e).__name__}: {e}")
            raise
        finally:
            steps.close()  # all requests ended: the steps still in flight finish, their tokens dropped
        return True

    def run_until(self, done: Callable[[], bool]) -> None:
        """Drive steps on this thread until done() (a caller with no engine thread)."""
        while not done():
            if not self.step() and not done() and not (self.running or self._inbox or self.waiting):
                raise InfrError("the engine has nothing left to run")

    def resume(self, req: Request, tokens: list[int]) -> None:
        """A held request goes on: `tokens` become its sequence (their common prefix with what
        is cached is kept), and the next step computes the rest. Engine thread only."""
        if not req.held:
            raise InfrError("only a held request can resume")
        if req in self.held:
            self.held.remove(req)
        if req.slot is None:  # its slot went to another request meanwhile: admitted again, prefix cache first
            req.tokens, req.held, req.last_logits = list(tokens), False, None
            req.done_event.clear()
            self.waiting.appendleft(req)
            return
        bs = self.pool.block_size
        keep = 0
        n = min(req.computed, len(tokens) - 1)
        while keep < n and req.tokens[keep] == tokens[keep]:
            keep += 1
        if keep % bs and keep // bs < len(req.kv.hashes):  # never write into a block the prefix cache shares
            keep -= keep % bs
        req.tokens = list(tokens)
        if self.recurrent and keep != req.computed:  # the state stands at req.computed: a checkpoint before keep, or 0
            req.computed = self._restore(req, keep)
        elif self.kv.can_continue(req.kv, keep):
            self.kv.truncate(req.kv, keep)
            req.computed = keep
        else:  # its window blocks before `keep` went back: what the prefix cache still holds, else recompute
            self.kv.release(req.kv)
            req.computed = self._take_prefix(req)
        req.held, req.last_logits = False, None
        req.done_event.clear()
        self.running.append(req)

    def release(self, req: Request) -> None:
        """End a request now, whatever it is doing (a held one included). Engine thread only."""
        req.held = False
        if req in self.held:
            self.held.remove(req)
        self._finish(req, req.finish_reason or "stop")

    # --- internals

    def _drop_cancelled(self) -> None:
        for req in [r for r in self.running if r.cancelled] + [r for r in self.waiting if r.cancelled]:
            self._finish(req, "cancelled")

    def _window_tables(self, reqs) -> dict[int, list[int]] | None:
        """The window layers' block tables of these requests' slots (None: no window layers)."""
        return {r.slot: r.kv.window for r in reqs} if self.window_pool is not None else None

    def _schedule(self) -> list[tuple[Request, int, int]]:
        budget = self.batch_tokens
        chunks: list[tuple[Request, int, int]] = []
        for req in self.running:  # window blocks no row of theirs can see any more: back first, for anyone to take
            self.kv.trim(req.kv, req.computed)
        # Decode rows first (one token each), then prefill chunks of running requests, in arrival order.
        order = sorted(self.running, key=lambda r: (len(r.tokens) - r.computed > 1, r.id))
        for req in order:
            if req not in self.running or budget == 0:
                continue  # preempted while an earlier request took blocks
            n = self._chunk(req, min(len(req.tokens) - req.computed, budget))
            if not self._reserve(req, req.computed + n):
                continue  # req itself was preempted or failed
            chunks.append((req, req.computed, n))
            budget -= n
        # Then admit waiting requests while slots, budget and blocks last; a request that finds every
        # slot taken takes the one of the longest-paused held sequence (its full blocks stay cached).
        while self.waiting and self.held and not self._free_slots:
            old = self.held.pop(0)
            self.kv.release(old.kv)
            old.computed = 0
            self._free_slot(old)
        while self.waiting and self._free_slots and budget > 0:
            req = self.waiting[0]
            if not self._admit(req, chunks):
                break
            self.waiting.popleft()
            n = self._chunk(req, min(len(req.tokens) - req.computed, budget))
            if not self._grow(req, req.computed + n):
                self._evict_to_waiting(req, front=True)
                if not chunks and not self.running:  # nothing will free a block: it can never fit
                    self._finish(req, "error", error=self._too_big())
                    continue
                break
            chunks.append((req, req.computed, n))
            budget -= n
        return [(r, s, n) for r, s, n in chunks if r in self.running]

    def _admit(self, req: Request, chunks) -> bool:
        """Give req a slot and its cached prefix blocks (kvseq.KVCache.admit: the window layers' rule)."""
        req.slot = self._free_slots.pop()
        req.computed = self._take_prefix(req)
        if req.cached_tokens is None:
            req.cached_tokens = req.computed
            self.stats.prefix_hit_tokens += req.computed
        self.running.append(req)
        return True

    def _take_prefix(self, req: Request) -> int:
        """req (with a slot, no blocks) takes its cached prefix: the tokens it need not compute."""
        ck = self.window_checkpoints
        done = self.kv.admit(req.kv, req.tokens, req.cache_prompt, pinned=ck.lookup if ck is not None else None)
        if done:  # admitted at its prompt's last boundary: nothing will compute up to it, checkpoint it now
            self._pin_windows(req, done - 1, done)
        return self._restore(req, done) if self.recurrent and done else done

    def _restore(self, req: Request, upto: int) -> int:
        """A recurrent sequence goes back to the latest checkpoint of its prefix at or before upto
        (loaded into its slot), keeping only the KV before it; that position, or 0."""
        at = 0
        if self.checkpoints is not None:
            at = self.checkpoints.restore(req.slot, req.kv.hashes, upto, lambda p: self.kv.can_continue(req.kv, p))
        self.kv.truncate(req.kv, at)
        return at

    def _chunk(self, req: Request, n: int) -> int:
        """A recurrent sequence's next n rows, cut to end at its next checkpoint position whose
        prefix has none yet (req.checkpoint_at: step() snapshots there)."""
        req.checkpoint_at = None
        if self.checkpoints is None:
            return n
        bs, start = self.pool.block_size, req.computed
        for p in self.checkpoints.targets(start, min(len(req.prompt), len(req.tokens))):
            if p > start + n:
                break
            parent = req.kv.hashes[-1] if req.kv.hashes else b""
            h = block_hashes(req.tokens[:p], bs, start=len(req.kv.hashes), parent=parent)[-1]
            if h not in self.checkpoints:
                req.checkpoint_at = p
                return p - start
        return n

    def _grow(self, req: Request, n_tokens: int) -> bool:
        """Blocks for req's first n_tokens, without preempting anyone: window checkpoints are
        dropped (least recently used first) while the window pool is what runs short."""
        while not self.kv.grow(req.kv, n_tokens):
            need = -(-n_tokens // self.pool.block_size) - len(req.kv.full)
            ck = self.window_checkpoints
            if ck is None or self.pool.free < need or self.window_pool.free >= need or not ck.drop_oldest():
                return False
        return True

    def _reserve(self, req: Request, n_tokens: int) -> bool:
        """Blocks for req's first n_tokens, preempting the latest-admitted requests as needed.
        False when req itself had to go."""
        while not self._grow(req, n_tokens):
            victim = max(self.running, key=lambda r: r.id)
            if victim is req and len(self.running) == 1:
                self._finish(req, "error", error=self._too_big())
                return False
            self._evict_to_waiting(victim, front=True)
            self.stats.preemptions += 1
            victim.preemptions += 1
            if victim is req:
                return False
        return True

    def _too_big(self) -> str:
        return self.kv.too_big()

    def _evict_to_waiting(self, req: Request, front: bool) -> None:
        self.kv.release(req.kv)
        req.computed = 0
        self._free_slot(req)
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _free_slot(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        if req.slot is not None:
            self._free_slots.append(req.slot)
            req.slot = None

    def _accept(self, req: Request, token: int, logits: np.ndarray | None) -> None:
        if req.hold:  # the caller reads the logits and says what comes next (resume)
            req.last_logits, req.held = logits, True
            self.running.remove(req)
            self.held.append(req)
            req.done_event.set()
            return
        if req.cancelled:
            self._finish(req, "cancelled")
            return
        if req.t_first is None:
            req.t_first = time.perf_counter()
        if self.is_eog(token) and not req.ignore_eos:
            self._finish(req, "stop")
            return
        req.output.append(token)
        req.tokens.append(token)
        stop = bool(req.on_token(token, logits)) if req.on_token is not None else False
        if stop:
            self._finish(req, "stop")
        elif len(req.output) >= req.max_new or len(req.tokens) >= self.n_ctx:
            self._finish(req, "length")

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        if req.done:
            return
        req.finish_reason, req.error = reason, error
        req.t_done = time.perf_counter()
        self.kv.release(req.kv)
        self._free_slot(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.stats.finished += 1
        self.stats.cancelled += reason == "cancelled"
        req.done_event.set()
        if req.on_done is not None:
            req.on_done()


