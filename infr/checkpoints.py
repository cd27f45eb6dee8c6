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
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from infr.backends import RecurrentStates
from infr.errors import InfrError

# llama-server keeps 8 context checkpoints per slot by default (--ctx-checkpoints 8).
PER_SEQUENCE = 8
# llama-server's checkpoint cadence during a long prefill was every 8192 tokens (checkpoint_every_nt).
EVERY_TOKENS = 8192


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
        if not self.enabled:
            return []
        bs = self.block_size
        last = prompt_end // bs
        out = [b * bs for b in range(start // bs + 1, last) if b % self.every == 0]
        if last * bs > start:
            out.append(last * bs)
        return out

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


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
