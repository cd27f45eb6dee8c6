"""Sliding-window layers keep only their window; checkpoints pin the window before each prompt's
last block boundary (infr/checkpoints.py WindowCheckpoints), so a later request sharing a prefix
longer than the window (an edited last turn, a long shared prefix) restores it and prefills only
the rest; without checkpoints the engine recomputes. Every case gives the greedy tokens of a cold
run (no prefix cache) on the CPU reference: tiny-gemma3 and tiny-gemma4 (window 8: a checkpoint
pins one block), and tiny-gemma4-e2b (KV-shared layers) with a window of 40 (two blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.engine import Model
from infr.kvpool import BLOCK_SIZE, BlockPool, window_span
from tests.engine_runs import cold_runs, finished

CTX = 256


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-gemma4", "tiny-gemma4-e2b-w40"])
def path(request, tmp_path_factory):
    name = request.param
    changes = {"tokenizer": "gpt2"} if name == "tiny-gemma3" else {"sliding_window": 40} if "w40" in name else {}
    spec = synth.preset(name.removesuffix("-w40"), **changes)
    return synth.write_gguf(spec, tmp_path_factory.mktemp("swack") / f"{name}.gguf")


def _run(model, prompts, max_new=8, **kw):
    reqs = finished(model, prompts, max_new, ignore_eos=True, **kw)
    assert all(r.finish_reason == "length" for r in reqs), [r.finish_reason for r in reqs]
    return reqs


@pytest.fixture(scope="module")
def cold(path):
    """prompt -> its greedy tokens computed from position 0, no prefix cache, no checkpoints."""
    return cold_runs(path, CTX, 8, ignore_eos=True)


def _ids(seed, n):
    return np.random.default_rng(seed).integers(2, 500, n).tolist()


def test_pins_keep_blocks_out_of_use_and_eviction():
    pool = BlockPool(3, block_size=4)
    a, b = pool.allocate(), pool.allocate()
    pool.register(a, b"a")
    pool.pin([a])
    pool.release([a, b])
    assert pool.used == 0 and pool.free == 2 and pool.pinned == 1  # a is neither used nor allocatable
    assert a not in (pool.allocate(), pool.allocate())
    assert pool.match([b"a"]) == [a]
    pool.take([a])  # a sequence shares the pinned block
    assert pool.used == 3
    pool.unpin([a])
    pool.release([a])  # its last user: kept cached (hashed), then evictable
    assert pool.pinned == 0 and pool.free == 1 and pool.match([b"a"]) == [a]


def _long_prefix_case(model, cold):
    """Request a (150 tokens: checkpoint at 128), an unrelated one that churns the window pool, then
    b sharing a's first 135 tokens: the full layers hold 4 blocks of it."""
    a, b = _ids(1, 150), None
    (ra,) = _run(model, [a])
    assert ra.output == cold(a)
    for seed in (2, 12):  # unrelated requests: their window blocks push a's cached ones out
        _run(model, [_ids(seed, 200)], max_new=4)
    b = a[:135] + _ids(3, 12)
    rows = model.engine.stats.prefill_rows
    (rb,) = _run(model, [b])
    assert rb.output == cold(b)
    return rb, model.engine.stats.prefill_rows - rows, len(b)


def test_a_shared_prefix_past_the_window_restores_a_checkpoint(path, cold):
    model = Model(path, n_ctx=CTX, backend="cpu", kv_tokens=4 * CTX, batch_tokens=64)
    ck = model.window_checkpoints
    assert ck.span == window_span(model.plan.window, BLOCK_SIZE) == (2 if model.plan.window == 40 else 1)
    assert ck.count_max == 3
    rb, rows, n = _long_prefix_case(model, cold)
    assert rb.cached_tokens == 128 and rows == n - 128  # only the rest of b computed
    assert ck.restored == 1 and ck.saved == 3  # a's (at 128) and the unrelated requests' (at 192)
    assert model.pool.used == 0 and model.window_pool.used == 0 and model.window_pool.pinned == ck.blocks == 3 * ck.span


def test_without_checkpoints_the_engine_recomputes(path, cold):
    model = Model(path, n_ctx=CTX, backend="cpu", kv_tokens=4 * CTX, batch_tokens=64, checkpoints=0)
    rb, rows, n = _long_prefix_case(model, cold)
    assert rb.cached_tokens < 128 and rows == n - rb.cached_tokens  # the window before 128 went: computed again
    assert model.window_checkpoints.saved == 0 and model.window_pool.pinned == 0


def test_an_edited_last_turn_restores_the_checkpoint_before_it(path, cold):
    model = Model(path, n_ctx=CTX, backend="cpu", kv_tokens=4 * CTX, batch_tokens=64)
    ck = model.window_checkpoints
    p1 = _ids(4, 100)
    (r1,) = _run(model, [p1], max_new=30)  # an answer longer than the window
    p2 = p1 + r1.output + _ids(5, 20)
    (r2,) = _run(model, [p2])
    assert r2.cached_tokens == 128 and r2.output == cold(p2)  # the window before 128 is still cached
    _run(model, [_ids(6, 200)], max_new=4)  # another conversation between the turns
    edited = p1 + r1.output + _ids(7, 25)  # the last message written again
    (re,) = _run(model, [edited])
    assert re.cached_tokens == 128 and re.output == cold(edited)  # p2's checkpoint at its last boundary
    assert ck.restored == 1


def test_a_rewound_session_restores_the_checkpoint(path):
    model = Model(path, n_ctx=CTX, backend="cpu", kv_tokens=4 * CTX, batch_tokens=32, parallel=2)  # it keeps its slot
    alone = CPUBackend(model.gguf, model.plan, CTX)
    ids = _ids(8, 100)
    s = model.session()
    np.testing.assert_allclose(s.prefill(ids), alone.forward(ids, 0)[-1], atol=1e-3)
    for t in _ids(9, 20):  # decoding on past the window: the blocks before 96 go back
        s.decode(t)
    _run(model, [_ids(10, 200)], max_new=4)  # and are evicted from the window pool's cache
    before = s.stats.reused_tokens
    again = s.prefill(ids + [7, 8])  # the turn rewound: positions 100.. written again
    assert s.stats.reused_tokens - before == 96 and model.window_checkpoints.restored == 1
    np.testing.assert_allclose(again, alone.forward(ids + [7, 8], 0)[-1], atol=1e-3)
    s.reset()
    assert model.pool.used == 0 and model.window_pool.used == 0


def test_checkpoints_past_the_stores_room_give_way_to_running_sequences(path, cold):
    """A checkpoint at every block and room for 40: pinned windows fill the window store's idle
    blocks and are dropped, oldest first, when a step needs them; no sequence is preempted for
    them and every output is a cold run's."""
    model = Model(path, n_ctx=CTX, backend="cpu", parallel=3, batch_tokens=96, checkpoints=40, checkpoint_every=1)
    prompts = [_ids(20 + i, n) for i, n in enumerate((200, 150, 180, 120, 90, 210))]
    reqs = _run(model, prompts)
    assert [r.output for r in reqs] == [cold(p) for p in prompts]
    ck, st = model.window_checkpoints, model.engine.stats
    assert ck.saved < 40 and ck.evicted > 0 and st.preemptions == 0  # evicted for room, not for the count
    (r,) = _run(model, [prompts[-1][:130] + _ids(30, 6)])  # the latest ones survive
    assert r.cached_tokens == 128 and r.output == cold(prompts[-1][:130] + _ids(30, 6))


def test_metrics_show_the_checkpoints(path, cold):
    from infr.serve.metrics import Metrics

    model = Model(path, n_ctx=CTX, backend="cpu", kv_tokens=4 * CTX, batch_tokens=64)
    _long_prefix_case(model, cold)
    text = Metrics().render(model.engine)
    assert 'infr_swa_checkpoints_total{event="restored"} 1' in text
    assert 'infr_swa_checkpoints_total{event="saved"} 3' in text and "infr_swa_checkpoints 3" in text
    span, per = model.window_checkpoints.span, model.plan.kv_bytes_per_token(True) * BLOCK_SIZE
    assert f'infr_swa_checkpoint_bytes{{state="used"}} {3 * span * per}' in text
    assert f'infr_kv_window_blocks{{state="pinned"}} {3 * span}' in text
