"""The device layer: adapter listing, real limits, the probed subgroup size."""

from __future__ import annotations

import os
import subprocess
import sys


def test_subgroup_size_is_probed(gpu):
    size = gpu.subgroup_size
    assert size is None or (size & (size - 1) == 0 and 4 <= size <= 128)
    if gpu.has("subgroup") and "llvmpipe" in gpu.name:
        assert size == 8  # lavapipe on this machine class


def test_real_limits_requested(gpu):
    assert gpu.max_binding == gpu.adapter.limits["max-storage-buffer-binding-size"]
    assert gpu.device.limits["max-storage-buffer-binding-size"] == gpu.max_binding


def test_devices_command_lists_adapters(gpu):
    proc = subprocess.run([sys.executable, "-m", "infr", "devices"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("[0] ") and "binding" in lines[0]
    assert lines[-1].startswith("default: ") and "subgroup size" in lines[-1]


def test_bad_device_number():
    env = {**os.environ, "INFR_DEVICE": "99"}
    proc = subprocess.run([sys.executable, "-m", "infr", "run", "smollm2", "hi", "--backend", "gpu"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1
    assert "infr: error: device 99 does not exist" in proc.stderr


def test_dawn_toggles_from_the_environment():
    """INFR_DAWN_TOGGLES adds the measured extras to Dawn's toggles, each once; a name outside them
    fails with the list (a typo would otherwise leave a measurement with the defaults unnoticed)."""
    import pytest

    from infr.errors import InfrError
    from infr.gpu import device as D

    assert D.dawn_toggles({}) == D.DAWN_TOGGLES
    got = D.dawn_toggles({"INFR_DAWN_TOGGLES": " skip_validation,disable_workgroup_init,skip_validation"})
    assert got == D.DAWN_TOGGLES + ("skip_validation", "disable_workgroup_init")
    with pytest.raises(InfrError, match="unknown skip_validaton; choose from skip_validation"):
        D.dawn_toggles({"INFR_DAWN_TOGGLES": "skip_validaton"})
