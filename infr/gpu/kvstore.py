"""The paged KV cache on the device: per layer an f16 K and V store, and the block tables.

Layers that attend to every position store n_blocks blocks and read through
the block table the engine's full pool fills; sliding-window layers store
n_window_blocks (sized for the windows of the engine's sequences,
kvpool.store_sizes) and read through a table of their own, which the engine's
window pool fills (infr/kvseq.py). Each kind's kernels bind that kind's
`Paging` (the shared `state` and `rows` buffers, its table); a released
window block's entry is written as block 0, which no kernel reads (the window
mask starts above it).
"""

from __future__ import annotations

import numpy as np

from infr.errors import InfrError
from infr.gpu import kernels_misc as KS
from infr.gpu.runtime import storage
from infr.plan import Plan


class KVStore:
    def __init__(self, dev, plan: Plan, state, rows, n_blocks: int, n_window_blocks: int, block_size: int,
                 blocks_per_seq: int, max_seqs: int):
        self.dev = dev
        self.n_blocks, self.n_window_blocks = n_blocks, n_window_blocks
        self.block_size, self.blocks_per_seq, self.max_seqs = block_size, blocks_per_seq, max_seqs
        self.windowed = {st.layer: bool(st.window) for st in plan.state}
        self.separate = plan.window is not None  # window layers have a table of their own
        ident = self._identity_rows()
        full = storage(dev, ident, label="block_table")
        win = storage(dev, ident, label="window_block_table") if self.separate else full
        self.tables = {False: full, True: win}
        self.paging = {w: KS.Paging(state, rows, self.tables[w], block_size, blocks_per_seq) for w in (False, True)}
        self.identity = True  # whether the tables hold the identity table (slot 0 over blocks 0 .. in order)
        self.k, self.v = {}, {}
        self.vram = 0
        for st in plan.kv:  # the recurrent layers keep no KV (kernels_deltanet holds their state)
            n_rows = (n_window_blocks if st.window else n_blocks) * block_size
            self.k[st.layer] = storage(dev, n_rows * st.n_kv_heads * st.head_dim * 2, label="k")
            self.v[st.layer] = storage(dev, n_rows * st.n_kv_heads * st.v_head_dim * 2, label="v")
            self.vram += n_rows * st.bytes_per_token

    def paging_of(self, layer: int) -> KS.Paging:
        """The Paging layer `layer`'s KV store and attention kernels read."""
        return self.paging[self.windowed[layer]]

    def _identity_rows(self) -> np.ndarray:
        # a window store smaller than one context gets entries past its end: set_identity refuses to use them
        return KS.identity_table(self.blocks_per_seq, self.max_seqs)

    def set_identity(self) -> None:
        """Slot 0 over blocks 0 .. blocks_per_seq - 1 again, in every table (one sequence: forward())."""
        if self.n_window_blocks < self.blocks_per_seq:
            raise InfrError("one sequence over blocks 0.. (forward, decode_greedy) needs a sliding-window store of "
                            "one context; this backend's is sized for the engine's step()")
        if not self.identity:
            ident = self._identity_rows()
            for buf in {id(b): b for b in self.tables.values()}.values():
                self.dev.device.queue.write_buffer(buf, 0, ident)
            self.identity = True

    def write(self, table: np.ndarray, window_table: np.ndarray | None = None) -> None:
        """Flat tables ([n_slots * blocks_per_seq] entries) to the device: the full layers' and the
        window layers' (None: the same table; entries < 0 read as block 0). Entries past a store
        are refused."""
        table = np.asarray(table, np.int64).reshape(-1)
        if table.size and (table.min() < 0 or table.max() >= self.n_blocks):
            raise InfrError(f"block table entries must lie in 0..{self.n_blocks - 1}")
        q = self.dev.device.queue
        q.write_buffer(self.tables[False], 0, table.astype(np.uint32))
        if self.separate:
            win = table if window_table is None else np.maximum(np.asarray(window_table, np.int64).reshape(-1), 0)
            if win.size and win.max() >= self.n_window_blocks:
                raise InfrError(f"sliding-window block table entries must lie in 0..{self.n_window_blocks - 1}")
            q.write_buffer(self.tables[True], 0, win.astype(np.uint32))
        self.identity = False

    def load(self, tables: dict[int, list[int]], window_tables: dict[int, list[int]] | None) -> None:
        """A batch's tables (slot -> blocks; Batch.tables and Batch.window_tables)."""
        n_slots = max(tables) + 1
        if n_slots > self.max_seqs:
            raise InfrError(f"sequence slot {n_slots - 1} is past this backend's {self.max_seqs}")
        full = np.zeros((n_slots, self.blocks_per_seq), np.int64)
        for slot, blocks in tables.items():
            full[slot, : len(blocks)] = blocks
        win = None
        if window_tables is not None:
            win = np.zeros_like(full)
            for slot, blocks in window_tables.items():
                win[slot, : len(blocks)] = blocks
        self.write(full, win)
