"""Adapter choice, limits and features for the wgpu backend.

Discrete GPUs first; `INFR_DEVICE=N` (or `--device N`) picks from the list
`infr devices` prints. The device is created with the adapter's real limits
(lavapipe caps storage bindings at 128 MiB, the H200 at 2 GiB) and the
features infr uses when present.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from infr.errors import InfrError

WANTED_FEATURES = ("shader-f16", "subgroup", "timestamp-query", "timestamp-query-inside-passes", "pipeline-cache")
LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffers-per-shader-stage",
    "max-bind-groups",
)
_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3, "Unknown": 4}


class NoAdapterError(InfrError):
    pass


@dataclass
class Device:
    device: object  # wgpu.GPUDevice
    adapter: object
    info: dict
    features: frozenset[str]
    limits: dict

    @property
    def name(self) -> str:
        return f"{self.info.get('device', '?')} ({self.info.get('backend_type', '?')})"

    @property
    def max_binding(self) -> int:
        return int(self.limits["max-storage-buffer-binding-size"])

    @property
    def is_cpu(self) -> bool:
        return self.info.get("adapter_type") == "CPU"

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def subgroup_size(self) -> int | None:
        """Probed once with a kernel (None without the `subgroup` feature)."""
        if not hasattr(self, "_subgroup_size"):
            self._subgroup_size = _probe_subgroup_size(self) if self.has("subgroup") else None
        return self._subgroup_size


def list_adapters() -> list:
    try:
        import wgpu
    except ImportError as e:  # pragma: no cover - wgpu is a dependency
        raise NoAdapterError(f"wgpu is not importable: {e}") from None
    try:
        adapters = wgpu.gpu.enumerate_adapters_sync()
    except Exception as e:  # no Vulkan/Metal/DX12 loader at all
        raise NoAdapterError(f"no WebGPU adapter: {e}") from None
    return sorted(adapters, key=lambda a: _TYPE_RANK.get(a.info.get("adapter_type", "Unknown"), 4))


@lru_cache(maxsize=None)
def get_device(index: int | None = None) -> Device:
    """The process-wide device (pipelines and buffers are shared across sessions)."""
    adapters = list_adapters()
    if not adapters:
        raise NoAdapterError("no WebGPU adapter found (install a Vulkan driver, e.g. mesa-vulkan-drivers)")
    if index is None and os.environ.get("INFR_DEVICE"):
        try:
            index = int(os.environ["INFR_DEVICE"])
        except ValueError:
            raise InfrError(f"INFR_DEVICE={os.environ['INFR_DEVICE']!r} is not an adapter number") from None
    if index is not None and not 0 <= index < len(adapters):
        raise InfrError(f"device {index} does not exist; {len(adapters)} adapter(s): see `infr devices`")
    adapter = adapters[index or 0]
    features = [f for f in WANTED_FEATURES if f in adapter.features]
    limits = {k: adapter.limits[k] for k in LIMITS if k in adapter.limits}
    device = adapter.request_device_sync(required_features=features, required_limits=limits)
    return Device(device, adapter, dict(adapter.info), frozenset(features), limits)


def _probe_subgroup_size(dev: Device) -> int:
    import numpy as np

    from infr.gpu.runtime import Dispatch, Kernels, read, run, storage

    kern = Kernels(dev)
    pipe = kern.pipeline("subgroup_probe")
    out = storage(dev, 16, label="subgroup_size")
    run(dev, [Dispatch(pipe, kern.bind(pipe, [out]), (1, 1, 1))])
    return int(read(dev, out, np.uint32)[0])


def describe_adapters() -> list[str]:
    lines = []
    for i, a in enumerate(list_adapters()):
        info = a.info
        lim = a.limits
        feats = ", ".join(f for f in WANTED_FEATURES if f in a.features) or "none"
        lines.append(
            f"[{i}] {info.get('device', '?')} — {info.get('adapter_type', '?')}, {info.get('backend_type', '?')}; "
            f"binding {lim['max-storage-buffer-binding-size'] >> 20} MiB, buffer {lim['max-buffer-size'] >> 20} MiB, "
            f"workgroup storage {lim['max-compute-workgroup-storage-size'] >> 10} KiB; features: {feats}"
        )
    return lines
