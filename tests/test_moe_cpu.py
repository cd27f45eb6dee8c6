"""The MoE FFN's CPU reference on its own: the router's rules, the experts' sum against a plain
numpy formula, only the chosen experts read, rows independent of their batch; the Q4_K_M mix of
MoE synthetic models; which plans the GPU backend takes; `infr run` on a tiny MoE model."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.cpu.moe import RENORM_FLOOR, ExpertBank, ExpertCache, moe_forward, route
from infr.gguf_file import Tensor, open_gguf
from infr.models import build_spec
from infr.models.spec import Activation, Gating, MoESpec
from infr.plan import build_plan


def _silu(x):
    return x / (1.0 + np.exp(-x))


def test_softmax_topk_renormalised_is_softmax_over_the_chosen():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(50, 7)).astype(np.float32) * 3
    chosen, w = route(logits, MoESpec(7, 3, 8))
    assert (np.diff(np.take_along_axis(logits, chosen, 1), axis=1) < 0).all()  # descending
    assert set(map(tuple, np.sort(chosen, 1))) == set(map(tuple, np.sort(np.argsort(-logits, 1)[:, :3], 1)))
    sel = np.take_along_axis(logits, chosen, 1).astype(np.float64)
    want = np.exp(sel - sel.max(1, keepdims=True))
    np.testing.assert_allclose(w, want / want.sum(1, keepdims=True), rtol=1e-5)


def test_renormalisation_clamps_the_sum_at_llamacpps_floor():
    logits = np.array([[-30.0, -31.0, -29.5, -40.0]], np.float32)  # sigmoids ~1e-13: their sum is below the floor
    m = MoESpec(4, 2, 8, gating=Gating.SIGMOID, norm_weights=True)
    chosen, w = route(logits, m)
    assert chosen.tolist() == [[2, 0]]
    p = 1 / (1 + np.exp(-logits[0, [2, 0]].astype(np.float64)))
    np.testing.assert_allclose(w[0], p / RENORM_FLOOR, rtol=1e-5)
    assert w.sum() < 1e-6  # not renormalised to 1
    # and a weight scale multiplies after it
    _, w2 = route(logits, replace(m, weight_scale=2.5))
    np.testing.assert_allclose(w2, w * np.float32(2.5), rtol=1e-6)


def test_llama4_selects_on_raw_logits_with_unnormalised_sigmoid_weights():
    logits = np.array([[0.5, -1.0, 2.0, 1.9]], np.float32)
    chosen, w = route(logits, MoESpec(4, 1, 8, gating=Gating.SIGMOID, select_on_logits=True, norm_weights=False))
    assert chosen.tolist() == [[2]]
    np.testing.assert_allclose(w, [[1 / (1 + np.exp(-2.0))]], rtol=1e-6)


def _bank(name: str, values: np.ndarray, cache: ExpertCache) -> ExpertBank:
    return ExpertBank(Tensor(name, Q.F32, values.shape, values), cache)


@pytest.mark.parametrize("before", [False, True], ids=["weight-after", "weight-before"])
def test_experts_sum_is_the_plain_formula_fused_or_not(before):
    rng = np.random.default_rng(2)
    n_exp, hidden, d, t, k = 5, 12, 16, 9, 2
    g, u = (rng.normal(size=(n_exp, hidden, d)).astype(np.float32) for _ in range(2))
    dn = rng.normal(size=(n_exp, d, hidden)).astype(np.float32)
    h = rng.normal(size=(t, d)).astype(np.float32)
    logits = rng.normal(size=(t, n_exp)).astype(np.float32)
    m = MoESpec(n_exp, k, hidden, Activation.SILU, Gating.SOFTMAX, weight_before=before)
    cache = ExpertCache()
    got = moe_forward(h, logits, m, [_bank("g", g, cache), _bank("u", u, cache), _bank("d", dn, cache)],
                      (False, False, False))
    fused = moe_forward(h, logits, replace(m, fused_gate_up=True),
                        [_bank("gu", np.concatenate([g, u], axis=1), cache), _bank("d", dn, cache)], (False, False))
    chosen, w = route(logits, m)
    want = np.zeros((t, d))
    for r in range(t):
        for s, e in enumerate(chosen[r]):
            x = h[r].astype(np.float64) * (w[r, s] if before else 1.0)
            y = dn[e] @ (_silu(g[e] @ x) * (u[e] @ x))
            want[r] += y * (1.0 if before else w[r, s])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(fused, got)


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    spec = replace(synth.PRESETS["tiny-qwen3moe"], weight_type="Q8_0")
    return synth.write_gguf(spec, tmp_path_factory.mktemp("moe") / "q8.gguf")


def test_only_the_chosen_experts_are_read(tiny_q8):
    gf = open_gguf(tiny_q8)
    spec = build_spec(gf)
    be = CPUBackend(gf, build_plan(spec), 64)
    assert be.expert_banks and all(b.read == set() for b in be.expert_banks.values())  # nothing read at load
    assert not any(name in be.w._cache for name in be.expert_banks)
    be.forward([5], 0)
    n_used = spec.layers[0].ffn.n_used
    for layer in range(spec.n_layers):
        reads = [be.expert_banks[f"blk.{layer}.{b}.weight"].read for b in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")]
        assert reads[0] == reads[1] == reads[2] and len(reads[0]) == n_used
    assert be.expert_cache.misses == 3 * n_used * spec.n_layers  # one dequantization per bank and chosen expert
    bank = be.expert_banks["blk.0.ffn_down_exps.weight"]
    e = min(bank.read)
    t = gf.tensor("blk.0.ffn_down_exps.weight")
    np.testing.assert_array_equal(bank[e], dequantize(t.raw, t.qtype).reshape(t.shape)[e])  # gguf's own decoding


def test_rows_do_not_depend_on_what_shares_their_step(tiny_q8):
    gf = open_gguf(tiny_q8)
    plan = build_plan(build_spec(gf))
    ids = np.random.default_rng(3).integers(0, 512, 40).tolist()
    long = CPUBackend(gf, plan, 64).forward(ids, 0, n_logits=40)
    short = CPUBackend(gf, plan, 64).forward(ids[:20], 0, n_logits=20)
    np.testing.assert_array_equal(long[:20], short)  # other rows routed to the same experts change nothing


def test_gpu_lowering_takes_moe_and_llama4_plans(tmp_path):
    from infr.gpu.lowering import find_stacks

    gf = open_gguf(synth.write_gguf(synth.PRESETS["tiny-qwen3moe"], tmp_path / "q.gguf"))
    plan = build_plan(build_spec(gf))
    assert plan.cpu_only == ()  # the MoE FFN has GPU kernels (tests/gpu/test_moe_gpu.py)
    find_stacks(plan, gf, 1 << 27)
    gf = open_gguf(synth.write_gguf(synth.PRESETS["tiny-llama4"], tmp_path / "l.gguf"))
    plan = build_plan(build_spec(gf))
    # llama4's attention options have GPU kernels too (tests/gpu/test_llama4_gpu.py)
    assert {"weightless RMSNorm", "QueryTemp", "chunk"} <= _attention_options(plan)
    assert plan.cpu_only == ()
    find_stacks(plan, gf, 1 << 27)  # not refused


def _attention_options(plan) -> set[str]:
    from infr.ops import Attention, QueryTemp, RMSNorm

    out = set()
    for op in plan.ops:
        if isinstance(op, RMSNorm) and op.weight is None:
            out.add("weightless RMSNorm")
        if isinstance(op, QueryTemp):
            out.add("QueryTemp")
        if isinstance(op, Attention) and op.spec.chunk:
            out.add("chunk")
    return out


def _six_bit(i: int, n: int) -> bool:  # llama.cpp's use_more_bits
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@pytest.mark.parametrize("arch", ["qwen3moe", "llama4"])
def test_q4_k_m_mix_of_moe_models_follows_llamacpp(tmp_path, arch):
    spec = synth.SynthSpec(arch, n_layers=8, n_embd=256, n_heads=4, n_kv_heads=2, head_dim=64, n_ff=512,
                           n_vocab=300, tied=False, weight_type="Q4_K_M", n_expert=8, n_expert_used=2, n_ff_exp=256,
                           moe_step=2 if arch == "llama4" else 1)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "m.gguf"))
    for i in range(8):
        p = f"blk.{i}."
        moe = arch == "qwen3moe" or (i + 1) % 2 == 0
        six = Q.Q6_K if _six_bit(i, 8) else Q.Q4_K
        assert gf.tensor(p + "attn_k.weight").qtype == Q.Q8_0  # 8 experts: llama.cpp's Mixtral rule
        assert gf.tensor(p + "attn_v.weight").qtype == Q.Q8_0
        assert gf.tensor(p + "attn_output.weight").qtype == Q.Q5_K
        assert gf.tensor(p + "attn_q.weight").qtype == Q.Q4_K
        if moe:
            assert gf.tensor(p + "ffn_gate_inp.weight").qtype == Q.F32  # the router is never quantized
            assert gf.tensor(p + "ffn_gate_exps.weight").qtype == gf.tensor(p + "ffn_up_exps.weight").qtype == Q.Q4_K
            assert gf.tensor(p + "ffn_down_exps.weight").qtype == six
            assert gf.tensor(p + "ffn_down_exps.weight").shape == (8, 256, 256)
            if arch == "llama4":
                assert gf.tensor(p + "ffn_down_shexp.weight").qtype == six
        else:
            assert gf.tensor(p + "ffn_down.weight").qtype == six
    assert gf.tensor("output.weight").qtype == Q.Q6_K
    name = "blk.1.ffn_down_exps.weight"
    t = gf.tensor(name)
    got = dequantize(t.raw, t.qtype).reshape(t.shape)
    want = synth.reference_weights(spec, name)
    assert want.shape == t.shape
    assert np.sqrt(np.mean((got - want) ** 2)) / want.std() < 0.1
    logits = CPUBackend(gf, build_plan(build_spec(gf)), 16).forward([1, 2, 3], 0, n_logits=3)
    assert logits.shape == (3, 300) and np.isfinite(logits).all()


@pytest.mark.parametrize("preset,low,high", [("qwen3-30b-a3b", 30.0e9, 31.0e9), ("llama-4-scout", 105e9, 110e9)])
def test_real_shape_presets_have_the_models_parameter_counts(preset, low, high):
    # Qwen3-30B-A3B: 30.5B parameters; Llama-4-Scout: 109B with its vision tower, ~108B text.
    spec = replace(synth.PRESETS[preset], weight_type="Q4_K_M")
    plans = synth.tensor_plans(spec)
    assert low < sum(int(np.prod(t.shape)) for t in plans) < high
    banks = [t for t in plans if t.name.endswith("_exps.weight")]
    assert len(banks) == 3 * spec.n_layers and all(t.shape[0] == spec.n_expert for t in banks)
    assert {t.qtype for t in banks} == {Q.Q4_K, Q.Q6_K}


@pytest.mark.parametrize("preset", ["tiny-qwen3moe", "tiny-llama4"])
def test_infr_run_generates_on_a_tiny_moe_model(tmp_path, preset):
    path = synth.write_gguf(synth.PRESETS[preset], tmp_path / "m.gguf")
    proc = subprocess.run([sys.executable, "-m", "infr", "run", str(path), "abc", "--raw", "--temp", "0",
                           "--max-new", "6", "--backend", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    stats = re.search(r"generated: (\d+) tokens", proc.stderr)
    assert stats and int(stats.group(1)) == 6


@pytest.mark.parametrize("preset,weight_type", [("tiny-qwen3moe", "Q8_0"), ("tiny-llama4", "F32")])
def test_batched_equals_alone_on_moe_models(tmp_path, preset, weight_type):
    """Six greedy requests of different lengths share the engine's steps (their rows routed each
    to its own experts) and give exactly the tokens each gives alone."""
    from infr.engine import Model
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    path = synth.write_gguf(replace(synth.PRESETS[preset], weight_type=weight_type), tmp_path / "m.gguf")
    rng = np.random.default_rng(4)
    prompts = [rng.integers(2, 512, n).tolist() for n in (3, 9, 17, 40, 70, 130)]
    model = Model(path, n_ctx=160, backend="cpu", parallel=6, kv_tokens=6 * 160)
    greedy = SamplingParams(temperature=0.0)

    def run(ps, **kw):
        reqs = [model.engine.submit(Request(list(p), greedy, max_new=8, **kw)) for p in ps]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        return [r.output for r in reqs]

    alone = [run([p], cache_prompt=False)[0] for p in prompts]
    stats = model.engine.stats
    steps, rows = stats.steps, stats.rows
    assert run(prompts) == alone
    assert stats.steps - steps < (stats.rows - rows) / 4  # they did share steps
    assert sum(len(out) for out in alone) > len(prompts)  # (a request may stop at once on the end token)


def test_shared_expert_gate_and_query_temperature_ops():
    from types import SimpleNamespace

    from infr.cpu.kinds import compile_op
    from infr.models.llama4 import TEMPERATURE
    from infr.ops import QueryTemp, SigmoidGate

    rng = np.random.default_rng(5)
    h, s, wv = rng.normal(size=(6, 16)), rng.normal(size=(6, 16)), rng.normal(size=16)
    be = SimpleNamespace(w={"gate": wv.astype(np.float32)})
    env = {"h": h.astype(np.float32), "s": s.astype(np.float32)}
    compile_op(be, SigmoidGate("s", "h", "gate"))(env, None, None)
    np.testing.assert_allclose(env["s"], s / (1 + np.exp(-(h @ wv)))[:, None], rtol=1e-5)  # one scalar per row

    pos = np.array([0, 5, 8190, 8191, 20000, 3])
    env = {"q": np.ones((6, 8), np.float32)}
    compile_op(be, QueryTemp("q", TEMPERATURE))(env, None, SimpleNamespace(pos=pos))
    np.testing.assert_allclose(env["q"][:, 0], 1 + 0.1 * np.log(np.floor((pos + 1) / 8192) + 1), rtol=1e-6)
