"""The paged KV cache: batches of rows from several sequences, each row with its
own position and sequence slot, their keys in blocks of a scrambled block
table (docs/gpu_kernels.md, "Paged KV cache"), against the CPU reference run
per sequence on its own contiguous cache.

Cache rows that belong to no stored key hold NaN, so a kernel that reads a key
outside its row's sequence (or past its length) fails loudly. Padding rows
(t >= state[1]) carry positions and slots that point at live keys: the KV store
must not write there, and attention writes zeros for them. `pytest -s` prints
each measured error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from infr.cpu import ops as F
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_attn_mma as KAM
from infr.gpu import kernels_misc as M
from infr.gpu.runtime import Kernels, read, run, storage
from infr.models.spec import RopeSpec, RopeStyle

MAX_SEQS = 6


def _buf(gpu, arr: np.ndarray):
    return storage(gpu, np.ascontiguousarray(arr))


@dataclass
class Pool:
    """A scrambled pool: each slot's blocks at random physical blocks, the rest spare."""

    bs: int
    bps: int  # blocks per sequence slot
    n_blocks: int
    table: np.ndarray  # [MAX_SEQS, bps]
    lengths: dict[int, int]  # slot -> keys stored

    def cache_row(self, slot: int, p: int) -> int:
        return int(self.table[slot, p // self.bs]) * self.bs + p % self.bs

    def rows_of(self, slot: int, n: int) -> np.ndarray:
        return np.array([self.cache_row(slot, p) for p in range(n)], np.int64)


def _pool(rng, bs: int, lengths: dict[int, int]) -> Pool:
    bps = -(-max(lengths.values()) // bs) + 1
    used = sum(-(-n // bs) for n in lengths.values())
    n_blocks = used + 3
    order = rng.permutation(n_blocks)
    spare = int(order[-1])  # never holds a key: NaN
    table = np.full((MAX_SEQS, bps), spare, np.uint32)  # unused logical blocks point at it
    k = 0
    for slot, n in lengths.items():
        nb = -(-n // bs)
        table[slot, :nb] = order[k : k + nb]
        k += nb
    return Pool(bs, bps, n_blocks, table, dict(lengths))


@dataclass
class Batch:
    pos: np.ndarray   # live rows' positions
    slot: np.ndarray  # and slots
    T: int            # rows of the dispatch; rows n .. T - 1 are padding

    @property
    def n(self) -> int:
        return len(self.pos)


def _rows(batch: Batch, pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """Positions and slots of every row: padding rows point at live, stored keys (slot 0's
    position 5, or the last key of the first live row's sequence) that nobody may write."""
    pad = batch.T - batch.n
    pad_slot = np.array([list(pool.lengths)[0]] * pad, np.int64)
    pad_pos = np.array([min(5, pool.lengths[int(s)] - 1) for s in pad_slot], np.int64)
    return np.concatenate([batch.pos, pad_pos]), np.concatenate([batch.slot, pad_slot])


def _paging(gpu, batch: Batch, pool: Pool) -> M.Paging:
    pos, slot = _rows(batch, pool)
    return M.Paging(storage(gpu, M.pack_state(int(pos[0]), batch.n)), storage(gpu, M.pack_rows(pos, slot)),
                    storage(gpu, pool.table.reshape(-1)), pool.bs, pool.bps)


# Batches (the keys each sequence has stored; its rows in the batch), graph rows T.
def _case(name: str, rng) -> tuple[dict[int, int], Batch]:
    if name == "T1":  # one decode row of slot 3
        return {3: 200, 0: 40}, Batch(np.array([199]), np.array([3]), 1)
    if name == "T3":  # two decode rows and a padding row
        return {1: 150, 4: 290, 0: 9}, Batch(np.array([149, 289]), np.array([1, 4]), 3)
    if name == "T17":  # decode rows and short chunks of six sequences interleaved, 2 padding rows
        lengths = {0: 260, 1: 1, 2: 40, 3: 129, 4: 130, 5: 300}
        rows = [(0, p) for p in (257, 258, 259)] + [(1, 0), (2, 39), (3, 128), (5, 299)]
        rows += [(4, p) for p in range(122, 130)]
        order = rng.permutation(len(rows))
        slot, pos = (np.array([rows[i][j] for i in order]) for j in (0, 1))
        return lengths, Batch(pos, slot, 17)
    if name == "T40":  # a 32-row prefill chunk (two blocks of one sequence), then decode rows, 3 padding rows
        lengths = {2: 132, 0: 77, 5: 300, 1: 20}
        rows = [(2, p) for p in range(100, 132)] + [(0, 76), (5, 299), (1, 17), (1, 19), (1, 18)]
        slot, pos = (np.array([r[j] for r in rows]) for j in (0, 1))
        return lengths, Batch(pos, slot, 40)
    raise KeyError(name)


def _fill_caches(rng, pool: Pool, kv_heads: int, hd: int, vd: int):
    """Physical caches: NaN everywhere but at the stored keys of each sequence."""
    rows = pool.n_blocks * pool.bs
    kc = np.full((rows, kv_heads, hd), np.nan, np.float16)
    vc = np.full((rows, kv_heads, vd), np.nan, np.float16)
    for slot, n in pool.lengths.items():
        r = pool.rows_of(slot, n)
        kc[r] = rng.standard_normal((n, kv_heads, hd))
        vc[r] = rng.standard_normal((n, kv_heads, vd))
    return kc, vc


def _reference(q, kc, vc, pool: Pool, batch: Batch, n_heads, scale, window, softcap) -> np.ndarray:
    """Each sequence's rows against its own contiguous cache (the CPU reference)."""
    vd = vc.shape[2]
    want = np.zeros((batch.n, n_heads * vd), np.float32)
    for s in np.unique(batch.slot):
        mine = np.flatnonzero(batch.slot == s)
        n = pool.lengths[int(s)]
        r = pool.rows_of(int(s), n)
        want[mine] = F.attention(q[mine], kc[r], vc[r], batch.pos[mine], n, n_heads, scale, window, softcap)
    return want


def _check(name, got, want, vc_used, n_live):
    # As tests/gpu/test_attention_kernels.py: the same f16 inputs and f16 probabilities,
    # only the f32 summation order differs (a probability may tip by one f16 ulp).
    live, pad = got[:n_live], got[n_live:]
    e = np.abs(live - want)
    tol = 2.0**-10 * float(np.abs(vc_used.astype(np.float32)).max()) + 1e-5
    print(f"\n[max error] {name}: {e.max():.3g} (tolerance {tol:.3g}), median {np.median(e):.3g}")
    assert np.isfinite(live).all(), name
    assert e.max() <= tol, name
    assert np.median(e) <= 2e-6, name
    assert np.array_equal(pad, np.zeros_like(pad)), f"{name}: padding rows not zero"


SHAPES = {"gqa4_d64": (8, 2, 64, 64, None), "gqa2_dk96_dv64_softcap": (4, 2, 96, 64, 5.0)}


@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("case,shape", [("T1", "gqa4_d64"), ("T3", "gqa4_d64"), ("T17", "gqa4_d64"),
                                        ("T40", "gqa4_d64"), ("T17", "gqa2_dk96_dv64_softcap")])
def test_attention_kernels_paged(gpu, kernels, tune, case, shape, bs, window):
    """One-pass, split-K (one and two workgroups per head group), both taking turns by
    each row's length in one batch, and tiled: all on the same scrambled pool."""
    n_heads, kv_heads, hd, vd, softcap = SHAPES[shape]
    rng = np.random.default_rng(bs + len(case) + (window or 0))
    lengths, batch = _case(case, rng)
    pool = _pool(rng, bs, lengths)
    kc, vc = _fill_caches(rng, pool, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    T = batch.T
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    qb, out, pg = _buf(gpu, q), storage(gpu, T * n_heads * vd * 4), _paging(gpu, batch, pool)
    scale = 1.0 / np.sqrt(hd)
    want = _reference(q, kc, vc, pool, batch, n_heads, scale, window, softcap)
    used = np.concatenate([vc[pool.rows_of(s, n)] for s, n in lengths.items()])
    args = (n_heads, kv_heads, hd, vd, scale, window, softcap, T)
    n_ctx = pool.bps * bs
    scratch = KA.split_scratch(kernels, T, n_ctx, n_heads, vd)
    # Rows above 100 keys take split-K, the others the one-pass kernel, in one graph (span None).
    tune(INFR_ATTN_SPLIT_FROM="100", INFR_ATTN_ONE_PASS_CTX="0")
    switch = KA.attention_dispatches(kernels, qb, kcb, vcb, out, pg, lambda: scratch, *args, n_ctx=n_ctx,
                                     decode=True)
    assert [d.label.split()[0] for d in switch] == ["attention", "attn_scores", "attn_values", "attn_combine"]
    lowerings = {
        "one_pass": [M.attention_dispatch(kernels, qb, kcb, vcb, out, pg, *args)],
        "split_k": KA.split_dispatches(kernels, qb, kcb, vcb, out, pg, scratch, *args),
        "split_k_P2": KA.split_dispatches(kernels, qb, kcb, vcb, out, pg, scratch, *args, parallel=2),
        "switch": switch,
        "tiled": [KA.tiled_dispatch(kernels, qb, kcb, vcb, out, pg, *args, kernel=2)],
        "tiled_M64": [KA.tiled_dispatch(kernels, qb, kcb, vcb, out, pg, *args, kernel=2, tiling=(64, 4, 2))],
        "tiled_old": [KA.tiled_dispatch(kernels, qb, kcb, vcb, out, pg, *args, kernel=1)],
    }
    if KAM.takes(gpu, hd, vd, KAM.shape(n_heads, kv_heads)):  # the tensor cores' kernel (Dawn on NVIDIA)
        lowerings["tiled_mma"] = [KA.tiled_dispatch(kernels, qb, kcb, vcb, out, pg, *args, kernel=3)]
    for name, ds in lowerings.items():
        gpu.device.queue.write_buffer(out, 0, np.full(T * n_heads * vd, np.nan, np.float32))
        run(gpu, ds)
        got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
        _check(f"{name} {case} {shape} BS={bs} window={window}", got, want, used, batch.n)


def test_tiled_block_of_one_sequence_walks_its_keys_once(gpu, kernels):
    """A 16-row block whose rows all belong to one sequence but sit out of order
    (and a block mixing two sequences after it) still match the reference."""
    rng = np.random.default_rng(7)
    lengths = {4: 90, 1: 33}
    pos = np.concatenate([rng.permutation(np.arange(74, 90)), [32, 89, 31, 10]])
    slot = np.array([4] * 16 + [1, 4, 1, 1])
    batch, pool = Batch(pos, slot, 20), _pool(rng, 16, lengths)
    n_heads, kv_heads, hd, vd = 4, 1, 64, 64
    kc, vc = _fill_caches(rng, pool, kv_heads, hd, vd)
    q = (rng.standard_normal((batch.T, n_heads * hd)) * 2.5).astype(np.float32)
    out = storage(gpu, batch.T * n_heads * vd * 4)
    want = _reference(q, kc, vc, pool, batch, n_heads, 0.125, 40, None)
    used = np.concatenate([vc[pool.rows_of(s, n)] for s, n in lengths.items()])
    mma = [(3, None), (3, (32, 32))] if KAM.takes(gpu, hd, vd, KAM.shape(n_heads, kv_heads)) else []
    for kernel, tiling in [(1, None), (2, None), (2, (64, 4, 2))] + mma:
        d = KA.tiled_dispatch(kernels, _buf(gpu, q), _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32)),
                              out, _paging(gpu, batch, pool), n_heads, kv_heads, hd, vd, 0.125, 40, None, batch.T,
                              kernel=kernel, tiling=tiling)
        run(gpu, [d])
        got = read(gpu, out, count=batch.T * n_heads * vd).reshape(batch.T, -1)
        _check(f"tiled, one-sequence block out of order (kernel {kernel}, {tiling})", got, want, used, batch.n)


# --- RoPE and the KV store ----------------------------------------------------------------------


def _store_case(rng, bs: int):
    lengths, batch = _case("T17", rng)
    pool = _pool(rng, bs, lengths)
    return pool, batch


def _random_caches(rng, pool: Pool, kv_heads: int, hd: int, vd: int):
    rows = pool.n_blocks * pool.bs
    return (rng.standard_normal((rows, kv_heads, hd)).astype(np.float16),
            rng.standard_normal((rows, kv_heads, vd)).astype(np.float16))


def _expect_store(kc0, vc0, pool: Pool, batch: Batch, k_rows, v_rows):
    """The caches after storing the live rows' k, v at their cache rows, nothing else touched."""
    want_k, want_v = kc0.copy(), vc0.copy()
    for t in range(batch.n):
        r = pool.cache_row(int(batch.slot[t]), int(batch.pos[t]))
        want_k[r], want_v[r] = k_rows[t], v_rows[t]
    return want_k, want_v


def _read_cache(gpu, buf, like):
    return read(gpu, buf, np.uint32, like.size // 2).view(np.float16).reshape(like.shape)


@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("style", ["norm", "neox"])
def test_rope_kv_store_paged(gpu, kernels, style, bs):
    rng = np.random.default_rng(bs + len(style))
    pool, batch = _store_case(rng, bs)
    n_heads, kv_heads, hd, vd, n_rot, T, n = 4, 2, 64, 48, 64, batch.T, batch.n
    q = rng.standard_normal((T, n_heads * hd)).astype(np.float32)
    k = rng.standard_normal((T, kv_heads * hd)).astype(np.float32)
    v = (rng.standard_normal((T, kv_heads * vd)) * 3).astype(np.float32)
    kc0, vc0 = _random_caches(rng, pool, kv_heads, hd, vd)
    qb, kb = _buf(gpu, q), _buf(gpu, k)
    kcb, vcb = _buf(gpu, kc0.view(np.uint32)), _buf(gpu, vc0.view(np.uint32))
    run(gpu, [KA.rope_kv_dispatch(kernels, qb, kb, _buf(gpu, v), kcb, vcb, _paging(gpu, batch, pool), n_heads,
                                  kv_heads, hd, vd, n_rot, 1e4, 1.0, style, T)])
    spec = RopeSpec(RopeStyle(style), 1e4, n_rot, 1.0)
    angles = F.rope_angles(batch.pos, spec, None)  # each row at its own position
    got_k = read(gpu, kb, count=k.size).reshape(k.shape)[:n]
    for name, x, got, heads in (("q", q, read(gpu, qb, count=q.size).reshape(q.shape)[:n], n_heads),
                                ("k", k, got_k, kv_heads)):
        want = F.rope(x[:n], heads, hd, angles, spec.style)
        tol = float(np.abs(x).max()) * 2 * (1.5e-7 * 300 + 1e-6) + 1e-6  # test_attention_kernels' bound at pos 300
        err = float(np.abs(got - want).max())
        print(f"\n[max error] rope_kv paged {style} {name} BS={bs}: {err:.3g} (tolerance {tol:.3g})")
        assert err <= tol
    want_k, want_v = _expect_store(kc0, vc0, pool, batch, got_k.reshape(n, kv_heads, hd),
                                   v[:n].reshape(n, kv_heads, vd))
    assert np.array_equal(_read_cache(gpu, kcb, kc0).view(np.uint16), want_k.view(np.uint16))
    assert np.array_equal(_read_cache(gpu, vcb, vc0).view(np.uint16), want_v.view(np.uint16))


@pytest.mark.parametrize("bs", [16, 32])
def test_kv_store_paged(gpu, kernels, bs):
    rng = np.random.default_rng(bs)
    pool, batch = _store_case(rng, bs)
    kv_heads, hd, vd, T, n = 3, 64, 32, batch.T, batch.n
    k = (rng.standard_normal((T, kv_heads * hd)) * 3).astype(np.float32)
    v = (rng.standard_normal((T, kv_heads * vd)) * 3).astype(np.float32)
    kc0, vc0 = _random_caches(rng, pool, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc0.view(np.uint32)), _buf(gpu, vc0.view(np.uint32))
    run(gpu, [M.kv_store_dispatch(kernels, _buf(gpu, k), _buf(gpu, v), kcb, vcb, _paging(gpu, batch, pool),
                                  kv_heads, hd, vd, T)])
    want_k, want_v = _expect_store(kc0, vc0, pool, batch, k[:n].reshape(n, kv_heads, hd),
                                   v[:n].reshape(n, kv_heads, vd))
    assert np.array_equal(_read_cache(gpu, kcb, kc0).view(np.uint16), want_k.view(np.uint16))
    assert np.array_equal(_read_cache(gpu, vcb, vc0).view(np.uint16), want_v.view(np.uint16))


def test_rope_per_row_positions(gpu, kernels):
    rng = np.random.default_rng(3)
    pool, batch = _store_case(rng, 16)
    n_heads, hd, n_rot, n = 3, 64, 32, batch.n
    x = rng.standard_normal((batch.T, n_heads * hd)).astype(np.float32)
    xb = _buf(gpu, x)
    run(gpu, [M.rope_dispatch(kernels, xb, _paging(gpu, batch, pool), n_heads, hd, n_rot, 1e4, 1.0, "neox",
                              batch.T)])
    spec = RopeSpec(RopeStyle.NEOX, 1e4, n_rot, 1.0)
    want = F.rope(x[:n], n_heads, hd, F.rope_angles(batch.pos, spec, None), spec.style)
    got = read(gpu, xb, count=x.size).reshape(x.shape)[:n]
    tol = float(np.abs(x).max()) * 2 * (1.5e-7 * 300 + 1e-6) + 1e-6
    print(f"\n[max error] rope per-row positions: {float(np.abs(got - want).max()):.3g} (tolerance {tol:.3g})")
    assert np.abs(got - want).max() <= tol


# --- the step kernel: positions advance on the GPU ----------------------------------------------


def test_step_advances_live_rows(gpu, kernels):
    """Every live row moves to its next position, slots and padding rows stay; each live row's
    id is logged after the state[2] tokens logged so far (the engine's multi-step decode)."""
    pos, slot = np.array([40, 7, 300, 9, 9]), np.array([0, 3, 1, 2, 2])
    rows = _buf(gpu, M.pack_rows(pos, slot))
    state = _buf(gpu, np.array([40, 3, 2, 0], np.uint32))
    log = _buf(gpu, np.zeros(64, np.uint32))
    ids = _buf(gpu, np.array([77, 78, 79, 80], np.uint32))
    pipe = kernels.pipeline("step", "batch")
    from infr.gpu.runtime import Dispatch

    run(gpu, [Dispatch(pipe, kernels.bind(pipe, [ids, state, log, rows]), (1, 1, 1))] * 2)
    got = read(gpu, rows, np.uint32, 10).reshape(5, 2)
    np.testing.assert_array_equal(got[:, 0], [42, 9, 302, 9, 9])
    np.testing.assert_array_equal(got[:, 1], slot)
    st, lg = read(gpu, state, np.uint32, 4), read(gpu, log, np.uint32, 64)
    assert st.tolist() == [42, 3, 8, 0]
    assert lg[2:8].tolist() == [77, 78, 79] * 2 and lg[:2].sum() == 0 and lg[8:].sum() == 0


# --- GPUBackend.run_rows ------------------------------------------------------------------------


def test_run_rows_interleaved_equals_each_sequence_alone(tmp_path, gpu, tune):
    """Two sequences of tiny-gemma3 (a sliding window of 8 and a global layer) in
    blocks of 16 scattered over the pool, run together by run_rows (prefill rows
    interleaved in one tiled batch; decode steps of both, one padded to 4 rows;
    a 6-row step of 3 rows each, the batched-decode graph), give the logits of
    each sequence run alone through forward. Split-K takes keys past 28, so the
    host picks the graph by the longest row."""
    tune(INFR_ATTN_SPLIT_FROM="28", INFR_ATTN_ONE_PASS_CTX="0")
    from closeness import assert_logits_close, rounds_activations

    from infr import synth
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    gf = open_gguf(synth.write_gguf(synth.preset("tiny-gemma3"), tmp_path / "g.gguf"))
    plan = build_plan(build_spec(gf))
    q8 = rounds_activations(gf, plan)
    solo = GPUBackend(gf, plan, 160, dev=gpu, block_size=16)
    multi = GPUBackend(gf, plan, 160, dev=gpu, block_size=16)  # its own KV cache beside solo's
    assert multi.n_blocks == 10 and multi.block_size == 16
    rng = np.random.default_rng(1)
    V = plan.spec.n_vocab
    prompts = {0: rng.integers(0, V, 23), 1: rng.integers(0, V, 30)}
    later = {s: rng.integers(0, V, 5) for s in prompts}  # tokens fed after each prompt, the same both ways
    slots = {0: 2, 1: 5}  # sequence -> slot in the multi backend
    table = np.zeros((multi.max_seqs, multi.n_blocks), np.uint32)
    table[slots[0], :3] = [7, 2, 9]
    table[slots[1], :3] = [4, 0, 6]

    # Alone: each sequence through forward (slot 0, identity table), one after the other.
    alone = {}
    for s, p in prompts.items():
        n = len(p)
        alone[s] = [solo.forward(p, 0)[-1], solo.forward(later[s][:1], n)[-1], solo.forward(later[s][1:2], n + 1)[-1],
                    solo.forward(later[s][2:5], n + 2, n_logits=3)]

    def check(got, want, what):
        assert_logits_close(got, want, q8)
        assert int(np.argmax(got)) == int(np.argmax(want)), what

    # 1. Both prompts in one batch, rows interleaved; the two last prompt rows last (their logits).
    body = [(s, i) for i in range(29) for s in (0, 1) if i < len(prompts[s]) - 1]
    rows = body + [(0, 22), (1, 29)]
    ids = [prompts[s][i] for s, i in rows]
    got = multi.run_rows(ids, [i for _, i in rows], [slots[s] for s, _ in rows], table, n_logit_rows=2)
    check(got[0], alone[0][0], "prefill A")
    check(got[1], alone[1][0], "prefill B")
    # 2. A decode step of both (B's row sees 31 keys: the far graph, split-K for both rows).
    assert multi._far(30, 1, 2)
    got = multi.run_rows([later[0][0], later[1][0]], [23, 30], [slots[0], slots[1]], table, n_logit_rows=2)
    check(got[0], alone[0][1], "decode A")
    check(got[1], alone[1][1], "decode B")
    # 3. The next step in the graph of 4 rows, 2 of them padding.
    got = multi.run_rows([later[1][1], later[0][1]], [31, 24], [slots[1], slots[0]], table, n_logit_rows=2,
                         pad_to=4)
    check(got[0], alone[1][2], "padded decode B")
    check(got[1], alone[0][2], "padded decode A")
    # 4. Three rows of each, interleaved: a batched decode step of 6 rows (per-row attention, not tiled).
    rows = [(0, 2), (1, 2), (0, 3), (1, 3), (0, 4), (1, 4)]
    got = multi.run_rows([later[s][j] for s, j in rows], [len(prompts[s]) + j for s, j in rows],
                         [slots[s] for s, _ in rows], table, n_logit_rows=6)
    assert (6, 6, True, True) in multi._graphs  # (T, n_logits, far, decode)
    for i, (s, j) in enumerate(rows):
        check(got[i], alone[s][3][j - 2], f"batched decode {s} row {j}")
    # forward on slot 0 afterwards runs over the identity table again.
    np.testing.assert_allclose(multi.forward(prompts[0], 0)[-1], alone[0][0], atol=1e-5)
    from infr.errors import InfrError

    for bad in (dict(slots=[6]), dict(positions=[160]), dict(block_table=table[:, :9]),
                dict(block_table=np.full_like(table, 10))):
        args = dict(ids=[1], positions=[3], slots=[0], block_table=table[:6]) | bad
        with pytest.raises(InfrError):
            multi.run_rows(**args)
