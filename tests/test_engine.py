"""The engine seam on the CPU reference: the KV pool, continuous batching, preemption.

Batched equals alone: eight greedy requests of different lengths (one past
Gemma-3's 512-token window, two sharing a 400-token prefix) run together in
shared steps, and each gives exactly the tokens it gives when it runs alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from infr.batch import Batch, OutputRow
from infr.engine import Model
from infr.errors import InfrError
from infr.kvpool import BlockPool, PoolFull, block_hashes
from infr.sampling import SamplingParams
from infr.scheduler import Request

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = {"smollm2-135m": "smollm2_path", "gemma3-270m": "gemma3_path", "qwen2.5-coder-0.5b": "qwen_coder_path"}
GREEDY = SamplingParams(temperature=0.0)
N_NEW = 10


# ---------------------------------------------------------------- the pool


def test_pool_shares_full_blocks_by_prefix_and_evicts_oldest():
    pool = BlockPool(4, block_size=4)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    ha = block_hashes(a, 4)
    assert len(ha) == 2 and block_hashes(a[:8] + [0], 4) == ha  # only full blocks are named
    assert block_hashes([9, 9, 9, 9] + a[4:8], 4)[1] != ha[1]  # a hash names the whole prefix
    blocks = [pool.allocate() for _ in range(3)]
    for b, h in zip(blocks, ha):
        pool.register(b, h)
    assert pool.match(ha) == blocks[:2] and pool.match(block_hashes([1, 2, 3, 4, 0, 0, 0, 0], 4)) == blocks[:1]
    pool.take(blocks[:2])  # a second sequence shares the two full blocks
    pool.release(blocks)  # the first one leaves: its tail block is free, the shared two still used
    assert pool.used == 2 and pool.free == 2 and pool.cached == 2
    pool.release(blocks[:2])  # the second leaves: both stay cached, reusable
    assert pool.used == 0 and pool.cached == 2 and pool.match(ha) == blocks[:2]
    got = [pool.allocate() for _ in range(3)]  # two never-hashed blocks, then the oldest cached one
    assert pool.evicted == 1 and pool.cached == 1
    assert pool.match(ha) == blocks[:1]  # the chain's tail went first: its head still hits
    assert set(got) >= {blocks[2]}
    pool.allocate()
    with pytest.raises(PoolFull):
        pool.allocate()


# ---------------------------------------------------------------- batched equals alone


def _prompts(name: str) -> list[list[int]]:
    """Eight prompts of different lengths from the llama.cpp fixtures: one past Gemma-3's
    window where the fixtures have one, and two sharing a 400-token prefix."""
    cases = json.loads((FIXTURES / f"generation_{name}.json").read_text())["cases"]
    ids = [c["prompt_ids"] for c in cases]
    longest = max(ids, key=len)
    pool = [t for p in ids for t in p[1:]]  # every fixture token but each BOS, for a long shared prefix
    prefix = (longest[:1] + pool * 8)[:400]
    out = [ids[0], ids[1] if len(ids) > 1 else ids[0][:5], longest, prefix + ids[0][-7:], prefix + ids[-1][-13:]]
    for n in (3, 37, 130):
        out.append(pool[:n])
    assert len(out) == 8 and len({len(p) for p in out}) >= 6
    return out


@pytest.fixture(scope="module", params=list(MODELS))
def batched_model(request):
    path = request.getfixturevalue(MODELS[request.param])
    prompts = _prompts(request.param)
    ctx = max(len(p) for p in prompts) + N_NEW + 8
    model = Model(path, n_ctx=ctx, backend="cpu", parallel=8, kv_tokens=8 * ctx)
    return request.param, model, prompts


def _run_together(model, prompts, **kw) -> list[Request]:
    reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=N_NEW, **kw)) for p in prompts]
    model.engine.run_until(lambda: all(r.done for r in reqs))
    return reqs


def test_batched_equals_alone(batched_model):
    name, model, prompts = batched_model
    if name == "gemma3-270m":
        assert max(len(p) for p in prompts) > 512  # one prompt runs past the sliding window
    alone = []
    for p in prompts:
        (r,) = _run_together(model, [p], cache_prompt=False)
        alone.append(r.output)
    eng = model.engine
    steps, rows = eng.stats.steps, eng.stats.rows
    together = _run_together(model, prompts)
    assert all(r.finish_reason in ("length", "stop") for r in together)
    assert [r.output for r in together] == alone
    # shared steps: fewer steps than rows, and the longest batch holds every running sequence
    assert eng.stats.steps - steps < (eng.stats.rows - rows) / 4 and eng.stats.max_rows >= 8
    assert model.pool.used == 0  # every block came back


def test_prefix_cache_reuses_blocks_across_requests(batched_model):
    _, model, prompts = batched_model
    a, b = prompts[3], prompts[4]  # the two sharing a 400-token prefix
    (ra,) = _run_together(model, [a])
    hits = model.engine.stats.prefix_hit_tokens
    (rb,) = _run_together(model, [b])
    (rb_cold,) = _run_together(model, [b], cache_prompt=False)
    bs = model.pool.block_size
    assert rb.cached_tokens >= (400 // bs) * bs and model.engine.stats.prefix_hit_tokens - hits == rb.cached_tokens
    assert rb_cold.cached_tokens == 0 and rb.output == rb_cold.output


def test_preemption_keeps_outputs(smollm2_path):
    prompts = _prompts("smollm2-135m")[3:] + _prompts("smollm2-135m")[:3]
    ctx = max(len(p) for p in prompts) + N_NEW + 8
    big = Model(smollm2_path, n_ctx=ctx, backend="cpu", parallel=8, kv_tokens=8 * ctx)
    want = [r.output for r in _run_together(big, prompts)]
    # room for about two of the long prompts at a time: the rest wait or are preempted and recomputed
    small = Model(smollm2_path, n_ctx=ctx, backend="cpu", parallel=8, kv_tokens=ctx + 480)
    got = _run_together(small, prompts)
    assert small.engine.stats.preemptions > 0
    assert [r.output for r in got] == want
    assert small.pool.used == 0


def test_cancel_frees_blocks_at_once(smollm2_path):
    model = Model(smollm2_path, n_ctx=256, backend="cpu", parallel=2)
    eng = model.engine
    r = eng.submit(Request(list(range(1, 100)), GREEDY, max_new=50))
    eng.step()
    assert model.pool.used > 0 and not r.done
    eng.cancel(r)
    eng.step()
    assert r.finish_reason == "cancelled" and model.pool.used == 0 and not eng.running


def test_request_too_big_for_the_pool_fails_alone(smollm2_path):
    model = Model(smollm2_path, n_ctx=256, backend="cpu", parallel=2, kv_tokens=64)
    eng = model.engine
    big = eng.submit(Request(list(range(1, 120)), GREEDY, max_new=4))
    eng.run_until(lambda: big.done)
    assert big.finish_reason == "error" and "KV pool" in big.error
    ok = eng.submit(Request(list(range(1, 20)), GREEDY, max_new=4))
    eng.run_until(lambda: ok.done)
    assert ok.finish_reason == "length" and len(ok.output) == 4


def test_bad_requests_are_refused_at_submit(smollm2_path):
    model = Model(smollm2_path, n_ctx=64, backend="cpu")
    with pytest.raises(InfrError, match="empty prompt"):
        model.engine.submit(Request([]))
    with pytest.raises(InfrError, match="context holds 64"):
        model.engine.submit(Request(list(range(64))))
    with pytest.raises(InfrError, match="out of range"):
        model.engine.submit(Request([10**7]))


def test_session_prefill_decode_follow_the_engine(smollm2_path):
    """Session.prefill / decode extend one held sequence; a rewound prefill keeps the common prefix."""
    from infr.cpu.backend import CPUBackend

    model = Model(smollm2_path, n_ctx=256, backend="cpu")
    alone = CPUBackend(model.gguf, model.plan, 256)  # the one-sequence path, its own cache
    ids = list(range(1, 80))
    ref = alone.forward(ids, 0)[-1]
    s = model.session()
    assert np.allclose(s.prefill(ids), ref, atol=1e-3)
    nxt = int(np.argmax(ref))
    step = s.decode(nxt)  # a generated token's row: the CPU takes it alone (gemv), as a decode step does
    table = {0: list(range(alone.blocks_per_seq))}
    one = Batch(np.array([nxt], np.int32), np.array([len(ids)], np.int32), np.zeros(1, np.int32), table,
                [OutputRow(0, GREEDY, want_logits=True)], generated=np.ones(1, bool))
    assert np.allclose(step, alone.step(one).logits[0], atol=1e-3)
    again = s.prefill(ids[:50] + [7, 8])  # rewinds to 50 tokens, computes 2 (block-aligned reuse)
    assert s.stats.reused_tokens >= 32
    assert np.allclose(again, alone.forward(ids[:50] + [7, 8], 0)[-1], atol=1e-3)


def test_kv_size_as_a_fraction_of_free_memory(smollm2_path, monkeypatch):
    """`--kv-size 0.02` / `2%`: the backend sizes its store from the memory free once the weights
    are in (RAM for the CPU reference), the pool takes every block of it, and the start-up note
    says so; tokens stay tokens; bad values and an unknowable free size are clear errors."""
    import argparse

    from infr import memory
    from infr.kvpool import KVBudget, parse_kv_size
    from infr.serve.server import config_from_args

    assert parse_kv_size("4096") == 4096
    assert parse_kv_size("2%").fraction == parse_kv_size("0.02").fraction == 0.02
    for bad in ("0", "1.5", "-3%", "lots", "0x10"):
        with pytest.raises(InfrError):
            parse_kv_size(bad)
    monkeypatch.setattr(memory, "free_ram", lambda: 6 << 30)  # 6 GiB free, whatever this machine has
    budget = parse_kv_size("2%")
    model = Model(smollm2_path, n_ctx=256, backend="cpu", parallel=2, kv_tokens=budget)
    per_block = model.backend.kv_bytes_per_token * model.pool.block_size
    assert model.pool.n_blocks == model.backend.n_blocks == int(0.02 * ((6 << 30) - KVBudget.RESERVE)) // per_block
    assert model.kv_note == "2% of 6.0 GiB free RAM"
    r = model.engine.submit(Request([1, 2, 3], GREEDY, max_new=4, ignore_eos=True))
    model.engine.run_until(lambda: r.done)
    assert r.error is None and len(r.output) == 4
    monkeypatch.setattr(memory, "free_ram", lambda: 600 << 20)  # 88 MiB past the reserve: 2% is not one context
    with pytest.raises(InfrError, match="less than one context"):
        Model(smollm2_path, n_ctx=256, backend="cpu", kv_tokens=KVBudget(0.02))
    monkeypatch.setattr(memory, "free_ram", lambda: None)
    with pytest.raises(InfrError, match="give the KV cache size in tokens"):
        Model(smollm2_path, n_ctx=256, backend="cpu", kv_tokens=KVBudget(0.5))
    monkeypatch.setenv("INFR_KV_SIZE", "150%")
    with pytest.raises(InfrError, match="INFR_KV_SIZE"):
        config_from_args(argparse.Namespace(model=None))
    monkeypatch.setenv("INFR_KV_SIZE", "90%")
    assert config_from_args(argparse.Namespace(model=None)).kv_size.fraction == 0.9
    from infr.cli import _parser as build_parser

    with pytest.raises(SystemExit):  # a usage error on the command line, not a traceback
        build_parser().parse_args(["serve", "--kv-size", "2x"])
    assert build_parser().parse_args(["serve", "--kv-size", "75%"]).kv_size.fraction == 0.75
