"""Fused epilogues: the residual add inside the weight matmul (x = x + W·h)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from infr.numerics import matmul_input
from infr.gpu import kernels_matmul as KM
from infr.gpu.runtime import read, run, storage

from closeness import assert_logits_close, rounds_activations
from test_quant_kernels import make_weight  # tests/gpu is on sys.path (pytest's prepend import mode)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.Q3_K])  # the int8 GEMV and the generic kernel
@pytest.mark.parametrize("T", [1, 3])
def test_matmul_adds_residual(gpu, kernels, qtype, T):
    rng = np.random.default_rng(7)
    N, K = 67, 512
    w = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    resid = rng.standard_normal((T, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    chunks = KM.upload_weight(gpu, w)
    xb, rb, bb = storage(gpu, x), storage(gpu, resid), storage(gpu, bias)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    run(gpu, KM.matmul_dispatches(kernels, w, chunks, xb, y, bb, T, resid=rb))
    ref = matmul_input(x, w.qtype) @ dequantize(np.array(w.raw), w.qtype).reshape(N, K).T + bias + resid
    out = read(gpu, y, count=T * N).reshape(T, N)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(out, ref, atol=1e-5 * scale, rtol=0)


def test_plan_residual_adds_are_fused(smollm2_path, gemma3_path, gpu):
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.fusion import is_residual
    from infr.models import build_spec
    from infr.plan import build_plan

    for path, expected in ((smollm2_path, 2), (gemma3_path, 0)):  # Gemma norms the output first
        plan = build_plan(build_spec(open_gguf(path)))
        ops = list(plan.layers)
        fused = sum(is_residual(a, b) for a, b in zip(ops, ops[1:]))
        assert fused == expected * plan.spec.n_layers
    gf = open_gguf(smollm2_path)
    plan = build_plan(build_spec(gf))
    be = GPUBackend(gf, plan, 32, dev=gpu)
    unfused = len(plan.embed + plan.layers + plan.head)  # one dispatch per op, chunks aside
    # Rounding for the int8 GEMV: a quantize where no norm or attention wrote the rounded rows
    # (here K = 576 is not whole 256-value blocks): at most once for each of q|k|v, o, gate||up, down and the head.
    labels = [d.label for d in be._multi_step(1, False).dispatches]
    quant = sum(lb.startswith("quantize_q8") for lb in labels)
    assert 1 <= quant <= 4 * plan.spec.n_layers + 1
    stacked = sum(len(names) - 1 for names in be.stacks)  # q|k|v: one GEMV for three matmuls
    pairs = sum("_gate_up" in lb for lb in labels)  # gate, up and the activation in one
    # per layer: two residual adds into their matmuls, and rope(q), rope(k), kv_store as one rope_kv
    # (or inside the q|k|v GEMV: INFR_GEMV_ROPE, kernels_qkv_rope)
    roped = sum("_stacked_rope_kv " in lb for lb in labels)
    fused = 2 * plan.spec.n_layers + 2 * plan.spec.n_layers + stacked + 2 * pairs + roped
    assert be.dispatches_per_token == unfused - fused + quant


def test_qk_norms_are_fused_into_rope_kv(gemma3_path, gpu):
    """Gemma 3's per-head q and k norms run inside rope_kv (fusion.py's norm_rope_store): a decode
    step has no rmsnorm between the q|k|v GEMV and rope_kv, two dispatches fewer a layer, and the
    step still gives the CPU reference's logits (the norms' floats are the rmsnorm kernel's:
    tests/gpu/test_norm_rope_kv.py)."""
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    gf = open_gguf(gemma3_path)
    plan = build_plan(build_spec(gf))
    assert [g.kind for g in plan.groups].count("norm_rope_store") == plan.spec.n_layers
    be = GPUBackend(gf, plan, 32, dev=gpu)
    labels = [d.label.split()[0] for d in be._multi_step(1, False).dispatches]
    ropes = [i for i, lb in enumerate(labels) if lb.startswith("rope_kv")]
    assert len(ropes) == plan.spec.n_layers and all(labels[i - 1].startswith("gemv") for i in ropes), labels[:12]
    prompt = [2, 651, 6037, 576, 6081, 603]
    got, want = be.forward(prompt, 0, n_logits=1), CPUBackend(gf, plan, 32).forward(prompt, 0, n_logits=1)
    assert int(np.argmax(got[-1])) == int(np.argmax(want[-1]))
    assert_logits_close(got, want, rounds_activations(gf, plan))


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("T", [1, 3])
def test_gate_up_fused_with_activation(gpu, kernels, act, T):
    from infr.cpu import ops as F
    from infr.models.spec import Activation

    rng = np.random.default_rng(11)
    N, K = 75, 768  # rows not a multiple of the workgroup's; three blocks per row
    wg, wu = make_weight(Q.Q4_K, N, K, rng), make_weight(Q.Q4_K, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    ds = KM.gate_up_dispatches(kernels, wg, wu, cg, cu, storage(gpu, x), y, act, T)
    assert ds is not None and [d.label.split()[0] for d in ds] == ["quantize_q8", "gemv_q4_k_gate_up"]
    run(gpu, ds)
    x = F.quantize_q8(x)  # the 8-bit activations the Q4_K kernel multiplies
    g = x @ dequantize(np.array(wg.raw), Q.Q4_K).reshape(N, K).T
    u = x @ dequantize(np.array(wu.raw), Q.Q4_K).reshape(N, K).T
    ref = F.gated_act(g, u, Activation(act))
    out = read(gpu, y, count=T * N).reshape(T, N)
    np.testing.assert_allclose(out, ref, atol=1e-5 * np.abs(ref).max(), rtol=0)


def test_gate_up_not_fused_without_a_gemv(gpu, kernels):
    """Q2_K has no int8 GEMV: the pair runs as two matmuls (pairs of two GEMV types: test_gemv_types.py)."""
    rng = np.random.default_rng(1)
    wg, wu = make_weight(Q.Q4_K, 8, 256, rng), make_weight(Q.Q2_K, 8, 256, rng)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    assert KM.gate_up_dispatches(kernels, wg, wu, cg, cu, cg[0][0], cu[0][0], "silu", 1) is None


@pytest.mark.parametrize("q8", [0, 1], ids=["quantize", "pair_rounds"])  # GemvTuning.Q8
@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen2"])  # qwen2: the stacked q|k|v carries biases
def test_fused_graph_greedy_equals_cpu(tmp_path, gpu, family, q8):
    """A model whose every matrix takes the Q4_K kernels (K % 256 == 0): the
    stacked q|k|v and the fused gate||up run, and greedy decode on the GPU
    gives the CPU reference's tokens; with Q8, the pair rounds down's input itself."""
    from dataclasses import replace as _replace

    from infr.gpu import tuning

    with tuning.override(gemv=_replace(tuning.current().gemv, Q8=q8)):
        _fused_graph_greedy(tmp_path, gpu, family, q8)


def _fused_graph_greedy(tmp_path, gpu, family, q8):
    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    spec = synth.preset(family, n_embd=256, n_ff=512, n_heads=4, n_kv_heads=2, head_dim=64, weight_type="Q4_K")
    path = synth.write_gguf(spec, tmp_path / f"{family}.gguf")
    gf = open_gguf(path)
    plan = build_plan(build_spec(gf))
    gpu_be = GPUBackend(gf, plan, 64, dev=gpu)
    assert len(gpu_be.stacks) == plan.spec.n_layers  # q|k|v stacked in every layer
    labels = [d.label for d in gpu_be._multi_step(1, False).dispatches]
    assert sum("_stacked" in lb for lb in labels) == plan.spec.n_layers
    if q8:
        assert sum("_gate_up_q8 " in lb for lb in labels) == plan.spec.n_layers
        # the attention kernel rounds the o projection's input itself, the gate||up pair the down
        # projection's (tests/gpu/test_gate_up_q8.py): no quantize dispatch at all
        assert not any(lb.startswith("quantize_q8") for lb in labels), labels
    else:
        assert sum("_gate_up" in lb for lb in labels) == plan.spec.n_layers
        # the attention kernel rounds the o projection's input itself; only the down projection's is quantized
        assert labels.count("quantize_q8 256") == 0 and labels.count("quantize_q8 512") == plan.spec.n_layers
    cpu_be = CPUBackend(gf, plan, 64)
    prompt = [1, 17, 42, 99, 3, 250]
    want, logits = [], cpu_be.forward(prompt, 0)[-1]
    for i in range(12):
        want.append(int(np.argmax(logits)))
        logits = cpu_be.forward([want[-1]], len(prompt) + i)[-1]
    got_logits = gpu_be.forward(prompt, 0)[-1]
    first = int(np.argmax(got_logits))
    assert first == want[0]
    assert gpu_be.decode_greedy(first, len(prompt), 11) == want[1:]


@pytest.fixture
def pair_rounds():
    """GemvTuning.Q8 on (INFR_GEMV_Q8=1): the gate||up pair writes down's input rounded too."""
    from dataclasses import replace

    from infr.gpu import tuning

    with tuning.override(gemv=replace(tuning.current().gemv, Q8=1)):
        yield


def test_moe_layers_fuse_their_norm_rounding_and_residual_add(gpu, tmp_path, pair_rounds):
    """A qwen3moe layer of Q8_0 weights, 256 wide: the FFN norm writes its rows rounded too (the
    experts' int8 GEMV reads them past the f32 router: no quantize of them) and the experts' sum
    goes into the residual stream in the combine (no add dispatch), and (GemvTuning.Q8) the experts'
    gate||up pair writes its output rounded for the down bank (no quantize): 11 dispatches a layer, not 15 — and
    the model still follows the CPU reference, prompt batch (grouped experts) and decode."""
    from dataclasses import replace

    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan
    from infr.synth_presets import PRESETS

    from closeness import assert_gpu_follows_cpu

    spec = replace(PRESETS["tiny-qwen3moe"], n_embd=256, n_heads=4, head_dim=64, n_ff=256, weight_type="Q8_0",
                   name="tiny-qwen3moe-256")
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "moe256.gguf"))
    plan = build_plan(build_spec(gf))
    kinds = [g.kind for g in plan.groups]
    # attention's o and the last MoE; the other MoEs with the next layer's input norm (moe_residual_norm)
    assert kinds.count("residual") == spec.n_layers + 1 and kinds.count("moe_residual_norm") == spec.n_layers - 1
    from infr.gpu import tuning

    c = CPUBackend(gf, plan, 128)
    # INFR_MOE_COMBINE_NORM=1: the combine also writes the next norm's rounded rows
    with tuning.override(moe_combine_norm=1):
        g = GPUBackend(gf, plan, 128, dev=gpu)
        full = [d.label for d in g._multi_step(1, False).dispatches]
        labels = [lb.split()[0] for lb in full]
        assert labels.count("moe_combine") == 1 and labels.count("moe_combine_q8") == spec.n_layers - 1, labels
        assert "add" not in labels, labels
        assert not any(lb.startswith("quantize_q8") for lb in full), full
        assert labels.count("gemv_q8_0_expert_gate_up_q8") == spec.n_layers, labels
        fused_labels = labels
        # attention, FFN, and the head's norms, less those run inside the GEMV after them (kernels_norm_in;
        # never the FFN's here: the router reads it as floats) and the attention norms after a MoE's combine
        normed, fused = sum(lb.endswith("_norm") for lb in labels), spec.n_layers - 1
        assert labels.count("rmsnorm_q8") == 2 * spec.n_layers + 1 - normed - fused, labels
        assert normed <= spec.n_layers + 1 - fused, labels
        prompt = np.random.default_rng(3).integers(0, spec.n_vocab, 40).tolist()
        assert_gpu_follows_cpu(g, c, prompt, 6)
        # a prompt batch (grouped experts) keeps the combine and the norm apart: each of a row's workgroups
        # would read every pair's row again
        prompt_labels = [d.label.split()[0] for d in g._graph(64, 1)[0].dispatches]
        assert "moe_combine_q8" not in prompt_labels and prompt_labels.count("moe_combine") == spec.n_layers, prompt_labels
        fused_logits = _prompt_then_steps(g, prompt)
    # INFR_MOE_COMBINE_NORM=0 (the default): the combine, then the next norm apart; the same logits, bit for bit
    assert tuning.Tuning.from_env({}).moe_combine_norm == 0
    with tuning.override(moe_combine_norm=0):
        apart = GPUBackend(gf, plan, 128, dev=gpu)
        split = [d.label.split()[0] for d in apart._multi_step(1, False).dispatches]
        assert split.count("moe_combine") == spec.n_layers and "moe_combine_q8" not in split, split
        # here (a small q|k|v) the next layers' q|k|v GEMVs norm their rows themselves (kernels_norm_in): as many
        # dispatches
        assert sum(lb.endswith("_norm") for lb in split) == normed + fused and len(split) == len(fused_labels), split
        for a, b in zip(_prompt_then_steps(apart, prompt), fused_logits):
            np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def _prompt_then_steps(be, prompt: list[int]) -> list:
    """Logits of a 9-token prompt, then of three decode steps (where the MoE combine takes the next norm)."""
    return [be.forward(prompt[:9], 0)] + [be.forward([t], 9 + i) for i, t in enumerate(prompt[9:12])]


@pytest.mark.parametrize("width,w_width", [(640, 0), (1536, 1), (1152, 1152), (100, 1)])
def test_rmsnorm_add_equals_the_unfused_ops(gpu, kernels, width, w_width):
    """rmsnorm_add (fusion.py's norm_residual) gives word for word what rmsnorm, add and gemma4's
    Mul (layer_output_scale: one value or a vector) give one after another (on lavapipe; within a few
    ulp on an H100 through Dawn, where the word-for-word check failed: rel 1.5e-7 .. 3.2e-7, stop 36)."""
    from infr.gpu import kernels_gemma4 as KG4
    from infr.gpu import kernels_misc as KS

    rng = np.random.default_rng(width + w_width)
    T, eps, scale = 3, 1e-6, 0.75
    o = (rng.standard_normal((T, width)) * 3).astype(np.float32)
    x = rng.standard_normal((T, width)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, width).astype(np.float32)
    w = rng.uniform(0.2, 1.2, max(w_width, 1)).astype(np.float32)
    ob, xb, gb, wb = (storage(gpu, a) for a in (o, x, g, w))
    normed, added = storage(gpu, o.nbytes), storage(gpu, x.nbytes)
    ds = [KS.rmsnorm_dispatch(kernels, ob, gb, normed, width, None, eps, T), KS.add_dispatch(kernels, xb, normed, added, T * width)]
    if w_width:
        ds.append(KG4.mul_dispatch(kernels, added, wb, T * width, w_width, scale))
    run(gpu, ds)
    fused = storage(gpu, x.nbytes)
    extra = dict(w=wb, w_width=w_width, scale=scale) if w_width else {}
    run(gpu, [KS.rmsnorm_add_dispatch(kernels, ob, gb, xb, fused, width, eps, T, **extra)])
    want, got = read(gpu, added, np.uint32, T * width), read(gpu, fused, np.uint32, T * width)
    if "llvmpipe" in gpu.name.lower():
        np.testing.assert_array_equal(got, want)
    else:  # NVIDIA's compiler contracts x * inv * g + resid into an FMA in one kernel and not across two
        np.testing.assert_allclose(got.view(np.float32), want.view(np.float32), rtol=4e-7, atol=1e-7)
    assert not np.array_equal(got, x.view(np.uint32).reshape(-1))  # it did add something


@pytest.mark.parametrize("width,w_width,norm2", [(1536, 0, True), (1536, 1, False), (1024, 1024, True), (2816, 0, False)])
def test_rmsnorm_add_q8_equals_the_unfused_kernels(gpu, kernels, width, w_width, norm2):
    """rmsnorm_add_q8 (a norm_residual, or norm_residual_norm, whose output the int8 GEMV reads) gives
    word for word what rmsnorm_add and then rmsnorm_q8 (the next norm, rounded) or quantize_q8 (the
    stream rounded) give: the stream, the norm's output and the rounded rows; over one workgroup a row
    and several (1536: the second half idle), with and without gemma4's scale."""
    from infr.gpu import kernels_misc as KS
    from infr.gpu import kernels_q8 as KQ

    rng = np.random.default_rng(width + w_width + norm2)
    T, eps, eps2, scale = 3, 1e-6, 1e-5, 0.75
    o = (rng.standard_normal((T, width)) * 3).astype(np.float32)
    x = rng.standard_normal((T, width)).astype(np.float32)
    g, g2 = (rng.uniform(0.5, 1.5, width).astype(np.float32) for _ in range(2))
    w = rng.uniform(0.2, 1.2, max(w_width, 1)).astype(np.float32)
    ob, xb, gb, g2b, wb = (storage(gpu, a) for a in (o, x, g, g2, w))
    extra = dict(w=wb, w_width=w_width, scale=scale) if w_width else {}
    nq = KQ.words(width) * T
    added, normed = storage(gpu, x.nbytes), storage(gpu, x.nbytes)
    ds = [KS.rmsnorm_add_dispatch(kernels, ob, gb, xb, added, width, eps, T, **extra)]
    d, xq = (KQ.rmsnorm_q8_dispatch(kernels, added, g2b, normed, width, eps2, T) if norm2
             else KQ.quantize_dispatch(kernels, added, width, T))
    run(gpu, ds + [d])
    want = [read(gpu, added, np.uint32, T * width), read(gpu, xq, np.uint32, nq)]
    if norm2:
        want.append(read(gpu, normed, np.uint32, T * width))
    y, z = storage(gpu, x.nbytes), storage(gpu, x.nbytes)
    d, xq = KQ.rmsnorm_add_q8_dispatch(kernels, ob, gb, xb, y, width, eps, T, norm2=(g2b, z, eps2) if norm2 else None,
                                       **extra)
    run(gpu, [d])
    got = [read(gpu, y, np.uint32, T * width), read(gpu, xq, np.uint32, nq)]
    if norm2:
        got.append(read(gpu, z, np.uint32, T * width))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert np.any(want[1])  # rounded rows were written


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma4-e2b"])
def test_fused_post_norms_follow_the_cpu(gpu, tmp_path, preset):
    """A gemma whose rows are 256 wide (the tiny presets' 64 take the unfused kernels): its post-norms and
    the norms after them run as rmsnorm_add_q8 (NORM2: the pre-FFN and next-layer norms; without: e2b's
    per-layer gate input) in the prompt and decode graphs, and the GPU follows the CPU reference: the
    prompt's logits, and greedy decode."""
    from dataclasses import replace

    from closeness import assert_follows_greedy

    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    spec = replace(synth.PRESETS[preset], n_embd=256, weight_type="Q8_0")
    gf = open_gguf(synth.write_gguf(spec, tmp_path / f"{preset}-256.gguf"))
    plan = build_plan(build_spec(gf))
    g, c = GPUBackend(gf, plan, 64), CPUBackend(gf, plan, 64)
    for T in (1, 40):
        labels = {d.label.split()[0] for d in g._graph(T, 1)[0].dispatches}
        assert "rmsnorm_add_rmsnorm_q8" in labels, sorted(labels)
        assert ("rmsnorm_add_q8" in labels) == (preset == "tiny-gemma4-e2b"), sorted(labels)
    prompt = np.random.default_rng(22).integers(0, plan.spec.n_vocab, 40).tolist()
    assert_logits_close(g.forward(prompt, 0, n_logits=40), c.forward(prompt, 0, n_logits=40), True)
    first = int(np.argmax(g.forward(prompt[:6], 0)[-1]))
    assert_follows_greedy(c, prompt[:6], [first] + g.decode_greedy(first, 6, 16))
