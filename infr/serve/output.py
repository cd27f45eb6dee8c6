"""Released text -> OpenAI chat deltas: reasoning split, tool-call parsing, accumulation."""

from __future__ import annotations

from infr.serve.text import ReasoningSplitter
from infr.serve.tools import ParsedCall, ToolCallStream


class ChatOutput:
    """Feeds text through the `<think>` splitter, then (when tools are on) the tool-call parser.

    `push`/`finish` return deltas for streaming; the accumulated `content`, `reasoning` and
    `calls` make the non-streaming message.
    """

    def __init__(self, tools: ToolCallStream | None, think_open: bool = False,
                 think_tags: tuple[str, str] = ("<think>", "</think>")):
        self.reasoning_split = ReasoningSplitter(start_inside=think_open, tags=think_tags)
        self.tools = tools
        self.content = ""
        self.reasoning = ""
        self.calls: list[ParsedCall] = []

    def push(self, text: str) -> list[dict]:
        content, reasoning = self.reasoning_split.push(text)
        return self._deltas(content, reasoning, final=False)

    def finish(self) -> list[dict]:
        content, reasoning = self.reasoning_split.flush()
        return self._deltas(content, reasoning, final=True)

    def _deltas(self, content: str, reasoning: str, final: bool) -> list[dict]:
        out: list[dict] = []
        if reasoning:
            self.reasoning += reasoning
            out.append({"reasoning_content": reasoning})
        events: list[tuple[str, object]] = []
        if self.tools is None:
            if content:
                events.append(("content", content))
        else:
            if content:
                events += self.tools.push(content)
            if final:
                events += self.tools.finish()
        for kind, value in events:
            if kind == "content" and value:
                self.content += value
                out.append({"content": value})
            elif kind == "call":  # parsed whole: one delta
                index = len(self.calls)
                self.calls.append(value)
                out.append({"tool_calls": [value.to_openai(index)]})
            elif kind == "call_head":  # OpenAI's first delta of a call: id, type, name, no arguments yet
                index = len(self.calls)
                self.calls.append(value)
                out.append({"tool_calls": [{"index": index, "id": value.id, "type": "function",
                                            "function": {"name": value.name, "arguments": ""}}]})
            elif kind == "call_args":  # then the arguments' text in pieces, by index only
                out.append({"tool_calls": [{"index": len(self.calls) - 1, "function": {"arguments": value}}]})
        return out

    def message(self) -> dict:
        msg: dict = {"role": "assistant", "content": self.content if (self.content or not self.calls) else None}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [c.to_openai() for c in self.calls]
        return msg
