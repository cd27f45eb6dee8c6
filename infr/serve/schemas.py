"""Request bodies as msgspec Structs: Litestar validates them and builds the OpenAPI schema.

Unknown keys are ignored, as OpenAI ignores them (`user`, `metadata`, `store`, ...). Fields we
know but cannot honour are declared so that `check_unsupported` can reject them by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from infr.serve.errors import APIError

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
MaxTokens = Annotated[int, Meta(ge=1, le=2**31 - 1)]


class ContentPart(Struct, kw_only=True):
    type: str
    text: str | None = None


class FunctionCall(Struct, kw_only=True):
    name: str
    arguments: str = "{}"


class ToolCall(Struct, kw_only=True):
    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class Message(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=128)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Struct, kw_only=True):
    name: str


class NamedToolChoice(Struct, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Struct, kw_only=True):
    name: str = "response"
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class _Sampling(Struct, kw_only=True):
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    min_p: Unit | None = None
    seed: Annotated[int, Meta(ge=0, le=2 ** 63 - 1)] | None = None
    stop: str | list[str] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None  # llama.cpp's name
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    cache_prompt: bool = True  # llama.cpp's switch for prefix reuse
    ignore_eos: bool = False  # llama.cpp's and vLLM's: keep generating past end-of-generation tokens


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: list[Message]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[str | int]
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class TokenizeRequest(Struct, kw_only=True):
    content: str | None = None
    messages: list[Message] | None = None
    add_special: bool = True
    with_pieces: bool = False
    model: str | None = None


class DetokenizeRequest(Struct, kw_only=True):
    tokens: list[Annotated[int, Meta(ge=0)]]
    model: str | None = None


def check_unsupported(req: _Sampling) -> None:
    """400 naming each field this server understands but cannot honour."""
    bad = []
    if req.n not in (None, 1):
        bad.append("n (only n=1 is supported)")
    if req.logit_bias:
        bad.append("logit_bias")
    if isinstance(req, ChatCompletionRequest):
        if req.audio is not None or (req.modalities and set(req.modalities) - {"text"}):
            bad.append("audio/modalities (text only)")
    if isinstance(req, CompletionRequest):
        if req.suffix:
            bad.append("suffix")
        if req.best_of not in (None, 1):
            bad.append("best_of")
    if bad:
        raise APIError(400, "unsupported field(s): " + ", ".join(bad), param=bad[0].split()[0])


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else list(stop)
    if len(items) > 16:
        raise APIError(400, f"stop has {len(items)} strings; at most 16 are allowed", param="stop")
    if any(s == "" for s in items):
        raise APIError(400, "stop strings must not be empty", param="stop")
    return items


def to_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)
