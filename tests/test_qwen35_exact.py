"""The hybrid DeltaNet family (qwen35) against llama.cpp, on infr.synth's tiny-qwen35 (random
weights, F32 and Q8_0): tests/fixtures/qwen35.json holds llama-server's probability vectors
(tests/fixtures/make_moe_fixtures.py --presets tiny-qwen35 --out tests/fixtures/qwen35.json).
The GGUF is regenerated and must be byte-identical to the one llama.cpp ran; infr's CPU reference
then runs teacher-forced rows of one prompt batch (the recurrence over a whole prompt) and a
prefill followed by one-token decode steps (the state carried step to step). Greedy tokens must be
identical and every probability within 1e-4 of llama.cpp's in F32. Q8_0 swaps in llama.cpp's
activation rounding, as tests/test_moe_exact.py explains; what is left then was measured at
2.5e-3 (the first teacher-forced row) and up to 2e-3 decoding, above the MoE models' 2e-3, and
is not explained yet (issue 15): hence MAX_DP_Q8.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from infr import synth
from tests.test_moe_exact import backend, check_decode, check_teacher, rows, use_llamacpp_rounding

FIXTURE = Path(__file__).parent / "fixtures" / "qwen35.json"
MAX_DP = 1e-4
MAX_DP_Q8 = 3e-3
DATA = json.loads(FIXTURE.read_text())
MODELS = sorted(DATA["models"])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35")
    cache: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in cache:
            m = DATA["models"][key]
            spec = replace(synth.PRESETS[m["preset"]], weight_type=m["weight_type"])
            cache[key] = synth.write_gguf(spec, root / f"{key}.gguf", seed=m["seed"])
        return cache[key]

    return get


@pytest.fixture
def q35_rounding(monkeypatch):
    """For key's weight type: the bound, with llama.cpp's activation rounding in place for Q8_0."""

    def use(key: str) -> float:
        if DATA["models"][key]["weight_type"] == "F32":
            return MAX_DP
        use_llamacpp_rounding(monkeypatch)
        return MAX_DP_Q8

    return use


def test_the_models_have_recurrent_layers(models):
    be = backend(models(MODELS[0]), DATA["n_ctx"])
    assert be.plan.recurrent and be.plan.kv  # both mixers: DeltaNet layers and gated attention


@pytest.mark.parametrize("key", MODELS)
def test_synth_file_is_the_one_llamacpp_ran(models, key):
    assert hashlib.sha256(models(key).read_bytes()).hexdigest() == DATA["models"][key]["sha256"]


@pytest.mark.parametrize("key", MODELS)
def test_teacher_forced_batch_matches_llamacpp(models, q35_rounding, key):
    check_teacher(DATA, models(key), key, q35_rounding(key))


@pytest.mark.parametrize("key", MODELS)
def test_greedy_decode_matches_llamacpp(models, q35_rounding, key):
    check_decode(DATA, models(key), key, q35_rounding(key))


def test_the_grouped_head_pairing_fails_the_oracle(models, monkeypatch):
    """An ablation: V-head h paired with K-head h // (H_v / H_k) (grouped) instead of h mod H_k (tiled)
    must miss llama.cpp by far more than the bound, or the oracle could not tell them apart."""
    from infr.cpu import deltanet

    key = next(k for k in MODELS if DATA["models"][k]["weight_type"] == "F32")
    m = DATA["models"][key]
    want = rows(m["teacher"], m["n_vocab"])
    be = backend(models(key), DATA["n_ctx"])
    monkeypatch.setattr(deltanet, "k_heads", lambda n_v, n_k: np.arange(n_v) // (n_v // n_k))
    got = be.forward(m["teacher"]["ids"], 0, n_logits=len(want))
    z = np.exp(got - got.max(axis=-1, keepdims=True))
    assert np.abs(z / z.sum(axis=-1, keepdims=True) - want).max() > 10 * MAX_DP
