"""The Dawn tier (`--backend dawn`: the same plan and kernels through wgpudawn) against the CPU
reference. Dawn refuses lavapipe (a software Vulkan driver without the descriptor-indexing
features Dawn requires), so these run where Dawn finds a hardware adapter (the H200) and skip
on CPU-only machines, CI's included, where the GPU tests run on lavapipe through wgpu-native.
The kernel tests run on Dawn too with INFR_TEST_FLAVOR=dawn."""

from __future__ import annotations

import os

import numpy as np
import pytest

from closeness import assert_gpu_follows_cpu  # tests/ is on sys.path
from infr import synth
from infr.cpu.backend import CPUBackend
from infr.errors import InfrError
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.plan import build_plan


@pytest.fixture(scope="module")
def dawn():
    if os.environ.get("CI"):  # the test extra installs it: missing there is a broken install
        import wgpudawn  # noqa: F401
    else:
        pytest.importorskip("wgpudawn", reason="wgpudawn (in the test extra and the dawn extra) is not installed")
    from infr.gpu.device import get_device

    try:
        dev = get_device(flavor="dawn")
    except InfrError as e:
        pytest.skip(f"Dawn finds no hardware GPU here (it refuses software Vulkan such as lavapipe): {e}")
    if dev.is_cpu or dev.info.get("backend_type") == "Null":
        pytest.skip(f"Dawn's only adapter here is {dev.name}, which runs no kernels (a CPU or Null adapter)")
    return dev


def test_device_names_features_as_infr(dawn):
    assert dawn.dawn and dawn.api.__name__ == "wgpudawn"
    assert "subgroup" in dawn.features and dawn.subgroup_size == 32  # Dawn's "subgroups", probed by a kernel


@pytest.mark.parametrize("weight_type", ["Q4_K_M", "Q6_K", "Q8_0"])
def test_greedy_equals_cpu(tmp_path, dawn, weight_type):
    """A synthetic model of each mix: a 40-token prefill (mmq, tiled attention) gives the CPU
    reference's logits, and greedy decode its tokens, on Dawn."""
    from infr.gpu.backend import GPUBackend

    spec = synth.preset("tiny-llama", n_layers=4, n_embd=256, n_ff=512, n_heads=4, n_kv_heads=2, head_dim=64,
                        weight_type=weight_type)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "m.gguf"))
    plan = build_plan(build_spec(gf))
    be, cpu_be = GPUBackend(gf, plan, 96, dev=dawn), CPUBackend(gf, plan, 96)
    assert be.name == "dawn"
    assert_gpu_follows_cpu(be, cpu_be, np.random.default_rng(2).integers(0, spec.n_vocab, 40).tolist(), 12)


def test_engine_batched_equals_alone_and_cpu(tmp_path, dawn):
    """`Model(..., backend="dawn")`: requests sharing steps give what each gives alone on Dawn, and
    the CPU reference's tokens."""
    from infr.engine import Model
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    def run(model, prompts, **kw):
        reqs = [model.engine.submit(Request(list(p), SamplingParams(temperature=0.0), max_new=7, ignore_eos=True,
                                            **kw)) for p in prompts]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
        return [r.output for r in reqs]

    path = synth.write_gguf(synth.preset("tiny-llama", tokenizer="gpt2", weight_type="Q4_K_M"), tmp_path / "t.gguf")
    prompts = [list(range(1, 10)), list(range(5, 45)), [1, 2, 3], list(range(100, 170))]
    model = Model(path, n_ctx=128, backend="dawn", parallel=len(prompts))
    assert model.backend_name == "dawn" and model.backend.dev.dawn
    together = run(model, prompts)
    assert model.engine.stats.max_rows >= len(prompts)
    alone = [run(model, [p], cache_prompt=False)[0] for p in prompts]
    assert together == alone == run(Model(path, n_ctx=128, backend="cpu", parallel=len(prompts)), prompts)
