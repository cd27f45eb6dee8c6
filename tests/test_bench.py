"""`python -m infr.bench`: llama-bench's tests, columns and keys, on real runs of small models (CPU)."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics

import numpy as np
import pytest

from infr import bench
from infr.errors import InfrError
from infr.gguf_file import open_gguf

# Keys llama-bench writes (seen in its JSON output) that infr fills too.
LLAMA_BENCH_KEYS = {
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_threads", "n_gpu_layers", "type_k", "type_v", "n_prompt", "n_gen",
    "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts",
}
MD_HEADER = ["model", "size", "params", "backend", "threads", "test", "t/s"]
ARGS = ["-p", "8,16", "-n", "4", "-pg", "8,2", "-d", "0,8", "-r", "2", "--backend", "cpu"]
# llama-bench's order: per depth, pp tests, tg tests, then pp+tg
EXPECTED = [(8, 0, 0), (16, 0, 0), (0, 4, 0), (8, 2, 0), (8, 0, 8), (16, 0, 8), (0, 4, 8), (8, 2, 8)]
NAMES = ["pp8", "pp16", "tg4", "pp8+tg2", "pp8 @ d8", "pp16 @ d8", "tg4 @ d8", "pp8+tg2 @ d8"]


@pytest.fixture(scope="module")
def synth_env(tmp_path_factory):
    """A private cache for the synthetic GGUFs."""
    mp = pytest.MonkeyPatch()
    mp.setenv("INFR_CACHE", str(tmp_path_factory.mktemp("infr-cache")))
    yield
    mp.undo()


def run_main(capsys, *argv) -> str:
    assert bench.main(list(argv)) == 0
    return capsys.readouterr().out


def check_record(r: dict, backend_size: int) -> None:
    assert LLAMA_BENCH_KEYS <= set(r)
    n_tokens = r["n_prompt"] + r["n_gen"]
    assert len(r["samples_ns"]) == len(r["samples_ts"]) == 2
    for ns, ts in zip(r["samples_ns"], r["samples_ts"]):
        assert isinstance(ns, int) and ns > 0
        assert ts == pytest.approx(n_tokens * 1e9 / ns)
    assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]))
    assert r["stddev_ts"] == pytest.approx(statistics.stdev(r["samples_ts"]))
    assert abs(r["avg_ns"] - statistics.fmean(r["samples_ns"])) <= 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])
    assert r["backends"] == "CPU" and r["n_gpu_layers"] == 0 and r["n_threads"] >= 1
    assert r["model_size"] == backend_size
    assert r["model_type"].startswith("llama ")


def test_json_has_llama_bench_keys_and_tests(synth_env, capsys):
    results = json.loads(run_main(capsys, "-m", "synth:tiny-llama", *ARGS, "-o", "json"))
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in results] == EXPECTED
    path = bench.model_path("synth:tiny-llama")
    size = sum(t.nbytes for t in open_gguf(path).tensors.values())
    for r in results:
        check_record(r, size)
        assert r["model_filename"] == str(path)
        assert r["model_type"].endswith(" Q4_K - Medium")  # no :TYPE: llama.cpp's Q4_K_M mix


def test_jsonl_and_csv_and_md(synth_env, capsys, tmp_path):
    saved = tmp_path / "out" / "bench.json"
    lines = run_main(capsys, "-m", "synth:tiny-llama:Q8_0", *ARGS, "-o", "jsonl", "--save", str(saved))
    records = [json.loads(line) for line in lines.splitlines()]
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in records] == EXPECTED
    assert all(r["model_type"].endswith(" Q8_0") for r in records)
    assert json.loads(saved.read_text()) == records  # --save: the JSON results, whatever -o prints

    rows = list(csv.DictReader(io.StringIO(bench.render(records, "csv"))))
    assert len(rows) == len(EXPECTED)
    assert (LLAMA_BENCH_KEYS - {"samples_ns", "samples_ts"}) <= set(rows[0])  # llama-bench's CSV has no lists
    for row, r in zip(rows, records):
        assert (int(row["n_prompt"]), int(row["n_gen"]), int(row["n_depth"])) == (r["n_prompt"], r["n_gen"], r["n_depth"])
        assert float(row["avg_ts"]) == pytest.approx(r["avg_ts"])

    md = bench.render(records, "md").splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in md if line.startswith("|")]
    assert cells[0] == MD_HEADER
    assert all(re.fullmatch(r"-+:?", c) for c in cells[1])
    assert [row[5] for row in cells[2:]] == NAMES
    for row, r in zip(cells[2:], records):
        assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", row[6])
        assert float(row[6].split(" ± ")[0]) == pytest.approx(r["avg_ts"], abs=0.006)
        assert row[1].endswith(("MiB", "GiB")) and row[2].endswith((" M", " B"))
    assert md[-1] == f"build: {records[0]['build_commit']} ({records[0]['build_number']})"


def test_md_is_default_and_lists_every_model(synth_env, capsys):
    out = run_main(capsys, "-m", "synth:tiny-llama", "-m", "synth:tiny-qwen3", "-p", "4", "-n", "0", "-r", "1",
                   "--backend", "cpu")
    rows = [line for line in out.splitlines() if line.startswith("| ") and "pp4" in line]
    assert [r.split("|")[1].split()[0] for r in rows] == ["llama", "qwen3"]


def test_depth_is_prefilled_once_and_reused_by_the_timed_tokens(smollm2_path, monkeypatch, capsys):
    """Each test runs through the engine: its depth once, untimed; every repetition (warm-up and
    timed) takes the depth's KV blocks from the prefix cache and runs only its own tokens."""
    made = []
    real = bench.load_model
    monkeypatch.setattr(bench, "load_model", lambda *a: made.append(real(*a)) or made[-1])
    results = json.loads(run_main(capsys, "-m", str(smollm2_path), "-p", "8", "-n", "2", "-d", "32", "-r", "1",
                                  "--backend", "cpu", "-o", "json"))
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in results] == [(8, 0, 32), (0, 2, 32)]
    st = made[0].engine.stats
    # pp8 @ d32: the depth (33 rows), then 8 + 8 rows; tg2 @ d32: the depth from the cache (1 row),
    # then per repetition 1 row (its prompt) and 2 decode rows
    assert st.prefix_hit_tokens == 32 * 5
    assert st.prefill_rows + st.decode_rows == 33 + 8 + 8 + 1 + 2 * (1 + 2)
    assert made[0].pool.used == 0
    assert all(r["model_type"] == "llama 135M Q4_1" for r in results)


def test_parse_values_like_llama_bench():
    assert bench.parse_ints(["128,512", "1024"], [7]) == [128, 512, 1024]
    assert bench.parse_ints(["0-8+4", "16-64*2"], []) == [0, 4, 8, 16, 32, 64]
    assert bench.parse_ints(None, [512]) == [512]
    with pytest.raises(InfrError):
        bench.parse_ints(["12x"], [])
    with pytest.raises(InfrError):
        bench.parse_pg(["512"])
    assert bench.Test(512, 128, 4096).name == "pp512+tg128 @ d4096"
    assert bench.Test(0, 64, 4096).name == "tg64 @ d4096"


def test_synth_names_and_errors(synth_env, capsys):
    # the short alias reaches the llama-3.1-8b preset, whose weight-type check rejects this type
    with pytest.raises(InfrError, match="weight_type 'Q9_9'"):
        bench.model_path("synth:llama-8b:Q9_9")
    with pytest.raises(InfrError, match="unknown synthetic preset 'nope'"):
        bench.model_path("synth:nope")
    assert bench.main(["-m", "synth:tiny-llama", "-r", "0"]) == 1
    assert "-r must be >= 1" in capsys.readouterr().err
