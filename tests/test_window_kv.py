"""Sliding-window layers keep only their window (infr/kvseq.py) on the CPU reference.

Gemma-3's window layers give their KV blocks back while a sequence runs, and its greedy tokens
stay those of the one-sequence path that keeps every block; a cached prefix is reused for the
window layers only while the window blocks before the reuse point are held; preemption and a
rewound Session recompute what they must; every block of both pools comes back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.engine import Model
from infr.kvpool import BLOCK_SIZE, BlockPool, block_hashes
from infr.kvseq import RELEASED, KVCache, SeqBlocks
from infr.sampling import SamplingParams
from infr.scheduler import Request, Scheduler

FIXTURES = Path(__file__).parent / "fixtures"
GREEDY = SamplingParams(temperature=0.0)


# ---------------------------------------------------------------- the bookkeeping, no model


def _run_a(kv: KVCache, toks: list[int]) -> None:
    """Sequence A: 22 tokens computed, trimmed at 22, released."""
    full, win = kv.full, kv.window
    a = SeqBlocks()
    assert kv.admit(a, toks) == 0 and kv.grow(a, 22)
    kv.register(a, toks, 22)
    assert len(a.hashes) == 5 and full.used == win.used == 6
    assert not kv.grow(SeqBlocks(), 4) and full.used == 6  # the window pool is full: nothing taken from either
    assert kv.trim(a, 22) == 4  # the row at 22 sees 17..22: blocks 0..3 (positions 0..15) go back
    assert a.window[:4] == [RELEASED] * 4 and a.window_held == 2 and win.used == 2 and full.used == 6
    assert not kv.can_continue(a, 20) and kv.can_continue(a, 21) and kv.can_continue(a, 0)  # 20 sees 15: block 3
    kv.release(a)  # window blocks 3, 2, 1, 0 were released (cached, 3 oldest), then 4 (cached) and 5 (free)
    assert full.used == win.used == 0


def test_window_blocks_go_back_and_a_prefix_is_reused_only_with_its_window():
    """Blocks of 4 tokens, a window of 6: a row at position p sees p - 5 .. p."""
    toks = list(range(1, 23))  # 22 tokens: blocks 0..5, the last one partial
    b_toks = toks[:20] + [99, 98]  # shares A's 5 whole blocks
    hashes = block_hashes(b_toks[:20], 4)

    kv = KVCache(BlockPool(16, block_size=4), BlockPool(6, block_size=4), 6)
    _run_a(kv, toks)
    b = SeqBlocks()
    assert kv.admit(b, b_toks) == 20  # the row at 20 sees 15..: window blocks 3 and 4, both cached
    assert b.window[:3] == [RELEASED] * 3 and RELEASED not in b.window[3:] and len(b.full) == 5
    kv.release(b)

    full, win = BlockPool(16, block_size=4), BlockPool(6, block_size=4)
    kv = KVCache(full, win, 6)
    _run_a(kv, toks)
    taken = [win.allocate(), win.allocate()]  # the free block, then the oldest cached: window block 3 is evicted
    c = SeqBlocks()
    assert len(full.match(hashes)) == 5  # the full layers still hold the whole prefix ...
    assert kv.admit(c, b_toks) == 12  # ... but reuse at 20 (or 16) needs block 3: it falls back to 12 (blocks 1, 2)
    assert c.window == [RELEASED, win.match(hashes[1:3])[0], win.match(hashes[1:3])[1]] and len(c.full) == 3
    kv.release(c)
    win.release(taken)
    assert full.used == win.used == 0


# ---------------------------------------------------------------- Gemma-3 past its window


def test_gemma3_past_its_window_holds_only_the_window(gemma3_path):
    """A 1200-token Gemma-3 sequence: its window layers hold at most ceil(511 / 32) + 1 blocks after
    the prompt (not one per 32 positions), the window store is smaller than the full one, and its
    greedy tokens equal the one-sequence path that keeps every block (CPUBackend.forward)."""
    cases = json.loads((FIXTURES / "generation_gemma3-270m.json").read_text())["cases"]
    longest = max((c["prompt_ids"] for c in cases), key=len)
    filler = [t for c in cases for t in c["prompt_ids"][1:]]
    prompt = (longest + filler * 8)[:1200]
    n_new, ctx = 8, 1200 + 8 + 8
    model = Model(gemma3_path, n_ctx=ctx, backend="cpu", parallel=2, kv_tokens=4 * ctx)  # room past the windows'
    window = model.plan.window
    assert window == 512 and model.window_pool.n_blocks < model.pool.n_blocks
    held = []
    req = Request(list(prompt), GREEDY, max_new=n_new, ignore_eos=True,
                  on_token=lambda t, _: held.append((len(req.kv.full), req.kv.window_held)) and False)
    model.engine.submit(req)
    model.engine.run_until(lambda: req.done)
    assert req.finish_reason == "length" and len(held) == n_new
    limit = -(-(window - 1) // BLOCK_SIZE) + 1
    assert held[0][1] < held[0][0]  # trimmed between the prompt's chunks of 512 too (its last chunk's window held)
    for full, win in held[1:]:  # from the first decode step on
        assert win <= limit < -(-len(prompt) // BLOCK_SIZE) <= full
    assert model.pool.used == 0 and model.window_pool.used == 0
    assert model.window_pool.peak < model.pool.peak

    alone = CPUBackend(model.gguf, model.plan, ctx)  # window store of one context, identity table: nothing released
    assert alone.n_window_blocks == alone.n_blocks
    want, logits = [], alone.forward(prompt, 0)[-1]
    for i in range(n_new):
        want.append(int(np.argmax(logits)))
        logits = alone.forward([want[-1]], len(prompt) + i)[-1]
    assert req.output == want


# ---------------------------------------------------------------- the engine on tiny-gemma3 (window 8)


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    spec = synth.preset("tiny-gemma3", tokenizer="gpt2")
    return synth.write_gguf(spec, tmp_path_factory.mktemp("swa") / "tiny-gemma3.gguf")


def _run(model, prompts, max_new=6, **kw) -> list[Request]:
    reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=max_new, ignore_eos=True, **kw)) for p in prompts]
    model.engine.run_until(lambda: all(r.done for r in reqs))
    assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
    return reqs


def test_prefix_reuse_with_window_layers(tiny_gemma3):
    """A cached prefix is reused while the window pool still holds the blocks its window needs,
    and, without checkpoints of the window (infr/checkpoints.py; tests/test_swa_checkpoints.py), falls
    back (here to nothing) once they were evicted though the full pool still holds the prefix; the
    tokens are those of a run without the prefix cache either way."""
    model = Model(tiny_gemma3, n_ctx=256, backend="cpu", kv_tokens=1024, batch_tokens=32, checkpoints=0)
    assert model.plan.window == 8 and model.window_pool.n_blocks == 5 + 1 and model.pool.n_blocks == 32
    a = list(range(1, 101))
    _run(model, [a])
    b = a[:96] + [7, 8, 9, 10, 11, 12]
    (hit,) = _run(model, [b])
    assert hit.cached_tokens == 96  # block 2 (positions 64..95) is the window of position 96: still cached
    (cold,) = _run(model, [b], cache_prompt=False)
    assert hit.output == cold.output
    _run(model, [list(range(200, 400))])  # 7 window blocks through a pool of 6: the cached ones are evicted
    b2 = a[:96] + [13, 14, 15, 16, 17, 18]
    assert len(model.pool.match(block_hashes(b2[:96], BLOCK_SIZE))) == 3  # the full layers still hold it
    (miss,) = _run(model, [b2])
    assert miss.cached_tokens < 96
    (cold2,) = _run(model, [b2], cache_prompt=False)
    assert miss.output == cold2.output
    assert model.pool.used == 0 and model.window_pool.used == 0


def test_session_rewound_past_its_released_window_recomputes(tiny_gemma3):
    """A held sequence rewound to a point whose window blocks went back cannot keep that prefix:
    it takes what the prefix cache holds (three blocks) and computes the rest; a rewind whose
    window is held keeps its prefix; the logits are the one-sequence path's."""
    model = Model(tiny_gemma3, n_ctx=256, backend="cpu", batch_tokens=32)
    alone = CPUBackend(model.gguf, model.plan, 256)
    ids = list(range(1, 101))
    s = model.session()
    assert np.allclose(s.prefill(ids), alone.forward(ids, 0)[-1], atol=1e-3)
    held = model.engine.held[0]
    assert held.kv.window[:2] == [RELEASED] * 2  # trimmed while its prompt ran in chunks of 32
    reused = s.stats.reused_tokens
    s.prefill(ids[:98] + [7, 8])  # the row at 98 sees 91..: block 2, still held: 98 tokens kept
    assert s.stats.reused_tokens - reused == 98
    for t in (300, 301, 302, 303, 304):  # decoding on to 103 tokens gives block 2 (64..95) back
        s.decode(t)
    assert held.kv.window[2] == RELEASED
    reused = s.stats.reused_tokens
    again = s.prefill(ids + [7, 8])  # the full layers keep 100 tokens; the window layers would need 93..99
    assert s.stats.reused_tokens - reused == 96  # three blocks from the prefix cache, not the 100 it had
    assert np.allclose(again, alone.forward(ids + [7, 8], 0)[-1], atol=1e-3)
    s.reset()
    assert model.pool.used == 0 and model.window_pool.used == 0


def test_preemption_with_window_layers_keeps_outputs(tiny_gemma3):
    """Small pools (the full one, then the window one alone) preempt and recompute; every output is
    the big pools' one and every block comes back."""
    prompts = [list(range(s, s + n)) for s, n in ((1, 150), (3, 40), (9, 190), (20, 7), (40, 120), (5, 64))]
    ctx = 256
    big = Model(tiny_gemma3, n_ctx=ctx, backend="cpu", parallel=6, kv_tokens=6 * ctx)
    want = [r.output for r in _run(big, prompts, max_new=12)]
    small = Model(tiny_gemma3, n_ctx=ctx, backend="cpu", parallel=6, kv_tokens=ctx + 96)
    got = _run(small, prompts, max_new=12)
    assert small.engine.stats.preemptions > 0 and [r.output for r in got] == want
    assert small.pool.used == 0 and small.window_pool.used == 0
    # the same backend with a window pool of 6 blocks: that pool is what runs out
    tight = BlockPool(6)
    eng = Scheduler(big.backend, BlockPool(big.pool.n_blocks), ctx, big.tokenizer.is_eog, big.spec.n_vocab,
                    parallel=6, batch_tokens=32, window_pool=tight, window=big.plan.window)
    reqs = [eng.submit(Request(list(p), GREEDY, max_new=12, ignore_eos=True)) for p in prompts]
    eng.run_until(lambda: all(r.done for r in reqs))
    assert eng.stats.preemptions > 0 and [r.output for r in reqs] == want
    assert tight.peak == 6 and tight.used == 0 and eng.pool.used == 0


def test_window_blocks_in_metrics_and_bench(tiny_gemma3):
    from infr import bench
    from infr.serve.metrics import Metrics

    model = Model(tiny_gemma3, n_ctx=512, backend="cpu", parallel=2, batch_tokens=64)
    _run(model, [list(range(1, 300))])
    text = Metrics().render(model.engine)
    assert 'infr_kv_window_blocks{state="used"} 0' in text and "infr_kv_window_blocks_evicted_total" in text
    info = bench.kv_info(model)
    assert info["kv_window_blocks"] == model.window_pool.n_blocks < info["kv_blocks"] == model.pool.n_blocks
    assert 0 < info["kv_window_blocks_peak"] < info["kv_blocks_peak"] == -(-305 // BLOCK_SIZE)


def test_a_memory_budget_gives_the_window_layers_savings_to_the_full_pool(tiny_gemma3, monkeypatch):
    """`--kv-size 2%`: the window store takes what two windows, a step and a pinned window of each
    sequence (infr/checkpoints.py) need, and the rest of the
    fraction goes to the full layers' blocks: about seven times the blocks one store for every layer
    had (tiny-gemma3: one global layer in seven), so more sequences fit."""
    from infr import memory
    from infr.kvpool import KVBudget, window_blocks

    monkeypatch.setattr(memory, "free_ram", lambda: 1 << 30)
    model = Model(tiny_gemma3, n_ctx=256, backend="cpu", parallel=2, kv_tokens=KVBudget(0.02))
    plan = model.plan
    budget = 0.02 * ((1 << 30) - KVBudget.RESERVE)
    need = window_blocks(plan.window, BLOCK_SIZE, 2, 512, model.backend.multi_step, 256 // BLOCK_SIZE, 2)
    assert model.window_pool.n_blocks == model.backend.n_window_blocks == need == 2 * 4 + 16 + 2 * 1
    reserved = need * BLOCK_SIZE * plan.kv_bytes_per_token(True)
    assert model.pool.n_blocks == int(budget - reserved) // (plan.kv_bytes_per_token(False) * BLOCK_SIZE)
    one_store = int(budget) // (plan.kv_bytes_per_token() * BLOCK_SIZE)
    assert model.pool.n_blocks > 6 * one_store
    (r,) = _run(model, [list(range(1, 120))])
    assert len(r.output) == 6 and model.pool.used == model.window_pool.used == 0
