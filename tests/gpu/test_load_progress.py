"""The GPU backend's load progress callback (weight upload, decode-graph build) and its tqdm adapter."""

from __future__ import annotations

import pytest

from infr import synth
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.plan import build_plan


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    spec = synth.preset("tiny-llama", n_embd=256, n_ff=512, head_dim=64, weight_type="Q4_K")
    return synth.write_gguf(spec, tmp_path_factory.mktemp("progress") / "small.gguf")


def test_progress_reports_upload_bytes_then_graph(gpu, small):
    from infr.gpu.backend import GPUBackend

    gf = open_gguf(small)
    plan = build_plan(build_spec(gf))
    calls = []
    be = GPUBackend(gf, plan, 64, dev=gpu, progress=lambda *a: calls.append(a))
    upload = [c for c in calls if c[0] == "upload"]
    graph = [c for c in calls if c[0] == "graph"]
    assert [c[0] for c in calls] == ["upload"] * len(upload) + ["graph"] * len(graph)  # upload first
    total = sum(gf.tensor(n).nbytes for n in plan.weights())
    assert {c[2] for c in upload} == {total}
    dones = [c[1] for c in upload]
    assert dones == sorted(dones) and dones[-1] == total and len(set(dones)) == len(dones)
    assert len(graph) > 2 and graph[-1][1] == graph[-1][2]  # per lowered op, then done
    assert [c[1] for c in graph[:-1]] == sorted(c[1] for c in graph[:-1])
    n = len(calls)
    be.forward([1, 2, 3], 0)  # a new batch shape builds its graph silently: the callback is for the load
    assert len(calls) == n


def test_tqdm_progress_fills_and_closes_each_bar(monkeypatch):
    import tqdm.auto

    from infr import notebook

    made = []

    class Bar:
        def __init__(self, total, desc, **kw):
            self.total, self.desc, self.n, self.closed = total, desc, 0, False
            made.append(self)

        def update(self, k):
            assert k >= 0 and not self.closed
            self.n += k

        def close(self):
            self.closed = True

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    report = notebook.tqdm_progress()
    for done in (10, 40, 100):
        report("upload", done, 100)
    report("graph", 0, 9)
    report("graph", 3, 9)
    assert made[1].n == 3 and not made[1].closed
    report("graph", 1, 1)  # the backend's final call says "done" in its own units
    report("graph", 1, 1)
    assert [(b.desc, b.n, b.total, b.closed) for b in made] == [
        ("upload weights", 100, 100, True), ("compile pipelines, build the decode graph", 9, 9, True)]
