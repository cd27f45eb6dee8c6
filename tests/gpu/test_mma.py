"""The tensor-core prompt matmul (wgsl/gemm_mma.wgsl, the Dawn tier's mmq) with every block reader
against quantize_q8(x) @ dequantize(W).T, on the shapes and epilogues of test_mmq_types.py.

It runs where a device multiplies f16 subgroup matrices (Dawn on NVIDIA: INFR_TEST_FLAVOR=dawn
on the H200) and skips elsewhere (lavapipe has none; its kernels are checked by Tint in
test_tint.py). The weights and activations enter the tensor cores as f16: the q8-rounded activation
and the block's value, each rounded once more (relative 2^-11), so the error bound is
2^-10 |W[r]| |x[t]| (Cauchy-Schwarz), against mmq's exact integer sums.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from test_mmq_types import _check as mmq_check
from test_mmq_types import _nan, _want  # tests/gpu is on sys.path (prepend import mode)
from test_moe_gpu import _grouped_case, _grouped_pair_case
from test_quant_kernels import make_weight

from infr.cpu import ops as F
from infr.errors import UnsupportedError
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_moe as KMoE
from infr.gpu import kernels_q8 as KQ
from infr.gpu import tuning
from infr.gpu.runtime import read, run, storage
from infr.models.spec import Activation

TOL = 2.0**-10
TYPES = list(KMQ.READERS)
PLAIN, PAIR, SPLIT = KMA.MmaTile(128, 64, 2, 4, 2), KMA.MmaTile(64, 64, 4, 2, 2, 0), KMA.MmaTile(64, 32, 4, 2, 2, 0)


@pytest.fixture(scope="module")
def mma(gpu):
    if not KMA.available(gpu):
        pytest.skip(f"{gpu.name} has no f16 subgroup matrices: this kernel runs only on the Dawn tier with tensor "
                    "cores (INFR_TEST_FLAVOR=dawn on an NVIDIA GPU); lavapipe compiles it in test_tint.py")
    return gpu


def _rows(kernels, x, K: int, T: int):
    """x rounded (quantize_q8) as the engine feeds the kernel, into a buffer of its own (one pass
    holds three products here)."""
    gpu = kernels.dev
    quant, xq = KQ.quantize_dispatch(kernels, storage(gpu, x), K, T, into=storage(gpu, 4 * T * KQ.words(K)))
    return [quant], xq


def _check(name, got, want, scale):
    mmq_check(name, got, want, scale, TOL)


@pytest.mark.parametrize("qtype", TYPES, ids=[q.name.lower() for q in TYPES])
def test_type_matches_reference(mma, kernels, qtype):
    _three_products(mma, kernels, qtype, (PLAIN, PAIR, SPLIT))


COPIED = (KMA.MmaTile(64, 128, 2, 2, 4), PAIR, KMA.MmaTile(64, 32, 2, 2, 2))


@pytest.mark.parametrize("xc,wc", [(1, 0), (0, 1), (1, 1), (0, 128), (0, 2), (2, 0), (2, 2)],
                         ids=["tokens", "weights", "both", "wc128", "words", "token-words", "both-words"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.IQ4_XS], ids=lambda q: q.name.lower())
def test_rows_copied_as_f16(mma, kernels, qtype, xc, wc):
    """XC / WC tiles: q8_f16.wgsl writes the rounded rows as f16 once, mma_dequant.wgsl the weight rows
    (the pair's gate and up, each padded), and the kernel copies its tiles from them by matrix loads.
    Within the bound, and the same bits as the tiles that convert both themselves (the same f16
    values, multiplied in the same order). wc128: WC_TILE (the default from 256 tokens), within the bound.
    words (WC 2): the weight rows copied by vec4 loads and f16 stores, the same bits again; token-words
    (XC 2) the token rows so, both-words both (WC_TILE's)."""
    if wc == 128:
        assert KMA.WC_TILE.fits(mma, KMQ.READERS[qtype], pair=True)
        _three_products(mma, kernels, qtype, (KMA.WC_TILE,) * 3)
        return
    got = _three_products(mma, kernels, qtype, tuple(replace(t, XC=xc, WC=wc) for t in COPIED))
    want = _three_products(mma, kernels, qtype, COPIED)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name.lower())
def test_token_tiles_first_gives_the_same_bits(mma, kernels, qtype):
    """Workgroups numbered token tiles first (INFR_GEMM_TOKENS_FIRST) run the same tiles in another
    launch order: each product the same bits as in grid order (rows and tokens over several tiles)."""
    tiles = (KMA.MmaTile(64, 32, 2, 2, 2), PAIR, SPLIT)
    with tuning.override(gemm_tokens_first=0):
        want = _three_products(mma, kernels, qtype, tiles)
    with tuning.override(gemm_tokens_first=1):
        got = _three_products(mma, kernels, qtype, tiles)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("xc", [0, 2], ids=["direct", "direct-token-words"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0], ids=lambda q: q.name.lower())
def test_units_converted_directly(mma, kernels, qtype, xc):
    """WC 3 tiles (kernels_mma.DIRECT_TILE's kind): each invocation's fetched units turned straight into
    f16 values of the weight tile, no int8 lanes staged and no dequantizing pass: the same bits as the
    tiles converting staged lanes (the same f16 values, multiplied in the same order), and DIRECT_TILE
    within the bound."""
    _three_products(mma, kernels, qtype, (KMA.DIRECT_TILE,) * 3)
    got = _three_products(mma, kernels, qtype, tuple(replace(t, XC=xc, WC=3) for t in COPIED))
    want = _three_products(mma, kernels, qtype, COPIED)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("tile", [KMA.DIRECT_Q6_TILE, KMA.DIRECT_FEW_TILE], ids=["q6-64x128", "few-128x64"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0], ids=lambda q: q.name.lower())
def test_direct_tiles(mma, kernels, qtype, tile):
    """kernels_mma.direct_tile's other WC 3 tiles (Q6_K's 64 x 128; DIRECT_FEW_TILE's 128 rows over 4 subgroups,
    where DIRECT_TILE gives few workgroups) within the bound as a plain product, a gate||up pair and a q|k|v split."""
    _three_products(mma, kernels, qtype, (tile,) * 3)


VIEWED = [KMA.DIRECT_TILE, KMA.WC_TILE, COPIED[0], KMA.PLAIN_KP_TILE, KMA.MmaTile(64, 64, 2, 2, 2, 8, 1, 1)]


@pytest.mark.parametrize("tile,qtype", [(t, q) for t in VIEWED for q in (Q.Q4_K, Q.Q6_K)]
                         + [(KMA.DIRECT_TILE, q) for q in (Q.Q8_0, Q.Q5_0)],
                         ids=[f"{n}-{q}" for n in ("direct", "wc", "converting", "kp", "matrix-copies") for q in ("q4_k", "q6_k")]
                         + ["direct-q8_0", "direct-q5_0"])
def test_views_give_the_same_bits(mma, kernels, qtype, tile):
    """VW 1 (the tiles and the epilogue's scratch as views of one workgroup buffer, stored by 8- and 16-byte words):
    the same values in the same places, so each product the same bits as VW 0's."""
    want = _three_products(mma, kernels, qtype, (tile,) * 3)
    got = _three_products(mma, kernels, qtype, (replace(tile, VW=1),) * 3)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("tile", [KMA.MmaTile(64, 256, 2, 2, 4, 8, 2, 3, 1, 1), KMA.MmaTile(128, 192, 2, 2, 4, 8, 2, 3, 1, 1)],
                         ids=["64x256", "128x192"])
def test_tiles_only_views_fit(mma, kernels, tile):
    """Token tiles past 48 KiB without VW (the scratch beside the tiles) within the bound with it."""
    assert not replace(tile, VW=0).fits(mma, pair=True) and tile.fits(mma, pair=True)
    _three_products(mma, kernels, Q.Q4_K, (tile,) * 3)


MIXED = [(256, 128, 128), (200, 100, 60)]  # q, k, v rows: tile-aligned, and passes overrunning their neighbours


@pytest.fixture
def mixed_on():
    """MmaTuning.mixed (INFR_MMA_MIXED=1): a mixed stack as one product, off by default until a GPU runs it."""
    with tuning.override(mma=replace(tuning.current().mma, mixed=True)):
        yield


@pytest.mark.parametrize("sizes", MIXED, ids=lambda s: "+".join(map(str, s)))
def test_mixed_stack_is_one_product(mma, kernels, sizes, mixed_on):
    """A Q4_K_M layer's mixed stack (Q4_K q, k and a Q6_K v) at T = 300 on the tile the engine picks
    (WC_TILE: it copies f16 weight rows) runs as one product: one token pass, a dequant pass per matrix
    into its rows of one f16 buffer, one q|k|v kernel. Within the bound of the reference, with the bias;
    the same bits as the three products the engine ran before, where each matrix's rows sit at the same
    place in its 128-row tiles (offsets of whole tiles), within rounding elsewhere."""
    gpu = mma
    K, T = 512, 300
    rng = np.random.default_rng([sum(sizes), 23])
    ts = [make_weight(q, n, K, rng) for q, n in zip((Q.Q4_K, Q.Q4_K, Q.Q6_K), sizes)]
    tile = KMQ.mixed_tile(kernels, ts, T)
    assert tile == KMA.WC_TILE, tile
    bias = rng.standard_normal(sum(sizes)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    pre, xq = _rows(kernels, x, K, T)
    chunks = KM.upload_stacked(gpu, ts, label="qkv")
    outs = [_nan(gpu, T, n) for n in sizes]
    one = KMQ.stacked_dispatches(kernels, ts, chunks, xq, outs, storage(gpu, bias), T)
    assert [d.label.split()[0] for d in one] == ["q8_f16", "mma_dequant_q4_k", "mma_dequant_q4_k", "mma_dequant_q6_k",
                                                 "mmq_q4_k+q6_k_stacked"], [d.label for d in one]
    run(gpu, pre + one)
    got = [read(gpu, y, count=T * n).reshape(T, n) for y, n in zip(outs, sizes)]
    # before: each matrix its own product on a view of its rows, with its slice of the bias
    alone = [_nan(gpu, T, n) for n in sizes]
    first, ds = 0, []
    for tw, part, y, n in zip(ts, KM.stack_parts(ts, chunks), alone, sizes):
        ds += KMQ.mmq_dispatches(kernels, tw, part, xq, y, storage(gpu, bias[first: first + n]), T, tile=tile)
        first += n
    run(gpu, ds)
    first = 0
    for tw, g, y, n in zip(ts, got, alone, sizes):
        want, scale = _want(tw, x)
        _check(f"mixed stack {first}..{first + n}", g, want + bias[first: first + n], scale)
        apart = read(gpu, y, count=T * n).reshape(T, n)
        if all(s % 128 == 0 for s in sizes):
            np.testing.assert_array_equal(g, apart)
        else:
            np.testing.assert_allclose(g, apart, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(apart))))
        first += n


class _Layout:
    """Kernels that compile nothing and bind nothing: the dispatches' pipelines are (name, QTYPE) and
    their bind groups the resource lists, over a real device's buffers (lavapipe will do)."""

    def __init__(self, kernels):
        self.dev = kernels.dev

    def pipeline(self, name, entry="main", unchecked=False, **consts):
        return name, consts.get("QTYPE"), consts.get("WCOPY")

    def bind(self, pipeline, res):
        return list(res)


def _qkv(sizes, K, types=(Q.Q4_K, Q.Q4_K, Q.Q6_K)):
    from types import SimpleNamespace

    return [SimpleNamespace(qtype=q, shape=(n, K)) for q, n in zip(types, sizes)]


def _h100():
    """A stand-in for Dawn's H100 device: its limits and subgroup matrices (kernels_mma.available)."""
    from types import SimpleNamespace

    config = {"component_type": "f16", "result_component_type": "f32", "m": 16, "n": 16, "k": 16,
              "min_subgroup_size": 32, "max_subgroup_size": 32}
    limits = {"max-compute-workgroup-storage-size": 49152, "max-compute-invocations-per-workgroup": 1024,
              "max-storage-buffers-per-shader-stage": 16, "max-storage-buffer-binding-size": 1 << 30}
    return SimpleNamespace(dawn=True, has=lambda f: True, subgroup_matrix_configs=[config], is_cpu=False,
                           limits=limits, name="H100 stand-in")


@pytest.mark.parametrize("sizes", [(4096, 1024, 1024), (200, 100, 60)], ids=["8b", "odd"])
def test_mixed_stack_layout(gpu, kernels, sizes):
    """The dispatches of a mixed stack's one product, without compiling them (runs on any adapter): each
    dequant pass reads its matrix's view of the upload, writes its f16 rows at the stack's row offsets
    of the scratch (a pass running past its matrix written over by the next; the last one reaching the
    stack's 128-row padding) within the scratch, in stack order; the product reads the whole upload at
    binding 1 as the first matrix's type, copies the rows (WCOPY) and splits q|k|v."""
    K, T = 512, 300
    ts = _qkv(sizes, K)
    rb = [KM.row_bytes(t.qtype, K) for t in ts]
    layout = KM.stack_layout(ts)
    raw = storage(gpu, layout[-1][0] + layout[-1][1] + 64)
    rec = _Layout(kernels)
    xq = storage(gpu, 4 * T * KQ.words(K))
    outs = [storage(gpu, 4 * T * n) for n in sizes]
    ds = KMQ.stacked_dispatches(rec, ts, [(raw, 0, sum(sizes))], xq, outs, None, T, tile=KMA.WC_TILE)
    assert [d.pipeline[:2] for d in ds] == [("q8_f16", None), ("mma_dequant", "q4_k"), ("mma_dequant", "q4_k"),
                                            ("mma_dequant", "q6_k"), ("gemm_mma", "q4_k")]
    assert ds[-1].label == f"mmq_q4_k+q6_k_stacked {'+'.join(map(str, sizes))}x{K}" and ds[-1].pipeline[2] == "true"
    x16, w16 = ds[-1].bind_group[12], ds[-1].bind_group[13]
    assert x16 is ds[0].bind_group[2] and ds[-1].bind_group[1] is raw and ds[-1].bind_group[2] is xq
    assert ds[-1].bind_group[3] is outs[0] and ds[-1].bind_group[6] is outs[1] and ds[-1].bind_group[7] is outs[2]
    N, padded = sum(sizes), -(-sum(sizes) // 128) * 128
    assert ds[-1].groups == (padded // 128, -(-T // 128), 1)
    written = np.zeros(w16.size // (2 * K), int)  # the pass that last wrote each f16 row
    for i, (d, n, (off, nbytes)) in enumerate(zip(ds[1:4], sizes, layout)):
        view, at, size = d.bind_group[1]
        assert view is raw and at == off and size >= n * rb[i] and at % KM.STACK_ALIGN == 0
        buf, at, size = d.bind_group[13]
        assert buf is w16 and at % KM.STACK_ALIGN == 0 and at + size <= w16.size
        r0, rows = at // (2 * K), size // (2 * K)
        assert r0 == sum(sizes[:i]) and d.groups == (rows // 64, K // 512, 1) and rows >= n
        written[r0: r0 + rows] = i + 1
    # the last writer of each stack row is its own matrix's pass; rows up to the padding are written
    assert (written[:N] == np.repeat([1, 2, 3], sizes)).all() and (written[N:padded] == 3).all()


def test_lowering_runs_a_mixed_stack_as_one_product(monkeypatch):
    """Lowering.stacked on a device with the tensor cores (a stand-in, nothing runs): a mixed stack takes
    one product where the stack's tile copies f16 weight rows (T >= wc_min_t), three below that or with
    INFR_MMA_WC=0; a stack of one type one product either way."""
    from types import SimpleNamespace

    from infr.gpu import tuning
    from infr.gpu.lowering import Lowering
    from infr.ops import MatMul

    calls = []
    monkeypatch.setattr(KMQ, "stacked_dispatches", lambda k, ts, *a, **kw: calls.append(("stacked", len(ts))) or [])
    monkeypatch.setattr(KMQ, "mmq_dispatches", lambda k, t, *a, **kw: calls.append(("mmq", int(t.shape[0]))) or [])
    names = ("q", "k", "v")
    mms = [MatMul(src="x", dst=f"{n}_out", weight=n, q8=True) for n in names]

    monkeypatch.setattr(KM, "stack_parts", lambda tensors, chunks: [[("view", 0, int(t.shape[0]))] for t in tensors])

    def lower(T, types):
        ts = dict(zip(names, _qkv((4096, 1024, 1024), 4096, types)))
        dev = _h100()
        be = SimpleNamespace(kern=SimpleNamespace(dev=dev), dev=dev, gf=SimpleNamespace(tensor=ts.get),
                             weights={names: [("upload", 0, 6144)]}, stack_bias={},
                             buffers={b: [object()] for b in ["x"] + [m.dst for m in mms]})
        low = Lowering(be, T)
        low.q8 = (be.buffers["x"][0], 4096, "xq")  # the norm before wrote x rounded: no quantize dispatch
        calls.clear()
        low.stacked(mms, names)
        return list(calls)

    mixed, same = (Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q4_K,) * 3
    three = [("mmq", 4096), ("mmq", 1024), ("mmq", 1024)]
    assert lower(512, mixed) == three  # MmaTuning.mixed is off by default
    assert lower(512, same) == [("stacked", 3)]
    with tuning.override(mma=KMA.MmaTuning(mixed=True)):
        _mixed_lowering(lower, mixed, same, three)


def _mixed_lowering(lower, mixed, same, three):
    assert lower(512, mixed) == [("stacked", 3)]
    assert lower(128, mixed) == three
    assert lower(512, same) == lower(128, same) == [("stacked", 3)]
    with tuning.override(mma=KMA.MmaTuning(wc=False, mixed=True)):
        assert lower(512, mixed) == three


KP_TILES = (KMA.MmaTile(64, 32, 4, 2, 1, 8, 0, 0, 4), KMA.MmaTile(64, 32, 4, 2, 2, 8, 0, 0, 2),
            KMA.MmaTile(64, 16, 4, 2, 1, 8, 0, 0, 8), KMA.PLAIN_KP_TILE)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.IQ4_XS], ids=lambda q: q.name.lower())
def test_stages_split_among_subgroup_groups(mma, kernels, qtype):
    """KP tiles (batched decode steps): groups of subgroups each multiply their share of a stage's
    values and group 0 stores the sums. Within the bound for the plain product, the pair and the
    q|k|v split, each tile; and within rounding of the same tile's KP = 1 (other summation order)."""
    tiles = [t for t in KP_TILES if t.fits(mma, KMQ.READERS[qtype], pair=True)]
    assert len(tiles) >= 3  # the IQ4 readers' 1 KiB table puts 64 x 16 with 8 groups past 48 KiB
    for tile in tiles:
        got = _three_products(mma, kernels, qtype, (tile,) * 3)
        want = _three_products(mma, kernels, qtype, (replace(tile, KP=1),) * 3)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(w))))


def _three_products(gpu, kernels, qtype, tiles):
    """A plain product with bias and residual, a GELU gate||up pair and the q|k|v split on `tiles`,
    each against the reference; their outputs."""
    plain, pair_tile, split = tiles
    rng = np.random.default_rng([int(qtype), 11])
    ds = []
    N, K, T = 75, 768, 33  # plain with bias and the residual add: rows and tokens past the tile's
    t = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    resid = rng.standard_normal((T, N)).astype(np.float32)
    y = _nan(gpu, T, N)
    pre, xf = _rows(kernels, x, K, T)
    ds += pre + KMQ.mmq_dispatches(kernels, t, KM.upload_weight(gpu, t), xf, y, storage(gpu, bias), T,
                                   resid=storage(gpu, resid), tile=plain)
    Np, Kp, Tp = 72, 512, 70  # gate||up with GELU
    wg, wu = make_weight(qtype, Np, Kp, rng), make_weight(qtype, Np, Kp, rng)
    xp = rng.standard_normal((Tp, Kp)).astype(np.float32) * 0.1
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    yp = _nan(gpu, Tp, Np)
    pre, xfp = _rows(kernels, xp, Kp, Tp)
    pair = KMQ.gate_up_dispatches(kernels, wg, wu, cg, cu, xfp, yp, "gelu", Tp, tile=pair_tile)
    assert pair is not None and len(pair) == 1 + bool(pair_tile.XC) + (pair_tile.WC in (1, 2))
    ds += pre + pair
    sizes, Ks = (40, 24, 24), 256  # the q|k|v split with its bias
    ts = [make_weight(qtype, n, Ks, rng) for n in sizes]
    sbias = rng.standard_normal(sum(sizes)).astype(np.float32)
    xs = rng.standard_normal((Tp, Ks)).astype(np.float32)
    outs = [_nan(gpu, Tp, n) for n in sizes]
    pre, xfs = _rows(kernels, xs, Ks, Tp)
    ds += pre + KMQ.stacked_dispatches(kernels, ts, KM.upload_stacked(gpu, ts, label="qkv"), xfs, outs,
                                       storage(gpu, sbias), Tp, tile=split)
    run(gpu, ds)
    outs_read = [read(gpu, y, count=T * N), read(gpu, yp, count=Tp * Np)] + [
        read(gpu, yb, count=Tp * n) for yb, n in zip(outs, sizes)]

    want, scale = _want(t, x)
    _check(f"{qtype.name} plain", read(gpu, y, count=T * N).reshape(T, N), want + bias + resid, scale)
    g, gs = _want(wg, xp)
    u, us = _want(wu, xp)
    ref = F.gated_act(g, u, Activation.GELU)
    got = read(gpu, yp, count=Tp * Np).reshape(Tp, Np)
    assert not np.isnan(got).any()
    # act(g) u moves by |act'(g)| |u| dg + |act(g)| du, and GELU's slope is below 1.2
    bound = TOL * (1.2 * np.abs(u) * gs + np.abs(F.gated_act(g, np.ones_like(u), Activation.GELU)) * us)
    assert float(np.max(np.abs(got - ref) - bound)) < 0, float(np.max(np.abs(got - ref) / bound))
    first = 0
    for tw, yb, n in zip(ts, outs, sizes):
        want, scale = _want(tw, xs)
        _check(f"{qtype.name} stacked {first}..{first + n}", read(gpu, yb, count=Tp * n).reshape(Tp, n),
               want + sbias[first: first + n], scale)
        first += n
    return outs_read


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda q: q.name.lower())
def test_pair_applies_the_table_gelu(mma, kernels, tune, qtype):
    """INFR_MMA_TABLE_PAIR=1: gemma4's dense gate||up pair takes the tensor cores with the table GELU
    (binding 11) in its epilogue, for gates inside the table's +-10 and past it. Against the reference,
    the f16 products' bound plus one f16 step of the gate through the table (slope under 1.2, the
    table's output an f16 too)."""
    from test_gelu_pair import _table_range, _x

    gpu = mma
    assert not KMQ.pairs_act(kernels, make_weight(qtype, 72, 512, np.random.default_rng(0)),
                             [(None, 0, 72)], 70, "gelu_f16")  # off by default: gate, up and the GELU apart
    tune(INFR_MMA_TABLE_PAIR="1")
    rng = np.random.default_rng([int(qtype), 17])
    N, K, T = 72, 512, 70
    wg, wu = make_weight(qtype, N, K, rng), make_weight(qtype, N, K, rng)
    x = _x(rng, T, K, wg)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    y = _nan(gpu, T, N)
    pre, xf = _rows(kernels, x, K, T)
    assert KMQ.pairs_act(kernels, wg, cg, T, "gelu_f16")
    pair = KMQ.gate_up_dispatches(kernels, wg, wu, cg, cu, xf, y, "gelu_f16", T, tile=PAIR)
    assert pair is not None and len(pair) == 1
    run(gpu, pre + pair)
    g, gs = _want(wg, x)
    u, us = _want(wu, x)
    _table_range(g)
    ref = F.gated_act(g, u, Activation.GELU_F16)
    got = read(gpu, y, count=T * N).reshape(T, N)
    assert not np.isnan(got).any()
    act = np.abs(F.gated_act(g, np.ones_like(u), Activation.GELU_F16))
    bound = TOL * (1.2 * np.abs(u) * gs + act * us) + 1.2 * 2.0**-10 * (np.abs(g) + 1e-3) * np.abs(u) * 2
    assert float(np.max(np.abs(got - ref) - bound)) < 0, float(np.max(np.abs(got - ref) / bound))


GROUPED = [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0]


@pytest.mark.parametrize("qtype", GROUPED, ids=[q.name.lower() for q in GROUPED])
def test_grouped_experts_on_the_tensor_cores(mma, kernels, qtype):
    """kernels_moe's grouped expert products (MUL_MAT_ID) with this kernel's expert tiles, on each
    default tile: plain (rows of 704 for the 32-value types, as Gemma 4 26B's down) and, for Q4_K,
    the gate||up pair from two banks and from one fused bank (f16 products: a looser bound)."""
    K = 256 if qtype in (Q.Q4_K, Q.Q6_K) else 704
    for tile in [t for t in KMA.without_copies(KMA.TILES) if t.fits(mma, KMQ.READERS[qtype], pair=True)]:
        _grouped_case(mma, kernels, qtype, False, K, tile=tile, tol=TOL)
        if qtype == Q.Q4_K:
            for fused in (False, True):
                _grouped_pair_case(mma, kernels, fused, tile=tile, rtol=4e-3)




@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_0], ids=lambda q: q.name.lower())
def test_grouped_experts_convert_units_directly(mma, kernels, qtype):
    """Grouped expert products on a WC 3 tile (each gathered row's fetched units straight into f16): plain (Q5_0's
    rows 704 wide, as Gemma 4 26B's down), and
    for Q4_K the gate||up pair from two banks and one fused bank, within the bounds of the tiles above."""
    for tile in (KMA.EXPERT_DIRECT_TILE, KMA.MmaTile(128, 32, 2, 4, 2, 8, 0, 3)):
        assert tile in KMA.without_copies((tile,)) and tile.fits(mma, pair=True)
        _grouped_case(mma, kernels, qtype, False, 256 if qtype in (Q.Q4_K, Q.Q6_K) else 704, tile=tile, tol=TOL)
        if qtype == Q.Q4_K:
            for fused in (False, True):
                _grouped_pair_case(mma, kernels, fused, tile=tile, rtol=4e-3)


def test_engine_picks_the_tensor_cores(mma, kernels):
    """Where the device has them, a prompt batch's matmul is this kernel (by tile), and INFR_MMA=0 keeps mmq."""
    from infr.gpu import tuning

    assert KMQ._tile(kernels, Q.Q4_K, 4096, 512) == replace(KMA.DIRECT_TILE, VW=1)  # MmaTuning.vw
    assert KMQ._tile(kernels, Q.Q6_K, 4096, 512) == KMA.DIRECT_Q6_TILE  # a Q6_K down or v
    # grouped experts with MmaTuning.experts (default; INFR_MMA_EXPERTS=0: the int8 GEMM's): Qwen3-30B-A3B's
    # pp512, 4096 pairs over 128 experts, 32 an expert, takes EXPERT_DIRECT_TILE (Q4_K), a Q8_0 bank's too;
    # an IQ4_XS bank (no direct conversion) and fewer pairs an expert (a batched decode step) the int8 GEMM's
    assert KMoE.grouped_tile(kernels, Q.Q4_K, 768, 4096, pair=True, E=128) == KMA.EXPERT_DIRECT_TILE
    assert KMoE.grouped_tile(kernels, Q.Q8_0, 768, 4096, pair=True, E=128) == KMA.EXPERT_DIRECT_TILE
    assert isinstance(KMoE.grouped_tile(kernels, Q.IQ4_XS, 768, 4096, pair=True, E=128), KMQ.MmqTile)
    assert isinstance(KMoE.grouped_tile(kernels, Q.Q4_K, 768, 31 * 128, pair=True, E=128), KMQ.MmqTile)
    with tuning.override(mma=KMA.MmaTuning(experts=False)):
        assert isinstance(KMoE.grouped_tile(kernels, Q.Q4_K, 768, 4096, pair=True, E=128), KMQ.MmqTile)
    with tuning.override(mma=KMA.MmaTuning(on=False)):
        assert isinstance(KMQ._tile(kernels, Q.Q4_K, 4096, 512), KMQ.MmqTile)
        assert isinstance(KMoE.grouped_tile(kernels, Q.Q4_K, 768, 4096, pair=True, E=128), KMQ.MmqTile)


def test_tuning_reads_the_environment_and_picks_tiles():
    """INFR_MMA=0 turns the kernel off, INFR_MMA_EXPERTS=0 leaves grouped experts to the int8 GEMM; INFR_MMA_TILES
    replaces the list; a tile that does not fit the device's workgroup memory, or a pair tile with an
    odd number of row matrices, is passed over."""
    assert not KMA.MmaTuning.from_env({"INFR_MMA": "0"}).on
    assert KMA.MmaTuning.from_env({}).experts and not KMA.MmaTuning.from_env({"INFR_MMA_EXPERTS": "0"}).experts
    t = KMA.MmaTuning.from_env({"INFR_MMA_TILES": "64,128,2,2,4 32,32,2,1,1,0"})
    assert [x.spec for x in t.tiles] == ["64,128,2,2,4,8", "32,32,2,1,1,0"]

    class Dev:  # the limits Dawn gives an H100
        limits = {"max-compute-workgroup-storage-size": 49152, "max-compute-invocations-per-workgroup": 1024,
                  "max-storage-buffers-per-shader-stage": 16}

    class Few(Dev):  # WebGPU's default storage buffers a stage: no room for the f16 row copies' bindings
        limits = {**Dev.limits, "max-storage-buffers-per-shader-stage": 8}

    assert KMA.MmaTuning().tile_for(Dev(), 4096, 512) == KMA.WC_TILE
    assert not (t := KMA.MmaTuning().tile_for(Few(), 4096, 512)).XC and not t.WC

    big = KMA.MmaTile(128, 128, 2, 2, 4)  # 55 KiB of workgroup memory
    assert big.shared_bytes() > 49152 and not big.fits(Dev())
    odd = KMA.MmaTile(32, 64, 2, 2, 2)  # one row matrix per subgroup: no gate / up halves
    assert odd.fits(Dev()) and not odd.fits(Dev(), pair=True)
    tiles = KMA.MmaTuning(tiles=(big, KMA.MmaTile(64, 128, 2, 2, 4), KMA.MmaTile(64, 64, 2, 2, 2)), min_groups=256,
                          wc=False, plain_tiles=None)
    assert tiles.tile_for(Dev(), 4096, 512).spec == "64,128,2,2,4,8"  # 256 workgroups
    assert tiles.tile_for(Dev(), 2048, 512).spec == "64,64,2,2,2,8"  # 64 x 128 gives 128 only
    assert tiles.tile_for(Dev(), 2048, 128) is None  # none fills the device: mmq's smaller tiles
    # a batched decode step's few rows take the tile padding them least, the first on a tie
    small = KMA.MmaTuning(tiles=(KMA.MmaTile(64, 128, 2, 2, 4), KMA.MmaTile(64, 64, 2, 2, 2), KMA.MmaTile(64, 32, 2, 2, 2)),
                          wc=False, plain_tiles=None)
    assert [small.tile_for(Dev(), 4096, T).BT for T in (512, 100, 64, 33, 32, 16)] == [128, 128, 64, 64, 32, 32]
    assert all(t.fits(Dev()) and t.fits(Dev(), pair=True) for t in KMA.TILES)
    # XC (a seventh field): the token tile copied by matrices, whole ones per subgroup
    xc = KMA.MmaTuning.from_env({"INFR_MMA_TILES": "64,128,2,2,4,8,1"}).tiles[0]
    assert xc.XC == 1 and xc.spec == "64,128,2,2,4,8,1" and xc.token_mats == 4 and xc.fits(Dev())
    # XC 2: the token rows copied by vec4 words, where no whole matrix per subgroup is left to copy too
    thin = KMA.MmaTile.parse("128,16,2,8,1,8,2")
    assert thin.XC == 2 and thin.fits(Dev()) and thin.token_mats == 0 and not replace(thin, XC=1).fits(Dev())
    assert not replace(thin, XC=3).fits(Dev()) and KMA.MmaTile.parse(thin.spec) == thin
    # WC 2 (WC_TILE's): the weight rows copied by vec4 words, no per-subgroup matrix count to divide
    assert KMA.WC_TILE.WC == 2 and KMA.MmaTile.parse(KMA.WC_TILE.spec) == KMA.WC_TILE and KMA.WC_TILE.fits(Dev())
    assert KMA.WC_TILE.XC == 2 and replace(KMA.WC_TILE, XC=1).fits(Dev())  # its tokens by vec4 words too
    assert replace(KMA.WC_TILE, WC=1).fits(Dev()) and not replace(KMA.WC_TILE, WC=4).fits(Dev())
    # WC 3 (DIRECT_TILE's): no f16 rows and no staged lanes, so 128 x 128 fits; taken first (INFR_MMA_DIRECT=0: not)
    # for the types with a direct conversion, from wc_min_t tokens, however large its (unwritten) f16 rows
    direct = KMA.MmaTuning.from_env({"INFR_MMA_VW": "0"})
    vws = KMA.MmaTuning.from_env({})  # by default DIRECT_TILE as a VW tile (INFR_MMA_VW=0: not)
    assert vws.vw and not direct.vw and vws.tile_for(Dev(), 4096, 512, qtype="q4_k") == replace(KMA.DIRECT_TILE, VW=1)
    assert KMA.DIRECT_TILE.WC == 3 and KMA.DIRECT_TILE.fits(Dev()) and KMA.DIRECT_TILE.shared_bytes() <= 49152
    assert [direct.tile_for(Dev(), 4096, 512, pair=True, qtype=q) for q in ("q4_k", "q6_k", "iq4_xs")] == [
        KMA.DIRECT_TILE, KMA.DIRECT_TILE, KMA.WC_TILE]  # a Q6_K pair on DIRECT_TILE (untimed on DIRECT_Q6_TILE)
    assert direct.tile_for(Dev(), 4096, 512, qtype="q6_k") == KMA.DIRECT_Q6_TILE
    # direct_tile: Q6_K's own shape; DIRECT_FEW_TILE where DIRECT_TILE gives under DIRECT_FEW_GROUPS workgroups (the
    # 8B's k or v alone at T = 512: 8 x 4), a pair's groups counted by its half tiles
    assert all(t.WC == 3 and t.fits(Dev(), pair=True) for t in (KMA.DIRECT_Q6_TILE, KMA.DIRECT_FEW_TILE))
    # VW 1: the epilogue's scratch over the tiles (8 KiB less for 8 subgroups), so 64 x 256 fits; PAD a multiple of 8
    vw = KMA.MmaTile.parse("64,256,2,2,4,8,2,3,1,1")
    assert vw.VW == 1 and KMA.MmaTile.parse(vw.spec) == vw and vw.fits(Dev()) and not replace(vw, VW=0).fits(Dev())
    assert replace(KMA.DIRECT_TILE, VW=1).shared_bytes() == KMA.DIRECT_TILE.shared_bytes() - 8192
    assert not replace(KMA.DIRECT_TILE, VW=1, PAD=4).fits(Dev()) and replace(KMA.DIRECT_TILE, PAD=4).fits(Dev())
    few, direct = direct, KMA.MmaTuning.from_env({"INFR_MMA_VW": "0", "INFR_MMA_DIRECT_FEW": "0"})
    assert few.direct_few and not direct.direct_few  # on by default (INFR_MMA_DIRECT_FEW=0: not)
    assert direct.tile_for(Dev(), 1024, 512, qtype="q4_k") == KMA.DIRECT_TILE
    assert [few.tile_for(Dev(), n, 512, qtype="q4_k") for n in (1024, 2048)] == [KMA.DIRECT_FEW_TILE, KMA.DIRECT_TILE]
    assert few.tile_for(Dev(), 1024, 512, qtype="q6_k") == KMA.DIRECT_Q6_TILE
    assert few.tile_for(Dev(), 1024, 512, pair=True, qtype="q8_0") == KMA.DIRECT_TILE  # 16 x 4
    assert KMA.direct_tile("q5_0", 1024, 256, few=True) == KMA.DIRECT_FEW_TILE
    assert KMA.direct_tile("q5_0", 1024, 256) == KMA.DIRECT_TILE
    assert KMA.direct_tile("q5_0", 1024, 256, few=True, vw=True) == KMA.DIRECT_FEW_TILE
    assert KMA.direct_tile("q5_0", 4096, 256, few=True, vw=True) == replace(KMA.DIRECT_TILE, VW=1)
    assert direct.tile_for(Dev(), 4096, 512, qtype="q4_k", w16_bytes=1 << 40) == KMA.DIRECT_TILE
    assert direct.tile_for(Dev(), 4096, 255, qtype="q4_k") == KMA.TILES[0]
    assert KMA.MmaTuning.from_env({"INFR_MMA_DIRECT": "0"}).tile_for(Dev(), 4096, 512, qtype="q4_k") == KMA.WC_TILE
    # WC 3 in a tile list for those types, no minimum (here without the expert lead tile)
    ex = replace(KMA.MmaTuning.from_env({"INFR_MMA_EXPERTS": "1", "INFR_MMA_TILES": "128,32,2,4,2,8,0,3 64,32,2,2,2"})
                 .for_experts(), lead=())
    assert [ex.tile_for(Dev(), 768, 32, pair=True, qtype=q).spec for q in ("q4_k", "iq4_xs")] == [
        "128,32,2,4,2,8,0,3", "64,32,2,2,2,8"]
    # by default (INFR_MMA_EXPERTS=1 alone) EXPERT_DIRECT_TILE first for those types, whatever it pads
    ex = KMA.MmaTuning.from_env({"INFR_MMA_EXPERTS": "1"}).for_experts()
    assert [ex.tile_for(Dev(), 768, 32, pair=True, qtype=q) for q in ("q4_k", "q6_k", "iq4_xs")] == [
        KMA.EXPERT_DIRECT_TILE, KMA.EXPERT_DIRECT_TILE, KMA.TILES[2]]
    tall = replace(KMA.WC_TILE, BN=256, BT=32, SGR=4, SGT=1)
    assert tall.shared_bytes() <= 49152 and not tall.fits(Dev())  # past the f16 rows' padding to 128
    on, off = KMA.MmaTuning(), KMA.MmaTuning.from_env({"INFR_MMA_WC": "0"})
    assert on.wc and not off.wc and on.tile_for(Dev(), 4096, 512) == KMA.WC_TILE
    assert off.tile_for(Dev(), 4096, 512) == KMA.TILES[0]
    assert on.tile_for(Dev(), 4096, 255) == KMA.TILES[0]  # below wc_min_t
    wc = KMA.MmaTuning.from_env({"INFR_MMA_TILES": "64,128,2,2,4,8,1,1 64,32,2,2,2,8,1", "INFR_MMA_WC_MIN_T": "200",
                                 "INFR_MMA_WC": "0"})
    assert [wc.tile_for(Dev(), 4096, T).spec for T in (512, 199)] == ["64,128,2,2,4,8,1,1", "64,32,2,2,2,8,1"]
    Dev.limits["max-storage-buffer-binding-size"] = 1 << 31  # f16 weight rows past wc_max_bytes: no WC
    assert wc.tile_for(Dev(), 4096, 512, w16_bytes=200 << 20).WC and not wc.tile_for(Dev(), 4096, 512, w16_bytes=300 << 20).WC
    # plain products (and the q|k|v split) may take tiles of their own: here KP groups at 32 rows
    own = KMA.MmaTuning.from_env({"INFR_MMA_PLAIN_TILES": "64,64,2,2,2 32,32,4,1,2,8,0,0,4"})
    assert own.plain_tiles == (KMA.TILES[1], KMA.PLAIN_KP_TILE) and KMA.MmaTuning().plain_tiles == KMA.PLAIN_TILES
    assert KMA.MmaTuning.from_env({"INFR_MMA_TILES": "64,32,2,2,2"}).plain_tiles is None  # the given tiles for all
    kp = own.tile_for(Dev(), 4096, 32)
    assert kp.spec == "32,32,4,1,2,8,0,0,4" and kp.KP == 4 and kp.invocations == 256 and kp.fits(Dev())
    assert own.tile_for(Dev(), 4096, 32, pair=True) == KMA.TILES[2] and own.tile_for(Dev(), 4096, 64).BT == 64
    # KP tiles only for a decode step's few rows (KP_MAX_T), not wherever they would pad least
    assert [KMA.MmaTuning().tile_for(Dev(), 4096, T).KP for T in (32, 64, 96, 160)] == [4, 1, 1, 1]
    # WC_TILE wherever it may run, though 64 x 32 would pad 480 tokens less
    picks = [KMA.MmaTuning().tile_for(Dev(), 4096, T, pair=p) for T in (480, 288) for p in (False, True)]
    assert picks == [KMA.WC_TILE] * 4
    late = KMA.MmaTuning.from_env({"INFR_MMA_WC": "0", "INFR_MMA_TILES": f"64,32,2,2,2 {KMA.WC_TILE.spec}"})
    assert late.tile_for(Dev(), 4096, 480) == KMA.WC_TILE  # wherever it stands in the list
    assert KMA.MmaTile.parse(kp.spec) == kp and not replace(kp, XC=1).fits(Dev()) and not replace(kp, KP=3).fits(Dev())
    # rows whose K its 128-value stages do not divide (SmolLM2's 576) take a tile of 64-value stages
    assert own.tile_for(Dev(), 4096, 32, K=576).spec == "64,64,2,2,2,8" and own.tile_for(Dev(), 4096, 32, K=640) == kp
    with pytest.raises(UnsupportedError):
        KMA.pipeline(None, "q4_k", replace(kp, XC=1))
    # grouped expert products never take a tile copying f16 rows, WC_TILE included, at any share of tokens
    experts = KMA.MmaTuning().for_experts()
    assert not any(experts.tile_for(Dev(), 4096, T, pair=p, qtype=q).WC in (1, 2) for T in (32, 256, 512, 4096)
                   for p in (False, True) for q in (None, "q4_k"))
    few = KMA.MmaTile(128, 16, 2, 8, 1)  # 4 token matrices a stage for 8 subgroups
    assert few.fits(Dev()) and not replace(few, XC=1).fits(Dev())


def test_batched_decode_keeps_the_gemv_for_plain_products():
    """Where the tensor cores are, a plain product of fewer than plain_min_t rows stays on the int8
    GEMV and a gate||up pair below pair_min_t (each measured on an H100); without them, or with
    INFR_MMA=0, mmq's own threshold alone."""
    from types import SimpleNamespace

    from infr.gpu import tuning

    config = {"component_type": "f16", "result_component_type": "f32", "m": 16, "n": 16, "k": 16,
              "min_subgroup_size": 32, "max_subgroup_size": 32}
    mma_dev = SimpleNamespace(dawn=True, has=lambda f: True, subgroup_matrix_configs=[config], is_cpu=False)
    plain_dev = SimpleNamespace(dawn=False, has=lambda f: False, subgroup_matrix_configs=[], is_cpu=False)
    w = SimpleNamespace(qtype=Q.Q4_K, shape=(4096, 4096))
    assert KMA.available(mma_dev) and not KMA.available(plain_dev)
    lo, hi = KMQ.MMQ_MIN_T, KMA.PLAIN_MIN_T
    use = lambda dev, T, pair=False: KMQ.use_mmq(T, dev, w, True, pair=pair)  # noqa: E731
    assert [use(mma_dev, T) for T in (lo - 1, lo, hi - 1, hi)] == [False, False, False, True]
    # rows whose K no KP tile's stages divide (SmolLM2's 576) keep the GEMV up to GEMV_MIN_T
    narrow = SimpleNamespace(qtype=Q.Q4_K, shape=(4096, 576))
    assert hi < KMA.GEMV_MIN_T and not KMQ.use_mmq(hi, mma_dev, narrow, True)
    assert KMQ.use_mmq(KMA.GEMV_MIN_T, mma_dev, narrow, True)
    pair = KMA.PAIR_MIN_T
    assert lo < pair < hi
    assert [use(mma_dev, T, pair=True) for T in (lo, pair - 1, pair, hi - 1)] == [False, False, True, True]
    assert [use(plain_dev, T) for T in (lo - 1, lo, hi - 1)] == [False, True, True]
    assert KMQ.use_mmq(lo, mma_dev)  # no tensor: the batch size alone (the grouped experts' test)
    with tuning.override(mma=KMA.MmaTuning(on=False)):
        assert use(mma_dev, lo)
    assert KMA.MmaTuning.from_env({"INFR_MMA_PLAIN_MIN_T": "64"}).plain_min_t == 64
    assert KMA.MmaTuning.from_env({"INFR_MMA_PAIR_MIN_T": "33"}).pair_min_t == 33
    assert KMA.MmaTuning.from_env({"INFR_MMA_TABLE_PAIR": "1"}).table_pair and not KMA.MmaTuning().table_pair
