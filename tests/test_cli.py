"""`infr run` as a user runs it: a subprocess, real models, real output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infr.gguf_file import open_gguf
from infr.tokenizer import Tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
STATS = re.compile(r"^infr: prompt: (\d+) tokens \((\d+) reused\), .* \| generated: (\d+) tokens, [\d.]+ tok/s$", re.M)


def infr(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "infr", *args], input=stdin, capture_output=True, text=True, env=full_env, timeout=600
    )


def _raw_case(name: str) -> dict:
    data = json.loads((FIXTURES / f"generation_{name}.json").read_text())
    return next(c for c in data["cases"] if c["kind"] == "raw")


def test_raw_greedy_prints_llama_cpp_continuation(smollm2_path):
    case = _raw_case("smollm2-135m")
    tok = Tokenizer.from_gguf(open_gguf(smollm2_path))
    expected = tok.decode(case["tokens"][:16], skip_special=True)
    proc = infr("run", str(smollm2_path), case["text"], "--raw", "--temp", "0", "--max-new", "16")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected + "\n"
    prompt, reused, generated = map(int, STATS.search(proc.stderr).groups())
    assert (prompt, reused, generated) == (len(case["prompt_ids"]), 0, 16)


def test_env_sets_options_and_flags_win(smollm2_path):
    case = _raw_case("smollm2-135m")
    env = {"INFR_MAX_NEW": "3", "INFR_TEMP": "0"}
    proc = infr("run", str(smollm2_path), case["text"], "--raw", env=env)
    assert int(STATS.search(proc.stderr).group(3)) == 3
    proc = infr("run", str(smollm2_path), case["text"], "--raw", "--max-new", "5", env=env)
    assert int(STATS.search(proc.stderr).group(3)) == 5


def test_default_model_one_shot_chat(smollm2_path):
    # One positional argument that is not a model is the message for the default model.
    proc = infr("run", "What is the capital of Japan?", "--temp", "0", "--max-new", "12")
    assert proc.returncode == 0, proc.stderr
    assert "Tokyo" in proc.stdout
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in proc.stderr


def test_interactive_chat_keeps_history_and_reuses_prefix(smollm2_path):
    proc = infr("run", str(smollm2_path), "--temp", "0", "--max-new", "8", stdin="Hello!\nAnd again?\n")
    assert proc.returncode == 0, proc.stderr
    turns = [tuple(map(int, m)) for m in STATS.findall(proc.stderr)]
    assert len(turns) == 2
    (p1, r1, g1), (p2, r2, g2) = turns
    assert r1 == 0 and p2 > p1 + g1  # the second prompt holds the first exchange
    assert r2 >= p1  # ... and only its new part was prefilled


def test_seed_gives_same_sampled_output(smollm2_path):
    args = ("run", str(smollm2_path), "Tell me a story.", "--temp", "1.0", "--max-new", "12")
    a = infr(*args, "--seed", "7")
    b = infr(*args, "--seed", "7")
    c = infr(*args, "--seed", "8")
    assert a.stdout == b.stdout and a.stdout.strip()
    assert a.stdout != c.stdout


def test_model_without_template_says_so(gemma3_path):
    proc = infr("run", str(gemma3_path), "Hello", "--temp", "0", "--max-new", "4")
    assert proc.returncode == 0, proc.stderr
    assert "infr: model has no chat template; using a plain" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "no-such-model", "hi"], "infr: error: no such model 'no-such-model': not a file, not an offline model"),
        (["run", "missing.gguf", "hi"], "infr: error: no such file: missing.gguf"),
        (["run", "smollm2", "--backend", "tpu", "hi"], "infr: error: unknown backend 'tpu'; choose one of auto, cpu, gpu"),
        (["run", "smollm2", "--top-p", "1.5", "hi"], "infr: error: top_p must be in (0, 1]"),
        (["run", "smollm2", "--raw"], "infr: error: --raw needs a MESSAGE"),
        (["run", "smollm2", "--ctx", "0", "hi"], "infr: error: context size must be positive, got 0"),
    ],
)
def test_bad_input_one_line_errors(args, message, smollm2_path):
    proc = infr(*args, env={"INFR_CTX": "256"})
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("infr: error:")]
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_env_value(smollm2_path):
    proc = infr("run", "smollm2", "hi", env={"INFR_TEMP": "warm"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == "infr: error: INFR_TEMP='warm' is not a valid float"


def test_prompt_larger_than_context(smollm2_path):
    proc = infr("run", str(smollm2_path), "word " * 50, "--raw", "--ctx", "16")
    assert proc.returncode == 1
    assert re.search(r"^infr: error: prompt has 5\d tokens but the context holds 16 \(use --ctx\)$", proc.stderr, re.M)
