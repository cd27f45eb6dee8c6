"""gemma4 on the CPU reference: the family's metadata and its errors, the plan's per-layer shapes,
KV-shared layers with no cache of their own, the per-layer embedding table read by row, and the tiny
synthetic models through the engine (the numbers against llama.cpp: tests/test_gemma4_exact.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.errors import GGUFError, InfrError
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.models.spec import Activation, FFNSpec, ParallelFFN
from infr.ops import Attention, MatMul, MoE, Mul, PerLayerInputs, RMSNorm, StoreKV
from infr.plan import build_plan


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("g4")
    made: dict[str, object] = {}

    def get(name: str, weight_type: str = "F32"):
        key = f"{name}-{weight_type}"
        if key not in made:
            made[key] = synth.write_gguf(replace(synth.PRESETS[name], weight_type=weight_type), root / f"{key}.gguf")
        return made[key]

    return get


# ---------------------------------------------------------------- spec and plan


def test_dense_spec_and_plan(paths):
    spec = build_spec(open_gguf(paths("tiny-gemma4")))
    swa = [la.attention.sliding_window for la in spec.layers]
    assert swa == [8, 8, None, 8, 8, None]
    s, f = spec.layers[0].attention, spec.layers[2].attention
    assert (s.n_kv_heads, s.head_dim, s.rope.theta, s.rope.n_rot, s.rope.freq_factors) == (2, 16, 10000.0, 16, None)
    assert (f.n_kv_heads, f.head_dim, f.rope.theta, f.rope.n_rot, f.rope.freq_factors) == (
        1, 32, 1e6, 32, "rope_freqs.weight")
    assert s.scale == f.scale == 1.0 and s.v_norm and not s.v_from_k and f.v_from_k
    assert spec.final_logit_softcap == 30.0 and spec.per_layer_input == 0
    assert all(la.output_scale and la.kv_from is None for la in spec.layers)
    assert spec.layers[0].ffn == FFNSpec(96, Activation.GELU_F16)
    plan = build_plan(spec)
    assert [st.layer for st in plan.kv] == list(range(6))
    assert plan.kv_bytes_per_token() == 4 * 2 * 2 * 16 * 2 + 2 * 2 * 1 * 32 * 2
    w = plan.weights()
    assert "blk.2.attn_v.weight" not in w and "blk.0.attn_v.weight" in w  # full layers: V from the raw K
    v_norms = [op for op in plan.layers if isinstance(op, RMSNorm) and op.dst == "v"]
    assert all(op.weight is None and op.group == op_d for op, op_d in zip(v_norms, (16, 16, 32, 16, 16, 32)))
    assert [op.src for op in v_norms] == ["v", "v", "k", "v", "v", "k"]  # the raw K projection where no attn_v
    assert plan.cpu_only == ()  # the GPU runs it too (tests/gpu/test_gemma4_gpu.py)


def test_e2b_kv_shared_layers_keep_no_cache_and_read_their_source(paths):
    gf = open_gguf(paths("tiny-gemma4-e2b"))
    spec = build_spec(gf)
    # shared_kv_layers 3: own caches on 0..2; SWA layers 3, 4 read layer 1, the full layer 5 reads 2
    assert [la.kv_from for la in spec.layers] == [None, None, None, 1, 1, 2]
    assert [la.ffn.hidden for la in spec.layers] == [96, 96, 96, 192, 192, 192]  # double-wide when shared
    assert spec.per_layer_input == 32
    plan = build_plan(spec)
    assert [st.layer for st in plan.kv] == [0, 1, 2]
    assert plan.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2 + 2 * 1 * 32 * 2
    stores = [op.layer for op in plan.layers if isinstance(op, StoreKV)]
    reads = [op.layer for op in plan.layers if isinstance(op, Attention)]
    assert stores == [0, 1, 2] and reads == [0, 1, 2, 1, 1, 2]
    assert not any(w.startswith(("blk.3.attn_k", "blk.4.attn_v", "blk.5.attn_k")) for w in plan.weights())
    assert isinstance(plan.embed[-1], PerLayerInputs)
    assert plan.cpu_only == ()
    be = CPUBackend(gf, plan, 64)
    assert sorted(be.k_cache) == [0, 1, 2]  # no cache at all for layers 3..5


def test_moe_spec_and_plan(paths):
    spec = build_spec(open_gguf(paths("tiny-gemma4-moe")))
    ffn = spec.layers[0].ffn
    assert isinstance(ffn, ParallelFFN) and ffn.expert_scales and ffn.dense == FFNSpec(64, Activation.GELU_F16)
    m = ffn.moe
    assert (m.n_expert, m.n_used, m.hidden, m.fused_gate_up, m.norm_weights) == (8, 2, 32, True, True)
    plan = build_plan(spec)
    layer0 = plan.layers[: next(i for i, op in enumerate(plan.layers) if isinstance(op, Attention) and op.layer == 1)]
    router = next(op for op in layer0 if isinstance(op, MatMul) and op.dst == "router")
    moe = next(op for op in layer0 if isinstance(op, MoE))
    assert router.src == "r" and moe.src == "h" and moe.scales == "blk.0.ffn_down_exps.scale"
    # the router's input: the raw residual, weightless-normed, times 1/sqrt(n_embd) and ffn_gate_inp.scale
    i = layer0.index(router)
    assert layer0[i - 2] == RMSNorm("r", "x", None, spec.norm_eps)
    assert isinstance(layer0[i - 1], Mul) and layer0[i - 1].weight == "blk.0.ffn_gate_inp.scale"
    assert layer0[i - 1].scale == pytest.approx(1 / 8)


def test_per_layer_table_is_read_by_row_not_loaded(paths):
    gf = open_gguf(paths("tiny-gemma4-e2b", "Q8_0"))
    be = CPUBackend(gf, build_plan(build_spec(gf)), 64)
    assert gf.tensor("per_layer_token_embd.weight").type_name == "Q8_0"
    assert "per_layer_token_embd.weight" not in be.w._cache  # gathered from its blocks per step
    assert np.isfinite(be.forward([5, 9, 300], 0)).all()


# ---------------------------------------------------------------- malformed files


def _set(key, value):
    return lambda m: m.__setitem__(key, value)


@pytest.mark.parametrize("change,message", [
    (lambda m: m.pop("gemma4.attention.sliding_window_pattern"), "sliding_window_pattern"),
    (_set("gemma4.attention.sliding_window_pattern", [True, False]), "one bool per layer"),
    (lambda m: m.pop("gemma4.attention.key_length_swa"), "key_length_swa"),
    (_set("gemma4.attention.value_length_swa", 8), "value_length == key_length"),
    (lambda m: m.pop("gemma4.embedding_length_per_layer_input"), "embedding_length_per_layer_input"),
    (_set("gemma4.attention.shared_kv_layers", 6), r"shared_kv_layers 6 is not in 0..5"),
    (_set("gemma4.attention.shared_kv_layers", 2), "not of its kind"),  # layer 4 (SWA) would read 2 (full)
    (_set("gemma4.attention.head_count_kv", [2, 2, 1]), "3 values for 6 layers"),
    (_set("gemma4.rope.dimension_count_swa", 7), "must be even"),
    (_set("gemma4.rope.dimension_count_swa", 32), r"in 1..16"),
    (_set("gemma4.attention.head_count", 3), "not a multiple"),
    (_set("gemma4.feed_forward_length", [96] * 5), "5 values for 6 layers"),
])
def test_malformed_metadata_is_a_clear_error(paths, change, message):
    gf = open_gguf(paths("tiny-gemma4-e2b"))
    change(gf.metadata)
    with pytest.raises(GGUFError, match=message):
        build_spec(gf)


def test_missing_rope_freqs_is_a_clear_error(paths):
    gf = open_gguf(paths("tiny-gemma4"))
    del gf.tensors["rope_freqs.weight"]
    with pytest.raises(GGUFError, match="rope_freqs"):
        build_spec(gf)


def test_wrong_per_layer_width_is_refused_at_load(paths):
    gf = open_gguf(paths("tiny-gemma4-e2b"))
    gf.metadata["gemma4.embedding_length_per_layer_input"] = 16  # the file's tables are 32 wide
    with pytest.raises(InfrError, match="per_layer_model_proj"):
        CPUBackend(gf, build_plan(build_spec(gf)), 32)


# ---------------------------------------------------------------- end to end


@pytest.mark.parametrize("name", ["tiny-gemma4-e2b", "tiny-gemma4-moe"])
def test_prompt_in_chunks_gives_one_passes_logits(paths, name):
    """Chunks of a prompt past the window: shared layers read what their source stored in earlier steps."""
    gf = open_gguf(paths(name))
    plan = build_plan(build_spec(gf))
    ids = np.random.default_rng(6).integers(2, 512, 23).tolist()
    one = CPUBackend(gf, plan, 64).forward(ids, 0, n_logits=23)
    be = CPUBackend(gf, plan, 64)
    parts = [be.forward(ids[a:b], a, n_logits=b - a) for a, b in ((0, 5), (5, 17), (17, 23))]
    np.testing.assert_array_equal(np.vstack(parts), one)
    assert np.isfinite(one).all() and one.std() > 0.01


@pytest.mark.parametrize("name", ["tiny-gemma4-e2b", "tiny-gemma4-moe"])
def test_batched_equals_alone_through_the_engine(paths, name):
    """Five greedy requests of different lengths (past the window) share the engine's steps and give
    exactly the tokens each gives alone."""
    from infr.engine import Model
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    rng = np.random.default_rng(4)
    prompts = [rng.integers(2, 512, n).tolist() for n in (3, 9, 17, 40, 70)]
    model = Model(paths(name), n_ctx=100, backend="cpu", parallel=5, kv_tokens=5 * 100)
    greedy = SamplingParams(temperature=0.0)

    def run(ps, **kw):
        reqs = [model.engine.submit(Request(list(p), greedy, max_new=8, **kw)) for p in ps]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.finish_reason != "error" for r in reqs), [r.error for r in reqs]
        return [r.output for r in reqs]

    alone = [run([p], cache_prompt=False)[0] for p in prompts]
    stats = model.engine.stats
    steps, rows = stats.steps, stats.rows
    assert run(prompts, cache_prompt=False) == alone
    assert stats.steps - steps < (stats.rows - rows) / 4  # they did share steps
    assert sum(len(out) for out in alone) > len(prompts)
    assert run(prompts) == alone  # again with the prefix cache on: the same tokens


def test_gpu_backend_takes_the_plan_and_would_name_what_it_cannot_run(paths, monkeypatch):
    from infr.errors import UnsupportedError
    from infr.gpu.lowering import find_stacks
    from infr.plan import Plan

    gf = open_gguf(paths("tiny-gemma4-e2b"))
    plan = build_plan(build_spec(gf))
    find_stacks(plan, gf, 1 << 30)  # every op has GPU kernels (tests/gpu/test_gemma4_gpu.py)
    monkeypatch.setattr(Plan, "cpu_only", property(lambda self: ("per-layer embeddings", "KV-shared layers")))
    with pytest.raises(UnsupportedError, match="gemma4: per-layer embeddings, KV-shared layers have no GPU kernels yet"):
        find_stacks(plan, gf, 1 << 30)


def test_real_shape_presets_in_the_q4_k_m_mix():
    """llama-quantize's rules (infr/synth_gemma4.py): the per-layer table is in the token-embedding
    category (Q6_K, the head's type, in a tied model), per_layer_model_proj and the router are never
    quantized, attn_v's 6-bit layers count the attn_v tensors that exist."""
    e2b = {t.name: t for t in synth.tensor_plans(replace(synth.PRESETS["gemma4-e2b"], weight_type="Q4_K_M"))}
    assert e2b["per_layer_token_embd.weight"].shape == (262144, 35 * 256)
    assert e2b["per_layer_token_embd.weight"].qtype.name == "Q6_K"
    assert e2b["per_layer_model_proj.weight"].qtype.name == "F32"
    assert e2b["blk.34.ffn_up.weight"].shape == (12288, 1536) and e2b["blk.14.ffn_up.weight"].shape == (6144, 1536)
    assert "blk.15.attn_k.weight" not in e2b and "blk.14.attn_k.weight" in e2b  # 20 KV-shared layers
    v = [e2b[f"blk.{i}.attn_v.weight"].qtype.name for i in range(15)]
    # use_more_bits(i, 15) over the 15 attn_v tensors: i < 1, i >= 13, (i - 1) % 3 == 2
    assert v == ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K",
                 "Q6_K", "Q6_K", "Q6_K"]
    moe = {t.name: t for t in synth.tensor_plans(replace(synth.PRESETS["gemma4-26b-a4b"], weight_type="Q4_K_M"))}
    assert moe["blk.0.ffn_gate_up_exps.weight"].shape == (128, 2 * 704, 2816)
    assert moe["blk.0.ffn_gate_inp.weight"].qtype.name == "F32"
    assert "blk.5.attn_v.weight" not in moe and moe["blk.5.attn_k.weight"].shape == (2 * 512, 2816)
    assert moe["blk.0.attn_k.weight"].shape == (8 * 256, 2816) and moe["rope_freqs.weight"].shape == (256,)
