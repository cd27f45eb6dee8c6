"""Chat templates: a GGUF's Jinja `tokenizer.chat_template` rendered as llama.cpp renders it.

The template runs in jinja2's ImmutableSandboxedEnvironment with `trim_blocks` and
`lstrip_blocks`, the setup Hugging Face and llama.cpp both use, and with the names real
templates call (`raise_exception`, `strftime_now`, a `tojson` that does not HTML-escape).

Before rendering, messages and tools are brought into the shape llama.cpp's server hands its
template (facts from llama.cpp's common/chat.cpp, checked by tests/fixtures/templates.json):
- content given as a list of text parts becomes one string, parts joined by "\\n";
  missing or null content becomes "";
- a tool call's `function.arguments` given as a JSON string is parsed into an object, because
  templates write `arguments | tojson` and would otherwise emit a quoted string;
- each tool becomes {"type": "function", "function": {"name", "description", "parameters"}}
  in that key order, `description` defaulting to "" and `parameters` to {};
- a leading BOS / trailing EOS text the template writes is dropped when the tokenizer adds
  that token itself, so the prompt is not tokenized with two BOS tokens.

A file can carry named variants (`tokenizer.chat_template.<name>`); as in llama.cpp the
`tool_use` one is used when tools are given, and stands in for a missing default.

A file without a template (base models such as Gemma-3-270m) gets a plain fallback: one
`role: content` line per message and a final `assistant:` when a reply is wanted. llama.cpp
falls back to ChatML instead, but ChatML's `<|im_start|>` markers are not special tokens in a
base model's vocabulary and only read as noise to it; plain labelled lines are the text a base
model continues most naturally.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infr import chat_gemma4
from infr.errors import InfrError

DEFAULT_KEY = "tokenizer.chat_template"
TOOL_USE = "tool_use"

# Text-continuation fallback; see the module docstring for why not ChatML.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
FALLBACK_REASON = "model has no chat template; using a plain 'role: content' fallback"


class TemplateError(InfrError):
    """The chat template cannot be compiled or refused to render these messages."""


class ToolCallArguments(dict):
    """A tool call's parsed arguments that still print as the caller's JSON text.

    Templates that write `arguments | tojson` need an object (llama.cpp parses the string
    for them); templates that print `{{ arguments }}` expect the original string. A dict
    whose str() is that string serves both.
    """

    def __init__(self, mapping: dict, text: str):
        super().__init__(mapping)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Same parameters and defaults as Hugging Face's chat-template filter; jinja2's own
    # `tojson` HTML-escapes <, >, &, ' and would corrupt prompts.
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=tuple(separators) if separators is not None else None,
        sort_keys=sort_keys,
    )


def _raise_exception(message: Any) -> None:
    raise TemplateError(_one_line(f"chat template: {message}"))


class _GenerationTag(jinja2.ext.Extension):
    """Passes `{% generation %}...{% endgeneration %}` through (HF marks trainable spans with it)."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return body


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, jinja2.ext.do, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _compile(env: ImmutableSandboxedEnvironment, source: str, name: str) -> jinja2.Template:
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(
            _one_line(f"chat template {name!r} has a syntax error at line {e.lineno}: {e.message}")
        ) from None


class ChatTemplate:
    """A model's chat template(s), ready to turn messages into a prompt string."""

    def __init__(
        self,
        source: str | None,
        bos_token: str = "",
        eos_token: str = "",
        named: dict[str, str] | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
        now: Callable[[], datetime] = datetime.now,
    ):
        named = dict(named or {})
        if not source and TOOL_USE in named:
            source = named[TOOL_USE]  # llama.cpp: a lone tool_use template is the default too
        self.is_fallback = not source
        self.fallback_reason = FALLBACK_REASON if self.is_fallback else None
        self.source = source or FALLBACK_TEMPLATE
        self.named_sources = named
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.now = now  # strftime_now's clock; tests and fixtures pin it
        self._env = _environment()
        self._env.globals["strftime_now"] = lambda fmt: self.now().strftime(fmt)
        self._default = _compile(self._env, self.source, "default")
        # Gemma 4 reads tool results from the calling message (infr/chat_gemma4.py).
        self._fold_tools = {id(self._default): chat_gemma4.wants_tool_responses(self.source)}
        self._named: dict[str, jinja2.Template | TemplateError] = {}
        for name, src in named.items():
            try:
                self._named[name] = _compile(self._env, src, name)
                self._fold_tools[id(self._named[name])] = chat_gemma4.wants_tool_responses(src)
            except TemplateError as e:
                # llama.cpp ignores a broken tool_use template; fail only if it is chosen.
                self._named[name] = e

    @classmethod
    def from_gguf(
        cls,
        gf: Any,
        bos_token: str,
        eos_token: str,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
    ) -> "ChatTemplate":
        """Read the default and named templates from a GGUFFile's metadata.

        add_bos/add_eos say whether the tokenizer adds those tokens itself; left as None
        they come from `tokenizer.ggml.add_bos_token` / `add_eos_token` (absent: False).
        """
        meta = gf.metadata
        prefix = DEFAULT_KEY + "."
        named = {k[len(prefix):]: v for k, v in meta.items() if k.startswith(prefix) and isinstance(v, str)}
        if add_bos is None:
            add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        if add_eos is None:
            add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        return cls(meta.get(DEFAULT_KEY) or None, bos_token, eos_token, named, add_bos, add_eos)

    def _pick(self, tools: list[dict] | None) -> jinja2.Template:
        if tools and TOOL_USE in self._named:
            chosen = self._named[TOOL_USE]
            if isinstance(chosen, TemplateError):
                raise chosen
            return chosen
        return self._default

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages` (OpenAI-style dicts), optionally with `tools`."""
        template = self._pick(tools)
        context = dict(extra)
        norm = normalise_messages(messages)
        if self._fold_tools.get(id(template)):
            norm = chat_gemma4.fold_tool_messages(norm)
        context.update(
            messages=norm,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        if tools:
            # Templates test `if tools`; an empty list and no tools must read the same.
            context["tools"] = normalise_tools(tools)
        try:
            text = template.render(**context)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(_one_line(f"chat template failed: {type(e).__name__}: {e}")) from None
        except Exception as e:  # a template expression hit a Python error (str + None, ...)
            raise TemplateError(_one_line(f"chat template failed: {type(e).__name__}: {e}")) from None
        # Same trimming as llama.cpp: the tokenizer adds these tokens itself.
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        text = ""
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InfrError(f"{where}: only text content parts are supported, got {kind!r}")
            # llama.cpp joins parts with a newline, none before the first non-empty text.
            if text:
                text += "\n"
            text += part["text"]
        return text
    raise InfrError(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}")


def _tool_call(call: Any, where: str) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = call["function"]
    args = fn.get("arguments")
    if not isinstance(args, str):
        return call
    name = fn.get("name", "?")
    try:
        parsed = json.loads(args)
    except json.JSONDecodeError as e:
        raise InfrError(f"{where}: tool call {name!r} has arguments that are not valid JSON ({e.msg} at char {e.pos})") from None
    if isinstance(parsed, dict):
        parsed = ToolCallArguments(parsed, args)
    return {**call, "function": {**fn, "arguments": parsed}}


def normalise_messages(messages: list[dict]) -> list[dict]:
    """Copies of `messages` in the shape templates expect (see the module docstring)."""
    if not isinstance(messages, list):
        raise InfrError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for i, msg in enumerate(messages):
        where = f"message {i}"
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InfrError(f"{where}: a message must be a dict with a string 'role'")
        norm = dict(msg)
        norm["content"] = _content_text(msg.get("content"), where)
        calls = msg.get("tool_calls")
        if calls:
            norm["tool_calls"] = [_tool_call(c, where) for c in calls]
        out.append(norm)
    return out


def normalise_tools(tools: list[dict]) -> list[dict]:
    """OpenAI tool definitions in llama.cpp's canonical form and key order."""
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise InfrError(f"tool {i}: expected {{'type': 'function', 'function': {{...}}}}")
        fn = tool["function"]
        if not isinstance(fn.get("name"), str):
            raise InfrError(f"tool {i}: function has no 'name'")
        params = fn.get("parameters")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description") or "",
                    "parameters": params if params is not None else {},
                },
            }
        )
    return out
