"""Qwen3 (dense): RoPE NEOX, RMSNorm on each q and k head, no bias, SwiGLU."""

from __future__ import annotations

from infr.gguf_file import GGUFFile
from infr.models.hparams import dense_model, read_hparams
from infr.models.spec import ModelSpec, RopeStyle


def build(gf: GGUFFile) -> ModelSpec:
    return dense_model(gf, read_hparams(gf), RopeStyle.NEOX, qk_norm=True)
