"""Checkpoints of a recurrent model's state, for prefix reuse (issue 15).

A DeltaNet layer's state is a fold of every earlier position: KV blocks found by the prefix
cache cannot bring it back, and it cannot be rewound. So the engine snapshots each sequence's
recurrent state (backend.save_state) at block boundaries of its prompt, as llama-server's context
checkpoints and vLLM's block-aligned hybrid caching do, and keeps the snapshots here keyed by
the prefix cache's chained hash of the block that ends at the snapshot's position: that hash
names every token before it, so a snapshot is only ever restored onto the same prefix.

Where: the last block boundary at or before the prompt's end (a follow-up chat turn, or a
request with the same system prompt, finds it) and every `every` blocks before it (long
prompts). The scheduler cuts a prefill chunk to end exactly at such a position and snapshots
after that step. On admission the longest KV prefix match is walked back to the latest
boundary that has a snapshot; the snapshot is loaded into the slot (backend.load_state), the
KV past it is dropped, and only the rest is prefilled.

Only prompt rows are snapshot: a generated token's row is summed another way on the CPU
reference (batch.Batch.generated), so a state built from it is not bit for bit the state a
later prompt holding that token builds.

Memory: each snapshot is Plan.recurrent_bytes_per_sequence; the cache holds at most
`budget_bytes`, least recently used evicted first.

Sliding-window layers (Gemma 3, Gemma 4) give their KV blocks back once older than the window
(infr/kvseq.py), so a prefix the full layers still hold may be unusable: its window blocks were
evicted. WindowCheckpoints keeps, at the same positions, the window layers' last window before
the position: not a copy, but a pin on those blocks in the window pool (kvpool.BlockPool.pin),
so they are never evicted while the checkpoint lives (llama-server's --swa-checkpoints). On
admission (kvseq.KVCache.admit) a prefix the full pool holds is taken up to the latest
checkpoint inside it when the window pool alone cannot serve as long a one; the pinned blocks
are shared read-only like any cached block. The window store has room for WINDOW_CHECKPOINTS
per sequence (kvpool.store_sizes); when a step needs more window blocks than are free, the
least recently used checkpoint goes first, before any sequence is preempted. Memory: a
checkpoint pins window_span blocks (ceil((window - 1) / block_size)), each of block_size tokens
of the window layers' KV (Plan.kv_bytes_per_token(True)); checkpoints of one sequence that
overlap share blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from infr.backends import RecurrentStates
from infr.errors import InfrError
from infr.kvpool import BlockPool, window_span
from infr.kvseq import RELEASED, SeqBlocks

# llama-server keeps 8 context checkpoints per slot by default (--ctx-checkpoints 8).
PER_SEQUENCE = 8
# llama-server's checkpoint cadence during a long prefill was every 8192 tokens (checkpoint_every_nt).
EVERY_TOKENS = 8192
# llama-server keeps 3 snapshots of a slot's SWA cache by default (--swa-checkpoints 3); the window
# store has room for WINDOW_CHECKPOINTS of them per sequence, the rest live in its idle blocks.
SWA_PER_SEQUENCE = 3


def targets(start: int, prompt_end: int, block_size: int, every: int) -> list[int]:
    """Checkpoint positions after `start` up to the prompt's end: its last block boundary and
    every `every` blocks before it."""
    bs = block_size
    last = prompt_end // bs
    out = [b * bs for b in range(start // bs + 1, last) if b % every == 0]
    if last * bs > start:
        out.append(last * bs)
    return out


class Checkpoints:
    """The snapshot cache: block hash at the snapshot's position -> snapshot, LRU under a byte budget."""

    def __init__(self, backend: RecurrentStates, bytes_per_snapshot: int, budget_bytes: int, block_size: int,
                 every_blocks: int):
        if bytes_per_snapshot <= 0:
            raise InfrError("checkpoints need a model with recurrent state")
        if budget_bytes < 0 or every_blocks < 1:
            raise InfrError(f"checkpoint budget must be >= 0 and cadence >= 1 block, got {budget_bytes}, "
                            f"{every_blocks}")
        self.backend = backend
        self.bytes_per_snapshot, self.budget_bytes = int(bytes_per_snapshot), int(budget_bytes)
        self.block_size, self.every = int(block_size), int(every_blocks)
        self._snaps: OrderedDict[bytes, object] = OrderedDict()
        self.saved = 0  # snapshots taken
        self.restored = 0  # snapshots loaded into a slot
        self.evicted = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes >= self.bytes_per_snapshot

    @property
    def count(self) -> int:
        return len(self._snaps)

    @property
    def bytes(self) -> int:
        return len(self._snaps) * self.bytes_per_snapshot

    def __contains__(self, h: bytes) -> bool:
        return h in self._snaps

    def targets(self, start: int, prompt_end: int) -> list[int]:
        """Snapshot positions after `start` up to the prompt's end: its last block boundary and
        every `every` blocks before it."""
        return targets(start, prompt_end, self.block_size, self.every) if self.enabled else []

    def save(self, h: bytes, slot: int) -> None:
        """Snapshot slot's state (standing at the end of the block hashed h); evict down to the budget."""
        if not self.enabled:
            return
        self._snaps[h] = self.backend.save_state(slot)
        self._snaps.move_to_end(h)
        self.saved += 1
        while self.bytes > self.budget_bytes:
            self._snaps.popitem(last=False)
            self.evicted += 1

    def restore(self, slot: int, hashes: Sequence[bytes], upto: int, usable=lambda pos: True) -> int:
        """Load into slot the snapshot at the latest block boundary <= upto (hashes[i]: the prefix
        hash of block i of the sequence) for which usable(pos); the position it stands at, or 0
        (none: the sequence starts from position 0)."""
        bs = self.block_size
        for b in range(min(upto // bs, len(hashes)), 0, -1):
            snap = self._snaps.get(hashes[b - 1])
            if snap is not None and usable(b * bs):
                self._snaps.move_to_end(hashes[b - 1])
                self.backend.load_state(slot, snap, b * bs)
                self.restored += 1
                return b * bs
        return 0

    def line(self) -> str:
        """The start-up report: snapshot size and the cache's room."""
        n = self.budget_bytes // self.bytes_per_snapshot
        return (f"recurrent state {_size(self.bytes_per_snapshot)} per sequence; prefix checkpoints: up to {n} "
                f"({_size(self.budget_bytes)}), every {self.every} blocks and at each prompt's last block boundary")


class WindowCheckpoints:
    """Pins of the sliding-window layers' last window at prompt block boundaries: block hash at
    the checkpoint's position -> the window blocks before it, at most `count`, LRU."""

    def __init__(self, pool: BlockPool, window: int, count: int, every_blocks: int, bytes_per_token: int):
        if count < 0 or every_blocks < 1:
            raise InfrError(f"checkpoint count must be >= 0 and cadence >= 1 block, got {count}, {every_blocks}")
        self.pool, self.window, self.count_max, self.every = pool, int(window), int(count), int(every_blocks)
        self.block_size = pool.block_size
        self.span = window_span(self.window, self.block_size)  # blocks a checkpoint pins (fewer near position 0)
        self.bytes_per_token = int(bytes_per_token)
        self.bytes_per_snapshot = self.span * self.block_size * self.bytes_per_token
        self._pins: OrderedDict[bytes, list[int]] = OrderedDict()
        self.saved = 0  # checkpoints taken
        self.restored = 0  # prefixes taken up to a checkpoint the window pool alone could not serve
        self.evicted = 0  # dropped: over the count, or their blocks needed by a step

    @property
    def enabled(self) -> bool:
        return self.count_max > 0

    @property
    def count(self) -> int:
        return len(self._pins)

    @property
    def blocks(self) -> int:
        """Window blocks pinned (checkpoints of one sequence can share some)."""
        return len({b for pins in self._pins.values() for b in pins})

    @property
    def bytes(self) -> int:
        return self.blocks * self.block_size * self.bytes_per_token

    @property
    def budget_bytes(self) -> int:
        return self.count_max * self.bytes_per_snapshot

    def __contains__(self, h: bytes) -> bool:
        return h in self._pins

    def targets(self, start: int, prompt_end: int) -> list[int]:
        return targets(start, prompt_end, self.block_size, self.every) if self.enabled else []

    def save(self, h: bytes, seq: SeqBlocks, pos: int) -> None:
        """Pin the window blocks a row at `pos` (a block boundary, hashed h) sees in seq: they must
        be held (the sequence has just computed past pos)."""
        if not self.enabled:
            return
        if h in self._pins:
            self._pins.move_to_end(h)
            return
        m = pos // self.block_size
        blocks = seq.window[max(0, m - self.span):m]
        if RELEASED in blocks:  # already given back (never the case right after the step that wrote them)
            return
        self.pool.pin(blocks)
        self._pins[h] = blocks
        self.saved += 1
        while len(self._pins) > self.count_max:
            self.drop_oldest()

    def lookup(self, h: bytes) -> list[int] | None:
        """The pinned window blocks before the position hashed h, for a sequence to take (admit)."""
        blocks = self._pins.get(h)
        if blocks is not None:
            self._pins.move_to_end(h)
            self.restored += 1
        return blocks

    def drop_oldest(self) -> bool:
        """Unpin the least recently used checkpoint; False when there is none."""
        if not self._pins:
            return False
        _, blocks = self._pins.popitem(last=False)
        self.pool.unpin(blocks)
        self.evicted += 1
        return True

    def line(self) -> str:
        return (f"sliding-window checkpoints: up to {self.count_max} of {self.span} blocks "
                f"({_size(self.bytes_per_snapshot)} each), pinned in the window store")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
