"""The cluster's OpenAI-compatible ingress: one Ray Serve deployment running a Litestar app with
`infr serve`'s error handlers and key check. It routes each request by its `model` (strictly:
an unknown name gets `infr serve --strict-model`'s 404) and by its prompt's prefix
(infr/cluster/routing.py) to one engine replica, and relays that replica's answer, which `infr
serve`'s own app made (infr/cluster/replica.py). A replica that dies mid-answer ends a stream with
an error event and a non-streamed request with a 503; it takes no new requests until it is back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from litestar import Litestar, Request, Response, get, post
from litestar.params import FromPath
from litestar.response import Stream
from ray import serve
from ray.exceptions import RayError

from infr.cluster.config import ClusterConfig, ModelEntry
from infr.cluster.metrics import merge
from infr.cluster.routing import PromptKeys, Replicas, block_hashes
from infr.serve import errors
from infr.serve.app import check_key, sse
from infr.serve.errors import APIError
from infr.serve.service import model_not_found

log = logging.getLogger("infr.cluster")
RELAYED_HEADERS = {b"content-type", b"cache-control", b"x-accel-buffering", b"www-authenticate"}
ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions")  # prompts worth a prefix-aware choice


class Served:
    """One served model: its replica slots (handles), the routing state, the prompt tokenizer."""

    def __init__(self, entry: ModelEntry, handles: list, replicas: Replicas, keys: PromptKeys | None):
        self.entry, self.handles, self.replicas, self.keys = entry, handles, replicas, keys
        self.created = int(time.time())
        self.requests = 0
        self.failures = 0
        self.backend: str | None = None  # the engines' backend (gpu, cpu, dawn), from slot 0 at start


@serve.ingress()  # late-bound (Ray >= 2.56): the app is built once __init__ has the replicas' handles
class Ingress:
    def __init__(self, config: ClusterConfig, handles: dict[str, list]):
        self.config = config
        self._handles = handles  # model id -> one DeploymentHandle per replica slot
        self.models: dict[str, Served] = {}
        self.names: dict[str, Served] = {}  # every name a request may give: the id, and the ref as given
        self._probes: set[asyncio.Task] = set()

    async def __serve_build_asgi_app__(self) -> Litestar:
        cfg = self.config
        loop = asyncio.get_running_loop()
        for entry in cfg.models:
            handles = self._handles[entry.id]
            if cfg.autoscaling:  # one deployment whose replicas Ray's own router picks: no affinity
                replicas, keys = Replicas(1, 1, 0, 0, 0), None
            else:
                info = await handles[0].info.remote()
                replicas = Replicas(len(handles), info["block_size"], cfg.affinity_blocks, cfg.affinity_entries,
                                    cfg.affinity_slack)
                keys = await loop.run_in_executor(None, PromptKeys, entry.ref)
            model = Served(entry, handles, replicas, keys)
            if not cfg.autoscaling:  # as `infr serve`'s /v1/models says it (an autoscaled group may have no replica)
                model.backend = info["backend"]
            self.models[entry.id] = model
            self.names.setdefault(entry.id, model)
            self.names.setdefault(entry.ref, model)
        return build_app(self)

    # ---------------------------------------------------------------- routing

    def model_for(self, name) -> Served:
        if name is None or not isinstance(name, str):  # none given: the first model (a bad type: its 400)
            return next(iter(self.models.values()))
        model = self.names.get(name)
        if model is None:
            raise model_not_found(name, list(self.models))
        return model

    async def slot_for(self, model: Served, path: str, data) -> int:
        hashes: list[bytes] = []
        if model.keys is not None and path in ROUTED_PATHS and isinstance(data, dict):
            r = model.replicas
            # in a thread: a long prompt's template and tokenizer must not stall the streams this loop relays
            tokens = await asyncio.get_running_loop().run_in_executor(None, model.keys.tokens, path, data)
            hashes = block_hashes(tokens, r.block_size, r.max_blocks)
        deadline = time.monotonic() + self.config.event_gap_s
        while True:  # every replica down: wait a while for a restart rather than fail at once
            slot = model.replicas.choose(hashes)
            if slot is not None:
                return slot
            if time.monotonic() > deadline:
                raise APIError(503, f"no replica of {model.entry.id!r} is live; they are restarting, retry shortly",
                               code="replica_unavailable")
            await asyncio.sleep(0.2)

    def failed(self, model: Served, slot: int, e: BaseException) -> None:
        log.warning("replica %d of %s failed: %s: %s", slot, model.entry.id, type(e).__name__, e)
        model.failures += 1
        if model.keys is None:  # one autoscaled group: Ray replaces its replicas and routes around them
            return
        if model.replicas.live[slot]:
            model.replicas.failed(slot)
            task = asyncio.ensure_future(self._probe(model, slot))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    async def _probe(self, model: Served, slot: int) -> None:
        """Ask the slot's deployment until a replica answers (Ray restarts it); then it is live again."""
        while True:
            await asyncio.sleep(self.config.probe_s)
            call = model.handles[slot].info.remote()
            try:
                await asyncio.wait_for(call, timeout=5)
            except Exception:  # noqa: BLE001 (still down or still loading)
                call.cancel()
                continue
            model.replicas.live[slot] = True
            log.info("replica %d of %s is back", slot, model.entry.id)
            return

    # ---------------------------------------------------------------- relaying

    async def forward(self, request: Request, path: str) -> Response:
        check_key(request, self.config.api_key)
        body = await request.body()
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = None  # not JSON: the replica's app answers with `infr serve`'s 400
        model = self.model_for(data.get("model") if isinstance(data, dict) else None)
        model.requests += 1
        slot = await self.slot_for(model, path, data)
        r = model.replicas
        r.load[slot] += 1
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()
                   if k.lower() not in ("authorization", "x-api-key", "content-length")]
        headers.append((b"content-length", str(len(body)).encode()))
        gen = model.handles[slot].options(stream=True).handle.remote(
            request.method, path, request.scope.get("query_string", b""), headers, body)
        streaming = False
        try:
            head = await self._next(gen, self.config.first_event_s)
            out_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head["headers"]
                           if k.lower() in RELAYED_HEADERS}
            # Litestar appends the charset again to a text type: pass the bare type
            media = out_headers.pop("content-type", "application/json").split(";")[0].strip()
            if media.startswith("text/event-stream"):
                streaming = True
                return Stream(self._relay(gen, model, slot), status_code=head["status"], media_type=media,
                              headers=out_headers)
            chunks = []
            while True:
                try:
                    chunks.append(await self._next(gen, self.config.event_gap_s))
                except StopAsyncIteration:
                    break
            return Response(b"".join(chunks), status_code=head["status"], media_type=media, headers=out_headers)
        except (RayError, asyncio.TimeoutError, StopAsyncIteration) as e:
            self.failed(model, slot, e)
            raise APIError(503, f"the replica serving {model.entry.id!r} failed before answering "
                                f"({_reason(e)}); retry the request", code="replica_failed") from None
        finally:
            if not streaming:
                r.load[slot] -= 1
                gen.cancel()

    @staticmethod
    async def _next(gen, timeout: float):
        return await asyncio.wait_for(gen.__anext__(), timeout=timeout)

    async def _relay(self, gen, model: Served, slot: int) -> AsyncIterator[bytes]:
        try:
            while True:
                try:
                    yield await self._next(gen, self.config.event_gap_s)
                except StopAsyncIteration:
                    return
        except (RayError, asyncio.TimeoutError) as e:  # headers are sent: the failure is an error event
            self.failed(model, slot, e)
            yield sse(errors.body(503, f"the replica serving {model.entry.id!r} failed mid-answer ({_reason(e)}); "
                                       "retry the request", code="replica_failed"))
            yield b"data: [DONE]\n\n"
        finally:
            model.replicas.load[slot] -= 1
            gen.cancel()  # a client that left: the replica's app sees a disconnect and frees the slot

    # ---------------------------------------------------------------- health, models, metrics

    def health(self) -> Response:
        models = {m.entry.id: {"live": sum(m.replicas.live), "replicas": m.replicas.n} for m in self.models.values()}
        ok = all(v["live"] for v in models.values())
        return Response({"status": "ok" if ok else "degraded", "models": models}, status_code=200 if ok else 503)

    def model_card(self, model: Served) -> dict:
        return {"id": model.entry.id, "object": "model", "created": model.created, "owned_by": "infr",
                "meta": {"replicas": model.replicas.n, "live": sum(model.replicas.live),
                         **({"backend": model.backend} if model.backend else {})}}

    async def metrics(self) -> str:
        async def one(model: Served, slot: int):
            if not model.replicas.live[slot]:
                return None
            call = model.handles[slot].metrics.remote()
            try:
                return await asyncio.wait_for(call, timeout=5)
            except Exception:  # noqa: BLE001 (a replica going down: its numbers are missing this time)
                call.cancel()
                return None

        pairs = [(m, i) for m in self.models.values() for i in range(len(m.handles))]
        texts = await asyncio.gather(*(one(m, i) for m, i in pairs))
        parts = [({"model": m.entry.id, "replica": str(i)}, t) for (m, i), t in zip(pairs, texts) if t is not None]
        return merge(parts, self.cluster_samples())

    def cluster_samples(self) -> list[tuple[str, str, str, list[tuple[dict, float]]]]:
        ms = list(self.models.values())
        return [
            ("cluster_requests_total", "counter", "Requests the ingress routed, by model.",
             [({"model": m.entry.id}, m.requests) for m in ms]),
            ("cluster_replicas", "gauge", "Replica slots, by model and state.",
             [({"model": m.entry.id, "state": s}, n) for m in ms
              for s, n in (("live", sum(m.replicas.live)), ("down", m.replicas.n - sum(m.replicas.live)))]),
            ("cluster_replica_failures_total", "counter", "Requests whose replica died or stalled, by model.",
             [({"model": m.entry.id}, m.failures) for m in ms]),
            ("cluster_routed_total", "counter", "Routing choices: a cached prefix's replica, or the least loaded.",
             [({"model": m.entry.id, "by": k}, v) for m in ms for k, v in m.replicas.routed.items()]),
            ("cluster_requests_in_flight", "gauge", "Requests on each replica, as the ingress counts them.",
             [({"model": m.entry.id, "replica": str(i)}, m.replicas.load[i]) for m in ms
              for i in range(m.replicas.n)]),
        ]


def _reason(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "no answer in time"
    if isinstance(e, StopAsyncIteration):
        return "it ended the answer before starting it"
    return type(e).__name__


def build_app(ingress: Ingress) -> Litestar:
    @get("/health", sync_to_thread=False)
    def health() -> Response:
        return ingress.health()

    @get("/v1/models", sync_to_thread=False)
    def list_models(request: Request) -> dict:
        check_key(request, ingress.config.api_key)
        return {"object": "list", "data": [ingress.model_card(m) for m in ingress.models.values()]}

    @get("/v1/models/{name:path}", sync_to_thread=False)
    def get_model(request: Request, name: FromPath[str]) -> dict:
        check_key(request, ingress.config.api_key)
        name = name.lstrip("/")
        model = ingress.names.get(name)
        if model is None:
            raise model_not_found(name)
        return ingress.model_card(model)

    @get("/metrics", media_type="text/plain; version=0.0.4")
    async def metrics(request: Request) -> str:
        check_key(request, ingress.config.api_key)
        return await ingress.metrics()

    @post(["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"], status_code=200)
    async def relayed(request: Request) -> Response:
        return await ingress.forward(request, request.url.path)

    return Litestar(route_handlers=[health, list_models, get_model, metrics, relayed],
                    exception_handlers=errors.HANDLERS, request_max_body_size=32 * 1024 * 1024, debug=False)
