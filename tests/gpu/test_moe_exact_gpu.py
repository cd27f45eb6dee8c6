"""The MoE families against llama.cpp on the GPU backend (lavapipe in CI): tests/test_moe_exact.py's
fixtures (llama-server's probabilities on tiny random-weight qwen3moe and llama4 files), run by
GPUBackend instead of the CPU reference. F32 only: with Q8_0 weights infr's 8-bit activation
rounding (f32 scale, halves to even) is not llama.cpp's, and the GPU kernels have no switch to
take llama.cpp's as the CPU reference's test does. Same bound, MAX_DP, and the same greedy tokens.

The llama4 prompt of 8200 tokens crosses the 8192-token attention chunk (keys before 8192 masked on
the chunked layers, tau(p) > 1 on the NoPE layer): ~90 s on lavapipe.
"""

from __future__ import annotations

import pytest

from infr.gguf_file import open_gguf
from infr.gpu.backend import GPUBackend
from infr.models import build_spec
from infr.plan import build_plan
from tests.test_moe_exact import DATA, MAX_DP, _long, assert_close, decode, models, rows  # noqa: F401 (fixture)

F32 = sorted(k for k, m in DATA["models"].items() if m["weight_type"] == "F32")
LONG_F32 = [k for k in F32 if "long" in DATA["models"][k]]


def _gpu(path, n_ctx: int) -> GPUBackend:
    gf = open_gguf(path)
    return GPUBackend(gf, build_plan(build_spec(gf)), n_ctx)


def test_both_families_are_covered():
    assert {DATA["models"][k]["preset"] for k in F32} == {"tiny-qwen3moe", "tiny-llama4"}
    assert LONG_F32 == ["tiny-llama4-F32"]


@pytest.mark.parametrize("key", F32)
def test_teacher_forced_batch_matches_llamacpp_on_the_gpu(gpu, models, key):
    m = DATA["models"][key]
    want = rows(m["teacher"], m["n_vocab"])
    got = _gpu(models(key), DATA["n_ctx"]).forward(m["teacher"]["ids"], 0, n_logits=len(want))
    assert_close(key, got, want, bound=MAX_DP)


@pytest.mark.parametrize("key", F32)
def test_greedy_decode_matches_llamacpp_on_the_gpu(gpu, models, key):
    m = DATA["models"][key]
    g = m["generate"]
    got = decode(_gpu(models(key), DATA["n_ctx"]), g["ids"], g["tokens"])
    assert_close(key, got, rows(g, m["n_vocab"]), g["tokens"], MAX_DP)


@pytest.mark.parametrize("key", LONG_F32)
def test_llama4_prompt_past_the_attention_chunk_matches_llamacpp_on_the_gpu(gpu, models, key):
    m, ids = _long(key)
    lg = m["long"]
    assert len(ids) > 8192 + 1
    got = decode(_gpu(models(key), DATA["long_ctx"]), ids, lg["tokens"])
    assert_close(key, got, rows(lg, m["n_vocab"]), lg["tokens"], MAX_DP)
