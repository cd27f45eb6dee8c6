"""OpenAI-shaped errors: every failure a client sees is `{"error": {...}}` with a status."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

log = logging.getLogger("infr.serve")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param,
                      "code": code if code is not None else status}}


def _response(status: int, message: str, param: str | None = None, code: str | None = None) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Response(body(status, message, param, code), status_code=status, headers=headers)


def _validation_message(exc: ValidationException) -> tuple[str, str | None]:
    # Litestar/msgspec put the precise reason in `extra`; a client wants that, not "Validation failed".
    extra = exc.extra if isinstance(exc.extra, list) else []
    parts, param = [], None
    for item in extra:
        if isinstance(item, dict):
            key = item.get("key")
            msg = str(item.get("message", ""))
            if key and key != "body":
                param = param or str(key)
                parts.append(f"{msg} (at {key})")
            else:
                parts.append(msg)
    detail = "; ".join(p for p in parts if p) or str(exc.detail)
    if "malformed" in detail.lower() or "decode" in detail.lower():
        return f"request body is not valid JSON: {detail}", None
    return f"invalid request: {detail}", param


def handle_api_error(request: Request, exc: APIError) -> Response:
    return _response(exc.status, exc.message, exc.param, exc.code)


def handle_validation(request: Request, exc: ValidationException) -> Response:
    message, param = _validation_message(exc)
    return _response(400, message, param)


def handle_http(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    message = str(exc.detail)
    if status == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif status == 400 and "malformed" in message.lower():
        message = f"request body is not valid JSON: {message}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return _response(status, message)


def handle_any(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _response(500, f"internal error: {type(exc).__name__}: {exc}")


HANDLERS = {APIError: handle_api_error, ValidationException: handle_validation,
            HTTPException: handle_http, Exception: handle_any}
