"""infr.notebook and infr.gpu.measure, the notebooks' helpers, on a small synthetic model and small kernels."""

from __future__ import annotations

import numpy as np
import pytest

from infr import synth


@pytest.fixture(scope="module")
def model(gpu, tmp_path_factory):
    from infr.engine import Model

    spec = synth.preset("tiny-llama", n_embd=256, n_ff=512, head_dim=64, weight_type="Q4_K", tokenizer="gpt2")
    path = synth.write_gguf(spec, tmp_path_factory.mktemp("nbhelpers") / "small.gguf")
    return Model(path, n_ctx=64, backend="gpu")


def test_profiled_generate_times_every_step_of_a_greedy_run(model):
    from infr.notebook import family_coverage, profiled_generate

    prompt = [1, 2, 3, 4, 5]
    seen = []
    run = profiled_generate(model, prompt, 6, on_step=lambda r: seen.append(len(r.steps)))
    assert seen == [1, 2, 3, 4, 5, 6]
    assert [s.kind for s in run.steps] == ["prefill"] + ["decode"] * 5
    assert [s.context for s in run.steps] == list(range(5, 11))
    # the same tokens as an unprofiled greedy loop
    s = model.session()
    logits, want = s.prefill(prompt), []
    for i in range(6):
        want.append(int(np.argmax(logits)))
        if i < 5:
            logits = s.decode(want[-1])
    assert run.tokens == want
    kernels = run.by_kernel()
    assert abs(sum(kernels.values()) - run.gpu_us) <= 1e-6 * run.gpu_us
    assert sum(a["count"] for a in run.by_label().values()) == sum(st.result.dispatches for st in run.steps)
    assert run.gbps() and all(g > 0 for g in run.gbps().values())  # weight kernels carry their bytes
    assert 0 < run.gpu_us and 0 < run.sync_us <= run.wall_us
    coverage = family_coverage(model.plan, kernels)
    assert set(coverage) >= {"Embed", "RMSNorm", "MatMul", "Rope", "StoreKV", "Attention", "GatedAct"}
    assert all(coverage.values()), coverage
    no_rope = {k: v for k, v in kernels.items() if not k.startswith("rope")}
    assert not family_coverage(model.plan, no_rope)["Rope"]


def test_matmul_case_checks_and_times_the_kernel(gpu, kernels):
    from infr.gpu import measure

    for qtype in ("q8_0", "q4_k"):
        c = measure.matmul_case(gpu, kernels, qtype, 96, 512, reps=2)
        assert c.max_err < 1e-5, (qtype, c.max_err)
        assert c.us > 0 and abs(sum(c.kernel_us.values()) - c.us) < 1e-9 * c.us
        assert any(label.endswith("96x512") for label in c.kernel_us)
        assert c.weight_bytes == 96 * 512 // 32 * 34 if qtype == "q8_0" else c.weight_bytes == 96 * 512 // 256 * 144


def test_read_bandwidth_and_live_plot_outside_ipython(gpu):
    from infr.gpu import measure
    from infr.notebook import LivePlot

    bw = measure.read_bandwidth(gpu, nbytes=4 << 20, reps=2)
    assert bw.nbytes == 4 << 20 and bw.seconds > 0 and bw.gbps == pytest.approx(bw.nbytes / bw.seconds / 1e9)
    live = LivePlot(1, 2)
    live.axes[0].plot([0, 1], [1, 2])
    assert live.png().startswith(b"\x89PNG")
    live.update()  # never shown: nothing to redraw, nothing counted
    assert live.updates == 0
