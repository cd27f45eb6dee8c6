"""gemma4 against llama.cpp on the GPU backend (lavapipe in CI): tests/test_gemma4_exact.py's fixtures
(llama-server's probabilities on tiny-gemma4, tiny-gemma4-e2b and tiny-gemma4-moe), run by GPUBackend
on the oracle plan (llama.cpp's activation rounding, as tests/gpu/test_moe_exact_gpu.py), with the CPU
test's bounds (F32 1e-4, Q8_0 3e-3) and the same greedy tokens. The table GELU reads the CPU
reference's table, so the GPU differs from it only by f32 sums in another order.
Measured on lavapipe (teacher-forced / decoding): F32 1.0e-5 / 4.7e-6 (dense), 6.8e-6 / 3.8e-6 (e2b),
8.8e-6 / 9.4e-6 (moe); Q8_0 1.8e-8 / 2.9e-8 (dense), 2.4e-8 / 3.4e-5 (e2b).

tiny-gemma4-moe in Q8_0 is refused on the GPU: its experts' FFN is 32 wide, and the int8 expert GEMV
takes rows of whole 64-value groups (tests/gpu/test_gemma4_gpu.py checks the refusal)."""

from __future__ import annotations

import pytest

from infr.gguf_file import open_gguf
from infr.gpu.backend import GPUBackend
from infr.numerics import LLAMACPP
from tests.test_gemma4_exact import DATA, g4_rounding, models  # noqa: F401 (fixture)
from tests.test_moe_exact import assert_close, decode, oracle_plan, rows

REFUSED = {"tiny-gemma4-moe-Q8_0"}
KEYS = [k for k in sorted(DATA["models"]) if k not in REFUSED]


def _gpu(path, n_ctx: int) -> GPUBackend:
    gf = open_gguf(path)
    be = GPUBackend(gf, oracle_plan(gf), n_ctx)
    assert be.kern.q8_rounding == LLAMACPP
    return be


def test_every_fixture_but_the_refused_one_runs():
    assert len(KEYS) == 5 and REFUSED <= set(DATA["models"])


@pytest.mark.parametrize("key", KEYS)
def test_teacher_forced_batch_matches_llamacpp_on_the_gpu(gpu, models, key):
    m = DATA["models"][key]
    want = rows(m["teacher"], m["n_vocab"])
    got = _gpu(models(key), DATA["n_ctx"]).forward(m["teacher"]["ids"], 0, n_logits=len(want))
    assert_close(key, got, want, bound=g4_rounding(key))


@pytest.mark.parametrize("key", KEYS)
def test_greedy_decode_matches_llamacpp_on_the_gpu(gpu, models, key):
    m = DATA["models"][key]
    g = m["generate"]
    got = decode(_gpu(models(key), DATA["n_ctx"]), g["ids"], g["tokens"])
    assert_close(key, got, rows(g, m["n_vocab"]), g["tokens"], g4_rounding(key))
