"""The KV cache pool: fixed-size blocks, ref-counted, shared by token prefix.

The engine owns this bookkeeping; a backend owns the memory (per layer, a
[n_blocks * block_size, kv_heads, head_dim] store) and reads a sequence's
keys through its block table (PagedAttention, Kwon et al. SOSP 2023).

A block is *full* when all block_size of its tokens are in the cache. A full
block is hashed by its tokens and the hash of the block before it (so a hash
names the whole prefix up to the block's end) and can then be shared by any
sequence whose tokens start the same way (vLLM's automatic prefix caching).
Blocks whose last user went are kept, still hashed, until the space is
needed: the least recently released one is evicted first. A *pinned* block
(a checkpoint of the sliding-window layers' KV, infr/checkpoints.py) is never
evicted nor reused while pinned, but it is not in use by any sequence either.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from infr.errors import InfrError

BLOCK_SIZE = 32  # tokens per block: a prefix hit is rounded down to it
# Pinned windows (checkpoints of the sliding-window layers, infr/checkpoints.py) the window store
# has room for per sequence: one keeps a conversation's last prompt for its next turn. More may be
# kept in the store's idle blocks; they give way when a step needs them.
WINDOW_CHECKPOINTS = 1


class PoolFull(Exception):
    """No block is free or evictable."""


class KVBudget:
    """A KV store sized as a fraction of the memory its backend finds free once the weights are
    in (`--kv-size 0.9` or `90%`): the backend calls blocks() before it allocates the store."""

    RESERVE = 512 << 20  # bytes left for what the backend allocates after its store (graphs, scratch)

    def __init__(self, fraction: float):
        if not 0 < fraction <= 1:
            raise InfrError(f"a KV cache fraction must lie in (0, 1], got {fraction}")
        self.fraction = fraction
        self.note = ""  # how it was sized, once blocks() ran: for the start-up report

    def free_memory(self, backend) -> tuple[int, str] | None:
        """(free bytes, where) the fraction is taken of (a layer split's parts on one adapter share one reading)."""
        return backend.free_memory()

    def describe(self, free: tuple[int, str]) -> str:
        return f"{self.fraction:.0%} of {free[0] / 2**30:.1f} GiB free {free[1]}"

    def blocks(self, backend, block_size: int, min_blocks: int = 1, max_blocks: int | None = None,
               per_token: int | None = None, reserved: int = 0) -> int:
        """Blocks of `block_size` tokens in the fraction of the free memory (less RESERVE), at most
        max_blocks (a per-layer buffer's binding limit); fewer than min_blocks (one context) is
        an error, not a larger store than asked for. `per_token`: bytes a token of a block takes
        (default backend.kv_bytes_per_token, every layer); `reserved`: bytes of the fraction
        already spoken for (the sliding-window layers' store, sized by what it must hold)."""
        free = self.free_memory(backend)
        if free is None:
            raise InfrError(f"--kv-size as a fraction needs the free memory of the {backend.name} backend's device, "
                            "which it cannot query here; give the KV cache size in tokens")
        per_token = per_token or backend.kv_bytes_per_token
        n = int(self.fraction * max(0, free[0] - self.RESERVE) - reserved) // (per_token * block_size)
        n = max(n, 0)
        self.note = self.describe(free)
        if max_blocks is not None and n > max_blocks:
            n = max_blocks
            self.note += ", capped by the device's largest buffer binding"
        if n < min_blocks:
            raise InfrError(f"--kv-size {self.fraction:g}: {self.note} holds {n * block_size} tokens, "
                            f"less than one context ({min_blocks * block_size}); give more, or a smaller --ctx")
        return n


def window_span(window: int, block_size: int) -> int:
    """Whole blocks a row at a block boundary sees in the window layers (the window - 1 keys
    before it): what a checkpoint of the window pins (infr/checkpoints.py)."""
    return -(-(window - 1) // block_size)


def window_blocks(window: int, block_size: int, max_seqs: int, batch_tokens: int, ahead: int,
                  blocks_per_seq: int, checkpoints: int = 0) -> int:
    """Blocks the sliding-window layers' pool needs so that it is never what stops a step: each of
    max_seqs sequences holds the blocks of the window - 1 keys before its first row (a block more
    where they straddle one), and its rows' own: `ahead` positions of a multi-step decode call,
    or its share of the step's batch_tokens prompt rows (a block more each for alignment). A
    sequence never holds more than blocks_per_seq (one context). llama.cpp sizes its SWA cache
    the same way: the window times the sequences, plus one batch. `checkpoints`: room for that
    many pinned windows (infr/checkpoints.py) on top."""
    per_seq = window_span(window, block_size) + 1 + -(-max(ahead, 1) // block_size) + 1
    return (max_seqs * min(blocks_per_seq, per_seq) + -(-batch_tokens // block_size)
            + checkpoints * min(blocks_per_seq, window_span(window, block_size)))


def store_sizes(backend, plan, kv_blocks: "int | KVBudget | None", block_size: int, blocks_per_seq: int,
                max_seqs: int | None = None, batch_tokens: int | None = None, max_blocks: int | None = None,
                ) -> tuple[int, int]:
    """(blocks of the full layers' store, blocks of the sliding-window layers' store) for a
    backend of this plan. `kv_blocks`: the full store's blocks (at least one context), or a
    KVBudget: the memory fraction less what the window store takes goes to the full store, so
    more sequences fit. The window store is sized by window_blocks for max_seqs sequences of
    batch_tokens rows a step (ahead: the backend's multi_step), at most the full store's size;
    without max_seqs, or without full layers to give the memory to, it is the full store's size
    (so one sequence can run over an identity table: forward()); it has room for
    WINDOW_CHECKPOINTS checkpoints of each sequence's window. A recurrent model's per-slot
    state (max_seqs sequences of Plan.recurrent_bytes_per_sequence) comes out of a KVBudget first."""
    full_b, win_b = plan.kv_bytes_per_token(False), plan.kv_bytes_per_token(True)
    states = plan.recurrent_bytes_per_sequence * (max_seqs or 1)
    need = None
    if plan.window and full_b and max_seqs is not None:
        need = window_blocks(plan.window, block_size, max_seqs, batch_tokens or block_size, backend.multi_step,
                             blocks_per_seq, WINDOW_CHECKPOINTS * max_seqs)
    if isinstance(kv_blocks, KVBudget):
        if need is None:
            n = kv_blocks.blocks(backend, block_size, blocks_per_seq, max_blocks, reserved=states)
            return n, n
        n = kv_blocks.blocks(backend, block_size, blocks_per_seq, max_blocks, per_token=full_b,
                             reserved=need * block_size * win_b + states)
        return n, min(n, need)
    n = max(int(kv_blocks or 0), blocks_per_seq)
    return n, n if need is None else min(n, need)


def parse_kv_size(text: str) -> "int | KVBudget":
    """`--kv-size`: tokens (an integer), or a fraction of the free memory (0.9 or 90%)."""
    t = str(text).strip()
    try:
        if t.endswith("%"):
            return KVBudget(float(t[:-1]) / 100)
        if t.isdigit():
            if int(t) < 1:
                raise ValueError(t)
            return int(t)
        return KVBudget(float(t))
    except ValueError:
        raise InfrError(f"--kv-size takes tokens (4096) or a fraction of free memory (0.9, 90%), got {text!r}") from None


def block_hashes(tokens: Sequence[int], block_size: int, start: int = 0, parent: bytes = b"") -> list[bytes]:
    """Chained hashes of the full blocks of `tokens`, from block `start` on
    (`parent`: the hash of block start - 1)."""
    out = []
    ids = np.asarray(tokens, dtype="<i4")
    for b in range(start, len(ids) // block_size):
        h = hashlib.blake2b(ids[b * block_size:(b + 1) * block_size].tobytes(), digest_size=16, key=parent[:64])
        parent = h.digest()
        out.append(parent)
    return out


class BlockPool:
    def __init__(self, n_blocks: int, block_size: int = BLOCK_SIZE):
        if n_blocks <= 0:
            raise ValueError(f"a KV pool needs at least one block, got {n_blocks}")
        self.n_blocks, self.block_size = int(n_blocks), int(block_size)
        self.ref = [0] * self.n_blocks
        self.hash_of: list[bytes | None] = [None] * self.n_blocks
        self.by_hash: dict[bytes, int] = {}
        self._free = list(range(self.n_blocks - 1, -1, -1))  # never hashed, or evicted: pop() takes block 0 first
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced but hashed, oldest release first
        self._pins: dict[int, int] = {}  # block -> pins on it (checkpoints)
        self._idle_pinned = 0  # pinned blocks no sequence references: neither used nor free
        self.evicted = 0
        self.peak = 0  # most blocks in use at once

    # --- queries

    @property
    def free(self) -> int:
        """Blocks a new allocation can take (unreferenced, cached ones included)."""
        return len(self._free) + len(self._cached)

    @property
    def used(self) -> int:
        """Blocks sequences reference."""
        return self.n_blocks - self.free - self._idle_pinned

    @property
    def pinned(self) -> int:
        """Blocks pinned (by checkpoints), whether sequences reference them too or not."""
        return len(self._pins)

    @property
    def cached(self) -> int:
        """Hashed blocks (in use or not): what a prefix can hit."""
        return len(self.by_hash)

    def match(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks holding the longest run of these prefix hashes."""
        out = []
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    # --- changes

    def take(self, blocks: Sequence[int]) -> None:
        """Reference blocks found by match()."""
        for b in blocks:
            if self.ref[b] == 0:
                if b in self._pins:
                    self._idle_pinned -= 1
                else:
                    self._cached.pop(b, None)
            self.ref[b] += 1
        self.peak = max(self.peak, self.used)

    def allocate(self) -> int:
        """A fresh block (referenced once), evicting the oldest cached one if needed."""
        if self._free:
            b = self._free.pop()
        elif self._cached:
            b, _ = self._cached.popitem(last=False)
            del self.by_hash[self.hash_of[b]]
            self.hash_of[b] = None
            self.evicted += 1
        else:
            raise PoolFull("every KV block is in use")
        self.ref[b] = 1
        self.peak = max(self.peak, self.used)
        return b

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block; the last one frees it (kept cached when hashed)."""
        for b in reversed(blocks):  # tail blocks first: they are the least likely to be hit again
            self.ref[b] -= 1
            if self.ref[b] < 0:
                raise AssertionError(f"KV block {b} released more often than taken")
            if self.ref[b] == 0:
                if b in self._pins:
                    self._idle_pinned += 1
                else:
                    self._unused(b)

    def _unused(self, b: int) -> None:
        if self.hash_of[b] is None:
            self._free.append(b)
        else:
            self._cached[b] = None

    def pin(self, blocks: Sequence[int]) -> None:
        """Keep blocks (referenced now) as they are until unpin(): never evicted nor reused."""
        for b in blocks:
            if self.ref[b] == 0 and b not in self._pins:
                raise AssertionError(f"KV block {b} pinned while unused")
            self._pins[b] = self._pins.get(b, 0) + 1

    def unpin(self, blocks: Sequence[int]) -> None:
        """Drop one pin from each block; an unreferenced block whose last pin goes is released."""
        for b in reversed(blocks):
            n = self._pins[b] - 1
            if n:
                self._pins[b] = n
                continue
            del self._pins[b]
            if self.ref[b] == 0:
                self._idle_pinned -= 1
                self._unused(b)

    def register(self, block: int, h: bytes) -> None:
        """Mark a full block as holding the prefix named `h` (a no-op if another block already does)."""
        if self.hash_of[block] is None and h not in self.by_hash:
            self.hash_of[block] = h
            self.by_hash[h] = block
