"""Tool calls: the model's own dialect in the prompt, parsed back into OpenAI `tool_calls`.

Dialects (picked from the chat template's text):
- hermes (Qwen2.5, Hermes, Qwen3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- llama3: the whole reply is `{"name": ..., "parameters": {...}}` (after `<|python_tag|>`)
- gemma: a fenced `tool_code` block holding `name(arg=value, ...)`
- gemma4: `<|tool_call>call:name{key:value,...}<tool_call|>`, one span per call (tools_gemma4.py)
Every dialect also accepts a reply that is one bare JSON call naming a known tool, which small
models often write instead of their tags.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass

from infr.serve.text import TagSplitter

DIALECT_TAGS = {"hermes": ("<tool_call>", "</tool_call>"), "gemma": ("```tool_code", "```"),
                "gemma4": ("<|tool_call>", "<tool_call|>"),
                "llama3": ("<|python_tag|>", "\n\n\n")}  # llama3's tag is rarely closed; see finish()
# Text the server writes for the model when a call is forced (tool_choice required / named).
FORCED_PREFIX = {"hermes": "<tool_call>\n", "llama3": "", "gemma": "", "gemma4": ""}
# Special tokens whose text the server keeps in the output when tools are on, so the dialect's
# tags reach the parser (the rest of the special tokens print nothing, as llama-server's).
PRESERVED_TOKENS = {"gemma4": ("<|tool_call>", "<tool_call|>", '<|"|>')}

# For templates that never mention tools: a Hermes-style system note so the model knows them.
TOOL_SYSTEM_NOTE = (
    "You may call functions. The available tools, as JSON schemas:\n<tools>\n{tools}\n</tools>\n"
    "To call one, reply with <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>"
)


def pick_dialect(template_source: str) -> str:
    if "<|tool_call>" in template_source:  # Gemma 4
        return "gemma4"
    if "<tool_call>" in template_source:
        return "hermes"
    if "<|python_tag|>" in template_source or "ipython" in template_source:
        return "llama3"
    if "tool_code" in template_source:
        return "gemma"
    return "hermes"


def template_knows_tools(template_source: str) -> bool:
    return "tools" in template_source


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = "call_" + uuid.uuid4().hex[:24]

    def to_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


def parse_json_call(text: str, names: set[str] | None = None) -> ParsedCall | None:
    """A call from `{"name": ..., "arguments"|"parameters": {...}}`; None when it is not one."""
    text = text.strip()
    if text.startswith("```"):  # some models fence their JSON
        text = text.strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_python_call(text: str, names: set[str] | None = None) -> ParsedCall | None:
    """Gemma's `name(a=1, b="x")`: keyword arguments with literal values only."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if names is not None and node.func.id not in names:
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        return None
    return ParsedCall(node.func.id, json.dumps(args, ensure_ascii=False))


# The head of a JSON call up to the brace that opens its arguments object.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


class CallBuilder:
    """One JSON call as its text arrives, for streaming it the way OpenAI does: once
    `{"name": "<known tool>", "arguments": {` has come, ("call_head", call) goes out (id and
    name, empty arguments), then ("call_args", piece) for each piece of the arguments object's
    text up to the brace that closes it (strings and escapes are tracked, so braces inside
    strings do not count). Anything else stays unmatched and the caller parses the whole call
    at the end, as before. `call.arguments` accumulates the pieces."""

    def __init__(self, names: set[str]):
        self.names = names
        self.text = ""
        self.call: ParsedCall | None = None
        self.pos = 0  # scanned up to here in `text`
        self.depth = 0
        self.in_string = self.escape = self.closed = False

    def push(self, text: str) -> list[tuple[str, object]]:
        self.text += text
        out: list[tuple[str, object]] = []
        if self.call is None:
            m = _HEAD.match(self.text)
            if m is None:
                return out
            try:
                name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                return out
            if name not in self.names:  # an unknown name: left to the whole-call parse
                return out
            self.call = ParsedCall(name, "")
            self.pos = m.end()
            out.append(("call_head", self.call))
        if self.closed:
            return out
        t, i = self.text, self.pos
        while i < len(t):
            c = t[i]
            i += 1
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.closed = True
                    break
        piece, self.pos = t[self.pos:i], i
        if piece:
            self.call.arguments += piece
            out.append(("call_args", piece))
        return out

    @property
    def streaming(self) -> bool:
        return self.call is not None


class ToolCallStream:
    """Turns released text into ("content", text) events and tool calls: ("call", ParsedCall)
    for a call parsed whole, or ("call_head", call) then ("call_args", piece)... for a JSON
    call streamed as it is written (see CallBuilder)."""

    def __init__(self, dialect: str, names: set[str], forced_prefix: bool = False):
        self.dialect = dialect
        self.names = names
        open_tag, close_tag = DIALECT_TAGS[dialect]
        # A forced call starts inside the tag the server already wrote.
        self.tags = TagSplitter(open_tag, close_tag, start_inside=forced_prefix and dialect == "hermes")
        self.forced = forced_prefix
        self.mode: str | None = "tags" if forced_prefix and dialect == "hermes" else None  # None: undecided
        self.pending = ""  # text held while undecided or in bare-JSON mode
        self.span = ""  # the inside of the current tag span
        self.builder = CallBuilder(names)
        self.calls = 0

    def push(self, text: str) -> list[tuple[str, object]]:
        if self.mode is None:
            self.pending += text
            head = self.pending.lstrip()
            if not head:
                return []
            # A reply that opens with "{" may be a bare JSON call: hold it to the end.
            self.mode = "json" if head.startswith("{") or self.forced else "tags"
            text, self.pending = self.pending, ""
        if self.mode == "json":
            self.pending += text
            # Streamed only when forced: the grammar then makes the reply exactly one call. Unforced,
            # the reply is a call only if it is nothing but one (small models echo JSON after it).
            return self._count(self.builder.push(text)) if self.forced else []
        return self._convert(self.tags.push(text))

    def finish(self) -> list[tuple[str, object]]:
        if self.mode in (None, "json"):
            text, self.pending = self.pending, ""
            if self.builder.streaming:  # already out; text after the call is dropped
                return []
            call = parse_json_call(text, self.names) or parse_json_call(text)
            if call is not None:
                self.calls += 1
                return [("call", call)]
            return [("content", text)] if text else []
        out = self._convert(self.tags.flush())
        if self.tags.inside:  # a span left open at the end
            out += self._end_span(closed=False)
        return out

    def _count(self, events: list[tuple[str, object]]) -> list[tuple[str, object]]:
        self.calls += sum(kind == "call_head" for kind, _ in events)
        return events

    def _convert(self, pieces: list[tuple[str, str]]) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        for kind, text in pieces:
            if kind == "out":
                out.append(("content", text))
            elif kind == "in":
                self.span += text
                out += self._count(self.builder.push(text))
            elif kind == "end":
                out += self._end_span(closed=True)
        return out

    def _end_span(self, closed: bool) -> list[tuple[str, object]]:
        body, streamed = self.span, self.builder.streaming
        self.span, self.builder = "", CallBuilder(self.names)
        if streamed:  # the call went out piece by piece
            return []
        if self.dialect == "gemma":
            call = parse_python_call(body, self.names) or parse_json_call(body)
        elif self.dialect == "gemma4":
            from infr.serve.tools_gemma4 import parse_gemma4_call  # it imports ParsedCall from here

            call = parse_gemma4_call(body, self.names) or parse_json_call(body, self.names)
        else:
            call = parse_json_call(body)
        if call is not None:
            self.calls += 1
            return [("call", call)]
        open_tag, close_tag = DIALECT_TAGS[self.dialect]  # not a call after all: the text goes back verbatim
        return [("content", open_tag + body + (close_tag if closed else ""))]
