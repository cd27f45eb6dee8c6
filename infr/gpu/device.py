"""Adapter choice, limits and features for the GPU backend.

Discrete GPUs first; `INFR_DEVICE=N` (or `--device N`) picks from the list
`infr devices` prints. The device is created with the adapter's real limits
(lavapipe caps storage bindings at 128 MiB, the H200 at 2 GiB) and the
features infr uses when present.

Two WebGPU implementations run the same kernels, each behind wgpu-py's API:
wgpu-native (`wgpu`, the default) and Dawn (`wgpudawn`, the optional Dawn
tier: `--backend dawn`), whose extras reach the tensor cores. A Device carries
its API module (`dev.api`: buffer usages, raw entry points) and names its
features as infr does (`subgroup`), whichever spelling the implementation uses.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import lru_cache

from infr.errors import InfrError

WANTED_FEATURES = ("shader-f16", "subgroup", "timestamp-query", "timestamp-query-inside-passes", "pipeline-cache")
FLAVORS = {"wgpu": "wgpu", "dawn": "wgpudawn"}  # implementation -> its wgpu-py API module
# Dawn's names for infr's features; its in-pass timestamps are another API, so its profiles put each
# dispatch in a pass of its own between pass timestamps (infr.gpu.profile.Timer.per_pass).
_DAWN_FEATURES = {"subgroup": "subgroups", "shader-f16": "shader-f16", "timestamp-query": "timestamp-query",
                  "subgroup-matrix": "chromium-experimental-subgroup-matrix"}
# Instance toggles for Dawn: experimental features (subgroup matrices), f16 on NVIDIA's Vulkan
# driver (off by default there), and no bounds clamping (wgpu's unchecked modules, everywhere).
DAWN_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia", "disable_robustness")
# Off: Dawn masks the low 16 bits of timestamps unless told not to, which made its profiles' kernel
# times multiples of 65.5 µs.
DAWN_TOGGLES_OFF = ("timestamp_quantization",)
# Toggles a measurement may add (INFR_DAWN_TOGGLES="a,b", read when Dawn's instance is made): Dawn's
# validation of every command ("skip_validation"), and the zeroing of workgroup memory each workgroup
# does before it runs ("disable_workgroup_init": only for kernels that write before they read).
# Dawn records its commands at submit: 4.5 ms of Gemma 4 E2B's 73 ms prompt forward on an H100.
DAWN_TOGGLES_EXTRA = ("skip_validation", "disable_workgroup_init")


def dawn_toggles(env=None) -> tuple[str, ...]:
    """DAWN_TOGGLES and those of DAWN_TOGGLES_EXTRA that INFR_DAWN_TOGGLES names."""
    env = os.environ if env is None else env
    asked = [t.strip() for t in env.get("INFR_DAWN_TOGGLES", "").split(",") if t.strip()]
    unknown = [t for t in asked if t not in DAWN_TOGGLES_EXTRA]
    if unknown:
        raise InfrError(f"INFR_DAWN_TOGGLES: unknown {', '.join(unknown)}; choose from {', '.join(DAWN_TOGGLES_EXTRA)}")
    return DAWN_TOGGLES + tuple(dict.fromkeys(asked))
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
    device: object  # GPUDevice of `api`
    adapter: object
    info: dict
    features: frozenset[str]  # infr's names (WANTED_FEATURES, subgroup-matrix)
    limits: dict
    api: object = None  # the wgpu-py API module: wgpu, or wgpudawn for the Dawn tier
    flavor: str = "wgpu"
    index: int = 0  # the adapter's (list_adapters'): devices of one adapter share its memory

    def __post_init__(self):
        if self.api is None:
            import wgpu

            self.api = wgpu

    @property
    def dawn(self) -> bool:
        return self.flavor == "dawn"

    @property
    def name(self) -> str:
        tier = ", Dawn" if self.dawn else ""
        return f"{self.info.get('device', '?')} ({self.info.get('backend_type', '?')}{tier})"

    @property
    def max_binding(self) -> int:
        return int(self.limits["max-storage-buffer-binding-size"])

    @property
    def is_cpu(self) -> bool:
        return self.info.get("adapter_type") == "CPU"

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def subgroup_matrix_configs(self) -> list[dict]:
        """Dawn's subgroup-matrix configurations (component types, m, n, k, subgroup sizes); [] elsewhere."""
        if not hasattr(self, "_sm_configs"):
            self._sm_configs = []
            if self.dawn and self.has("subgroup-matrix"):
                from wgpudawn.backends.dawn import extras

                self._sm_configs = list(extras.get_adapter_properties(self.adapter).get("subgroup_matrix_configs", []))
        return self._sm_configs

    @property
    def subgroup_size(self) -> int | None:
        """Probed once with a kernel (None without the `subgroup` feature)."""
        if not hasattr(self, "_subgroup_size"):
            self._subgroup_size = _probe_subgroup_size(self) if self.has("subgroup") else None
        return self._subgroup_size


@lru_cache(maxsize=None)
def api_module(flavor: str = "wgpu"):
    """The wgpu-py API module of an implementation (Dawn's with its instance toggles set, once:
    before its instance exists)."""
    if flavor not in FLAVORS:
        raise InfrError(f"unknown WebGPU implementation {flavor!r}; choose one of {', '.join(FLAVORS)}")
    try:
        api = __import__(FLAVORS[flavor])
    except ImportError as e:
        hint = " (the Dawn tier is an extra: pip install wgpudawn)" if flavor == "dawn" else ""
        raise NoAdapterError(f"{FLAVORS[flavor]} is not importable: {e}{hint}") from None
    if flavor == "dawn":
        from wgpudawn.backends.dawn import extras

        toggles = dawn_toggles()
        try:
            extras.set_instance_extras(enable_toggles=list(toggles), disable_toggles=list(DAWN_TOGGLES_OFF))
        except RuntimeError as e:  # another user of wgpudawn in this process made its instance first
            warnings.warn(f"Dawn runs without infr's toggles {toggles} (off: {DAWN_TOGGLES_OFF}): {e}",
                          stacklevel=2)
    return api


def feature_names(flavor: str) -> dict[str, str]:
    """infr's feature name -> the implementation's."""
    return dict(_DAWN_FEATURES) if flavor == "dawn" else {f: f for f in WANTED_FEATURES}


def list_adapters(flavor: str = "wgpu") -> list:
    api = api_module(flavor)
    try:
        adapters = api.gpu.enumerate_adapters_sync()
        if not adapters and flavor == "dawn":  # Dawn lists no Null adapter (WGPU_BACKEND_TYPE=Null) but gives one
            adapters = [a for a in (api.gpu.request_adapter_sync(power_preference="high-performance"),) if a]
    except Exception as e:  # no Vulkan/Metal/DX12 loader at all
        raise NoAdapterError(f"no WebGPU adapter: {e}") from None
    return sorted(adapters, key=lambda a: _TYPE_RANK.get(a.info.get("adapter_type", "Unknown"), 4))


@lru_cache(maxsize=None)
def get_device(index: int | None = None, flavor: str = "wgpu", instance: int = 0) -> Device:
    """The process-wide device of an implementation (pipelines and buffers are shared across sessions).
    `instance` k > 0: another device of the same adapter (a layer split on one GPU: get_devices)."""
    adapters = list_adapters(flavor)
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
    names = feature_names(flavor)
    ours = [f for f, theirs in names.items() if theirs in adapter.features]
    limits = {k: adapter.limits[k] for k in LIMITS if k in adapter.limits}
    device = adapter.request_device_sync(required_features=[names[f] for f in ours], required_limits=limits)
    return Device(device, adapter, dict(adapter.info), frozenset(ours), limits, api_module(flavor), flavor,
                  index or 0)


def _default_index() -> int:
    try:
        return int(os.environ.get("INFR_DEVICE") or 0)
    except ValueError:
        return 0


def gpu_adapters(flavor: str = "wgpu") -> list[int]:
    """distinct_adapters' indices without creating a device (a cluster's driver counts GPUs, a
    replica maps its Ray GPU id before its engine picks one): the adapters of the backend type of
    the first listed (INFR_DEVICE's where it names one). [] where none is found."""
    try:
        adapters = list_adapters(flavor)
    except NoAdapterError:
        return []
    if not adapters:
        return []
    first = _default_index()
    kind = adapters[first if 0 <= first < len(adapters) else 0].info.get("backend_type")
    return [i for i, a in enumerate(adapters) if a.info.get("backend_type") == kind]


def distinct_adapters(flavor: str = "wgpu") -> list[int]:
    """Indices (list_adapters') of the distinct GPUs: the adapters of the default one's backend type
    (wgpu lists one GPU once per backend, Vulkan and GL)."""
    kind = get_device(flavor=flavor).info.get("backend_type")
    return [i for i, a in enumerate(list_adapters(flavor)) if a.info.get("backend_type") == kind]


def get_devices(n: int, flavor: str = "wgpu", same_adapter: bool = False) -> tuple[list[Device], str | None]:
    """n devices for a layer split (infr/split.py), and a note when they share an adapter: the
    first n distinct adapters (distinct_adapters), else, or with same_adapter, n devices requested
    from the adapter get_device picks (INFR_DEVICE / --device), so the split's path runs on one GPU
    too. The default adapter's device is get_device's own (its pipelines shared)."""
    first = get_device(flavor=flavor)  # called as everyone calls it: lru_cache keys on the spelling
    distinct = distinct_adapters(flavor)
    if n <= len(distinct) and not same_adapter:
        default = distinct.index(first_index) if (first_index := _default_index()) in distinct else -1
        return [first if j == default else get_device(i, flavor=flavor) for j, i in enumerate(distinct[:n])], None
    why = "as asked (INFR_SPLIT_SAME_ADAPTER)" if same_adapter and n <= len(distinct) else \
        f"{len(distinct)} distinct adapter(s)"
    return [first] + [get_device(flavor=flavor, instance=k) for k in range(1, n)], \
        f"{why} for a split over {n} GPUs: running {n} devices of {first.name}"


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
