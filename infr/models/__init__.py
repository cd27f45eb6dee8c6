"""Model families: GGUF architecture name -> builder of a `ModelSpec`."""

from __future__ import annotations

from typing import Callable

from infr.errors import UnsupportedError
from infr.gguf_file import GGUFFile
from infr.models import gemma3, gemma4, llama, llama4, qwen2, qwen3, qwen3moe, qwen35, qwen35moe
from infr.models.spec import ModelSpec

FAMILIES: dict[str, Callable[[GGUFFile], ModelSpec]] = {
    "llama": llama.build,
    "qwen2": qwen2.build,
    "qwen3": qwen3.build,
    "gemma3": gemma3.build,
    "gemma4": gemma4.build,
    "qwen3moe": qwen3moe.build,
    "llama4": llama4.build,
    "qwen35": qwen35.build,
    "qwen35moe": qwen35moe.build,
}


def build_spec(gf: GGUFFile) -> ModelSpec:
    arch = gf.arch
    if arch not in FAMILIES:
        raise UnsupportedError(
            f"{gf.path.name}: unsupported architecture {arch!r}; supported: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[arch](gf)
