"""Streaming text filters: stop strings and tagged spans (`<think>`, `<tool_call>`).

Each filter takes text as it is released and returns only what can no longer change, holding
back a tail that could still turn into a stop string or a tag. Text passes between filters as
whole Python strings, so a UTF-8 character is never split across two chunks.
"""

from __future__ import annotations


def _held_prefix(buf: str, needles: list[str]) -> int:
    """Length of the longest tail of `buf` that begins some needle (but is not all of it)."""
    hold = 0
    for s in needles:
        for k in range(min(len(s) - 1, len(buf)), hold, -1):
            if buf.endswith(s[:k]):
                hold = k
                break
    return hold


class StopFilter:
    """Cuts the output at the first stop string; the stop string itself is never released."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.hit: str | None = None

    def push(self, text: str) -> str:
        if self.hit is not None:
            return ""
        if not self.stops:
            return text
        self.buf += text
        first, which = -1, None
        for s in self.stops:
            i = self.buf.find(s)
            if i >= 0 and (first < 0 or i < first):
                first, which = i, s
        if which is not None:
            out, self.buf, self.hit = self.buf[:first], "", which
            return out
        hold = _held_prefix(self.buf, self.stops)
        out, self.buf = self.buf[: len(self.buf) - hold], self.buf[len(self.buf) - hold:]
        return out

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return "" if self.hit is not None else out


class TagSplitter:
    """Splits text into ("out", text) and ("in", text) pieces around open/close tags, and an
    ("end", "") piece where a span closes. Text that could still become a tag is held back."""

    def __init__(self, open_tag: str, close_tag: str, start_inside: bool = False):
        self.open, self.close = open_tag, close_tag
        self.inside = start_inside
        self.buf = ""

    def push(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        out: list[tuple[str, str]] = []
        while self.buf:
            tag = self.close if self.inside else self.open
            i = self.buf.find(tag)
            if i >= 0:
                self._emit(out, self.buf[:i])
                self.buf = self.buf[i + len(tag):]
                if self.inside:
                    out.append(("end", ""))
                self.inside = not self.inside
                continue
            hold = _held_prefix(self.buf, [tag])
            self._emit(out, self.buf[: len(self.buf) - hold])
            self.buf = self.buf[len(self.buf) - hold:]
            break
        return out

    def flush(self) -> list[tuple[str, str]]:
        """The rest at end of generation (`inside` tells whether a span was left open)."""
        out: list[tuple[str, str]] = []
        self._emit(out, self.buf)
        self.buf = ""
        return out

    def _emit(self, out: list[tuple[str, str]], text: str) -> None:
        if text:
            out.append(("in" if self.inside else "out", text))


# Gemma 4 thinks in a channel: `<|channel>thought\n...<channel|>` (its tags are special tokens
# the server keeps in the output for this; infr/serve/service.py).
GEMMA4_THOUGHT = ("<|channel>thought\n", "<channel|>")


class ReasoningSplitter:
    """`<think>...</think>` (or the given tags') text goes to reasoning_content; the rest is content."""

    def __init__(self, start_inside: bool = False, tags: tuple[str, str] = ("<think>", "</think>")):
        self.tags = TagSplitter(*tags, start_inside=start_inside)

    def push(self, text: str) -> tuple[str, str]:
        return self._join(self.tags.push(text))

    def flush(self) -> tuple[str, str]:
        return self._join(self.tags.flush())

    @staticmethod
    def _join(pieces: list[tuple[str, str]]) -> tuple[str, str]:
        content = "".join(t for k, t in pieces if k == "out")
        reasoning = "".join(t for k, t in pieces if k == "in")
        return content, reasoning
