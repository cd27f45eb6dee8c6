"""The notebooks in notebooks/, executed top to bottom headless (nbclient, kernel python3).

Each notebook ends with assert cells that check what it shows (the profile
covers every op family of the plan, per-kernel times add up to the GPU time
measured independently, the live plots were redrawn more than once, kernel
outputs match the numpy reference); a failing assert fails the cell and so
this test. The notebooks are executed fresh from a copy; the saved, executed
ones in the repository are not touched. About 2 minutes together on lavapipe.
"""

from __future__ import annotations

from pathlib import Path

import nbclient  # the `test` extra installs nbclient, nbformat, ipykernel and what the notebooks import
import nbformat
import pytest

from tests.gpu.conftest import gpu  # noqa: F401  (the fixture, used by name)

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# notebook -> (needs a WebGPU adapter, the line its last cell prints once every check passed)
CASES = {
    "quickstart.ipynb": (False, "quickstart checks passed"),
    "profiling.ipynb": (True, "profiling checks passed"),
    "kernels.ipynb": (True, "kernel checks passed"),
}


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(CASES)


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == kind]


@pytest.mark.parametrize("name", sorted(CASES))
def test_notebook_runs_headless(name, tmp_path, request):
    needs_gpu, passed = CASES[name]
    if needs_gpu:  # tests/gpu/conftest.py's fixture: skips where no WebGPU adapter exists, fails under CI
        request.getfixturevalue("gpu")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:  # executed fresh: drop the saved outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=900,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError (with the cell and traceback) if any cell fails
    streams = "".join(o.get("text", "") for o in _outputs(nb, "stream"))
    assert passed in streams, streams[-2000:]
    if name != "quickstart.ipynb":  # the live plot's last frame stays in the notebook as a PNG
        assert any("image/png" in o.get("data", {}) for o in _outputs(nb, "display_data"))
