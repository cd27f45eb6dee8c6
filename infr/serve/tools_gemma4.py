"""Gemma 4's tool calls: `call:NAME{key:value,...}` (the inside of `<|tool_call>...<tool_call|>`)
parsed into a name and JSON arguments.

Values as Gemma 4's chat template writes them (infr/chat_gemma4.py): strings between `<|"|>`
marks, taken verbatim (quotes, braces and backslashes inside are text, nothing is escaped);
numbers, true, false and null bare; objects `{key:value,...}` with bare keys (or keys between
`<|"|>` marks, as the template writes them inside tool declarations); lists `[value,...]`.
Models also slip into JSON now and then, so JSON strings and quoted keys are read too, and a
bare word that is not a number or literal is kept as a string. Anything else is not a call:
the parser returns None and the text goes back to the client as content.
"""

from __future__ import annotations

import json
import re

from infr.serve.tools import ParsedCall

QUOTE = '<|"|>'
_NAME = re.compile(r"\s*call\s*:\s*([A-Za-z_][\w.\-]*)\s*(?=\{)")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$")
_LITERALS = {"true": True, "false": False, "null": None, "none": None, "True": True, "False": False, "None": None}
_MAX_DEPTH = 64  # deeper nesting is refused rather than recursed into


class _Bad(ValueError):
    pass


class _Reader:
    def __init__(self, text: str):
        self.t, self.i = text, 0

    def ws(self) -> None:
        while self.i < len(self.t) and self.t[self.i].isspace():
            self.i += 1

    def peek(self, s: str) -> bool:
        return self.t.startswith(s, self.i)

    def expect(self, s: str) -> None:
        self.ws()
        if not self.peek(s):
            raise _Bad(f"expected {s!r} at {self.i}")
        self.i += len(s)

    def quoted(self) -> str:
        """A `<|"|>...<|"|>` string (the opening mark is next)."""
        self.i += len(QUOTE)
        end = self.t.find(QUOTE, self.i)
        if end < 0:
            raise _Bad("unterminated string")
        s, self.i = self.t[self.i:end], end + len(QUOTE)
        return s

    def json_string(self) -> str:
        try:
            s, end = json.JSONDecoder().raw_decode(self.t, self.i)
        except json.JSONDecodeError as e:
            raise _Bad(f"bad JSON string at {self.i}") from e
        self.i = end
        return s

    def value(self, depth: int = 0):
        if depth > _MAX_DEPTH:
            raise _Bad("nested too deeply")
        self.ws()
        if self.peek(QUOTE):
            return self.quoted()
        if self.peek('"'):
            return self.json_string()
        if self.peek("{"):
            return self.obj(depth + 1)
        if self.peek("["):
            return self.array(depth + 1)
        return self.bare()

    def bare(self):
        start = self.i
        while self.i < len(self.t) and self.t[self.i] not in ",}]" and not self.peek(QUOTE):
            self.i += 1
        word = self.t[start:self.i].strip()
        if not word:
            raise _Bad(f"missing value at {start}")
        if word in _LITERALS:
            return _LITERALS[word]
        if _NUMBER.match(word):
            return json.loads(word)
        return word

    def key(self) -> str:
        self.ws()
        if self.peek(QUOTE):
            return self.quoted()
        if self.peek('"'):
            return self.json_string()
        start = self.i
        while self.i < len(self.t) and self.t[self.i] not in ":,{}[]":
            self.i += 1
        k = self.t[start:self.i].strip()
        if not k:
            raise _Bad(f"missing key at {start}")
        return k

    def obj(self, depth: int) -> dict:
        self.expect("{")
        out: dict = {}
        self.ws()
        if self.peek("}"):
            self.i += 1
            return out
        while True:
            k = self.key()
            self.expect(":")
            out[k] = self.value(depth)
            self.ws()
            if self.peek(","):
                self.i += 1
                self.ws()
                if self.peek("}"):  # a trailing comma
                    self.i += 1
                    return out
                continue
            self.expect("}")
            return out

    def array(self, depth: int) -> list:
        self.expect("[")
        out: list = []
        self.ws()
        if self.peek("]"):
            self.i += 1
            return out
        while True:
            out.append(self.value(depth))
            self.ws()
            if self.peek(","):
                self.i += 1
                self.ws()
                if self.peek("]"):
                    self.i += 1
                    return out
                continue
            self.expect("]")
            return out


def parse_arguments(text: str) -> dict:
    """`{key:value,...}` as a dict; ValueError when it is not one (or text follows it)."""
    r = _Reader(text)
    args = r.obj(0)
    r.ws()
    if r.i != len(r.t):
        raise _Bad(f"text after the arguments at {r.i}")
    return args


def parse_gemma4_call(body: str, names: set[str] | None = None) -> ParsedCall | None:
    """One call from the inside of a `<|tool_call>` span; None when it is not a well-formed call
    of a known tool (`names`; None: any name)."""
    m = _NAME.match(body)
    if m is None or (names is not None and m.group(1) not in names):
        return None
    try:
        args = parse_arguments(body[m.end():])
    except ValueError:
        return None
    return ParsedCall(m.group(1), json.dumps(args, ensure_ascii=False))
