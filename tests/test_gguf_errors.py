"""Every bad input to the GGUF layer gets a one-line message that names the problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from infr.cpu.backend import CPUBackend
from infr.engine import Model
from infr.errors import GGUFError, InfrError, UnsupportedError
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.plan import build_plan


def _write(path: Path, arch: str = "llama", tensors: dict | None = None, meta: dict | None = None) -> Path:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_feed_forward_length(16)
    for key, value in (meta or {}).items():
        w.add_string(key, value) if isinstance(value, str) else w.add_uint32(key, value)
    for name, arr in (tensors or {"token_embd.weight": np.zeros((4, 8), np.float32)}).items():
        if isinstance(arr, tuple):  # (raw bytes array, qtype)
            w.add_tensor(name, arr[0], raw_dtype=arr[1])
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello world, not a model")
    with pytest.raises(GGUFError, match=r"notes.gguf: not a GGUF file \(starts with b'hell'"):
        open_gguf(p)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        open_gguf(tmp_path / "absent.gguf")


def test_truncated_data(tmp_path):
    p = _write(tmp_path / "t.gguf")
    data = p.read_bytes()
    p.write_bytes(data[:-64])
    with pytest.raises(GGUFError, match=r"t.gguf: truncated or corrupt GGUF file \(\d+ bytes: "):
        open_gguf(p)


def test_truncated_header(tmp_path):
    p = _write(tmp_path / "t.gguf")
    p.write_bytes(p.read_bytes()[:40])
    with pytest.raises(GGUFError, match=r"t.gguf: truncated or corrupt GGUF file \(40 bytes: "):
        open_gguf(p)


def test_unsupported_architecture(tmp_path):
    gf = open_gguf(_write(tmp_path / "m.gguf", arch="mamba"))
    with pytest.raises(UnsupportedError,
                       match=r"unsupported architecture 'mamba'; supported: gemma3, gemma4, llama, llama4, qwen2, qwen3, qwen35, qwen35moe, qwen3moe"):
        build_spec(gf)


def test_missing_tensor(smollm2_path, tmp_path):
    gf = open_gguf(smollm2_path)
    with pytest.raises(GGUFError, match=r"SmolLM2-135M-Instruct.Q4_1.gguf: missing tensor 'blk.30.attn_q.weight'"):
        gf.tensor("blk.30.attn_q.weight")


def test_missing_tensor_at_load(tmp_path):
    # A llama file with only an embedding table: loading names the first missing weight.
    p = _write(tmp_path / "m.gguf", tensors={"token_embd.weight": np.zeros((4, 8), np.float32)})
    gf = open_gguf(p)
    with pytest.raises(GGUFError, match=r"m.gguf: missing tensor 'blk.0.attn_norm.weight'"):
        CPUBackend(gf, build_plan(build_spec(gf)), 16)


def test_unsupported_tensor_type(tmp_path):
    # IQ2_XXS blocks: 66 bytes per 256 values; infr does not implement that type.
    raw = np.zeros((4, 66), np.uint8)
    tensors = {"token_embd.weight": (raw, GGMLQuantizationType.IQ2_XXS)}
    p = _write(tmp_path / "m.gguf", tensors=tensors)
    gf = open_gguf(p)
    with pytest.raises(UnsupportedError, match=r"tensor 'token_embd.weight' has unsupported type IQ2_XXS; supported: "):
        CPUBackend(gf, build_plan(build_spec(gf)), 16)


def test_split_model_missing_shard(tmp_path):
    p = _write(tmp_path / "m-00001-of-00002.gguf")
    with pytest.raises(GGUFError, match=r"split model is missing m-00002-of-00002.gguf"):
        open_gguf(p)


def test_cli_prints_one_line_without_traceback(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + b"\x00" * 3)
    proc = subprocess.run([sys.executable, "-m", "infr", "run", str(p), "hi"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "infr: error: bad.gguf: truncated or corrupt GGUF file (" + proc.stderr.split("file (", 1)[1].strip()
    ]
    assert "Traceback" not in proc.stderr


def test_context_too_small_for_prompt(smollm2_path):
    model = Model(smollm2_path, n_ctx=8)
    with pytest.raises(InfrError, match="prompt has 12 tokens but the context holds 8"):
        model.session().prefill(list(range(12)))
