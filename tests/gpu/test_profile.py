"""The profiler: GPU time per dispatch from timestamps inside the pass (or around a pass per
dispatch), labelled and aggregated."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infr import synth
from infr.gguf_file import open_gguf
from infr.gpu import profile
from infr.models import build_spec
from infr.plan import build_plan


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    spec = synth.preset("tiny-llama", n_embd=256, n_ff=512, head_dim=64, weight_type="Q4_K")
    return synth.write_gguf(spec, tmp_path_factory.mktemp("profile") / "tiny.gguf")


@pytest.mark.parametrize("per_pass", [False, True], ids=["in-pass", "pass-per-dispatch"])
def test_profile_covers_every_dispatch_of_the_decode_loop(gpu, tiny, per_pass):
    """Timestamps inside the pass (wgpu-native), and a pass per dispatch between pass timestamps
    (what Dawn has; forced here on lavapipe): the same dispatches timed, the same tokens."""
    from infr.gpu.backend import GPUBackend

    if not gpu.has("timestamp-query-inside-passes"):
        pytest.skip("this adapter lacks timestamp-query-inside-passes, so there is nothing to time per dispatch (lavapipe in CI has it)")
    gf = open_gguf(tiny)
    be = GPUBackend(gf, build_plan(build_spec(gf)), 64, dev=gpu)
    be.forward([1, 2, 3], 0)
    per_token = len(be._multi_step(1, False))
    with profile.profile(per_pass=per_pass) as p:
        be.decode_greedy(5, 3, 10, per_submit=4)  # three submits: 4 + 4 + 2 steps
        assert profile.timer_for(gpu).per_pass == per_pass
    res = p.result
    assert res.tokens == 10
    assert res.dispatches == 10 * per_token  # every dispatch of every step timed, none twice
    assert sum(r.count for r in res.rows) == res.dispatches
    kernels = set(res.by_kernel())
    # every kernel of the step (the fusions the tuning takes decide which: INFR_GEMV_Q8, INFR_GEMV_ROPE)
    asked = {d.label.split()[0] for d in be._multi_step(1, False).dispatches}
    assert asked <= kernels, (asked - kernels, kernels)
    assert {"embed_q4_k", "rmsnorm_q8", "attention", "gemv_q4_k", "argmax", "step"} <= asked
    assert any(k.startswith("gemv_q4_k_stacked") for k in asked) and any("_gate_up" in k for k in asked)
    assert all(r.total_us > 0 for r in res.rows)  # lavapipe runs each dispatch for real time
    assert abs(sum(r.total_us for r in res.rows) - res.gpu_us) < 1e-6 * res.gpu_us + 1e-9
    gemv = [r for r in res.rows if r.kernel.startswith("gemv")]
    assert gemv and all(r.gbps and r.gbps > 0 for r in gemv)  # weight ops carry their bytes
    # Same tokens with the profiler as without: timing does not change the work.
    assert be.decode_greedy(5, 3, 10) == be.decode_greedy(5, 3, 10)
    assert res.host_us["encode"] > 0 and json.dumps(res.to_json())


def test_profiler_off_encodes_no_timestamps(gpu, tiny):
    assert profile.timer_for(gpu) is None  # outside `profile()`: the backend's fast path


def test_infr_profile_env_prints_a_table_at_exit(tiny):
    env = {**os.environ, "INFR_PROFILE": "1"}
    code = (
        "from infr.gguf_file import open_gguf; from infr.models import build_spec; from infr.plan import build_plan;"
        "from infr.gpu.backend import GPUBackend;"
        f"gf = open_gguf({str(tiny)!r}); be = GPUBackend(gf, build_plan(build_spec(gf)), 64);"
        "print(be.decode_greedy(1, 0, 4))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "gemv_q4_k" in out.stderr and "GPU time" in out.stderr and "host µs/token" in out.stderr
