"""Llama (and SmolLM2, Mistral-style dense models): RoPE NORM (adjacent pairs,
the converter permutes q and k for it), SwiGLU, Llama 3 frequency factors when
the file has rope_freqs."""

from __future__ import annotations

from infr.gguf_file import GGUFFile
from infr.models.hparams import dense_model, read_hparams
from infr.models.spec import ModelSpec, RopeStyle


def build(gf: GGUFFile) -> ModelSpec:
    return dense_model(gf, read_hparams(gf), RopeStyle.NORM)
