"""Model ids for clients: the served id (--alias, a GGUF path's stem, or MODEL as given) in
/v1/models and every response, any request `model` served by default, and --strict-model's 404."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest
from litestar.testing import TestClient

from infr import offline
from infr.serve.app import create_app
from infr.serve.server import add_parser, config_from_args
from infr.serve.service import Config, served_id
from tests.serve.conftest import wait_ready

MSG = [{"role": "user", "content": "Say hi."}]


def _app(**kw):
    return TestClient(create_app(Config(ctx=256, parallel=1, backend="cpu", **kw)), timeout=120)


def _client(tc):
    return openai.OpenAI(base_url=f"{tc.base_url}/v1", api_key="unused", http_client=tc, max_retries=0)


@pytest.fixture(scope="module")
def strict_by_path(smollm2_path):
    with _app(model=str(smollm2_path), strict_model=True) as tc:
        wait_ready(tc.get)
        yield tc


@pytest.fixture(scope="module")
def lenient_by_ref(smollm2_path):
    ref = "smollm2-135m"
    offline.ensure(ref, quiet=True)  # the ref resolves from infr's offline cache (smollm2_path may be elsewhere)
    with _app(model=ref) as tc:
        wait_ready(tc.get)
        yield tc


def test_id_rule(tmp_path):
    gguf = tmp_path / "My-Model.Q4_0.gguf"
    gguf.write_bytes(b"")
    assert served_id(str(gguf)) == "My-Model.Q4_0"
    assert served_id("model.gguf") == "model"  # a bare file name, as store.resolve reads it
    assert served_id(str(gguf), "mine") == "mine"
    assert served_id("smollm2-135m") == "smollm2-135m"
    assert served_id("bartowski/Qwen2.5-0.5B-GGUF:Q4_K_M") == "bartowski/Qwen2.5-0.5B-GGUF:Q4_K_M"
    assert served_id("synth:tiny") == "synth:tiny"
    assert served_id(None) == offline.DEFAULT_MODEL


def test_path_gives_file_stem(strict_by_path, smollm2_path):
    client = _client(strict_by_path)
    assert [m.id for m in client.models.list().data] == [smollm2_path.stem]
    r = client.chat.completions.create(model=smollm2_path.stem, messages=MSG, max_tokens=2, temperature=0)
    assert r.model == smollm2_path.stem
    assert strict_by_path.get(f"/v1/models/{smollm2_path.stem}").json()["id"] == smollm2_path.stem


def test_strict_rejects_other_names(strict_by_path):
    for path, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "Hi"})):
        r = strict_by_path.post(path, json={"model": "gpt-5", "max_tokens": 2, **body})
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model" and err["type"] == "not_found_error"
        assert "gpt-5" in err["message"]
    r = strict_by_path.get("/v1/models/gpt-5")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_ref_id_and_lenient_model_names(lenient_by_ref):
    client = _client(lenient_by_ref)
    assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
    r = client.chat.completions.create(model="gpt-5", messages=MSG, max_tokens=2, temperature=0)
    assert r.model == "smollm2-135m" and r.choices[0].message.content is not None
    chunks = list(client.chat.completions.create(model="anything", messages=MSG, max_tokens=2, temperature=0,
                                                 stream=True))
    assert chunks and {c.model for c in chunks} == {"smollm2-135m"}
    assert client.completions.create(model="x", prompt="Hi", max_tokens=2, temperature=0).model == "smollm2-135m"
    # GET /v1/models/{name} describes only the served model, in either mode
    assert lenient_by_ref.get("/v1/models/smollm2-135m").json()["id"] == "smollm2-135m"
    r = lenient_by_ref.get("/v1/models/gpt-5")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_alias_is_the_id(smol_openai):
    assert [m.id for m in smol_openai.models.list().data] == ["smol"]
    r = smol_openai.chat.completions.create(model="gpt-5", messages=MSG, max_tokens=2, temperature=0)
    assert r.model == "smol"


def _parse(*argv):
    import argparse

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    return config_from_args(p.parse_args(["serve", *argv]))


def test_cli_flags(monkeypatch):
    monkeypatch.delenv("INFR_MODEL_ALIAS", raising=False)
    monkeypatch.delenv("INFR_STRICT_MODEL", raising=False)
    c = _parse("m.gguf")
    assert c.model_alias is None and c.strict_model is False
    c = _parse("m.gguf", "--alias", "mine", "--strict-model")
    assert c.model_alias == "mine" and c.strict_model is True
    monkeypatch.setenv("INFR_STRICT_MODEL", "1")
    monkeypatch.setenv("INFR_MODEL_ALIAS", "env-name")
    c = _parse("m.gguf")
    assert c.strict_model is True and c.model_alias == "env-name"
    out = subprocess.run([sys.executable, "-m", "infr", "serve", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    assert "--alias NAME" in out and "--strict-model" in out
