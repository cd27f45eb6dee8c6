"""Smoke runs of perf scripts that the next device session depends on: they run on this adapter at a
small size and print what they promise (their timings are not asserted: benchmarks say speed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def test_attn_prefill_wide_compares_the_two_kernels(gpu):
    """--wide: the one-pass kernel and attn_tiled at head dim 512 on the same q, K, V agree (their
    largest difference is printed) for Gemma 4's E2B and 26B full-layer shapes."""
    lines = _run("perf/attn_prefill_time.py", "--wide", "--T", "24", "--reps", "1")
    rows = [ln.split() for ln in lines if ln.startswith(("8/1 x 512", "16/2 x 512"))]
    assert len(rows) == 2
    for r in rows:
        assert float(r[3]) > 0 and float(r[4]) > 0
        diff = float(r[7]) if r[5] == "(no" else float(r[6])  # after the attn_tiled2 column or "(no room)"
        assert diff < 2e-3  # max |diff| of the outputs (each kernel is held to the CPU reference elsewhere)


def test_prompt_host_time_splits_a_forward(gpu):
    """perf/prompt_host_time.py: per forward, the time in submit and in the read-back are both caught
    (each forward submits and waits), within the wall time, and the dispatch count is that of the
    graph the forward ran."""
    lines = _run("perf/prompt_host_time.py", "tiny-llama", "--T", "20", "--reps", "1")
    row = next(ln.split() for ln in lines if ln.startswith("tiny-llama"))
    forward, submit, wait, n = float(row[1]), float(row[2]), float(row[3]), int(row[5])
    assert submit > 0 and wait > 0 and submit + wait <= forward
    from infr import bench
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    gf = open_gguf(bench.synth_path("tiny-llama"))  # the file the script ran
    body, head, _ = GPUBackend(gf, build_plan(build_spec(gf)), 64)._graph(20, 1)
    assert n == len(body.dispatches) + len(head.dispatches)


def test_decode_host_time_splits_a_step(gpu):
    """perf/decode_host_time.py: per decode step, the time encoding and in submit are both caught and
    within the step's wall time, and a step encodes the dispatches of the multi-step graph (the same
    count every step: 16 steps after a 20-token prompt stay near)."""
    lines = _run("perf/decode_host_time.py", "tiny-llama", "--n", "16", "--depth", "20", "--reps", "1")
    row = next(ln.split() for ln in lines if ln.startswith("tiny-llama"))
    step, encode, submit, n = float(row[1]), float(row[2]), float(row[3]), float(row[5])
    assert encode > 0 and submit > 0 and encode + submit <= step
    from infr import bench
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    gf = open_gguf(bench.synth_path("tiny-llama"))  # the file the script ran
    be = GPUBackend(gf, build_plan(build_spec(gf)), 64)
    assert n == len(be._multi_step(1, False, be._sampling().load([])))


def test_ab_runs_takes_variants_in_turn(gpu, tmp_path):
    """perf/ab_runs.py: a snapshot of a commit's code runs as a variant of its own (its infr imported, not
    this tree's), beside this tree with and without an environment setting, round after round; a
    variant whose run fails gets its error on its line and the others go on."""
    import json
    import shutil

    import pytest

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the snapshot is made from git (perf/ab_runs.py snapshot runs where the repository is)")
    base = tmp_path / "base"
    _run("perf/ab_runs.py", "snapshot", "HEAD", str(base))
    (base / "infr" / "__init__.py").write_text("raise SystemExit('the snapshot was imported')\n")
    out = tmp_path / "ab.json"
    lines = _run("perf/ab_runs.py", "run", "synth:tiny-llama", "-p", "8", "-n", "4", "-r", "2", "--rounds", "2",
                 "--backend", "gpu", "--variant", f"snap=@{base}", "--variant", "tree=",
                 "--variant", "bad=INFR_MMA_VW=0,INFR_ATTN_MMA=16,31", "--out", str(out))
    runs = json.loads(out.read_text())["runs"]
    # a run's two tests each a line; the snapshot's and the bad setting's runs one error line each
    assert [(r["variant"], r["test"]) for r in runs] == [("snap", "pp8+tg4"), ("tree", "pp8"), ("tree", "tg4"),
                                                         ("bad", "pp8+tg4")] * 2
    assert all("the snapshot was imported" in r["error"] for r in runs if r["variant"] == "snap")
    assert all("16,31" in r["error"] for r in runs if r["variant"] == "bad")  # the value kept its comma
    for r in (r for r in runs if r["variant"] == "tree"):
        assert len(r["samples"]) == 2 and r["best"] == max(r["samples"]) > 0
    assert sum(ln.endswith("[tree]") and " best " in ln for ln in lines) == 4
