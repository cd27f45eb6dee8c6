"""Free memory where a backend keeps its KV cache, for `--kv-size` given as a fraction.

WebGPU has no memory query, so each place is asked its own way: system RAM (the CPU reference,
and software adapters such as lavapipe, which allocate there) from /proc/meminfo; an NVIDIA
GPU through NVML (libnvidia-ml, which the driver installs), the device matched by its PCI
device id; an AMD GPU through amdgpu's sysfs counters. None where none of these answers.
"""

from __future__ import annotations

import ctypes
import glob
import os
from pathlib import Path

NVIDIA, AMD = 0x10DE, 0x1002


def free_ram() -> int | None:
    """MemAvailable of /proc/meminfo, in bytes (else the free physical pages)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _NvmlPci(ctypes.Structure):  # nvmlPciInfo_t
    _fields_ = [("legacy_bus_id", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pci_device_id", ctypes.c_uint), ("pci_subsystem_id", ctypes.c_uint),
                ("bus_id", ctypes.c_char * 32)]


def free_nvidia(device_id: int | None) -> int | None:
    """Free bytes of the NVIDIA GPU whose PCI device id is `device_id` (the only one when None
    or unmatched and there is one), through NVML."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        frees, matches = [], []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            mem, pci = _NvmlMemory(), _NvmlPci()
            if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
                continue
            frees.append(int(mem.free))
            if device_id is not None and nvml.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)) == 0:
                if pci.pci_device_id >> 16 == device_id:  # (device << 16) | vendor
                    matches.append(int(mem.free))
        # Identical cards all match (the adapter names no bus): the least free of them, to be safe.
        return min(matches) if matches else (frees[0] if len(frees) == 1 else None)
    except AttributeError:  # an older libnvidia-ml without one of these entry points
        return None
    finally:
        nvml.nvmlShutdown()


def free_amdgpu(device_id: int | None) -> int | None:
    """Free VRAM of an amdgpu card (total - used from sysfs), matched by PCI device id."""
    found = []
    for card in glob.glob("/sys/class/drm/card*/device"):
        try:
            total = int(Path(card, "mem_info_vram_total").read_text())
            used = int(Path(card, "mem_info_vram_used").read_text())
            dev = int(Path(card, "device").read_text(), 16)
        except (OSError, ValueError):
            continue
        found.append((dev, total - used))
    match = [free for dev, free in found if dev == device_id]
    return match[0] if match else (found[0][1] if len(found) == 1 else None)


def free_ram_bytes() -> tuple[int, str] | None:
    """(free bytes, where) of system RAM: the CPU reference's memory."""
    free = free_ram()
    return (free, "RAM") if free is not None else None


def free_device_bytes(dev) -> tuple[int, str] | None:
    """(free bytes, where) of a WebGPU device (infr.gpu.device.Device): its VRAM, or the RAM a
    software adapter allocates in."""
    if dev.is_cpu:
        return free_ram_bytes()
    vendor, device_id = dev.info.get("vendor_id"), dev.info.get("device_id")
    free = free_nvidia(device_id) if vendor == NVIDIA else free_amdgpu(device_id) if vendor == AMD else None
    return (free, f"VRAM of {dev.name}") if free is not None else None
