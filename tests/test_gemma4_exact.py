"""gemma4 against llama.cpp, on infr.synth's tiny-gemma4 (31B-style dense), tiny-gemma4-e2b (per-layer
embeddings, KV-shared layers, double-wide FFN) and tiny-gemma4-moe (26B-style dense FFN beside routed
experts), random weights in F32 and Q8_0: tests/fixtures/gemma4.json holds llama-server's probability
vectors (tests/fixtures/make_moe_fixtures.py --presets tiny-gemma4 tiny-gemma4-e2b tiny-gemma4-moe
--out tests/fixtures/gemma4.json). The GGUF is regenerated and must be byte-identical to the one
llama.cpp ran; the CPU reference then runs teacher-forced rows of one 40-token prompt batch (past the
8-token sliding window) and a prefill followed by one-token decode steps. Greedy tokens must be
identical and every probability within 1e-4 of llama.cpp's in F32 (measured: up to 7.6e-6).

Q8_0 runs with llama.cpp's activation rounding in place (tests/test_moe_exact.py says why); left then
was up to 2.3e-4 (dense, teacher-forced) and 2.1e-3 (MoE, decoding), where a rounding step or a
router near-tie falls the other way after f32 sums in another order: hence MAX_DP_Q8.

Ablations (each must miss llama.cpp by far more than the bound, or the oracle could not tell): the
router reading the normed FFN input instead of the raw residual, no V norm, a KV-shared layer
reading the wrong layer's cache. (Exact GELU in place of llama.cpp's fp16 table measured 1.2e-5:
within the bound on these models, whose final norm keeps 1-ulp effects small, infr/synth_gemma4.py.)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from infr.cpu.backend import CPUBackend
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.ops import MatMul
from infr.plan import build_plan
from tests.test_moe_exact import backend, check_decode, check_teacher, rows, softmax, synth_models

FIXTURE = Path(__file__).parent / "fixtures" / "gemma4.json"
MAX_DP = 1e-4
MAX_DP_Q8 = 3e-3
DATA = json.loads(FIXTURE.read_text())
MODELS = sorted(DATA["models"])


models = synth_models(DATA, "gemma4")


def g4_rounding(key: str) -> float:
    """The bound for key's weight type (backend() builds the oracle plan with llama.cpp's rounding)."""
    return MAX_DP if DATA["models"][key]["weight_type"] == "F32" else MAX_DP_Q8


def test_the_fixture_prompts_cross_the_window(models):
    be = backend(models("tiny-gemma4-F32"), DATA["n_ctx"])
    windows = {st.window for st in be.plan.kv}
    assert None in windows and 8 in windows
    assert all(len(DATA["models"][k]["teacher"]["ids"]) > 4 * 8 for k in MODELS)


@pytest.mark.parametrize("key", MODELS)
def test_synth_file_is_the_one_llamacpp_ran(models, key):
    assert hashlib.sha256(models(key).read_bytes()).hexdigest() == DATA["models"][key]["sha256"]


@pytest.mark.parametrize("key", MODELS)
def test_teacher_forced_batch_matches_llamacpp(models, key):
    check_teacher(DATA, models(key), key, g4_rounding(key))


@pytest.mark.parametrize("key", MODELS)
def test_greedy_decode_matches_llamacpp(models, key):
    check_decode(DATA, models(key), key, g4_rounding(key))


def _miss(be: CPUBackend, key: str) -> float:
    """The largest |p_infr - p_llama.cpp| of key's teacher-forced rows on backend be."""
    m = DATA["models"][key]
    want = rows(m["teacher"], m["n_vocab"])
    return float(np.abs(softmax(be.forward(m["teacher"]["ids"], 0, n_logits=len(want))) - want).max())


def _plan_backend(path: Path, edit) -> CPUBackend:
    gf = open_gguf(path)
    plan = build_plan(build_spec(gf))
    return CPUBackend(gf, edit(plan), DATA["n_ctx"])


def test_routing_on_the_normed_state_fails_the_oracle(models):
    """The router on the FFN's normed input (pre_ffw_norm_2) instead of the raw residual scaled by
    ffn_gate_inp.scale: the mistake mlx-vlm made (wave2-families.md section 3.3)."""
    key = "tiny-gemma4-moe-F32"

    def normed(plan):
        swap = lambda op: replace(op, src="h") if isinstance(op, MatMul) and op.dst == "router" else op  # noqa: E731
        return replace(plan, layers=tuple(swap(op) for op in plan.layers))

    assert _miss(backend(models(key), DATA["n_ctx"]), key) <= MAX_DP
    assert _miss(_plan_backend(models(key), normed), key) > 10 * MAX_DP


def test_no_v_norm_fails_the_oracle(models):
    key = "tiny-gemma4-F32"

    def no_v_norm(spec):
        return replace(spec, layers=tuple(replace(la, attention=replace(la.attention, v_norm=False))
                                          for la in spec.layers))

    assert _miss(backend(models(key), DATA["n_ctx"], no_v_norm), key) > 10 * MAX_DP


def test_shared_layers_reading_the_wrong_cache_fail_the_oracle(models):
    """Every KV-shared layer reading the first layer of its kind (not llama.cpp's n - s - 2 / - 1)."""
    key = "tiny-gemma4-e2b-F32"

    def first_of_kind(spec):
        first = {}
        for la in spec.layers:
            first.setdefault(la.attention.sliding_window, la.index)
        return replace(spec, layers=tuple(la if la.kv_from is None else
                                          replace(la, kv_from=first[la.attention.sliding_window])
                                          for la in spec.layers))

    assert _miss(backend(models(key), DATA["n_ctx"], first_of_kind), key) > 10 * MAX_DP
