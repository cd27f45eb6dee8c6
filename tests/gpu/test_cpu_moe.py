"""`--cpu-moe N` (infr/gpu/host_moe.py): the experts of the first N MoE layers stay in host memory
and run on the CPU reference, the rest of the model on the GPU. On a tiny qwen3moe model (3 MoE
layers): those layers' expert banks are never uploaded, the graph runs them as host steps, and
greedy tokens are the same as with every expert on the GPU, through forward/decode_greedy and
through the engine's batched steps. The flag and its INFR_CPU_MOE twin reach the model from
`infr run`, `infr serve` and the benchmark."""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
import pytest

from infr import bench, synth
from infr.engine import Model
from infr.errors import InfrError
from infr.gguf_file import open_gguf
from infr.gpu import host_moe as HM
from infr.gpu.backend import GPUBackend
from infr.models import build_spec
from infr.plan import build_plan
from infr.sampling import SamplingParams
from infr.scheduler import Request


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synth.write_gguf(synth.preset("tiny-qwen3moe", weight_type="Q8_0"), tmp_path_factory.mktemp("cm") / "q.gguf")


def _banks(layer: int) -> set[str]:
    return {f"blk.{layer}.{b}.weight" for b in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}


@pytest.mark.parametrize("n", [1, 2, 99])  # 99: more than the model has, so every MoE layer
def test_cpu_moe_layers_stay_on_the_host_with_the_same_tokens(gpu, tiny, n):
    gf = open_gguf(tiny)
    plan = build_plan(build_spec(gf))
    assert plan.spec.n_layers == 3
    base, mixed = GPUBackend(gf, plan, 64), GPUBackend(gf, plan, 64, cpu_moe=n)
    host = set(range(min(n, 3)))
    assert mixed.host_moe == host
    for layer in range(3):  # the host layers' banks are not uploaded; the others are
        assert _banks(layer).isdisjoint(mixed.weights) == (layer in host)
        assert _banks(layer) <= set(base.weights)
    saved = sum(gf.tensor(b).nbytes for layer in host for b in _banks(layer))
    assert base.vram - mixed.vram == saved
    body = mixed._graph(1, 1)[0]
    assert isinstance(body, HM.HostRecording)
    assert [p.op.layer for p in body.parts if isinstance(p, HM.HostMoE)] == sorted(host)
    assert mixed.multi_step == 1  # host round trips every step: the engine steps one at a time

    prompt = np.random.default_rng(0).integers(0, 512, 14).tolist()
    want = base.forward(prompt, 0, n_logits=14)
    got = mixed.forward(prompt, 0, n_logits=14)
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)  # f32 sums in another order, same 8-bit inputs
    first = int(np.argmax(want[-1]))
    tokens = base.decode_greedy(first, 14, 10)
    assert mixed.decode_greedy(first, 14, 10) == tokens
    assert len(set(tokens)) > 2


def test_cpu_moe_through_the_engine_batched(gpu, tiny):
    """Requests of several lengths share steps (padding rows included) and give the tokens the
    all-GPU model gives."""
    prompts = [list(range(1, 10)), list(range(5, 45)), [1, 2, 3]]
    greedy = SamplingParams(temperature=0.0)

    def go(model):
        reqs = [model.engine.submit(Request(list(p), greedy, max_new=6, ignore_eos=True)) for p in prompts]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
        return [r.output for r in reqs]

    mixed = Model(tiny, n_ctx=64, backend="gpu", parallel=3, cpu_moe=1)
    assert mixed.backend.host_moe == {0}
    got = go(mixed)
    assert mixed.engine.stats.max_rows >= len(prompts)
    assert got == go(Model(tiny, n_ctx=64, backend="gpu", parallel=3))


def test_decode_steps_refuses_a_model_with_host_experts(gpu, tiny):
    from infr.batch import Batch, OutputRow

    gf = open_gguf(tiny)
    be = GPUBackend(gf, build_plan(build_spec(gf)), 64, cpu_moe=1)
    batch = Batch.build([(0, [5], 3, list(range(be.blocks_per_seq)), 3)], [OutputRow(0, SamplingParams(temperature=0))])
    with pytest.raises(InfrError, match="cpu_moe"):
        next(be.decode_steps(batch, 2))


def test_bad_cpu_moe_is_refused(tiny, monkeypatch):
    with pytest.raises(InfrError, match="cpu_moe must be 0 or more"):
        Model(tiny, n_ctx=64, backend="cpu", cpu_moe=-1)
    with pytest.raises(InfrError, match="--cpu-moe takes a number"):
        HM.host_layers(build_plan(build_spec(open_gguf(tiny))), -2)
    monkeypatch.setenv("INFR_CPU_MOE", "two")
    with pytest.raises(InfrError, match="INFR_CPU_MOE='two' is not a valid int"):
        bench.cpu_moe_option(None)
    proc = subprocess.run([sys.executable, "-m", "infr", "run", str(tiny), "hi", "--raw", "--cpu-moe", "-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--cpu-moe must be >= 0" in proc.stderr


def test_cpu_moe_flags_and_their_environment_twin(monkeypatch):
    from infr import cli
    from infr.serve import server

    monkeypatch.setenv("INFR_CPU_MOE", "2")
    assert bench.cpu_moe_option(None) == 2 and bench.cpu_moe_option(1) == 1  # the flag wins
    assert bench._parser().parse_args(["-ncmoe", "3"]).cpu_moe == 3
    run_args = cli._parser().parse_args(["run", "m.gguf", "hi"])
    assert cli._options(run_args)["cpu_moe"] == 2
    assert cli._options(cli._parser().parse_args(["run", "m.gguf", "hi", "--cpu-moe", "4"]))["cpu_moe"] == 4
    p = argparse.ArgumentParser()
    server.add_parser(p.add_subparsers(dest="command"))
    assert server.config_from_args(p.parse_args(["serve"])).cpu_moe == 2
    assert server.config_from_args(p.parse_args(["serve", "--cpu-moe", "5"])).cpu_moe == 5
    monkeypatch.delenv("INFR_CPU_MOE")
    assert server.config_from_args(p.parse_args(["serve"])).cpu_moe == 0


def test_infr_run_with_cpu_moe_on_the_gpu(gpu, tiny):
    proc = subprocess.run([sys.executable, "-m", "infr", "run", str(tiny), "abc", "--raw", "--temp", "0",
                           "--max-new", "5", "--backend", "gpu", "--cpu-moe", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "generated: 5 tokens" in proc.stderr


def test_cpu_moe_on_llama4_keeps_the_shared_expert_on_the_gpu(gpu, tmp_path):
    """llama4 (MoE every 2nd layer, a shared expert, the weight before the expert): the first MoE
    layer's experts on the host, its router and shared expert still GPU dispatches."""
    gf = open_gguf(synth.write_gguf(synth.preset("tiny-llama4", weight_type="Q8_0"), tmp_path / "l4.gguf"))
    plan = build_plan(build_spec(gf))
    base, mixed = GPUBackend(gf, plan, 64), GPUBackend(gf, plan, 64, cpu_moe=1)
    assert mixed.host_moe == {1} and _banks(1).isdisjoint(mixed.weights) and _banks(3) <= set(mixed.weights)
    assert "blk.1.ffn_gate_shexp.weight" in mixed.weights
    prompt = np.random.default_rng(1).integers(0, 512, 12).tolist()
    np.testing.assert_allclose(mixed.forward(prompt, 0, n_logits=12), base.forward(prompt, 0, n_logits=12),
                               atol=1e-3, rtol=0)
    first = int(np.argmax(base.forward(prompt, 0)[-1]))
    assert mixed.decode_greedy(first, 12, 8) == base.decode_greedy(first, 12, 8)
