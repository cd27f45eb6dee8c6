"""The GPU backend end to end: greedy tokens equal the CPU reference's on the
three real models (one Gemma prompt past its 512-token sliding window)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from closeness import assert_logits_close, assert_same_top1, greedy_tokens, rounds_activations

from infr.cpu.backend import CPUBackend
from infr.gguf_file import open_gguf
from infr.gpu.backend import MAX_BATCH, GPUBackend
from infr.models import build_spec
from infr.plan import build_plan

FIXTURES = Path(__file__).parent.parent / "fixtures"
MODELS = {"smollm2-135m": "smollm2_path", "gemma3-270m": "gemma3_path", "qwen2.5-coder-0.5b": "qwen_coder_path"}
N_TOKENS = 16


def _prompts(name: str) -> list[list[int]]:
    cases = json.loads((FIXTURES / f"generation_{name}.json").read_text())["cases"]
    chosen = [cases[0]["prompt_ids"]]
    longest = max(cases, key=lambda c: len(c["prompt_ids"]))
    chosen.append(longest["prompt_ids"] if name == "gemma3-270m" else cases[-1]["prompt_ids"])
    return chosen


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request, gpu):
    name = request.param
    gf = open_gguf(request.getfixturevalue(MODELS[name]))
    plan = build_plan(build_spec(gf))
    n_ctx = max(len(p) for p in _prompts(name)) + N_TOKENS + 8
    return name, GPUBackend(gf, plan, n_ctx, dev=gpu), CPUBackend(gf, plan, n_ctx)


def test_greedy_tokens_equal_cpu_reference(pair):
    name, gpu_be, cpu_be = pair
    prompts = _prompts(name)
    if name == "gemma3-270m":
        assert len(prompts[1]) > max(512, MAX_BATCH)  # past the window, and prefilled in several chunks
    for prompt in prompts:
        assert greedy_tokens(gpu_be, prompt, N_TOKENS) == greedy_tokens(cpu_be, prompt, N_TOKENS), (name, len(prompt))


def test_gpu_resident_greedy_equals_host_loop(pair):
    name, gpu_be, _ = pair
    prompt = _prompts(name)[0]
    expected = greedy_tokens(gpu_be, prompt, 12)
    first = int(np.argmax(gpu_be.forward(prompt, 0)[-1]))
    assert [first] + gpu_be.decode_greedy(first, len(prompt), 11, per_submit=4) == expected


def test_prefill_then_decode_equals_token_by_token(pair):
    name, gpu_be, cpu_be = pair
    ids = _prompts(name)[0][:12]
    batch = gpu_be.forward(ids, 0, n_logits=len(ids))
    steps = np.stack([gpu_be.forward([t], i)[-1] for i, t in enumerate(ids)])
    q8 = rounds_activations(gpu_be.gf, gpu_be.plan)
    assert_logits_close(steps, batch, q8)
    assert_same_top1(steps, batch, q8)
    ref = cpu_be.forward(ids, 0, n_logits=len(ids))
    assert_logits_close(batch, ref, q8)


def test_vram_and_dispatch_report(pair):
    name, gpu_be, _ = pair
    gf = gpu_be.gf
    assert gf.file_size * 0.9 < gpu_be.vram  # every weight uploaded once, in its block layout
    assert gpu_be.vram < gf.file_size * 1.5 + 64 * 2**20
    assert gpu_be.dispatches_per_token > 10 * gpu_be.plan.spec.n_layers
