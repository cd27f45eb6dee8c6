"""infr.synth's file types: llama.cpp's per-tensor mixes (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, IQ4_XS).

The expected types below are written out from llama.cpp's src/llama-quant.cpp
(llama_tensor_get_type_impl, no imatrix) for an 8-layer model: use_more_bits
picks layers {0, 3, 6, 7} (i < 1, i >= 7, (i - 1) % 3 == 2); IQ4_XS's early
ffn_down layers are those below 8 / 8 = 1. Each file must also decode, with
gguf's reference dequantizer, to the weights synth drew, and run through infr.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from infr import synth
from infr.engine import Model
from infr.gguf_file import open_gguf

N_LAYERS = 8
MORE_BITS = {0, 3, 6, 7}
ALL = set(range(N_LAYERS))
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class Mix:
    file_type: int  # general.file_type, llama.cpp's LLAMA_FTYPE_* number
    base: Q
    head: Q  # output.weight, or token_embd when tied
    bumped: dict = field(default_factory=dict)  # matrix -> (type, layers)


EXPECTED = {
    "Q4_K_M": Mix(15, Q.Q4_K, Q.Q6_K, {"attn_v": (Q.Q6_K, MORE_BITS), "ffn_down": (Q.Q6_K, MORE_BITS)}),
    "Q5_K_M": Mix(17, Q.Q5_K, Q.Q6_K, {"attn_v": (Q.Q6_K, MORE_BITS), "ffn_down": (Q.Q6_K, MORE_BITS)}),
    "Q6_K": Mix(18, Q.Q6_K, Q.Q6_K),
    "Q8_0": Mix(7, Q.Q8_0, Q.Q8_0),
    "Q4_0": Mix(2, Q.Q4_0, Q.Q6_K),
    # n_head / n_head_kv = 4 here: every attn_v gets Q5_K
    "IQ4_XS": Mix(30, Q.IQ4_XS, Q.Q6_K, {"attn_v": (Q.Q5_K, ALL), "ffn_down": (Q.Q5_K, {0})}),
    # llama-quantize --pure: one type everywhere, the file type kept
    "Q4_0-pure": Mix(2, Q.Q4_0, Q.Q4_0),
    "IQ4_XS-pure": Mix(30, Q.IQ4_XS, Q.IQ4_XS),
}
# Relative RMS error of one decoded matrix against the drawn weights (uniform
# values): measured 0.065-0.07 for the 4-bit types, 0.03 Q5_K, 0.015 Q6_K, 0.004 Q8_0.
MAX_ERROR = {Q.Q4_0: 0.09, Q.Q4_K: 0.09, Q.IQ4_XS: 0.09, Q.IQ4_NL: 0.09, Q.Q5_0: 0.05, Q.Q5_1: 0.05,
             Q.Q5_K: 0.05, Q.Q6_K: 0.025, Q.Q8_0: 0.01}


def spec_for(mix: str, tied: bool = False, **changes) -> synth.SynthSpec:
    # Every row 256 wide (or 512): no K-quant falls back. gpt2 tokenizer so infr.engine loads it.
    base = dict(n_layers=N_LAYERS, n_embd=256, n_heads=8, n_kv_heads=2, head_dim=32, n_ff=512, n_vocab=320,
                ctx=64, tied=tied, weight_type=mix, tokenizer="gpt2")
    return synth.SynthSpec("llama", **{**base, **changes})


def expected_type(mix: Mix, name: str, tied: bool) -> Q:
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return mix.head
    if name == "token_embd.weight":
        return mix.base
    _, layer, matrix, _ = name.split(".")
    qtype, layers = mix.bumped.get(matrix, (mix.base, ()))
    return qtype if int(layer) in layers else mix.base


@pytest.fixture(scope="module")
def f32_logits(tmp_path_factory):
    """The unquantized model's logits on a few tokens, per tied-ness: what every mix approximates."""
    out = {}
    for tied in (False, True):
        path = synth.write_gguf(spec_for("F32", tied), tmp_path_factory.mktemp("f32") / "m.gguf")
        out[tied] = Model(path, n_ctx=16, backend="cpu").session().prefill([5, 17, 200, 3])
    return out


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_mix_types_decode_and_run(name, tied, tmp_path, f32_logits):
    mix, spec = EXPECTED[name], spec_for(name, tied)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "m.gguf"))
    assert gf.get("general.file_type") == mix.file_type
    names = ["token_embd.weight"] + ([] if tied else ["output.weight"])
    names += [f"blk.{i}.{m}.weight" for i in range(N_LAYERS) for m in MATRICES]
    assert {n for n, t in gf.tensors.items() if t.qtype != Q.F32} == set(names)  # norms stay F32
    for n in names:
        t = gf.tensor(n)
        assert t.qtype == expected_type(mix, n, tied), n
        got = dequantize(t.raw, t.qtype).reshape(t.shape)
        want = synth.reference_weights(spec, n)
        err = np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2))
        assert err < MAX_ERROR[t.qtype], (n, t.qtype.name, err)
    logits = Model(gf.path, n_ctx=16, backend="cpu").session().prefill([5, 17, 200, 3])
    ref = f32_logits[tied]
    assert logits.shape == ref.shape and np.isfinite(logits).all()
    # the same network up to quantization: logits follow the F32 model's
    assert np.corrcoef(logits, ref)[0, 1] > 0.93  # measured 0.95-0.9999


def test_narrow_rows_take_llamacpps_fallbacks():
    # rows of 320 (ffn_down) and a 288-wide model: K-quants and IQ4_XS cannot tile them
    wide, narrow = spec_for("IQ4_XS", n_ff=320), spec_for("IQ4_XS", n_embd=288, head_dim=36)
    types = {t.name: t.qtype for t in synth.tensor_plans(wide)}
    assert types["blk.0.ffn_down.weight"] == Q.Q5_1  # Q5_K -> Q5_1
    assert types["blk.1.ffn_down.weight"] == Q.IQ4_NL  # IQ4_XS -> IQ4_NL
    assert types["blk.1.ffn_up.weight"] == Q.IQ4_XS
    types = {t.name: t.qtype for t in synth.tensor_plans(narrow)}
    assert types["output.weight"] == Q.Q8_0  # the head: Q6_K -> Q8_0
    assert types["blk.2.attn_v.weight"] == Q.Q5_1
    assert types["blk.2.attn_q.weight"] == Q.IQ4_NL
    k_mix = {t.name: t.qtype for t in synth.tensor_plans(spec_for("Q5_K_M", n_ff=320))}
    assert (k_mix["blk.0.ffn_down.weight"], k_mix["blk.1.ffn_down.weight"]) == (Q.Q8_0, Q.Q5_1)


def test_iq4_xs_attn_v_needs_a_gqa_of_four():
    spec = spec_for("IQ4_XS", n_kv_heads=4)  # 8 / 4 = 2 query heads per KV head
    types = {t.name: t.qtype for t in synth.tensor_plans(spec)}
    assert {types[f"blk.{i}.attn_v.weight"] for i in range(N_LAYERS)} == {Q.IQ4_XS}
    assert types["blk.0.ffn_down.weight"] == Q.Q5_K


def test_real_shapes_match_published_file_sizes():
    # Tensor bytes of synth's Llama-3.1-8B mixes against llama-quantize's own size
    # table (tools/quantize/quantize.cpp: 4.58G Q4_K_M, 5.33G Q5_K_M, 6.14G Q6_K,
    # 7.96G Q8_0, 4.34G Q4_0, for Llama-3-8B, in GiB): a misplaced rule moves them.
    published = {"Q4_K_M": 4.58, "Q5_K_M": 5.33, "Q6_K": 6.14, "Q8_0": 7.96, "Q4_0": 4.34}
    for name, gib in published.items():
        plans = synth.tensor_plans(synth.preset("llama-3.1-8b", weight_type=name))
        assert sum(synth.tensor_nbytes(t) for t in plans) / 2**30 == pytest.approx(gib, abs=0.02), name


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS], ids=lambda q: q.name)
def test_iq4_blocks_decode_to_the_weights(qtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 512)) * 0.05).astype(np.float32)
    x[1, :256] = np.abs(x[1, :256])  # one sign only: the largest value is positive
    x[2, :256] = -np.abs(x[2, :256])
    back = dequantize(synth.encode(x, qtype), qtype).reshape(x.shape)
    peer = dequantize(synth.encode(x, Q.Q4_0), Q.Q4_0).reshape(x.shape)  # gguf's own 4-bit encoder

    def err(y, rows=slice(None)):
        return float(np.sqrt(np.mean((y[rows] - x[rows]) ** 2)) / np.sqrt(np.mean(x[rows] ** 2)))

    assert err(back) < 1.05 * err(peer)
    for r in (1, 2):
        assert err(back, r) < 1.05 * err(peer, r)
    zeros = np.zeros((2, 256), np.float32)
    np.testing.assert_array_equal(dequantize(synth.encode(zeros, qtype), qtype), 0.0)


@pytest.mark.parametrize("preset,low,high", [("qwen35-4b", 4.1e9, 4.3e9), ("qwen35-35b-a3b", 34.4e9, 34.9e9)])
def test_qwen35_real_shapes_in_the_q4_k_m_mix(preset, low, high):
    # Text towers: Qwen3.5-4B ~4.2B parameters, Qwen3.5-35B-A3B ~34.7B (the published totals add a
    # vision tower). llama-quantize puts attn_qkv (the DeltaNet's input projection) in attn_v's
    # category: Q6_K in the use_more_bits layers like attn_v; it never quantizes ssm_conv1d (by name)
    # or 1-D tensors (ssm_a, ssm_dt, the shared expert's gate); attn_gate, ssm_alpha/beta/out take
    # the default type.
    spec = synth.preset(preset, weight_type="Q4_K_M")
    plans = synth.tensor_plans(spec)
    assert low < sum(int(np.prod(t.shape)) for t in plans) < high
    n = spec.n_layers
    more = {i for i in range(n) if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2}
    types = {t.name: t.qtype for t in plans}
    for i in range(n):
        v = f"blk.{i}.attn_v.weight" if (i + 1) % 4 == 0 else f"blk.{i}.attn_qkv.weight"
        assert types[v] == (Q.Q6_K if i in more else Q.Q4_K), v
        if (i + 1) % 4:
            assert types[f"blk.{i}.ssm_conv1d.weight"] == Q.F32 and types[f"blk.{i}.ssm_a"] == Q.F32
            assert {types[f"blk.{i}.{m}.weight"] for m in ("attn_gate", "ssm_alpha", "ssm_beta", "ssm_out")} == {Q.Q4_K}
    if spec.n_expert:
        assert types["blk.0.ffn_gate_inp_shexp.weight"] == Q.F32 and types["blk.0.ffn_gate_inp.weight"] == Q.F32
        for i in (0, min(set(range(n)) - more)):  # the layer read from the name, for banks and shared alike
            want = Q.Q6_K if i in more else Q.Q4_K
            assert types[f"blk.{i}.ffn_down_exps.weight"] == types[f"blk.{i}.ffn_down_shexp.weight"] == want
