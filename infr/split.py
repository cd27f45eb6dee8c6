"""One model across several GPUs: llama.cpp's `--split-mode` and `--tensor-split`, read once.

`none` runs the model on one device (`--device`, llama.cpp's `--main-gpu`). `layer` cuts the
plan's layers into contiguous ranges, one per device, in proportion to `--tensor-split` (default:
equal shares of every distinct adapter), as llama.cpp assigns them (layer_devices); each device
holds its layers' weights and KV cache, and the activations cross once per step (infr/gpu/split.py).
`row` (every matrix split across devices) is not supported. Unlike llama.cpp, whose default mode is
`layer` over every GPU, infr runs on one device unless asked: `--tensor-split` alone means `layer`.

Kept apart from the GPU backend so the command lines validate their flags without importing wgpu.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from infr.errors import InfrError, UnsupportedError

MODES = ("none", "layer", "row")
MAX_DEVICES = 16  # llama.cpp's LLAMA_MAX_DEVICES
ENV = {"mode": "INFR_SPLIT_MODE", "tensor_split": "INFR_TENSOR_SPLIT", "same_adapter": "INFR_SPLIT_SAME_ADAPTER"}


@dataclass(frozen=True)
class SplitOptions:
    mode: str = "none"
    tensor_split: tuple[float, ...] | None = None  # proportions per device; None: equal over every adapter
    # Every device requested from one adapter even where several exist (tests; INFR_SPLIT_SAME_ADAPTER=1).
    same_adapter: bool = False

    @property
    def layered(self) -> bool:
        return self.mode == "layer"

    @classmethod
    def read(cls, mode: str | None = None, tensor_split: str | None = None,
             env: Mapping[str, str] = os.environ) -> "SplitOptions":
        """From the flags (`--split-mode`, `--tensor-split`), else their INFR_* variables; flags win.
        Bad values raise InfrError naming the flag; `row` raises UnsupportedError."""
        if mode is None:
            mode = env.get(ENV["mode"]) or None
        if tensor_split is None:
            tensor_split = env.get(ENV["tensor_split"]) or None
        props = parse_tensor_split(tensor_split) if tensor_split is not None else None
        if mode is None:
            mode = "layer" if props is not None else "none"
        mode = mode.strip().lower()
        if mode not in MODES:
            raise InfrError(f"--split-mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "row":
            raise UnsupportedError("--split-mode row (each matrix split across GPUs by rows) is not supported; "
                                   "use --split-mode layer (contiguous layers per GPU) or none")
        same = (env.get(ENV["same_adapter"]) or "").strip().lower() not in ("", "0", "false", "no")
        return cls(mode, props if mode == "layer" else None, same)


def parse_tensor_split(text: str) -> tuple[float, ...]:
    """`3,1` (llama.cpp's --tensor-split) or `3/1` (llama-bench's -ts): one non-negative proportion
    per device, at least one above zero."""
    parts = [p.strip() for p in str(text).replace("/", ",").split(",")]
    usage = f"--tensor-split takes one proportion per GPU, comma-separated like 3,1; got {text!r}"
    if not parts or any(not p for p in parts):
        raise InfrError(usage)
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise InfrError(usage) from None
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise InfrError(f"--tensor-split proportions must be finite and >= 0; got {text!r}")
    if not any(values):
        raise InfrError(f"--tensor-split needs a proportion above 0; got {text!r}")
    if len(values) > MAX_DEVICES:
        raise InfrError(f"--tensor-split names {len(values)} GPUs; at most {MAX_DEVICES}")
    return values


def layer_devices(n_layer: int, proportions) -> tuple[list[int], int]:
    """(the device of each layer, the device of the output head), as llama.cpp's
    llama_model::load_tensors assigns them with every layer offloaded: the proportions' running
    sums, normalised, are split points over the n_layer + 1 offloadable layers (the repeating
    ones and the output); layer il goes to the first device whose split point lies above
    il / (n_layer + 1) (std::upper_bound), in float32 as llama.cpp computes it. The output lands
    on the last device with a share, so it follows every repeating layer."""
    props = np.asarray(proportions, np.float32)
    if props.ndim != 1 or not len(props) or (props < 0).any() or not props.any():
        raise InfrError(f"bad proportions {list(proportions)!r}")
    splits = np.cumsum(props, dtype=np.float32)
    splits = (splits / splits[-1]).astype(np.float32)
    act = np.float32(n_layer + 1)
    dev = [min(int(np.searchsorted(splits, np.float32(il) / act, side="right")), len(props) - 1)
           for il in range(n_layer + 1)]
    return dev[:n_layer], dev[n_layer]


@dataclass(frozen=True)
class Stage:
    """One device's share of a layer split: layers first .. last - 1, with the embed part (the
    first stage) and the output head (the last)."""

    device: int  # index into the split's devices
    first: int
    last: int
    embed: bool
    head: bool


def stages(n_layer: int, proportions) -> list[Stage]:
    """The devices that hold anything, in order, each with its contiguous range of layers. The
    token embedding goes with layer 0 (llama.cpp keeps the input layer on the CPU; here its rows
    are gathered on the first device)."""
    per_layer, out = layer_devices(n_layer, proportions)
    out_stages: list[Stage] = []
    for d in range(len(proportions)):
        mine = [il for il, x in enumerate(per_layer) if x == d]
        if not mine and d != out:
            continue
        first = mine[0] if mine else n_layer
        out_stages.append(Stage(d, first, (mine[-1] + 1) if mine else n_layer, embed=False, head=d == out))
    out_stages[0] = Stage(out_stages[0].device, 0, out_stages[0].last, embed=True, head=out_stages[0].head)
    return out_stages
