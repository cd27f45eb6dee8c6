"""Gemma 4's chat template: the real text, and the message shape it wants for tool results.

`infr/templates/gemma4.jinja` is the chat template Google released with the gemma-4-*-it models,
as llama.cpp keeps it (models/templates/gemma4.jinja). Synthetic Gemma 4 files carry it
(infr.synth's `tiny-gemma4-chat`), and a real GGUF brings its own copy.

Its dialect (facts from the template and Google's Gemma 4 function-calling guide):
- turns are `<|turn>ROLE\\n ... <turn|>\\n`, the assistant's role is `model`; a system message,
  tools or thinking open a `<|turn>system` turn, tools inside it as `<|tool>declaration:...<tool|>`;
- a call is `<|tool_call>call:NAME{key:value,...}<tool_call|>`: keys bare, strings between
  `<|"|>` marks with nothing escaped, numbers and true/false bare, objects `{k:v}`, lists `[v,...]`;
- a result is `<|tool_response>response:NAME{key:value,...}<tool_response|>` (a non-object result
  as `{value:...}`), written inside the model's turn right after its calls: the turn is not closed
  and the model goes on in it. The template reads results from a `tool_responses` list on a
  message, not from OpenAI's separate `role: tool` messages, so those are folded into the
  assistant message that made the calls (see fold_tool_messages).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

TEMPLATE_PATH = Path(__file__).parent / "templates" / "gemma4.jinja"


@lru_cache(maxsize=1)
def template_source() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def wants_tool_responses(source: str) -> bool:
    """A Gemma 4 template that reads tool results only from `tool_responses` (Google's first one;
    a template that handles `role: tool` itself is left alone)."""
    handles_tool_role = "== 'tool'" in source or "!= 'tool'" in source
    return "<|tool_call>" in source and "tool_responses" in source and not handles_tool_role


def _response_value(content: str):
    # Results usually come as JSON text; an object renders key by key, anything else as one value.
    try:
        value = json.loads(content)
    except (json.JSONDecodeError, ValueError, TypeError):
        return content
    return value if isinstance(value, dict) else content


def fold_tool_messages(messages: list[dict]) -> list[dict]:
    """Each run of `role: tool` messages joins the assistant message with the calls before it, as
    its `tool_responses` ({"name", "response"}); the name comes from the message's `name`, else
    the call its `tool_call_id` names, else the call in the same position. An assistant answer right
    after the results joins that message's content: the model wrote it in the same turn, and the
    template closes the turn after it. A tool message with no assistant call before it stays as it is."""
    out: list[dict] = []
    host: dict | None = None  # the assistant message collecting results
    for msg in messages:
        if host is not None and host["tool_responses"] and msg.get("role") == "assistant" and not msg.get("tool_calls"):
            # the answer written after the results, in the same model turn (as it was generated)
            host["content"] = (host.get("content") or "") + (msg.get("content") or "")
            host = None
            continue
        if msg.get("role") != "tool":
            host = None
            if msg.get("role") == "assistant" and msg.get("tool_calls"):
                host = dict(msg)
                host["tool_responses"] = []
                out.append(host)
            else:
                out.append(msg)
            continue
        if host is None:
            out.append(msg)
            continue
        # (id, name) of each well-formed call; anything odd just leaves a result unnamed
        calls = [(c.get("id"), c["function"].get("name")) for c in host["tool_calls"]
                 if isinstance(c, dict) and isinstance(c.get("function"), dict)]
        name = msg.get("name")
        if not name and msg.get("tool_call_id"):
            name = next((n for cid, n in calls if cid == msg["tool_call_id"]), None)
        if not name:
            i = len(host["tool_responses"])
            name = calls[i][1] if i < len(calls) else None
        content = msg.get("content")
        host["tool_responses"].append({"name": name if isinstance(name, str) and name else "unknown",
                                       "response": _response_value(content if isinstance(content, str) else "")})
    for m in out:
        if "tool_responses" in m and not m["tool_responses"]:
            del m["tool_responses"]  # calls still waiting for results: the turn closes as usual
    return out
