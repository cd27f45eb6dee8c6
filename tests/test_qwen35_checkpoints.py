"""qwen35's recurrent state in the engine: snapshots at block boundaries of prompts
(infr/checkpoints.py) restored for a shared prefix, a follow-up turn, a preempted sequence and a
rewound session, each giving exactly the tokens of a cold run (the tiny model on the CPU reference)."""

from __future__ import annotations

import numpy as np
import pytest

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.cpu.deltanet import RecurrentStore, deltanet_forward
from infr.engine import Model
from infr.errors import InfrError
from infr.models.spec import DeltaNetSpec
from tests.engine_runs import cold_runs, finished

TINY = synth.PRESETS["tiny-qwen35"]
CTX = 160


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return synth.write_gguf(TINY, tmp_path_factory.mktemp("q35ck") / "tiny-qwen35.gguf")


def _run(model, prompts, max_new=12, **kw):
    return finished(model, prompts, max_new, **kw)


@pytest.fixture(scope="module")
def cold(tiny_path):
    """prompt -> its tokens computed from position 0 alone, on a model that keeps no checkpoints."""
    return cold_runs(tiny_path, CTX, 12)


def _ids(seed, n):
    return np.random.default_rng(seed).integers(2, 512, n).tolist()


def test_store_snapshot_restores_onto_any_slot_at_its_position_only():
    m = DeltaNetSpec(n_k_heads=1, n_v_heads=2, d_k=8, d_v=8, d_conv=3)
    rng = np.random.default_rng(1)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    x = dict(qkv=f(9, m.conv_dim), z=f(9, 16), beta=f(9, 2), alpha=f(9, 2))
    w = dict(conv_w=f(m.conv_dim, 3) * np.float32(0.5), dt_bias=f(2), a=-np.exp(f(2)), norm_w=np.ones(8, np.float32))

    def run(store, rows, slot):
        p = np.arange(rows.start, rows.stop)
        return deltanet_forward(m, *(x[k][rows] for k in ("qkv", "z", "beta", "alpha")), p, np.full(len(p), slot),
                                store, 0, w["conv_w"], w["dt_bias"], w["a"], w["norm_w"], 1e-6)

    one = run(RecurrentStore({0: m}), slice(0, 9), 0)
    store = RecurrentStore({0: m})
    with pytest.raises(InfrError, match="no recurrent state"):
        store.snapshot(0)
    run(store, slice(0, 4), 0)
    snap = store.snapshot(0)
    run(store, slice(4, 9), 0)  # slot 0 goes on: the snapshot is a copy, unchanged
    store.restore(3, snap, 4)
    np.testing.assert_array_equal(run(store, slice(4, 9), 3), one[4:])
    store.restore(3, snap, 4)  # a snapshot restores again (load copies it)
    np.testing.assert_array_equal(run(store, slice(4, 9), 3), one[4:])
    with pytest.raises(InfrError, match="taken at position 4 cannot stand at 5"):
        store.restore(3, snap, 5)


def test_backend_save_and_load_state_through_the_protocol(tiny_path):
    model = Model(tiny_path, n_ctx=CTX, backend="cpu")
    be: CPUBackend = model.backend
    ids = _ids(2, 40)
    whole = CPUBackend(model.gguf, model.plan, CTX).forward(ids, 0, n_logits=8)
    be.forward(ids[:32], 0)
    snap = be.save_state(0)
    be.forward(_ids(3, 20), 32)  # slot 0 goes on with other tokens; the snapshot stays as it was
    with pytest.raises(InfrError, match="stands at position 52"):
        be.forward(ids[32:], 32)
    be.load_state(0, snap, 32)
    np.testing.assert_array_equal(be.forward(ids[32:], 32, n_logits=8), whole)


def test_a_shared_prefix_restores_a_checkpoint_and_gives_a_cold_runs_tokens(tiny_path, cold):
    model = Model(tiny_path, n_ctx=CTX, backend="cpu", checkpoint_every=1)
    shared = _ids(4, 80)
    a, b = shared + _ids(5, 20), shared + _ids(6, 15)
    (ra,) = _run(model, [a])
    assert ra.cached_tokens == 0 and ra.output == cold(a)
    assert model.checkpoints.count == 3  # blocks 1, 2 (every block) and 3 (the prompt's last boundary, 96)
    rows = model.engine.stats.prefill_rows
    (rb,) = _run(model, [b])
    assert rb.cached_tokens == 64  # the KV match (2 whole shared blocks) ends where a snapshot is
    assert model.engine.stats.prefill_rows - rows == len(b) - 64  # only the rest of the prompt computed
    assert rb.output == cold(b)
    assert model.checkpoints.restored == 1


def test_a_snapshot_is_never_used_for_another_prefix_of_the_same_length(tiny_path, cold):
    model = Model(tiny_path, n_ctx=CTX, backend="cpu", checkpoint_every=1)
    a = _ids(7, 100)
    _run(model, [a])
    c = list(a)
    c[5] += 1  # block 0 differs: no snapshot of a's can stand for it
    (rc,) = _run(model, [c])
    assert rc.cached_tokens == 0 and rc.output == cold(c)
    d = list(a)
    d[40] += 1  # block 1 differs: only the snapshot at 32 holds
    (rd,) = _run(model, [d])
    assert rd.cached_tokens == 32 and rd.output == cold(d)


def test_a_follow_up_turn_reuses_the_prompts_last_boundary_despite_an_unrelated_request(tiny_path, cold):
    model = Model(tiny_path, n_ctx=CTX, backend="cpu")  # default cadence: only the prompt's last boundary
    first = _ids(8, 70)
    (r1,) = _run(model, [first], max_new=10)
    (ru,) = _run(model, [_ids(9, 50)], max_new=4)  # another conversation between the turns
    assert ru.cached_tokens == 0
    second = first + r1.output + _ids(10, 9)  # the previous prompt, the answer, a new message
    (r2,) = _run(model, [second])
    assert r2.cached_tokens == 64  # the snapshot at the first prompt's last block boundary
    assert r2.output == cold(second)
    assert r1.output == cold(first, 10)


def test_lru_eviction_under_a_tiny_budget_keeps_the_tokens_right(tiny_path, cold):
    model = Model(tiny_path, n_ctx=CTX, backend="cpu", checkpoints=2)  # room for two snapshots
    ck = model.checkpoints
    a, u, v = _ids(11, 70), _ids(12, 70), _ids(13, 70)
    a2 = a[:64] + _ids(14, 10)
    _run(model, [a])
    _run(model, [u])
    (r,) = _run(model, [a2])  # restores a's snapshot: now the most recently used
    assert r.cached_tokens == 64 and r.output == cold(a2)
    _run(model, [v])  # a third snapshot: u's, the least recently used, goes
    assert ck.count == 2 and ck.evicted == 1 and ck.bytes == 2 * ck.bytes_per_snapshot
    (ra,) = _run(model, [a[:64] + _ids(16, 5)])  # a's kept
    assert ra.cached_tokens == 64 and ra.output == cold(a[:64] + _ids(16, 5))
    (ru,) = _run(model, [u[:64] + _ids(15, 7)])  # u's went: computed from 0 (its KV blocks are still cached)
    assert ru.cached_tokens == 0 and ru.output == cold(u[:64] + _ids(15, 7))
    one = Model(tiny_path, n_ctx=CTX, backend="cpu", checkpoints=1, checkpoint_every=1)
    reqs = _run(one, [a, u, a2, v])  # one snapshot of room, several a prompt: evicted as they come
    assert [r.output for r in reqs] == [cold(p) for p in (a, u, a2, v)]
    assert one.checkpoints.count == 1 and one.checkpoints.evicted >= 5


def test_preempted_sequences_restore_or_recompute_and_keep_their_tokens(tiny_path, cold):
    shared = _ids(17, 70)
    prompts = [shared + _ids(18 + i, n) for i, n in enumerate((12, 14, 10))]
    want = [cold(p, 24) for p in prompts]
    small = Model(tiny_path, n_ctx=CTX, backend="cpu", parallel=3, kv_tokens=8 * 32, checkpoint_every=1)
    reqs = _run(small, prompts, max_new=24)
    assert [r.output for r in reqs] == want
    st = small.engine.stats
    assert st.preemptions > 0 and small.checkpoints.restored > 0


def test_batched_equals_alone_while_snapshots_are_taken(tiny_path, cold):
    prompts = [_ids(30 + i, n) for i, n in enumerate((3, 33, 40, 70, 100))]
    model = Model(tiny_path, n_ctx=CTX, backend="cpu", parallel=5, kv_tokens=5 * CTX, checkpoint_every=1)
    stats = model.engine.stats
    reqs = _run(model, prompts, max_new=8)
    assert [r.output for r in reqs] == [cold(p, 8) for p in prompts]
    assert model.checkpoints.saved == 1 + 1 + 2 + 3  # boundaries 32; 32; 32, 64; 32, 64, 96
    assert stats.steps < stats.rows / 4  # they did share steps


def test_a_rewound_session_restores_the_checkpoint_before_the_rewind(tiny_path):
    model = Model(tiny_path, n_ctx=CTX, backend="cpu", checkpoint_every=1)
    alone = CPUBackend(model.gguf, model.plan, CTX)
    ids = _ids(40, 70)
    s = model.session()
    np.testing.assert_array_equal(s.prefill(ids), alone.forward(ids, 0)[-1])
    s.decode(7)
    before = s.stats.reused_tokens
    again = s.prefill(ids[:50] + [7, 8])
    assert s.stats.reused_tokens - before == 32  # from the snapshot at 32, not from 0
    np.testing.assert_array_equal(again, alone.forward(ids[:50] + [7, 8], 0)[-1])


def test_a_kv_budget_leaves_room_for_every_slots_recurrent_state(tiny_path):
    from infr.gguf_file import open_gguf
    from infr.kvpool import KVBudget, store_sizes
    from infr.models import build_spec
    from infr.plan import build_plan

    plan = build_plan(build_spec(open_gguf(tiny_path)))
    block = 32 * plan.kv_bytes_per_token()
    state = plan.recurrent_bytes_per_sequence

    class Device:  # the memory a backend finds free: room for 64 blocks and 4 sequences' states
        name, multi_step, kv_bytes_per_token = "test", 1, plan.kv_bytes_per_token()

        def free_memory(self):
            return KVBudget.RESERVE + 64 * block + 4 * state, "here"

    sizes = lambda seqs: store_sizes(Device(), plan, KVBudget(1.0), 32, 4, max_seqs=seqs)[0]  # noqa: E731
    assert sizes(4) == 64
    assert sizes(1) == 64 + 3 * state // block > 64  # fewer slots' states: the rest goes to KV blocks
