"""`--backend auto`: the GPU where wgpu finds a hardware adapter, the Dawn tier on NVIDIA where
wgpudawn is installed and Dawn finds the GPU too, else wgpu-native or the CPU reference."""

from __future__ import annotations

import pytest

from infr import backends
from infr.gpu import device as D


class _Dev:
    def __init__(self, vendor_id: int, adapter_type: str = "DiscreteGPU", backend_type: str = "Vulkan"):
        self.info = {"vendor_id": vendor_id, "adapter_type": adapter_type, "backend_type": backend_type,
                     "device": "test adapter"}
        self.name = "test adapter"

    @property
    def is_cpu(self) -> bool:
        return self.info["adapter_type"] == "CPU"


def _adapters(monkeypatch, wgpu_dev, dawn_dev=None, dawn_installed=True):
    def get_device(index=None, flavor="wgpu"):
        if flavor == "dawn":
            if dawn_dev is None:
                raise D.NoAdapterError("no WebGPU adapter")
            return dawn_dev
        if wgpu_dev is None:
            raise D.NoAdapterError("no WebGPU adapter")
        return wgpu_dev

    monkeypatch.setattr(D, "get_device", get_device)
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name: object() if name == "wgpudawn" and dawn_installed else None)


@pytest.mark.parametrize("case, wgpu_dev, dawn_dev, installed, want", [
    ("nvidia with wgpudawn", _Dev(0x10DE), _Dev(0x10DE), True, "dawn"),
    ("nvidia without wgpudawn", _Dev(0x10DE), _Dev(0x10DE), False, "gpu"),
    ("nvidia, Dawn finds no adapter", _Dev(0x10DE), None, True, "gpu"),
    ("nvidia, Dawn's only adapter is Null", _Dev(0x10DE), _Dev(0, "CPU", "Null"), True, "gpu"),
    ("amd", _Dev(0x1002), _Dev(0x1002), True, "gpu"),
    ("lavapipe", _Dev(0x10005, "CPU"), None, True, "cpu"),
    ("no adapter", None, None, True, "cpu"),
])
def test_auto_picks(monkeypatch, case, wgpu_dev, dawn_dev, installed, want):
    _adapters(monkeypatch, wgpu_dev, dawn_dev, installed)
    got, note = backends.choose_backend("auto")
    assert got == want, case
    assert (note is not None) == (want == "cpu" or (want == "gpu" and dawn_dev is None and installed
                                                   and wgpu_dev is not None and wgpu_dev.info["vendor_id"] == 0x10DE))


def test_named_backends_are_taken_as_asked(monkeypatch):
    _adapters(monkeypatch, _Dev(0x10DE), _Dev(0x10DE))
    assert backends.choose_backend("gpu") == ("gpu", None)
    assert backends.choose_backend("cpu") == ("cpu", None)
    with pytest.raises(Exception, match="unknown backend"):
        backends.choose_backend("cuda")
