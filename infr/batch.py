"""A batch: the unit of work of a backend step.

It holds the flattened tokens of every sequence scheduled this step (decode
rows and prefill chunks alike), each with its position and its sequence slot,
the block table of each slot in the batch, and the output rows: the rows
whose next token is sampled, with their own sampling settings. One backend
call, `step(batch)`, runs the model over every row and returns one token per
output row; logits come back only for the output rows that ask for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from infr.sampling import Sampler, SamplingParams


@dataclass
class OutputRow:
    row: int  # index into the batch's rows: the token whose next token is sampled
    params: SamplingParams
    history: Sequence[int] = ()  # the sequence's tokens so far, for repetition penalties
    sampler: Sampler | None = None  # the request's host sampler (its random stream); None: greedy or the GPU's
    mask: np.ndarray | None = None  # uint8 bitmask of the tokens a grammar allows (bit i: token i); None: all
    want_logits: bool = False  # return this row's logits (logprobs, or a caller that reads them)


@dataclass
class Batch:
    tokens: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]
    slots: np.ndarray  # int32 [T]: the sequence slot of each row
    tables: dict[int, list[int]]  # slot -> its physical KV blocks, in order (covering every position in the batch)
    outputs: list[OutputRow] = field(default_factory=list)
    # bool [T]: the row's token was generated (not the prompt's). The CPU reference takes those rows
    # by integer sums (infr/cpu/mmq.py), so a generated token's sums are the same alone, batched or
    # recomputed. None: none.
    generated: np.ndarray | None = None
    # slot -> the sliding-window layers' physical blocks (kvseq.RELEASED where a block older than the
    # window went back: never read). None: those layers read through `tables` too (a backend whose
    # window store is as large as its full one, or a model without window layers).
    window_tables: dict[int, list[int]] | None = None

    @property
    def rows(self) -> int:
        return int(len(self.tokens))

    @classmethod
    def build(cls, chunks: Sequence[tuple[int, Sequence[int], int, list[int], int]],
              outputs: list[OutputRow], window_tables: dict[int, list[int]] | None = None) -> "Batch":
        """chunks: (slot, tokens, first position, block table, prompt length) per sequence, rows in
        that order; rows at or past the prompt length hold generated tokens. window_tables: the
        window layers' tables of those slots (Batch.window_tables)."""
        toks, pos, slots, tables = [], [], [], {}
        for slot, ids, start, table, _ in chunks:
            toks.extend(ids)
            pos.extend(range(start, start + len(ids)))
            slots.extend([slot] * len(ids))
            tables[slot] = table
        n_prompt = np.concatenate([np.full(len(c[1]), c[4], np.int64) for c in chunks]) if chunks else np.zeros(0)
        positions = np.asarray(pos, np.int32)
        return cls(np.asarray(toks, np.int32), positions, np.asarray(slots, np.int32), tables, outputs,
                   positions >= n_prompt, window_tables)


@dataclass
class StepResult:
    tokens: list[int]  # one per output row, in order
    logits: dict[int, np.ndarray] = field(default_factory=dict)  # output index -> [n_vocab], rows that asked
