"""`infr pull / ls / rm / run` against a stand-in Hub on 127.0.0.1 (HF_ENDPOINT), through the
real huggingface_hub code path, with real small GGUF models that are then loaded and run."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hub_standin import StandinHub, tiny_model
from infr import hub as infr_hub
from infr import store
from infr.engine import Model
from infr.errors import InfrError
from infr.sampling import SamplingParams

SPLIT = [f"Q8_0/big-Q8_0-{i:05d}-of-00004.gguf" for i in range(1, 5)]


@pytest.fixture(scope="module")
def models(tmp_path_factory, smollm2_path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    out = {wt: tiny_model(d / f"tiny-{wt}.gguf", wt, smollm2_path)[0] for wt in ("Q4_K_M", "Q8_0", "Q4_0")}
    for i, shard in enumerate(tiny_model(d / "big-Q8_0.gguf", "Q8_0", smollm2_path, split_max_tensors=8)):
        out[SPLIT[i]] = shard
    return out


@pytest.fixture
def hub(models, tmp_path, monkeypatch):
    with StandinHub() as h:
        h.add("acme/tiny-GGUF", {"tiny-Q4_K_M.gguf": models["Q4_K_M"], "tiny-Q8_0.gguf": models["Q8_0"],
                                 "tiny-Q4_0.gguf": models["Q4_0"], "README.md": b"# tiny\n"})
        h.add("acme/split-GGUF", {name: models[name] for name in SPLIT})
        h.add("acme/vision-GGUF", {"mmproj-vision-Q4_K_M.gguf": models["Q4_0"], "vision-Q4_K_M-imatrix.gguf": b"GGUF",
                                   "vision-Q8_0.gguf": models["Q8_0"]})
        h.add("acme/gated-GGUF", {"gated-Q4_K_M.gguf": models["Q4_K_M"]}, token="hf_good")
        h.add("acme/weights", {"config.json": b"{}", "model.safetensors": b"\0" * 64})
        for var, value in {"HF_ENDPOINT": h.url, "HF_HUB_CACHE": tmp_path / "hub", "LLAMA_CACHE": tmp_path / "llama",
                           "INFR_CACHE": tmp_path / "infr", "HF_HOME": tmp_path / "hf-home"}.items():
            monkeypatch.setenv(var, str(value))
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TQDM_POSITION"):
            monkeypatch.delenv(var, raising=False)
        import huggingface_hub.constants as c

        monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(c, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))  # no stored login
        assert store.hf_cache_dir() == tmp_path / "hub"  # never the user's cache
        yield h


def infr(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infr", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def greedy(path: Path, n: int = 6) -> list[int]:
    model = Model(path, n_ctx=64, backend="cpu")
    ids = model.tokenizer.encode("The capital of France is", add_special=True)
    return list(model.session().generate(ids, SamplingParams(temperature=0), max_new=n))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_each_quant_then_load_and_run(hub, models):
    default = infr_hub.pull("acme/tiny-GGUF", quiet=True)
    assert default.name == "tiny-Q4_K_M.gguf" and default.read_bytes() == models["Q4_K_M"].read_bytes()
    for ref, wt in (("hf:acme/tiny-GGUF:q8_0", "Q8_0"), ("acme/tiny-GGUF/tiny-Q4_0.gguf", "Q4_0")):
        path = infr_hub.pull(ref, quiet=True)
        assert path.read_bytes() == models[wt].read_bytes()
        assert path.parent.parent.parent.name == "models--acme--tiny-GGUF"  # huggingface_hub's layout
        assert path.is_symlink() and Path(os.path.realpath(path)).name == sha256(models[wt])
    assert greedy(path) == greedy(models["Q4_0"])
    hub.log.clear()
    assert infr_hub.pull("acme/tiny-GGUF:Q8_0", quiet=True).exists()
    assert hub.gets() == []  # cached: asked the Hub what is current, downloaded nothing


def test_split_model_fetches_every_shard(hub, models):
    path = infr_hub.pull("acme/split-GGUF:Q8_0", quiet=True)
    assert path.name == "big-Q8_0-00001-of-00004.gguf"
    assert sorted(p for _, p, _ in hub.gets()) == [f"/acme/split-GGUF/resolve/main/{s}" for s in SPLIT]
    assert greedy(path) == greedy(models[SPLIT[0]])


def test_mmproj_and_imatrix_never_chosen(hub):
    path = infr_hub.pull("acme/vision-GGUF", quiet=True)  # no plain Q4_K_M: the fallback order, no side file
    assert path.name == "vision-Q8_0.gguf"
    assert [p for _, p, _ in hub.gets()] == ["/acme/vision-GGUF/resolve/main/vision-Q8_0.gguf"]


def test_run_pulls_on_first_use(hub, models):
    args = ["Hello", "--temp", "0", "--max-new", "5", "--backend", "cpu"]
    local = infr("run", str(models["Q8_0"]), *args)
    pulled = infr("run", "acme/tiny-GGUF:Q8_0", *args)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout == local.stdout and local.returncode == 0
    assert "infr: pulling acme/tiny-GGUF/tiny-Q8_0.gguf" in pulled.stderr
    assert len(hub.gets("tiny-Q8_0")) == 1
    assert infr("run", "acme/tiny-GGUF:Q8_0", *args).stdout == local.stdout
    assert len(hub.gets("tiny-Q8_0")) == 1  # second run: from the cache


def test_real_smollm2_pull_and_run(hub, smollm2_path):
    hub.add("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", {"smollm2-135m-instruct-q4_1.gguf": smollm2_path})
    args = ["What is the capital of France?", "--temp", "0", "--max-new", "8", "--backend", "cpu"]
    proc = infr("run", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == infr("run", str(smollm2_path), *args).stdout and "Paris" in proc.stdout
    path = store.resolve("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1", pull=False)
    assert Path(os.path.realpath(path)).name == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_cut_download_resumes_on_next_pull(hub, models):
    name = "tiny-Q8_0.gguf"
    hub.cut[("acme/tiny-GGUF", name)] = 1_000_000
    hub.down = True  # after the cut the server answers 503, like a network gone
    first = infr("pull", "acme/tiny-GGUF:Q8_0")
    assert first.returncode == 1 and "Traceback" not in first.stderr
    kept = 1_000_000 // infr_hub.CHUNK * infr_hub.CHUNK  # whole chunks reach the disk
    assert f"infr: error: download of acme/tiny-GGUF/{name} stopped at {kept / 1e6:.1f} MB of 5.2 MB" in first.stderr
    assert "run `infr pull acme/tiny-GGUF:Q8_0` again to resume" in first.stderr
    part = next((store.hf_cache_dir() / "models--acme--tiny-GGUF" / "blobs").glob("*.incomplete"))
    assert part.stat().st_size == kept
    hub.heal()
    second = infr("pull", "acme/tiny-GGUF:Q8_0", env={"TQDM_POSITION": "-1"})  # a progress bar even off a TTY
    assert second.returncode == 0, second.stderr
    assert re.search(r"tiny-Q8_0.gguf: 100%.*5.23M/5.23M", second.stderr)
    assert hub.gets(name)[-1][2] == f"bytes={kept}-"  # a Range request continued the file
    assert f"resuming at {kept / 1e6:.1f} MB" in second.stderr
    assert sha256(Path(second.stdout.strip())) == sha256(models["Q8_0"]) and not part.exists()


def test_connection_cut_once_is_resumed_within_the_pull(hub, models):
    hub.cut[("acme/tiny-GGUF", "tiny-Q4_0.gguf")] = 500_000  # huggingface_hub's own retry continues it
    path = infr_hub.pull("acme/tiny-GGUF:Q4_0", quiet=True)
    kept = 500_000 // infr_hub.CHUNK * infr_hub.CHUNK
    assert [r for _, _, r in hub.gets("tiny-Q4_0")] == [None, f"bytes={kept}-"]
    assert sha256(path) == sha256(models["Q4_0"])


def test_corrupted_bytes_are_rejected_not_cached(hub, models):
    hub.corrupt.add(("acme/tiny-GGUF", "tiny-Q4_K_M.gguf"))
    with pytest.raises(InfrError, match=r"acme/tiny-GGUF/tiny-Q4_K_M.gguf: downloaded bytes do not match the Hub's "
                                        r"checksum \(expected [0-9a-f]{64}, got [0-9a-f]{64}\); the download was discarded"):
        infr_hub.pull("acme/tiny-GGUF", quiet=True)
    repo_dir = store.hf_cache_dir() / "models--acme--tiny-GGUF"
    assert not list((repo_dir / "blobs").iterdir()) and not (repo_dir / "snapshots").exists()
    assert store.find_cached(store.parse_ref("acme/tiny-GGUF")) is None
    hub.corrupt.clear()
    assert sha256(infr_hub.pull("acme/tiny-GGUF", quiet=True)) == sha256(models["Q4_K_M"])


def test_model_from_hf_hub_download_is_found_and_not_downloaded_again(hub, models):
    from huggingface_hub import hf_hub_download

    got = hf_hub_download("acme/tiny-GGUF", "tiny-Q8_0.gguf", cache_dir=store.hf_cache_dir(), endpoint=hub.url)
    hub.log.clear()
    ls = infr("ls")
    assert ls.returncode == 0, ls.stderr
    row = next(line.split() for line in ls.stdout.splitlines() if "tiny-Q8_0.gguf" in line)
    assert row[:5] == ["acme/tiny-GGUF", "tiny-Q8_0.gguf", "Q8_0", "llama", "3.3M"] and row[-1] == "hf"
    proc = infr("run", "acme/tiny-GGUF:Q8_0", "Hi", "--temp", "0", "--max-new", "3", "--backend", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert f"loaded {Path(got).name}" in proc.stderr and hub.log == []  # not a single request


def test_gated_repo_needs_token(hub, monkeypatch):
    proc = infr("pull", "acme/gated-GGUF")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"infr: error: acme/gated-GGUF is gated (HF_TOKEN is not set): accept its licence at {hub.url}/acme/gated-GGUF "
        "while logged in, then set HF_TOKEN to a read token of that account"
    )
    assert ("HEAD", "/acme/gated-GGUF/resolve/main/gated-Q4_K_M.gguf", None) in hub.log  # answered 401
    monkeypatch.setenv("HF_TOKEN", "hf_other")  # answered 403
    with pytest.raises(InfrError, match=r"acme/gated-GGUF is gated \(HF_TOKEN is set but that account has no access\)"
                                        rf": accept its licence at {hub.url}/acme/gated-GGUF"):
        infr_hub.pull("acme/gated-GGUF", quiet=True)
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert infr_hub.pull("acme/gated-GGUF", quiet=True).name == "gated-Q4_K_M.gguf"


@pytest.mark.parametrize("ref, message", [
    ("acme/nope-GGUF", "acme/nope-GGUF: no such repository on {url} (check the name; a private repo needs HF_TOKEN)"),
    ("acme/weights", "acme/weights has no GGUF file (it has: config.json, model.safetensors); infr runs GGUF models: "
                     "look for a GGUF conversion of it (repos named ...-GGUF)"),
    ("acme/tiny-GGUF:Q2_K", "acme/tiny-GGUF has no Q2_K file; quants there: Q4_0, Q4_K_M, Q8_0"),
    ("acme/tiny-GGUF/tiny-F16.gguf", "acme/tiny-GGUF has no file tiny-F16.gguf; its GGUF files: tiny-Q4_0.gguf, "
                                     "tiny-Q4_K_M.gguf, tiny-Q8_0.gguf"),
])
def test_errors_a_user_can_act_on(hub, ref, message):
    with pytest.raises(InfrError) as e:
        infr_hub.pull(ref, quiet=True)
    assert str(e.value) == message.format(url=hub.url)


def test_network_down(hub, monkeypatch, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = infr("run", "acme/tiny-GGUF", "Hi", env={"HF_ENDPOINT": dead})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"infr: error: cannot reach the Hugging Face Hub at {dead} (ConnectError): is the network down? "
        "Models already in the cache run without it (HF_HUB_OFFLINE=1 skips the Hub)"
    )
    infr_hub.pull("acme/tiny-GGUF:Q8_0", quiet=True)
    monkeypatch.setenv("HF_ENDPOINT", dead)  # down, but a cached quant serves
    assert store.resolve("acme/tiny-GGUF").name == "tiny-Q8_0.gguf"


def test_hub_offline_uses_the_cache_only(hub):
    assert infr("pull", "acme/tiny-GGUF:Q4_0").returncode == 0
    hub.log.clear()
    env = {"HF_HUB_OFFLINE": "1"}
    proc = infr("run", "acme/tiny-GGUF:Q4_0", "Hi", "--max-new", "2", "--backend", "cpu", env=env)
    assert proc.returncode == 0, proc.stderr
    proc = infr("run", "acme/tiny-GGUF:Q8_0", "Hi", env=env)
    assert proc.stderr.strip() == ("infr: error: acme/tiny-GGUF: no cached file matches Q8_0; cached: tiny-Q4_0.gguf "
                                   "(HF_HUB_OFFLINE=1 is set: unset it to download)")
    proc = infr("pull", "acme/split-GGUF", env=env)
    assert proc.stderr.strip() == ("infr: error: HF_HUB_OFFLINE=1 is set and acme/split-GGUF is not in the cache; "
                                   "unset it to download")
    assert hub.log == []


def test_disk_full(hub, monkeypatch):
    import shutil

    from huggingface_hub import file_download

    with monkeypatch.context() as m:
        m.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
        with pytest.raises(InfrError, match=r"disk full: tiny-Q8_0.gguf needs 5.2 MB more in .*blobs, 0.0 MB free; "
                                            r"free some space \(`infr rm` removes cached models\) or point HF_HUB_CACHE"):
            infr_hub.pull("acme/tiny-GGUF:Q8_0", quiet=True)

    def enospc(url, f, **kw):  # the disk fills up mid-download
        f.write(b"G" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_download, "http_get", enospc)
    with pytest.raises(InfrError, match=r"^disk full: tiny-Q8_0.gguf needs 5.2 MB more in .*then pull again to resume$"):
        infr_hub.pull("acme/tiny-GGUF:Q8_0", quiet=True)
    part = next((store.hf_cache_dir() / "models--acme--tiny-GGUF" / "blobs").glob("*.incomplete"))
    assert part.stat().st_size == 1000  # kept for the pull that resumes


def test_ls_and_rm(hub, models, tmp_path, smollm2_path):
    infr_hub.pull("acme/tiny-GGUF", quiet=True)
    infr_hub.pull("acme/tiny-GGUF:Q8_0", quiet=True)
    infr_hub.pull("acme/split-GGUF", quiet=True)
    flat = store.llama_cache_dir()
    flat.mkdir()
    os.link(models["Q4_0"], flat / "acme_flat-GGUF_flat-Q4_0.gguf")
    (tmp_path / "infr" / "offline").mkdir(parents=True)
    os.symlink(smollm2_path, tmp_path / "infr" / "offline" / smollm2_path.name)
    rows = [line.split() for line in infr("ls").stdout.splitlines()]
    assert rows[0] == ["REPO", "FILE", "QUANT", "ARCH", "PARAMS", "SIZE", "CACHE"]
    split_size = sum(models[s].stat().st_size for s in SPLIT) / 1e6
    assert rows[1:] == [
        ["acme/split-GGUF", SPLIT[0], "Q8_0", "llama", "3.3M", f"{split_size:.1f}", "MB", "hf"],
        ["acme/tiny-GGUF", "tiny-Q4_K_M.gguf", "Q4_K_M", "llama", "3.3M", "5.2", "MB", "hf"],
        ["acme/tiny-GGUF", "tiny-Q8_0.gguf", "Q8_0", "llama", "3.3M", "5.2", "MB", "hf"],
        ["acme/flat-GGUF", "flat-Q4_0.gguf", "Q4_0", "llama", "3.3M", "5.2", "MB", "llama.cpp"],  # Q4_0 mix: Q8_0 head
        ["offline:smollm2-135m", smollm2_path.name, "Q4_1", "llama", "134.5M", "98.4", "MB", "offline"],
    ]
    rm = infr("rm", "acme/tiny-GGUF:Q8_0")
    assert rm.returncode == 0 and "infr: removed acme/tiny-GGUF/tiny-Q8_0.gguf" in rm.stderr
    blobs = store.hf_cache_dir() / "models--acme--tiny-GGUF" / "blobs"
    assert sorted(p.name for p in blobs.iterdir()) == [sha256(models["Q4_K_M"])]
    assert store.resolve("acme/tiny-GGUF", pull=False).name == "tiny-Q4_K_M.gguf"
    assert infr("rm", "acme/split-GGUF").returncode == 0
    assert not (store.hf_cache_dir() / "models--acme--split-GGUF").exists()
    proc = infr("rm", "acme/flat-GGUF")
    assert proc.returncode == 1 and (flat / "acme_flat-GGUF_flat-Q4_0.gguf").exists()
    assert "its copy in llama.cpp's cache" in proc.stderr and "infr only reads it" in proc.stderr
    proc = infr("rm", str(models["Q4_0"]))
    assert "is a local file, not a cached model; infr rm leaves it alone" in proc.stderr and models["Q4_0"].exists()
    assert "acme/none is not in the Hugging Face cache" in infr("rm", "acme/none").stderr


def test_offline_names_pull_with_no_hub(hub, tmp_path, smollm2_path):
    (tmp_path / "infr" / "offline").mkdir(parents=True)
    os.symlink(smollm2_path, tmp_path / "infr" / "offline" / smollm2_path.name)
    proc = infr("pull", "smollm2", env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "infr" / "offline" / smollm2_path.name)
