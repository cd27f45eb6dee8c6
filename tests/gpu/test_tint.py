"""Every kernel the engine compiles also passes Tint, Dawn's WGSL compiler (the Dawn tier's).

Tint is stricter than naga: barriers only in uniform control flow (a `var<private>` copy of a
setting is not uniform to it), f32 literals in range. Dawn's Null backend runs Tint's front end
without a GPU, so the pipelines a tiny model asks for on the wgpu adapter (greedy and sampled
requests), and the mmq kernel of every type, are compiled again as Tint modules here. Pipeline
limits (workgroup memory, bindings) belong to the real adapter and are not checked."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from gguf import GGMLQuantizationType as Q

from infr import synth
from infr.engine import Model
from infr.errors import UnsupportedError
from infr.gguf_file import open_gguf
from infr.gpu.backend import GPUBackend
from infr.models import build_spec
from infr.numerics import INFR, LLAMACPP
from infr.plan import build_plan
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_deltanet as KDN
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_moe as KMoE
from infr.gpu import runtime as R
from infr.sampling import SamplingParams
from infr.scheduler import Request
from tests.gpu.conftest import gpu  # noqa: F401  the GPU fixture: skips without an adapter, fails under CI


@pytest.fixture(scope="module")
def tint():
    """A Dawn device on the Null backend: create_shader_module runs Tint. wgpudawn is in the test
    extra; without it the tests skip, except under CI, where they fail (as the gpu fixture does)."""
    if not os.environ.get("CI"):
        pytest.importorskip("wgpudawn", reason="wgpudawn (in the test extra) is not installed: the Tint checks need Dawn")
    from infr.gpu.device import api_module

    wgpudawn = api_module("dawn")  # with infr's instance toggles: the subgroup matrices are an unsafe API
    with pytest.MonkeyPatch.context() as mp:  # read when the adapter is requested
        mp.setenv("WGPU_BACKEND_TYPE", "Null")
        adapter = wgpudawn.gpu.request_adapter_sync()
    return adapter.request_device_sync(required_features=[f for f in ("subgroups", "shader-f16",
                                                                       "chromium-experimental-subgroup-matrix")
                                                          if f in adapter.features])


def _key(name, entry, consts) -> tuple:
    return name, entry, tuple(sorted(consts.items()))


class _Recorder(R.Kernels):
    """Kernels that only note what is asked for (mmq_pipeline needs nothing compiled)."""

    def __init__(self, dev, asked: set):
        super().__init__(dev)
        self.asked = asked

    def pipeline(self, name, entry="main", unchecked=False, **consts):
        self.asked.add(_key(name, entry, consts))


def _tint_errors(device, asked: set) -> str:
    """Tint's messages (each names the line and the rule) for the sources of `asked`."""
    errors = []
    for name, _, consts in sorted(asked, key=repr):
        code = R.dawn_source(R.load_source(name, dict(consts)))  # Tint's enables, which naga refuses
        try:
            device.create_shader_module(label=name, code=code)
        except Exception as e:
            errors.append(f"{name}: {e}")
    return "\n\n".join(errors)


def _record_pipelines(monkeypatch) -> set:
    """The (name, entry, consts) of every pipeline the engine asks for from now on (a set filled as it runs)."""
    asked: set = set()
    real = R.Kernels.pipeline

    def record(self, name, entry="main", unchecked=False, **consts):
        mode = {} if self.q8_rounding == INFR else {"Q8_ROUND": self.q8_rounding}  # what a Kernels.rounding view adds
        asked.add(_key(name, entry, {**mode, **consts}))
        return real(self, name, entry, unchecked, **consts)

    monkeypatch.setattr(R.Kernels, "pipeline", record)
    return asked


def test_engine_kernels_pass_tint(gpu, tint, monkeypatch, tmp_path):  # noqa: F811
    asked = _record_pipelines(monkeypatch)
    path = synth.write_gguf(synth.preset("tiny-llama", tokenizer="gpt2", weight_type="Q4_K_M"), tmp_path / "t.gguf")
    model = Model(path, n_ctx=128, backend="gpu", parallel=2)
    for sp in (SamplingParams(temperature=0.0),
               SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, seed=1)):
        reqs = [model.engine.submit(Request(list(range(1, n)), sp, max_new=3, ignore_eos=True)) for n in (40, 5)]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
    names = {k[0] for k in asked}
    assert {"gemv", "attention", "rmsnorm", "sample", "sample_topk", "argmax"} <= names, names
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def _run_tiny(tmp_path, preset: str, weight_type: str = "Q8_0") -> None:
    """A tiny model of the preset (Q8_0 by default) through the engine on the GPU: a 29-token and a
    4-token prompt batched, three greedy tokens each (prompt, decode and batched graphs)."""
    path = synth.write_gguf(synth.preset(preset, weight_type=weight_type), tmp_path / f"{preset}-{weight_type}.gguf")
    model = Model(path, n_ctx=64, backend="gpu", parallel=2)
    reqs = [model.engine.submit(Request(list(range(1, n)), SamplingParams(temperature=0.0), max_new=3,
                                        ignore_eos=True)) for n in (30, 5)]
    model.engine.run_until(lambda: all(r.done for r in reqs))
    assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]


def test_llama4_kernels_pass_tint(gpu, tint, monkeypatch, tmp_path):  # noqa: F811
    """A tiny llama4 (weightless q/k norm, query temperature, chunked attention, MoE) through the engine."""
    asked = _record_pipelines(monkeypatch)
    _run_tiny(tmp_path, "tiny-llama4")
    names = {k[0] for k in asked}
    assert {"query_temp", "rmsnorm", "attention", "attn_tiled", "moe_route"} <= names, names
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_llamacpp_rounding_kernels_pass_tint(gpu, tint, monkeypatch, tmp_path):  # noqa: F811
    """The kernels of a plan with llama.cpp's activation rounding (Plan.q8_rounding: the oracle
    tests'), a tiny Q8_0 llama4 prompt and decode step: quantize_q8, the f32 GEMM and the attention
    output rounding in their llamacpp form."""
    asked = _record_pipelines(monkeypatch)
    path = synth.write_gguf(synth.preset("tiny-llama4", weight_type="Q8_0"), tmp_path / "l4.gguf")
    gf = open_gguf(path)
    be = GPUBackend(gf, replace(build_plan(build_spec(gf)), q8_rounding=LLAMACPP), 128)
    be.forward(list(range(1, 70)), 0)
    be.forward([5], 69)
    rounding = {k[0] for k in asked if ("Q8_ROUND", LLAMACPP) in k[2]}
    assert {"quantize_q8", "gemm"} <= rounding, rounding
    sources = {R.load_source(n, dict(c)) for n, _, c in asked if n in ("quantize_q8", "gemm")}
    assert any("q8_inverse" in src for src in sources)  # the llamacpp snippets are in
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_qwen35_kernels_pass_tint(gpu, tint, monkeypatch, tmp_path):  # noqa: F811
    """A tiny qwen35 (the DeltaNet mixer, gated attention with partial rotary) through the engine."""
    asked = _record_pipelines(monkeypatch)
    _run_tiny(tmp_path, "tiny-qwen35")
    names = {k[0] for k in asked}
    assert {"deltanet_conv", "deltanet_qknorm", "deltanet_rule", "deltanet_norm", "gated_attn", "rope_kv"} <= names, names
    assert {k[1] for k in asked if k[0] == "gated_attn"} == {"head_slice", "sigmoid_mul"}
    for pre in ("true", "false"):  # the real shapes' rule (d_k 128: vec4 rows of S), which tiny models don't ask for
        asked.add(_key("deltanet_rule", "main", {"PRE": pre, **KDN.rule_layout(128)}))
    asked.add(_key("deltanet_chunk_index", "main", {}))  # the chunked rule: prompt batches of 32+ rows
    for dk in (12, 128):
        asked |= {_key(f"deltanet_chunk_{p}", "main", {"DK": dk}) for p in ("intra", "state")}
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_gemma4_kernels_pass_tint(gpu, tint, monkeypatch, tmp_path):  # noqa: F811
    """Tiny gemma4s (the table GELU, scaled values, per-layer inputs, KV-shared layers; the experts'
    scales, whose Q8_0 banks of 32-value rows the GPU refuses, so in F32) through the engine."""
    asked = _record_pipelines(monkeypatch)
    _run_tiny(tmp_path, "tiny-gemma4-e2b")
    _run_tiny(tmp_path, "tiny-gemma4-moe", "F32")
    entries = {k[1] for k in asked if k[0] == "gemma4"}
    assert entries == {"gated_gelu_f16", "mul", "add_scaled"}, entries  # the experts' scales: in moe_combine
    # the GEMV's gate||up pair with the table GELU: the e2b's dense FFNs, and (asked here: the tiny
    # models' experts are too narrow for the int8 expert GEMV) over expert banks
    assert any(k[0] == "gemv" and ("PAIR_ACT", "gelu_f16") in k[2] for k in asked)
    KM.gemv_pipeline(_Recorder(gpu, asked), ("q8_0", "q4_k"), pair_act="gelu_f16", expert=True)
    for scale in ("true", "false"):  # the fused post-norms (the tiny models' 64-wide rows take rmsnorm_add)
        for norm2 in ("true", "false"):
            _Recorder(gpu, asked).pipeline("rmsnorm_add_q8", SCALE=scale, NORM2=norm2)
    assert {k[0] for k in asked} >= {"moe_combine_norms", "rmsnorm_add", "rope_kv"}  # the block end in the combine
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_mmq_kernels_pass_tint(gpu, tint):  # noqa: F811
    asked: set = set()
    rec = _Recorder(gpu, asked)
    for q in KMQ.READERS:
        for tile in KMQ.TILES:
            KMQ.mmq_pipeline(rec, q, tile)
            KMQ.mmq_pipeline(rec, q, tile, pair_act="gelu")
            KMQ.mmq_pipeline(rec, q, tile, split=True)
    assert len(asked) == 3 * len(KMQ.READERS) * len(KMQ.TILES)
    errors = _tint_errors(tint, asked)
    assert not errors, errors


XC_TILES = (KMA.MmaTile(64, 128, 2, 2, 4, 8, 1), KMA.MmaTile(128, 128, 2, 2, 2, 0, 1), KMA.MmaTile(64, 32, 2, 2, 2, 8, 1),
            KMA.MmaTile(64, 128, 2, 2, 4, 8, 1, 1), KMA.MmaTile(128, 128, 2, 2, 2, 8, 1, 1), KMA.MmaTile(64, 64, 4, 2, 2, 0, 0, 1))
KP_TILES = (KMA.MmaTile(64, 32, 4, 2, 1, 8, 0, 0, 4), KMA.MmaTile(64, 32, 4, 2, 2, 8, 0, 0, 2), KMA.MmaTile(32, 32, 4, 1, 2, 8, 0, 0, 4), KMA.MmaTile(64, 16, 4, 2, 1, 8, 0, 0, 8))
WV_TILES = (KMA.MmaTile(64, 128, 2, 2, 4, 8, 0, 2), KMA.MmaTile(64, 64, 4, 2, 2, 0, 0, 2),  # WC 2 (and WC_TILE below)
            KMA.MmaTile(64, 128, 2, 2, 4, 8, 1, 2), KMA.MmaTile(64, 128, 2, 2, 4, 8, 2),  # XC 2, alone and with WC 2
            KMA.MmaTile(128, 128, 2, 2, 4, 8, 2, 2), KMA.MmaTile(64, 32, 4, 2, 2, 0, 2, 1))


def test_mma_kernels_pass_tint(gpu, tint):  # noqa: F811
    """The tensor-core kernel (Dawn only) of every reader, plain, gate||up (SiLU, and gemma4's table GELU
    at binding 11) and q|k|v, and plain and gate||up over expert tiles, on each default tile."""
    if "chromium-experimental-subgroup-matrix" not in tint.features:
        pytest.fail("Dawn's Null adapter lists no subgroup matrices: this wgpudawn cannot check the kernel")
    asked: set = set()
    rec = _Recorder(gpu, asked)
    for q in KMQ.READERS:
        for tile in KMA.TILES:
            KMA.pipeline(rec, KM.wgsl_name(q), tile)
            KMA.pipeline(rec, KM.wgsl_name(q), tile, pair_act="silu")
            KMA.pipeline(rec, KM.wgsl_name(q), tile, pair_act="gelu_f16")
            KMA.pipeline(rec, KM.wgsl_name(q), tile, split=True)
        for tile in KMA.without_copies(KMA.TILES):  # kernels_moe's grouped experts
            KMA.pipeline(rec, KM.wgsl_name(q), tile, expert=True)
            KMA.pipeline(rec, KM.wgsl_name(q), tile, pair_act="silu", expert=True)
    assert len(asked) == len(KMQ.READERS) * (4 * len(KMA.TILES) + 2 * len(KMA.without_copies(KMA.TILES)))
    for tile in XC_TILES + WV_TILES + (KMA.WC_TILE,):  # tiles copied from f16 rows (q8_f16.wgsl, mma_dequant.wgsl), plain, pair and q|k|v
        KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), tile)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q6_K), tile, pair_act="silu")
        KMA.pipeline(rec, KM.wgsl_name(Q.Q8_0), tile, split=True)
    for tile in (KMA.DIRECT_TILE, KMA.DIRECT_Q6_TILE, KMA.DIRECT_FEW_TILE,  # units turned into f16 directly (WC 3)
                 KMA.MmaTile(64, 128, 2, 2, 4, 8, 0, 3)):
        KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), tile)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q6_K), tile, pair_act="silu")
        KMA.pipeline(rec, KM.wgsl_name(Q.Q6_K), tile, split=True)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), tile, pair_act="gelu_f16")
    KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), KMA.MmaTile(128, 32, 2, 4, 2, 8, 0, 3), pair_act="silu", expert=True)
    KMA.pipeline(rec, KM.wgsl_name(Q.Q6_K), KMA.EXPERT_DIRECT_TILE, expert=True)
    for q in (Q.Q8_0, Q.Q5_0):
        KMA.pipeline(rec, KM.wgsl_name(q), KMA.DIRECT_TILE, pair_act="silu")
        KMA.pipeline(rec, KM.wgsl_name(q), KMA.EXPERT_DIRECT_TILE, expert=True)
    # VW 1: the tiles and the epilogue's scratch as views of one workgroup buffer, every copy form and the tiles
    # it lets fit (64 x 256, 128 x 192)
    for tile in (KMA.DIRECT_TILE, KMA.WC_TILE, KMA.TILES[0], XC_TILES[0], KP_TILES[2], KMA.MmaTile(64, 64, 2, 2, 2, 8, 1, 1),
                 KMA.MmaTile(64, 256, 2, 2, 4, 8, 2, 3), KMA.MmaTile(128, 192, 2, 2, 4, 8, 2, 3)):
        tile = replace(tile, VW=1)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), tile)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q6_K), tile, pair_act="silu")
        KMA.pipeline(rec, KM.wgsl_name(Q.Q8_0), tile, split=True)
        if not (tile.XC or tile.WC in (1, 2)):
            KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), tile, pair_act="silu", expert=True)
        if tile.WC == 3:
            KMA.pipeline(rec, KM.wgsl_name(Q.Q5_0), tile, pair_act="gelu_f16")
        else:
            KMA.pipeline(rec, KM.wgsl_name(Q.IQ4_XS), tile, pair_act="gelu_f16")
    with pytest.raises(UnsupportedError, match="PAD a multiple of 8"):  # VW's wide stores need rows of whole words
        KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), replace(KMA.DIRECT_TILE, VW=1, PAD=4))
    for tile in KP_TILES:  # stages split among groups of subgroups (batched decode steps)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q4_K), tile)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q6_K), tile, pair_act="silu")
        KMA.pipeline(rec, KM.wgsl_name(Q.IQ4_XS), tile, split=True)
        KMA.pipeline(rec, KM.wgsl_name(Q.Q8_0), tile, pair_act="gelu_f16", expert=True)
    rec.pipeline("q8_f16")
    for q in KMQ.READERS:  # the dequantizing pass of every reader, plain and pair
        for pair in (False, True):
            KMQ.dequant_pipeline(rec, q, pair)
            if KM.wgsl_name(q) in KMA.DIRECT_TYPES:
                KMQ.dequant_pipeline(rec, q, pair, direct=True)
    errors = _tint_errors(tint, asked)
    assert not errors, errors


MIXED_STACKS = ((Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q5_K, Q.Q5_K, Q.Q6_K), (Q.IQ4_XS, Q.IQ4_XS, Q.Q6_K), (Q.Q4_0, Q.Q8_0))


def test_mma_mixed_stack_kernels_pass_tint(gpu, tint):  # noqa: F811
    """A mixed q|k|v stack's one product on WC_TILE (kernels_mmq.mixed_tile): the dispatches the engine
    builds (the token pass, each matrix's dequant pass, the split kernel compiled for the first type,
    which copies f16 weight rows and never runs its reader) compile in Tint."""
    from types import SimpleNamespace

    if "chromium-experimental-subgroup-matrix" not in tint.features:
        pytest.fail("Dawn's Null adapter lists no subgroup matrices: this wgpudawn cannot check the kernel")
    asked: set = set()

    class Rec(_Recorder):  # binds nothing either: the pipelines are not compiled here
        def bind(self, pipeline, res):
            return list(res)

    rec = Rec(gpu, asked)
    K, T = 512, 300
    for types in MIXED_STACKS:
        ts = [SimpleNamespace(qtype=q, shape=(n, K)) for q, n in zip(types, (256, 128, 128))]
        raw = R.storage(gpu, 4096 * K)
        outs = [R.storage(gpu, 4 * T * n) for n in (256, 128, 128)[:len(ts)]]
        ds = KMQ.stacked_dispatches(rec, ts, [(raw, 0, 512)], R.storage(gpu, 4 * T * K), outs, None, T,
                                    tile=KMA.WC_TILE)
        assert len(ds) == 2 + len(ts) and ds[-1].label.startswith(f"mmq_{KM.wgsl_name(types[0])}+")
    kernels = {(k[0], dict(k[2]).get("QTYPE"), dict(k[2]).get("SPLIT_DECL", "")) for k in asked}
    firsts = {KM.wgsl_name(t[0]) for t in MIXED_STACKS}
    assert {q for n, q, _ in kernels if n == "gemm_mma"} == firsts  # compiled for each stack's first type
    assert all(split for n, _, split in kernels if n == "gemm_mma")
    assert {q for n, q, _ in kernels if n == "mma_dequant"} == {KM.wgsl_name(q) for t in MIXED_STACKS for q in t}
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_moe_kernels_pass_tint(gpu, tint):  # noqa: F811
    """The MoE kernels: the router, the grouping of prompt batches, the rows around the experts, the
    shared expert's gate, the combine with the next norm (moe_combine_q8), the expert-indexed GEMV (plain and
    gate||up) and f32 matmul of every type, and the grouped int8 GEMM (plain and gate||up) of every reader on each default tile, and its
    gate||up with the table GELU (gemma4) on the first."""
    asked: set = set()
    rec = _Recorder(gpu, asked)
    for name, entry in (("moe_route", "main"), ("moe_combine", "combine"), ("moe_combine", "scale_rows"),
                        ("moe_combine_q8", "main"), ("moe_gate", "main"), ("moe_group", "main")):
        rec.pipeline(name, entry)
    for q in KM.GPU_TYPES:
        if q in KM.GEMV_FAMILY:
            KM.gemv_pipeline(rec, q, expert=True)
            KM.gemv_pipeline(rec, (q, q), pair_act="silu", expert=True)
        else:
            KMoE.f32_pipeline(rec, q)
    for q in KMQ.READERS:
        for tile in KMQ.TILES:
            KMQ.mmq_pipeline(rec, q, tile, expert=True)
            KMQ.mmq_pipeline(rec, q, tile, pair_act="silu", expert=True)
        KMQ.mmq_pipeline(rec, q, KMQ.TILES[0], pair_act="gelu_f16", expert=True)  # gemma4's pair: table at 11
    assert len(asked) == (6 + 2 * len(KM.GEMV_FAMILY) + len(KM.GPU_TYPES - set(KM.GEMV_FAMILY))
                          + 2 * len(KMQ.READERS) * len(KMQ.TILES) + len(KMQ.READERS))
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_tiled_attention_kernels_pass_tint(gpu, tint):  # noqa: F811
    """Both tiled prefill kernels on the real models' head shapes and others, attn_tiled2 on the
    tilings it picks (64 slots of 4 up to head dim 128, 16 slots of 2 past it or for short batches;
    1 to 8 heads a workgroup) and some perf/attn_prefill_time.py --sweep times; both at head dim 512
    (attn_tiled's 8-row blocks, attn_tiled2's 8 and 16 slots)."""
    asked: set = set()
    rec = _Recorder(gpu, asked)
    shapes = [(2, 2, 64, 64), (8, 2, 64, 64), (32, 8, 128, 128), (32, 4, 128, 128), (64, 4, 128, 128),
              (12, 2, 128, 128), (16, 8, 256, 256), (8, 1, 256, 256), (4, 2, 96, 64), (8, 4, 256, 128)]
    for shape in shapes:
        KA.tiled_pipeline(rec, *shape, 32, 1)
        for tiling in (None, KA.TILED2_SMALL, (32, 4, 4), (64, 8, 2), (64, 4, 4)):  # the defaults, --sweep's
            KA.tiled_pipeline(rec, *shape, 32, 2, tiling)
    KA.tiled_pipeline(rec, 8, 2, 64, 64, 16, 2)
    for shape in [(8, 1, 512, 512), (16, 2, 512, 512)]:  # Gemma 4's full layers: attn_tiled's 8-row blocks,
        KA.tiled_pipeline(rec, *shape, 32, 1)          # attn_tiled2's 8 and 16 slots (default_tiling past 256)
        for tiling in ((8, 2, 2), KA.TILED2_SMALL):
            KA.tiled_pipeline(rec, *shape, 32, 2, tiling)
    assert {k[0] for k in asked} == {"attn_tiled", "attn_tiled2"}
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_mma_attention_kernel_passes_tint(gpu, tint):  # noqa: F811
    """attn_mma (the tensor cores' prefill attention, Dawn only) on the real models' head shapes and
    others of whole 16-value matrices, at its default tiling and the others INFR_ATTN_MMA may pick."""
    if "chromium-experimental-subgroup-matrix" not in tint.features:
        pytest.fail("Dawn's Null adapter lists no subgroup matrices: this wgpudawn cannot check the kernel")
    asked: set = set()
    rec = _Recorder(gpu, asked)
    for shape in [(32, 8, 64, 64), (32, 8, 128, 128), (16, 2, 128, 128), (12, 2, 128, 128), (8, 1, 256, 256),
                  (8, 4, 256, 128), (4, 2, 96, 64)]:
        for tiling in (None, (32, 32), (128, 32), (64, 64)):
            KA.tiled_pipeline(rec, *shape, 16, 3, tiling)
    assert {k[0] for k in asked} == {"attn_mma"}
    errors = _tint_errors(tint, asked)
    assert not errors, errors
