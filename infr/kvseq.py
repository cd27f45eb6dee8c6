"""A sequence's KV blocks across the engine's pools (infr/kvpool.py).

Layers that attend to every earlier position keep one block per block_size
positions for the whole sequence: the *full* pool. Sliding-window layers
(Gemma-3: five of every six) see only the last `window` positions, so their KV
lives in a pool of its own, the *window* pool, and a sequence gives those
blocks back while it runs: before each step, every window block wholly below
the first key the step's first row can see (position computed - window + 1)
is released. The sequence's window table keeps its logical layout with
RELEASED where a block went; kernels never read those entries (their window
mask starts above them). So a long Gemma-3 sequence holds about
window / block_size window blocks, not one per block of its length, and the
window pool is sized for `max_seqs` windows (kvpool.window_blocks), not for
every context (vLLM's hybrid KV cache manager and llama.cpp's SWA cache do the
same).

Prefix caching keeps working on both pools: full and window blocks are hashed
alike (the chained hash of the tokens up to the block's end) and released
blocks stay cached until evicted. The reuse rule: a cached prefix of m blocks
is taken only when the full pool holds blocks 0 .. m - 1 *and* the window pool
holds the window blocks the first recomputed row sees, blocks
(m * bs - window + 1) // bs .. m - 1; otherwise the reuse point falls back to
the longest shorter prefix for which both hold (down to 0: the prompt is
recomputed), unless a checkpoint pins the window blocks of a longer prefix the full
pool holds (infr/checkpoints.py). A held sequence that is rewound (Session.prefill with other
tokens) keeps its prefix under the same rule, and recomputes from the prefix
cache when its own window blocks before the rewind point were already given
back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from infr.kvpool import BlockPool, PoolFull, block_hashes

RELEASED = -1  # a window table entry whose block went back to the pool (older than the window)


@dataclass
class SeqBlocks:
    """One sequence's tables: logical block i of its positions is full[i] in the full layers'
    store and window[i] in the window layers' (RELEASED once older than the window; empty when
    the model has no window layers); hashes name full[:len(hashes)] (and the window blocks of
    those that are still held), registered in the pools."""

    full: list[int] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    trimmed: int = 0  # window[:trimmed] are all RELEASED: each step's trim looks past them only

    @property
    def window_held(self) -> int:
        """Window blocks this sequence holds."""
        return sum(1 for b in self.window if b != RELEASED)


class KVCache:
    """The engine's KV bookkeeping over its pools: `full`, and `window` (None: the model has no
    sliding-window layer) for the layers that see only the last `window_size` positions."""

    def __init__(self, full: BlockPool, window: BlockPool | None = None, window_size: int | None = None):
        if (window is None) != (window_size is None):
            raise ValueError("a window pool and its window come together")
        if window is not None and window.block_size != full.block_size:
            raise ValueError("the window pool's blocks must be the full pool's size")
        self.full, self.window, self.window_size = full, window, window_size
        self.block_size = full.block_size

    # --- queries

    def first_key(self, pos: int) -> int:
        """The first position every window layer's row at `pos` (or later) sees."""
        return max(0, pos - self.window_size + 1) if self.window_size else 0

    def can_continue(self, seq: SeqBlocks, keep: int) -> bool:
        """Whether the sequence can run on from position `keep` (its KV of 0 .. keep - 1 kept):
        the window blocks its row at `keep` sees are still held."""
        if self.window is None or keep == 0:
            return True
        b = self.first_key(keep) // self.block_size
        return b >= len(seq.window) or seq.window[b] != RELEASED

    # --- changes

    def admit(self, seq: SeqBlocks, tokens: Sequence[int], use_cache: bool = True, pinned=None) -> int:
        """Give a sequence with no blocks its cached prefix (the reuse rule above): the tokens
        whose KV it now holds, a multiple of block_size, at most len(tokens) - 1 (at least one
        token runs, to give the next token's logits). `pinned(h)`: the window blocks a checkpoint
        keeps for the block boundary hashed h, or None (infr/checkpoints.py): the prefix goes on
        to the latest such boundary the full pool holds, when the window pool alone stops short."""
        bs = self.block_size
        seq.full, seq.window, seq.hashes, seq.trimmed = [], [], [], 0
        if not use_cache:
            return 0
        hashes = block_hashes(tokens[: (len(tokens) - 1) // bs * bs], bs)
        full = self.full.match(hashes)
        m, lo, win = len(full), 0, []
        while m and self.window is not None:
            lo = self.first_key(m * bs) // bs
            win = self.window.match(hashes[lo:m])
            if len(win) == m - lo:
                break
            m = lo + len(win)  # the first missing window block: no reuse point past it can be taken
        if pinned is not None and self.window is not None:
            for b in range(len(full), max(m, 1) - 1, -1):  # down to the window pool's own reuse point
                pins = pinned(hashes[b - 1])
                if pins is not None:  # blocks first_key(b * bs) // bs .. b - 1, as the loop above finds them
                    m, win = b, list(pins)
                    break
        seq.full, seq.hashes = list(full[:m]), hashes[:m]
        self.full.take(seq.full)
        if self.window is not None:
            win = win if m else []
            self.window.take(win)
            seq.window = [RELEASED] * (m - len(win)) + list(win)
            seq.trimmed = m - len(win)
        return m * bs

    def grow(self, seq: SeqBlocks, n_tokens: int) -> bool:
        """Blocks in every pool for the sequence's first n_tokens, or False (nothing taken)."""
        need = -(-n_tokens // self.block_size) - len(seq.full)
        if need <= 0:
            return True
        full, win = [], []
        try:
            for _ in range(need):
                full.append(self.full.allocate())
                if self.window is not None:
                    win.append(self.window.allocate())
        except PoolFull:
            self.full.release(full)
            if self.window is not None:
                self.window.release(win)
            return False
        seq.full += full
        seq.window += win
        return True

    def trim(self, seq: SeqBlocks, start: int) -> int:
        """Give back the window blocks no row from position `start` on can see; how many went."""
        if self.window is None:
            return 0
        end = min(self.first_key(start) // self.block_size, len(seq.window))
        if end <= seq.trimmed:  # every step of every running sequence asks: most give nothing back
            return 0
        gone = [b for b in seq.window[seq.trimmed:end] if b != RELEASED]
        if gone:
            self.window.release(gone)
        seq.window[seq.trimmed:end] = [RELEASED] * (end - seq.trimmed)
        seq.trimmed = end
        return len(gone)

    def truncate(self, seq: SeqBlocks, keep: int) -> None:
        """Keep the blocks of positions 0 .. keep - 1 (and the hashes of the whole ones)."""
        cut = -(-keep // self.block_size)
        self.full.release(seq.full[cut:])
        del seq.full[cut:]
        if self.window is not None:
            self.window.release([b for b in seq.window[cut:] if b != RELEASED])
            del seq.window[cut:]
            seq.trimmed = min(seq.trimmed, cut)
        del seq.hashes[keep // self.block_size:]

    def release(self, seq: SeqBlocks) -> None:
        """Every block back (hashed ones stay cached)."""
        self.truncate(seq, 0)

    def register(self, seq: SeqBlocks, tokens: Sequence[int], computed: int) -> None:
        """Hash the sequence's blocks that are whole in its first `computed` tokens."""
        bs = self.block_size
        whole = computed // bs
        if whole <= len(seq.hashes):
            return
        parent = seq.hashes[-1] if seq.hashes else b""
        new = block_hashes(tokens[: whole * bs], bs, start=len(seq.hashes), parent=parent)
        for i, h in enumerate(new, start=len(seq.hashes)):
            self.full.register(seq.full[i], h)
            if self.window is not None and seq.window[i] != RELEASED:
                self.window.register(seq.window[i], h)
        seq.hashes += new

    def too_big(self) -> str:
        p = self.full
        pools = f"the KV pool ({p.n_blocks} blocks of {p.block_size} tokens"
        if self.window is not None:
            pools += f"; {self.window.n_blocks} for the sliding-window layers"
        return pools + ") cannot hold this request; raise --kv-size"
