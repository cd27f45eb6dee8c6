"""`infr cluster` as a command: it starts a local Ray cluster, serves, and on SIGTERM drains (the
answer in flight finishes) and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
from cluster_kit import free_port  # tests/cluster is on sys.path

ROOT = Path(__file__).resolve().parents[2]



def test_command_serves_and_drains_on_sigterm(smollm2_path, tmp_path):
    port = free_port()
    log = tmp_path / "cluster.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "infr", "cluster", f"smol={smollm2_path}", "--replicas", "1",
                                 "--backend", "cpu", "--ctx", "256", "--parallel", "2", "--port", str(port),
                                 "--drain", "30"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the cluster did not come up:\n" + log.read_text()[-3000:]
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["smol"]
        started, result = threading.Event(), {}

        def streamed():
            text, finish = "", None
            msgs = [{"role": "user", "content": "Tell a story."}]
            for c in client.chat.completions.create(model="smol", messages=msgs, max_tokens=48, temperature=0,
                                                    stream=True, extra_body={"ignore_eos": True}):
                if c.choices:
                    text += c.choices[0].delta.content or ""
                    finish = c.choices[0].finish_reason or finish
                    started.set()
            result.update(text=text, finish=finish)

        t = threading.Thread(target=streamed)
        t.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=60)
        assert result.get("finish") == "length" and result["text"], result  # drained, not cut
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert "draining" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
