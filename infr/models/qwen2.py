"""Qwen2 / Qwen2.5: RoPE NEOX, bias on Q, K and V (when the file has them), SwiGLU."""

from __future__ import annotations

from infr.gguf_file import GGUFFile
from infr.models.hparams import dense_model, read_hparams
from infr.models.spec import ModelSpec, RopeStyle


def build(gf: GGUFFile) -> ModelSpec:
    return dense_model(gf, read_hparams(gf), RopeStyle.NEOX)
