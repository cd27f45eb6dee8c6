"""Every family against llama.cpp, on tiny random-weight models from infr.synth.

tests/fixtures/families.json holds llama.cpp's logits on each tiny preset
(see make_family_fixtures.py). The test regenerates the GGUF, checks it is
byte-identical to the one llama.cpp ran, and runs infr's CPU reference on
the same ids: once as one batch, once as a prefill then one token at a time.

Tolerances are measured, with headroom. The differences are rounding only:
with an f32 KV cache on both sides llama, qwen2 and qwen3 agree to 5e-6, and
a one-layer gemma3 too once infr mimics llama.cpp's fp16 GELU table. With
llama.cpp's default f16 cache, f32 differences of 1e-7 upstream flip an f16
rounding of q, K, V or the probabilities now and then; gemma3 adds its fp16
GELU table, and its post-attention/FFN norms scale small branch outputs (and
their errors) up to the residual's size. Deliberate one-thing perturbations
move the logits far more: attention scale x1.01 moves gemma3 by 6e-2; window
9 instead of 8, the other RoPE style, no QK-norm, no QKV bias or no
rope_freqs move them by 2 to 5.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.models.spec import Activation, RopeStyle
from infr.plan import build_plan

FIXTURE = Path(__file__).parent / "fixtures" / "families.json"
DATA = json.loads(FIXTURE.read_text())
PRESETS = sorted(DATA["families"])

# Max |infr - llama.cpp| on the stored rows, batch / stepwise: llama 3.8e-4 /
# 3.4e-4, qwen2 4.2e-4 / 3.0e-4, qwen3 2.8e-4 / 2.3e-4, gemma3 3.2e-3 / 3.2e-3.
# Over 12 other random 40-token sequences (all rows) the worst were llama
# 1.8e-3, qwen2 1.2e-3, qwen3 1.4e-3, gemma3 4.4e-3; the bounds cover those.
TOLERANCE = {"llama": 3e-3, "qwen2": 3e-3, "qwen3": 3e-3, "gemma3": 8e-3}


def rows(entry: dict, n_vocab: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(entry["logits_f32_b64"]), dtype="<f4").reshape(-1, n_vocab)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="module")
def models(model_dir):
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            fam = DATA["families"][name]
            cache[name] = synth.write_gguf(synth.PRESETS[name], model_dir / f"{name}.gguf", seed=fam["seed"])
        return cache[name]

    return get


def backend(path: Path) -> CPUBackend:
    gf = open_gguf(path)
    return CPUBackend(gf, build_plan(build_spec(gf)), DATA["n_ctx"])


def assert_close(name: str, got: np.ndarray, want: np.ndarray) -> None:
    fam = DATA["families"][name]
    tol = TOLERANCE[fam["arch"]]
    diff = np.abs(got - want)
    worst = np.unravel_index(int(diff.argmax()), diff.shape)
    assert diff.max() <= tol, f"{name}: max |infr - llama.cpp| {diff.max():.2e} > {tol} at row/token {worst}"
    mismatch = np.flatnonzero(got.argmax(axis=1) != want.argmax(axis=1))
    assert mismatch.size == 0, f"{name}: argmax differs from llama.cpp at rows {mismatch.tolist()}"


def test_fixture_covers_every_family():
    from infr.models import FAMILIES

    # the MoE families' oracle is moe.json (tests/test_moe_exact.py), qwen35's qwen35.json (test_qwen35_exact.py),
    # gemma4's gemma4.json (test_gemma4_exact.py)
    others = [json.loads((FIXTURE.parent / f).read_text())["models"] for f in ("moe.json", "qwen35.json",
                                                                               "gemma4.json")]
    covered = {fam["arch"] for fam in DATA["families"].values()} | {m["arch"] for o in others for m in o.values()}
    assert covered == set(FAMILIES)


@pytest.mark.parametrize("name", PRESETS)
def test_synth_file_is_the_one_llamacpp_ran(models, name):
    digest = hashlib.sha256(models(name).read_bytes()).hexdigest()
    assert digest == DATA["families"][name]["sha256"]


@pytest.mark.parametrize("name", PRESETS)
def test_batch_logits_match_llamacpp(models, name):
    fam = DATA["families"][name]
    want = rows(fam["batch"], fam["n_vocab"])
    got = backend(models(name)).forward(fam["batch"]["ids"], 0, n_logits=len(want))
    assert_close(name, got, want)


@pytest.mark.parametrize("name", PRESETS)
def test_prefill_then_decode_matches_llamacpp(models, name):
    fam = DATA["families"][name]
    ids, prefill = fam["stepwise"]["ids"], fam["stepwise"]["prefill"]
    want = rows(fam["stepwise"], fam["n_vocab"])
    be = backend(models(name))
    got = [be.forward(ids[:prefill], 0, n_logits=1)[0]]
    for pos in range(prefill, len(ids)):
        got.append(be.forward(ids[pos : pos + 1], pos, n_logits=1)[0])
    assert_close(name, np.stack(got), want)


@pytest.mark.parametrize("name", PRESETS)
def test_spec_read_back_from_synthetic_file(models, name):
    s = synth.PRESETS[name]
    spec = build_spec(open_gguf(models(name)))
    assert (spec.arch, spec.n_layers, spec.n_embd, spec.n_vocab) == (s.arch, s.n_layers, s.n_embd, s.n_vocab)
    assert spec.tied_embeddings == s.tied
    assert spec.norm_eps == pytest.approx(s.norm_eps)
    for layer in spec.layers:
        a = layer.attention
        assert (a.n_heads, a.n_kv_heads, a.head_dim, a.v_head_dim) == (s.n_heads, s.n_kv_heads, s.head_dim, s.head_dim)
        assert a.rope.n_rot == s.head_dim
        assert a.rope.style is (RopeStyle.NORM if s.arch == "llama" else RopeStyle.NEOX)
        assert a.qk_norm == (s.arch in ("qwen3", "gemma3"))
        assert a.qkv_bias == (s.arch == "qwen2")
        assert a.scale == pytest.approx(s.head_dim**-0.5)
        assert a.rope.freq_factors == ("rope_freqs.weight" if s.rope_scaling else None)
        assert layer.ffn.hidden == s.n_ff
        assert layer.ffn.activation is (Activation.GELU if s.arch == "gemma3" else Activation.SILU)
        assert layer.post_attn_norm == layer.post_ffn_norm == (s.arch == "gemma3")
        if s.arch == "gemma3":
            is_global = layer.index % 6 == 5
            assert a.sliding_window == (None if is_global else s.sliding_window)
            assert a.rope.theta == (s.rope_theta if is_global else 10000.0)
        else:
            assert a.sliding_window is None
            assert a.rope.theta == s.rope_theta
    if s.arch == "gemma3":
        assert spec.embed_scale == pytest.approx(s.n_embd**0.5)
        assert any(layer.attention.sliding_window is None for layer in spec.layers)  # the preset reaches a global layer


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    spec = synth.PRESETS["tiny-qwen3"]
    a = synth.write_gguf(spec, tmp_path / "a.gguf", seed=3).read_bytes()
    b = synth.write_gguf(spec, tmp_path / "b.gguf", seed=3).read_bytes()
    c = synth.write_gguf(spec, tmp_path / "c.gguf", seed=4).read_bytes()
    assert a == b
    assert len(a) == len(c) and a != c


# Quantized synthetic weights: infr.synth encodes the K-quants itself (gguf-py
# only decodes them), so check its blocks decode, with gguf's own decoder, to
# the values it meant to write, about as closely as gguf-py's own encoder for
# the affine type of the same bits does (one more bit halves the error). A
# misplaced nibble or scale bit errs by ~the weights' whole range instead.
K_QUANT_PEERS = {Q.Q4_K: (Q.Q4_1, 1.1), Q.Q5_K: (Q.Q5_1, 1.1), Q.Q6_K: (Q.Q5_1, 0.6)}


def _rel_rms_error(x: np.ndarray, qtype: Q) -> float:
    back = dequantize(synth.encode(x, qtype), qtype).reshape(x.shape)
    assert np.isfinite(back).all()
    return float(np.sqrt(np.mean((back - x) ** 2)) / np.sqrt(np.mean(x**2)))


@pytest.mark.parametrize("qtype", list(K_QUANT_PEERS), ids=lambda q: q.name)
def test_k_quant_blocks_decode_to_the_weights(qtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 512)) * 0.05).astype(np.float32)
    x[1, :256] = np.abs(x[1, :256])  # a block with no negative values
    peer, factor = K_QUANT_PEERS[qtype]
    assert _rel_rms_error(x, qtype) < factor * _rel_rms_error(x, peer)
    zeros = np.zeros((2, 256), np.float32)  # an all-zero block must not divide by zero
    np.testing.assert_array_equal(dequantize(synth.encode(zeros, qtype), qtype), 0.0)


def test_q4_k_m_mix_follows_llamacpp(tmp_path):
    # 256-wide so K-quants apply to every matrix; n_ff 320 sends ffn_down to the fallbacks.
    spec = synth.SynthSpec("llama", n_layers=8, n_embd=256, n_heads=4, n_kv_heads=2, head_dim=64, n_ff=320,
                           n_vocab=300, tied=True, weight_type="Q4_K_M")
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "m.gguf"))
    six_bit_layers = {i for i in range(8) if i < 1 or i >= 7 or (i - 1) % 3 == 2}  # llama.cpp's use_more_bits
    assert six_bit_layers == {0, 3, 6, 7}
    for i in range(8):
        assert gf.tensor(f"blk.{i}.attn_v.weight").qtype == (Q.Q6_K if i in six_bit_layers else Q.Q4_K)
        assert gf.tensor(f"blk.{i}.ffn_down.weight").qtype == (Q.Q8_0 if i in six_bit_layers else Q.Q5_0)
        assert gf.tensor(f"blk.{i}.attn_q.weight").qtype == Q.Q4_K
        assert gf.tensor(f"blk.{i}.attn_norm.weight").qtype == Q.F32
    assert gf.tensor("token_embd.weight").qtype == Q.Q6_K  # tied: it is the output head
    # The file decodes to the weights synth drew, quantization aside.
    for name in ("token_embd.weight", "blk.3.attn_v.weight", "blk.1.attn_k.weight", "blk.2.ffn_down.weight"):
        t = gf.tensor(name)
        got = dequantize(t.raw, t.qtype).reshape(t.shape)
        want = synth.reference_weights(spec, name)
        assert np.sqrt(np.mean((got - want) ** 2)) / want.std() < 0.1, name
    logits = CPUBackend(gf, build_plan(build_spec(gf)), 16).forward([1, 2, 3], 0, n_logits=3)
    assert logits.shape == (3, 300) and np.isfinite(logits).all()
