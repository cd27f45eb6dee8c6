"""llama4's attention options on the GPU against the CPU reference: the weightless q/k norm, the
query temperature (per-position factors read through `rows`) and chunked attention (keys before
floor(pos / chunk) * chunk masked) in every attention path: one-pass and split-K decode, tiled
prefill. End to end: the tiny llama4 model, its chunk and temperature floor cut so a short prompt
crosses them, gives the CPU reference's logits and greedy tokens.

As tests/gpu/test_attention_kernels.py, cache rows past the current length hold NaN, and so do
the rows before the chunk of every query, so a kernel that reads a masked key fails loudly.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest

from infr import synth
from infr.cpu import ops as F
from infr.cpu.backend import CPUBackend
from infr.cpu.kinds import compile_op
from infr.gguf_file import open_gguf
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_misc as M
from infr.gpu.backend import GPUBackend
from infr.gpu.runtime import read, run, storage
from infr.models import build_spec
from infr.models.llama4 import TEMPERATURE
from infr.models.spec import QueryTemperature
from infr.ops import QueryTemp, RMSNorm
from infr.plan import build_plan
from tests.closeness import assert_follows_greedy, assert_logits_close
from tests.engine_runs import greedy_outputs

from test_attention_kernels import _buf, _caches, _check  # tests/gpu is on sys.path (pytest's prepend import mode)


# --- weightless RMSNorm and the query temperature

@pytest.mark.parametrize("group,heads,T", [(24, 5, 7), (16, 3, 1), (72, 1, 3)])
def test_weightless_rms_norm(gpu, kernels, group, heads, T):
    rng = np.random.default_rng(group + T)
    x = (rng.standard_normal((T, heads * group)) * 3).astype(np.float32)
    y = storage(gpu, x.nbytes)
    run(gpu, [M.rmsnorm_dispatch(kernels, _buf(gpu, x), M.ones(kernels, group), y, heads * group, group, 1e-5, T)])
    env = {"q": x}
    compile_op(None, RMSNorm("q", "q", None, 1e-5, group=group))(env, None, None)
    got = read(gpu, y, count=x.size).reshape(x.shape)
    np.testing.assert_allclose(got, env["q"], rtol=2e-6, atol=1e-7)
    assert not np.allclose(got, x, atol=0.1)  # it did normalise


@pytest.mark.parametrize("temp,positions", [
    (QueryTemperature(floor_scale=8, scale=0.1), [0, 6, 7, 8, 15, 16, 100, 3, 63]),  # tau steps every 8 positions
    (TEMPERATURE, [0, 8190, 8191, 20000, 16382, 16383]),  # llama4's own: 1 below 8191
])
def test_query_temperature(gpu, kernels, temp, positions):
    T, width = len(positions), 3 * 24  # not a multiple of the workgroup
    rng = np.random.default_rng(T)
    q = rng.standard_normal((T, width)).astype(np.float32)
    n_pos = max(positions) + 1
    qb, pg = _buf(gpu, q), M.single_sequence(gpu, 0, T, n_pos)
    M.write_rows(gpu, pg, np.array(positions), 0)
    run(gpu, [M.query_temp_dispatch(kernels, qb, M.query_temp_table(kernels, temp, n_pos), pg.rows, width, n_pos, T)])
    env = {"q": q}
    compile_op(None, QueryTemp("q", temp))(env, None, SimpleNamespace(pos=np.array(positions)))
    got = read(gpu, qb, count=q.size).reshape(q.shape)
    np.testing.assert_array_equal(got, env["q"])  # the same float32 factors, one product each
    assert (np.abs(got - q).max(axis=1) > 0).sum() >= 3  # some rows really scaled


def test_bad_query_temperature_and_chunk_are_refused(gpu, kernels):
    tau = M.query_temp_table(kernels, TEMPERATURE, 16)
    with pytest.raises(ValueError, match="cannot hold 17 positions"):
        M.query_temp_dispatch(kernels, storage(gpu, 64), tau, storage(gpu, 64), 4, 17, 1)
    with pytest.raises(ValueError, match="chunk must be positive"):
        M.pack_attention(2, 2, 8, 8, 1.0, None, None, chunk=-4)


# --- chunked attention, kernel by kernel

def _poison(gpu, kcb, vcb, kc, vc, lo: int, n_kv: int):
    """Cache rows outside [lo, n_kv) become NaN on the GPU: the keys no query may read."""
    k2, v2 = kc.copy(), vc.copy()
    for a in (k2, v2):
        a[:lo] = np.nan
        a[n_kv:] = np.nan
    gpu.device.queue.write_buffer(kcb, 0, k2.view(np.uint32))
    gpu.device.queue.write_buffer(vcb, 0, v2.view(np.uint32))


def _first_key(positions, chunk: int, window: int | None) -> int:
    lo = min(p // chunk * chunk for p in positions)
    return max(lo, min(positions) + 1 - window) if window else lo


# name: (path, n_heads, kv_heads, head_dim, v_head_dim, T, chunk, window)
DECODE = {
    "one_pass_gqa4_d64": ("one_pass", 8, 2, 64, 64, 1, 40, None),
    "one_pass_T3_d24": ("one_pass", 4, 4, 24, 16, 3, 40, None),
    "split_gqa4_d64": ("split", 8, 2, 64, 64, 1, 200, None),  # the chunk starts inside a split-K chunk
    "split_T3_gqa2_d96_window": ("split", 4, 2, 96, 64, 3, 200, 150),
}


@pytest.mark.parametrize("case", list(DECODE))
def test_chunked_decode(gpu, kernels, case):
    path, n_heads, kv_heads, hd, vd, T, chunk, window = DECODE[case]
    n_ctx = 5 * 128 + 7
    rng = np.random.default_rng(len(case))
    kc, vc = _caches(rng, n_ctx, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    qb, out, pg = _buf(gpu, q), storage(gpu, T * n_heads * vd * 4), M.single_sequence(gpu, 0, T, n_ctx)
    scale = 1.0 / np.sqrt(hd)
    args = (n_heads, kv_heads, hd, vd, scale, window, None, T)
    if path == "one_pass":
        ds = [M.attention_dispatch(kernels, qb, kcb, vcb, out, pg, *args, chunk=chunk)]
    else:
        scratch = KA.split_scratch(kernels, T, n_ctx, n_heads, vd, chunk=128)
        ds = KA.split_dispatches(kernels, qb, kcb, vcb, out, pg, scratch, *args, chunk=chunk)
    # the last query's keys: inside the first chunk, at its end, just past it (T = 3: rows on both sides), far on
    for n_kv in sorted({T, chunk - 1, chunk, chunk + 1, chunk + 2, 2 * chunk + 5, n_ctx}):
        positions = np.arange(n_kv - T, n_kv)
        _poison(gpu, kcb, vcb, kc, vc, _first_key(positions, chunk, window), n_kv)
        M.write_rows(gpu, pg, positions, 0)
        gpu.device.queue.write_buffer(out, 0, np.full(T * n_heads * vd, np.nan, np.float32))
        run(gpu, ds)
        got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
        want = F.attention(q, kc, vc, positions, n_kv, n_heads, scale, window, None, chunk=chunk)
        _check(f"{case} n_kv={n_kv}", got, want, vc, n_kv)
        if n_kv > chunk + 1:  # the mask matters here: without it the answer is another
            unmasked = F.attention(q, kc, vc, positions, n_kv, n_heads, scale, window, None)
            assert np.abs(unmasked - want).max() > 1e-2


# name: (n_heads, kv_heads, head_dim, v_head_dim, start, T, chunk, window)
TILED = {
    "gqa4_d64_T37_chunk16": (8, 2, 64, 64, 5, 37, 16, None),  # several boundaries inside one block of rows
    "mha_d32_T20_chunk20_late": (2, 2, 32, 32, 50, 20, 20, None),
    "gqa2_dk96_dv64_T33_chunk24_window7": (4, 2, 96, 64, 9, 33, 24, 7),
}


@pytest.mark.parametrize("case", list(TILED))
def test_chunked_tiled_prefill(gpu, kernels, case):
    n_heads, kv_heads, hd, vd, start, T, chunk, window = TILED[case]
    n_kv = start + T
    n_ctx = n_kv + 20
    rng = np.random.default_rng(len(case))
    kc, vc = _caches(rng, n_ctx, kv_heads, hd, vd)
    kcb, vcb = _buf(gpu, kc.view(np.uint32)), _buf(gpu, vc.view(np.uint32))
    positions = np.arange(start, n_kv)
    # The kernel's K/V tiles start at multiples of 16 keys (a masked key there gets p = 0, times its
    # finite V): NaN from the tile before the first key's on.
    _poison(gpu, kcb, vcb, kc, vc, _first_key(positions, chunk, window) // 16 * 16, n_kv)
    q = (rng.standard_normal((T, n_heads * hd)) * 2.5).astype(np.float32)
    out = storage(gpu, T * n_heads * vd * 4)
    scale = 1.0 / np.sqrt(hd)
    d = KA.tiled_dispatch(kernels, _buf(gpu, q), kcb, vcb, out, M.single_sequence(gpu, start, T, n_ctx), n_heads,
                          kv_heads, hd, vd, scale, window, None, T, chunk=chunk)
    run(gpu, [d])
    got = read(gpu, out, count=T * n_heads * vd).reshape(T, n_heads * vd)
    want = F.attention(q, kc, vc, positions, n_kv, n_heads, scale, window, None, chunk=chunk)
    _check(f"tiled {case}", got, want, vc, n_kv)


# --- end to end

def _small_chunks(spec, chunk: int = 8, floor: int = 8):
    """llama4's spec with its 8192-token chunk and temperature floor cut, so a short prompt crosses them."""
    def one(a):
        return replace(a, chunk=chunk if a.chunk else None,
                       temperature=replace(a.temperature, floor_scale=floor) if a.temperature else None)
    return replace(spec, layers=tuple(replace(la, attention=one(la.attention)) for la in spec.layers))


@pytest.fixture(scope="module")
def llama4_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("l4")
    return {w: synth.write_gguf(synth.preset("tiny-llama4", weight_type=w), d / f"l4-{w}.gguf") for w in ("F32", "Q8_0")}


@pytest.mark.parametrize("weights,path", [("F32", "one_pass"), ("F32", "split"), ("Q8_0", "one_pass")])
def test_tiny_llama4_follows_the_cpu_reference(gpu, llama4_files, tune, weights, path):
    if path == "split":  # decode past 16 keys takes split-K
        tune(INFR_ATTN_SPLIT_FROM="16", INFR_ATTN_ONE_PASS_CTX="0")
    gf = open_gguf(llama4_files[weights])
    spec = _small_chunks(build_spec(gf))
    plan = build_plan(spec)
    kinds = [(la.attention.chunk, la.attention.temperature is not None, la.attention.qk_rms_after_rope)
             for la in spec.layers]
    assert kinds == [(8, False, True)] * 3 + [(None, True, False)]  # chunked with q/k norm; NoPE with temperature
    g, c = GPUBackend(gf, plan, 64), CPUBackend(gf, plan, 64)
    body = [d.label for d in g._graph(1, 1, path == "split")[0].dispatches]
    assert "query_temp" in body and body.count("rmsnorm") >= 6
    assert any(lb.startswith("attn_scores") for lb in body) == (path == "split")
    prompt = np.random.default_rng(0).integers(0, 512, 30).tolist()  # tiled prefill over four chunks
    q8 = weights != "F32"
    want = c.forward(prompt, 0, n_logits=30)
    assert_logits_close(g.forward(prompt, 0, n_logits=30), want, q8)
    no_chunks = CPUBackend(gf, build_plan(_small_chunks(spec, chunk=None)), 64).forward(prompt, 0, n_logits=30)
    assert np.abs(no_chunks - want)[-10:].max() > 0.2  # the chunks change these logits: the mask is tested
    # greedy decode from position 10 to 40: one-token steps crossing chunk and temperature boundaries
    first = int(np.argmax(g.forward(prompt[:10], 0)[-1]))
    got = [first] + g.decode_greedy(first, 10, 30)
    assert_follows_greedy(c, prompt[:10], got)
    assert len(set(got)) > 2


def test_tiny_llama4_batched_equals_alone_and_the_cpu_reference(gpu, llama4_files, monkeypatch):
    """Through the engine, the family's chunk and temperature floor cut to 8 (the spec reads them
    when the model loads): sequences of several lengths share steps, paged, each crossing chunk
    boundaries, and give the tokens each gives alone and the CPU reference gives."""
    from infr.engine import Model
    from infr.models import llama4

    monkeypatch.setattr(llama4, "CHUNK", 8)
    monkeypatch.setattr(llama4, "TEMPERATURE", replace(llama4.TEMPERATURE, floor_scale=8))
    prompts = [list(range(1, 10)), list(range(5, 45)), [1, 2, 3], list(range(100, 130))]

    go = partial(greedy_outputs, max_new=12)

    on_gpu = Model(llama4_files["F32"], n_ctx=64, backend="gpu", parallel=len(prompts))
    assert {la.attention.chunk for la in on_gpu.spec.layers} == {8, None}
    together = go(on_gpu, prompts)
    assert on_gpu.engine.stats.max_rows >= len(prompts)
    alone = [go(on_gpu, [p], cache_prompt=False)[0] for p in prompts]
    on_cpu = Model(llama4_files["F32"], n_ctx=64, backend="cpu", parallel=len(prompts))
    assert together == alone == go(on_cpu, prompts)
