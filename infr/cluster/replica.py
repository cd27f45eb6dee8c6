"""One engine replica: a Ray Serve deployment that owns one infr Service (the model, its engine
thread with continuous batching and prefix cache, as `infr serve` runs it) and answers the ingress
by running `infr serve`'s own Litestar app in-process, so every schema, check, error body and
stream chunk is the one `infr serve` gives. Requests arrive over a DeploymentHandle as plain
(method, path, headers, body) and go back as a stream: the response head, then its body chunks."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator

from ray import serve

from infr.serve.service import Config as ServeConfig

log = logging.getLogger("infr.cluster")


def adapter_for(gpu_id: int, adapters: list[int]) -> tuple[int, str | None]:
    """The wgpu adapter (list_adapters' index) of Ray GPU id `gpu_id`: the id-th distinct GPU
    (infr/gpu/device.py lists discrete GPUs first, in the driver's order). An id past them (a
    local cluster advertises as many GPUs as its replicas ask for, so several replicas may share
    one adapter, e.g. lavapipe's) wraps around onto adapter id mod their count, with a note."""
    k = gpu_id % len(adapters)
    note = None if k == gpu_id else (f"Ray GPU id {gpu_id} has no adapter of its own ({len(adapters)} found): "
                                     f"sharing adapter {adapters[k]}")
    return adapters[k], note


def pick_gpu(backend: str) -> str | None:
    """Point the engine at the GPU Ray gave this replica: Ray hides the others from CUDA only
    (CUDA_VISIBLE_DEVICES); Vulkan still lists every GPU, so INFR_DEVICE names its adapter
    (adapter_for). An INFR_DEVICE already set wins; a CPU engine, or a replica without a GPU, is
    left alone. Returns a note where the replica shares its adapter."""
    import ray

    ids = ray.get_gpu_ids()
    if not ids or os.environ.get("INFR_DEVICE") or backend == "cpu":
        return None
    from infr.gpu.device import gpu_adapters

    adapters = gpu_adapters("dawn" if backend == "dawn" else "wgpu")
    if not adapters:  # the engine's own load says there is no adapter
        return None
    index, note = adapter_for(int(ids[0]), adapters)
    os.environ["INFR_DEVICE"] = str(index)
    return note


def _device_name(backend) -> str | None:
    dev = getattr(backend, "dev", None)  # a GPU backend's (the last device of a split); the CPU has none
    return dev.name if dev is not None else None


class EngineReplica:
    """Deployed once per replica slot (infr/cluster/app.py says why), with num_cpus/num_gpus from
    the cluster config; Ray restarts it when its process dies or check_health fails."""

    def __init__(self, config: ServeConfig):
        from infr.serve.app import create_app
        from infr.serve.service import Service

        logging.basicConfig(level=logging.INFO, format="infr: %(message)s")
        note = pick_gpu(config.backend)
        if note:
            log.warning("%s", note)
        self.service = Service(config)
        self.service.load()  # blocking: the replica counts as started once its model is in
        self.service.start_workers()
        self.app = create_app(config, self.service)

    def info(self) -> dict:
        """What the ingress needs to route: the KV block size (a prefix hit is rounded down to it)
        and the process, for logs and for the fault tests."""
        model = self.service.model
        return {"block_size": model.pool.block_size, "pid": os.getpid(), "model": self.service.model_id,
                "n_ctx": model.n_ctx, "backend": model.backend_name, "device": _device_name(model.backend),
                "infr_device": os.environ.get("INFR_DEVICE")}

    def served(self) -> dict:
        """This replica's process and the requests its engine took (an autoscaled group's replicas,
        which the ingress does not address one by one, are told apart by it)."""
        return {"pid": os.getpid(), "requests": sum(self.service.metrics.requests.values())}

    def metrics(self) -> str:
        svc = self.service
        return svc.metrics.render(svc.model.engine)

    def check_health(self) -> None:
        thread = self.service._thread
        if thread is None or not thread.is_alive():
            raise RuntimeError("the engine thread is not running")

    async def handle(self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
                     body: bytes) -> AsyncIterator[object]:
        """One HTTP exchange with the replica's `infr serve` app: yields {"status", "headers"},
        then body chunks as they are sent. Closing the generator (the client left, the ingress gave
        up) disconnects the app, which cancels the generation and frees its KV blocks."""
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
                 "query_string": query, "headers": headers, "client": ("ingress", 0),
                 "server": ("replica", 0), "state": {}}
        sent: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        body_read = False

        async def receive() -> dict:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.put_nowait(message)

        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: sent.put_nowait(None))
        try:
            while True:
                message = await sent.get()
                if message is None:  # the app returned without finishing its response
                    task.result()
                    raise RuntimeError("the replica's app ended without a response")
                if message["type"] == "http.response.start":
                    yield {"status": message["status"], "headers": list(message.get("headers", []))}
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield bytes(message["body"])
                    if not message.get("more_body", False):
                        return
        finally:
            gone.set()
            if not task.done():
                try:
                    await asyncio.wait_for(task, timeout=5)  # the app sees the disconnect and cleans up
                except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                    task.cancel()


def deployment_options(name: str, *, num_cpus: float, num_gpus: float, max_ongoing: int, drain_s: float,
                       replicas: int = 1, max_replicas: int | None = None, upscale_delay_s: float = 30.0,
                       downscale_delay_s: float = 600.0, look_back_s: float = 30.0) -> dict:
    """Serve options of one replica slot (or, with max_replicas, of an autoscaled group). Ray waits
    up to drain_s for a replica's requests in flight before it stops it (the shutdown drain)."""
    opts: dict = {"name": name, "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
                  "max_ongoing_requests": max_ongoing, "graceful_shutdown_timeout_s": drain_s,
                  "graceful_shutdown_wait_loop_s": 0.5, "health_check_period_s": 5, "health_check_timeout_s": 30}
    if max_replicas is None:
        opts["num_replicas"] = replicas
    else:
        opts["autoscaling_config"] = {"min_replicas": replicas, "max_replicas": max_replicas,
                                      "target_ongoing_requests": 2, "upscale_delay_s": upscale_delay_s,
                                      "downscale_delay_s": downscale_delay_s, "look_back_period_s": look_back_s}
    return opts


def deployment(name: str, config: ServeConfig, **kw):
    """The bound deployment running `config` with deployment_options(name, **kw)."""
    return serve.deployment(EngineReplica).options(**deployment_options(name, **kw)).bind(config)
