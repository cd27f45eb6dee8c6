"""The Litestar app: OpenAI-compatible routes over one Service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from infr.errors import InfrError
from infr.serve import errors
from infr.serve.errors import APIError
from infr.serve.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from infr.serve.service import Config, Service, model_not_found, new_id, timings, usage

log = logging.getLogger("infr.serve")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _svc(request: Request | ASGIConnection) -> Service:
    return request.app.state.service


def require_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    check_key(connection, _svc(connection).config.api_key)


def check_key(connection: ASGIConnection, key: str | None) -> None:
    """401 unless the request carries `key` (none: every request passes); the cluster ingress uses it too."""
    if not key:
        return
    auth = connection.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else connection.headers.get("x-api-key", "")
    if given != key:
        raise APIError(401, "invalid API key" if given else "missing API key (send Authorization: Bearer KEY)",
                       code="invalid_api_key")


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


# ---------------------------------------------------------------- health, models, metrics


@get("/health", sync_to_thread=False)
def health(request: Request) -> Response:
    svc = _svc(request)
    if svc.ready:
        return Response({"status": "ok"}, status_code=200)
    if svc.load_error:
        return Response({"status": "error", "error": svc.load_error}, status_code=503)
    return Response({"status": "loading model"}, status_code=503)


@get("/v1/models", guards=[require_key], sync_to_thread=False)
def list_models(request: Request) -> dict:
    svc = _svc(request)
    svc.metrics.request("models")
    data = [{"id": svc.model_id, "object": "model", "created": svc.created, "owned_by": "infr"}]
    if svc.ready:
        data[0]["meta"] = {"n_ctx": svc.model.n_ctx, "backend": svc.model.backend_name,
                           "n_vocab": svc.model.spec.n_vocab}
    return {"object": "list", "data": data}


@get("/v1/models/{name:path}", guards=[require_key], sync_to_thread=False)
def get_model(request: Request, name: FromPath[str]) -> dict:
    svc = _svc(request)
    name = name.lstrip("/")
    if name not in svc.names:
        raise model_not_found(name)
    return {"id": svc.model_id, "object": "model", "created": svc.created, "owned_by": "infr"}


@get("/metrics", guards=[require_key], sync_to_thread=False, media_type="text/plain; version=0.0.4")
def metrics(request: Request) -> str:
    svc = _svc(request)
    return svc.metrics.render(svc.model.engine if svc.model is not None else None)


# ---------------------------------------------------------------- tokenize


@post("/tokenize", guards=[require_key], sync_to_thread=False, status_code=200)
def tokenize(request: Request, data: JSONBody[TokenizeRequest]) -> dict:
    svc = _svc(request)
    svc.metrics.request("tokenize")
    svc.require_model(data.model)
    tok = svc.model.tokenizer
    if (data.content is None) == (data.messages is None):
        raise APIError(400, "send exactly one of content or messages", param="content")
    if data.messages is not None:
        import msgspec

        msgs = [{k: v for k, v in msgspec.to_builtins(m).items() if v is not None} for m in data.messages]
        try:
            text = svc.model.template.render(msgs, add_generation_prompt=True)
        except InfrError as e:
            raise APIError(400, f"the chat template refused these messages: {e}", param="messages") from None
        ids = tok.encode(text, add_special=True, parse_special=True)
    else:
        ids = tok.encode(data.content, add_special=data.add_special, parse_special=True)
    out: dict = {"tokens": ids, "count": len(ids)}
    if data.with_pieces:
        out["pieces"] = [tok.token_to_bytes(i).decode("utf-8", errors="replace") for i in ids]
    return out


@post("/detokenize", guards=[require_key], sync_to_thread=False, status_code=200)
def detokenize(request: Request, data: JSONBody[DetokenizeRequest]) -> dict:
    svc = _svc(request)
    svc.metrics.request("detokenize")
    svc.require_model(data.model)
    tok = svc.model.tokenizer
    bad = [t for t in data.tokens if t >= tok.n_vocab]
    if bad:
        raise APIError(400, f"token {bad[0]} is outside the vocabulary (0..{tok.n_vocab - 1})", param="tokens")
    return {"content": tok.decode(data.tokens, skip_special=False)}


# ---------------------------------------------------------------- chat


@post("/v1/chat/completions", guards=[require_key], status_code=200)
async def chat_completions(request: Request, data: JSONBody[ChatCompletionRequest]) -> Response:
    svc = _svc(request)
    svc.metrics.request("chat")
    prep = svc.prepare_chat(data)
    cid, created = new_id("chatcmpl-"), int(time.time())
    base = {"id": cid, "created": created, "model": svc.model_id, "system_fingerprint": "infr"}
    if data.stream:
        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        return Stream(_chat_stream(svc, prep, base, include_usage, data.logprobs),
                      media_type="text/event-stream", headers=SSE_HEADERS)
    out, logprobs = prep.output, []
    outcome = None
    for kind, value in await _collect(request, svc.events(prep.job)):
        if kind == "text":
            out.push(value["text"])
            logprobs += value["logprobs"]
        else:
            outcome = value
    out.finish()
    choice = {"index": 0, "message": out.message(), "finish_reason": _finish(outcome, out),
              "logprobs": {"content": logprobs} if data.logprobs else None}
    return Response({**base, "object": "chat.completion", "choices": [choice], "usage": usage(outcome),
                     "timings": timings(outcome)})


async def _collect(request: Request, events: AsyncIterator) -> list:
    """All of a non-streaming request's events, or a 499 when the client hangs up first: leaving
    `events` early cancels the generation and frees its slot, as a closed stream does. The ASGI
    server's receive() yields http.disconnect once the body is read and the client has gone."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    consumer = asyncio.ensure_future(_drain(events))
    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not consumer.done():
            consumer.cancel()
    if consumer.cancelled() or not consumer.done():
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        raise APIError(499, "the client closed the connection before the answer was ready",
                       code="client_closed_request")
    return consumer.result()


async def _drain(events: AsyncIterator) -> list:
    return [ev async for ev in events]


def _finish(outcome, out) -> str:
    if out is not None and out.calls:
        return "tool_calls"
    return "length" if outcome.finish_reason == "length" else "stop"


async def _chat_stream(svc: Service, prep, base: dict, include_usage: bool, logprobs: bool) -> AsyncIterator[bytes]:
    def chunk(delta: dict, finish: str | None = None, lp: list | None = None, timed=None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish,
                  "logprobs": {"content": lp} if logprobs and lp is not None else None}
        c = {**base, "object": "chat.completion.chunk", "choices": [choice]}
        if include_usage:
            c["usage"] = None
        if timed is not None:  # the last chunk carries llama-server's timings
            c["timings"] = timings(timed)
        return sse(c)

    out = prep.output
    yield chunk({"role": "assistant", "content": ""})
    try:
        outcome = None
        async for kind, value in svc.events(prep.job):
            if kind == "done":
                outcome = value
                break
            deltas = out.push(value["text"])
            lp = value["logprobs"]
            if not deltas and lp:
                deltas = [{"content": ""}]  # logprobs of held-back text still go out with this chunk
            for i, d in enumerate(deltas):
                yield chunk(d, lp=lp if i == 0 else None)
        for d in out.finish():
            yield chunk(d)
        yield chunk({}, _finish(outcome, out), timed=outcome)
        if include_usage:
            yield sse({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage(outcome)})
    except Exception as e:  # headers are sent: the failure goes out as an error event
        yield _stream_error(svc, e)
    yield b"data: [DONE]\n\n"


def _stream_error(svc: Service, e: Exception) -> bytes:
    if not isinstance(e, APIError):
        log.error("stream failed: %s: %s", type(e).__name__, e)
        e = APIError(500, f"generation failed: {type(e).__name__}: {e}")
    svc.metrics.error(e.status)
    return sse(errors.body(e.status, e.message, e.param, e.code))


# ---------------------------------------------------------------- completions


@post("/v1/completions", guards=[require_key], status_code=200)
async def completions(request: Request, data: JSONBody[CompletionRequest]) -> Response:
    svc = _svc(request)
    svc.metrics.request("completions")
    prep = svc.prepare_completion(data)
    base = {"id": new_id("cmpl-"), "created": int(time.time()), "model": svc.model_id, "system_fingerprint": "infr"}
    echo = svc.model.tokenizer.decode(prep.job.prompt, skip_special=True) if data.echo else ""
    if data.stream:
        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        return Stream(_completion_stream(svc, prep, base, include_usage, echo, data.logprobs is not None),
                      media_type="text/event-stream", headers=SSE_HEADERS)
    text, entries, outcome = echo, [], None
    for kind, value in await _collect(request, svc.events(prep.job)):
        if kind == "text":
            text += value["text"]
            entries += value["logprobs"]
        else:
            outcome = value
    choice = {"index": 0, "text": text, "finish_reason": _finish(outcome, None),
              "logprobs": _legacy_logprobs(entries, len(echo)) if data.logprobs is not None else None}
    return Response({**base, "object": "text_completion", "choices": [choice], "usage": usage(outcome),
                     "timings": timings(outcome)})


def _legacy_logprobs(entries: list[dict], offset: int) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e["token"])
        lps.append(e["logprob"])
        tops.append({t["token"]: t["logprob"] for t in e["top_logprobs"]})
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


async def _completion_stream(svc, prep, base, include_usage, echo, want_lp) -> AsyncIterator[bytes]:
    def chunk(text: str, finish: str | None = None, entries: list | None = None, timed=None) -> bytes:
        c = {**base, "object": "text_completion",
             "choices": [{"index": 0, "text": text, "finish_reason": finish,
                          "logprobs": _legacy_logprobs(entries, 0) if want_lp and entries else None}]}
        if timed is not None:  # the last chunk carries llama-server's timings
            c["timings"] = timings(timed)
        return sse(c)

    try:
        if echo:
            yield chunk(echo)
        outcome = None
        async for kind, value in svc.events(prep.job):
            if kind == "done":
                outcome = value
                break
            yield chunk(value["text"], entries=value["logprobs"])
        yield chunk("", _finish(outcome, None), timed=outcome)
        if include_usage:
            yield sse({**base, "object": "text_completion", "choices": [], "usage": usage(outcome)})
    except Exception as e:  # headers are sent: the failure goes out as an error event
        yield _stream_error(svc, e)
    yield b"data: [DONE]\n\n"


# ---------------------------------------------------------------- app


def create_app(config: Config, service: Service | None = None) -> Litestar:
    svc = service or Service(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar):
        app.state.service = svc
        svc.start_workers()
        task = None
        if not svc.ready:
            # Load in a thread so /health answers 503 while the weights come in.
            async def load() -> None:
                try:
                    await asyncio.get_running_loop().run_in_executor(None, svc.load)
                except Exception as e:  # keep serving /health with the reason
                    svc.load_error = f"{type(e).__name__}: {e}" if not isinstance(e, InfrError) else str(e)
                    log.error("model failed to load: %s", svc.load_error)

            task = asyncio.create_task(load())
        try:
            yield
        finally:
            if task is not None and not task.done():
                task.cancel()
            svc.stop_workers()

    def before_send_status(message, scope) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400 and scope["path"] != "/health":
            svc.metrics.error(message["status"])

    app = Litestar(
        route_handlers=[health, list_models, get_model, metrics, tokenize, detokenize, chat_completions, completions],
        lifespan=[lifespan],
        exception_handlers=errors.HANDLERS,
        openapi_config=OpenAPIConfig(title="infr", version="0.1.0", description="OpenAI-compatible API of infr"),
        before_send=[before_send_status],
        request_max_body_size=32 * 1024 * 1024,
        debug=False,
    )
    app.state.service = svc
    return app
