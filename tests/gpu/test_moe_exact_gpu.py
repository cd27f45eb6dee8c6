"""The MoE families against llama.cpp on the GPU backend (lavapipe in CI): tests/test_moe_exact.py's
fixtures (llama-server's probabilities on tiny random-weight qwen3moe and llama4 files), run by
GPUBackend instead of the CPU reference, on the same plan: llama.cpp's activation rounding
(test_moe_exact.oracle_plan, Plan.q8_rounding = "llamacpp"), which the GPU kernels that round take
as a compile-time switch (wgsl/q8_round_llamacpp.wgsl, gemm_q8_llamacpp.wgsl). The same bounds as
the CPU test (MAX_DP for F32, MAX_DP_Q8 for Q8_0) and the same greedy tokens.

Measured on lavapipe (Q8_0): qwen3moe 7.1e-4 teacher-forced (the CPU reference 6.6e-4: llama.cpp's
batch), 5.1e-4 decoding (the CPU 3e-8); llama4 3e-8 teacher-forced, 1.8e-4 decoding (as the CPU).
qwen3moe's decode is further than the CPU's from step 11 on: four values of layer 0's f16 V cache
round one f16 step apart on the GPU (f32 sums in another order land them on the other side of an
f16 half step), that moves the attention output by ~1e-5 relative, and at position 18 a value of
layer 1's q|k|v input 3.5e-5 from an 8-bit half step rounds to the other neighbour: layer 1 and 2's
K and V at position 18 differ from there on. Not the rounding mode: with infr's rounding both
backends are 7.7e-3 from llama.cpp, with two greedy tokens different.

The llama4 prompt of 8200 tokens crosses the 8192-token attention chunk (keys before 8192 masked on
the chunked layers, tau(p) > 1 on the NoPE layer): ~90 s on lavapipe, so F32 only.
"""

from __future__ import annotations

import pytest

from infr.gguf_file import open_gguf
from infr.gpu.backend import GPUBackend
from infr.numerics import LLAMACPP
from tests.test_moe_exact import (DATA, _long, assert_close, bound, decode, models, oracle_plan,  # noqa: F401 (fixture)
                                  rows)

KEYS = sorted(DATA["models"])
LONG_F32 = [k for k in KEYS if "long" in DATA["models"][k] and DATA["models"][k]["weight_type"] == "F32"]


def _gpu(path, n_ctx: int) -> GPUBackend:
    gf = open_gguf(path)
    be = GPUBackend(gf, oracle_plan(gf), n_ctx)
    assert be.kern.q8_rounding == LLAMACPP  # the kernels round as the plan says
    return be


def test_both_families_are_covered():
    assert {(DATA["models"][k]["preset"], DATA["models"][k]["weight_type"]) for k in KEYS} == {
        (p, w) for p in ("tiny-qwen3moe", "tiny-llama4") for w in ("F32", "Q8_0")}
    assert LONG_F32 == ["tiny-llama4-F32"]


@pytest.mark.parametrize("key", KEYS)
def test_teacher_forced_batch_matches_llamacpp_on_the_gpu(gpu, models, key):
    m = DATA["models"][key]
    want = rows(m["teacher"], m["n_vocab"])
    got = _gpu(models(key), DATA["n_ctx"]).forward(m["teacher"]["ids"], 0, n_logits=len(want))
    assert_close(key, got, want, bound=bound(key))


@pytest.mark.parametrize("key", KEYS)
def test_greedy_decode_matches_llamacpp_on_the_gpu(gpu, models, key):
    m = DATA["models"][key]
    g = m["generate"]
    got = decode(_gpu(models(key), DATA["n_ctx"]), g["ids"], g["tokens"])
    assert_close(key, got, rows(g, m["n_vocab"]), g["tokens"], bound(key))


@pytest.mark.parametrize("key", LONG_F32)
def test_llama4_prompt_past_the_attention_chunk_matches_llamacpp_on_the_gpu(gpu, models, key):
    m, ids = _long(key)
    lg = m["long"]
    assert len(ids) > 8192 + 1
    got = decode(_gpu(models(key), DATA["long_ctx"]), ids, lg["tokens"])
    assert_close(key, got, rows(lg, m["n_vocab"]), lg["tokens"], bound(key))
