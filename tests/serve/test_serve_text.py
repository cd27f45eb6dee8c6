"""Stop strings, tag splitting and tool-call dialect parsing on their own."""

from __future__ import annotations

import json

from infr.serve.output import ChatOutput
from infr.serve.text import ReasoningSplitter, StopFilter
from infr.serve.tools import ToolCallStream, parse_python_call, pick_dialect


def feed(f, pieces):
    return "".join(f.push(p) for p in pieces) + f.flush()


def test_stop_split_across_pieces_is_held_then_cut():
    f = StopFilter(["END"])
    assert f.push("abc E") == "abc "  # "E" may start the stop string: held
    assert f.push("N") == ""
    assert f.push("Dxyz") == "" and f.hit == "END"
    assert f.flush() == ""


def test_partial_stop_released_when_it_does_not_match():
    assert feed(StopFilter(["END"]), ["a E", "Nd", " b"]) == "a ENd b"


def test_earliest_of_several_stops():
    f = StopFilter(["world", "lo"])
    assert f.push("hello world") == "hel" and f.hit == "lo"


def test_reasoning_split_streaming():
    r = ReasoningSplitter()
    pieces = ["<thi", "nk>plan", " it</th", "ink>answer"]
    got = [r.push(p) for p in pieces] + [r.flush()]
    assert "".join(c for c, _ in got) == "answer"
    assert "".join(x for _, x in got) == "plan it"


def test_hermes_calls_streamed_and_content_kept():
    out = ChatOutput(ToolCallStream("hermes", {"f"}))
    deltas = []
    for p in ["Sure. <tool", "_call>\n{\"name\": \"f\", \"argu", "ments\": {\"x\": 1}}\n</tool_call>"]:
        deltas += out.push(p)
    deltas += out.finish()
    assert out.content == "Sure. "
    (call,) = out.calls
    assert call.name == "f" and json.loads(call.arguments) == {"x": 1}
    tc = [d for d in deltas if "tool_calls" in d][0]["tool_calls"][0]
    assert tc["id"].startswith("call_") and tc["function"]["name"] == "f" and tc["index"] == 0


def test_bare_json_call_llama3_style():
    out = ChatOutput(ToolCallStream("llama3", {"get"}))
    out.push('{"name": "get", "parameters": {"q": "a"}}')
    out.finish()
    assert out.calls[0].name == "get" and json.loads(out.calls[0].arguments) == {"q": "a"}
    assert out.message()["content"] is None


def test_json_text_that_is_not_a_call_stays_content():
    out = ChatOutput(ToolCallStream("hermes", {"f"}))
    out.push('{"a": 1}')
    out.finish()
    assert out.content == '{"a": 1}' and not out.calls


def test_gemma_tool_code():
    out = ChatOutput(ToolCallStream("gemma", {"add"}))
    out.push("```tool_code\nadd(a=1, b='x')\n```")
    out.finish()
    assert out.calls[0].name == "add" and json.loads(out.calls[0].arguments) == {"a": 1, "b": "x"}
    assert parse_python_call("os.system('x')") is None


def test_pick_dialect():
    assert pick_dialect("... <tool_call> ...") == "hermes"
    assert pick_dialect("<|python_tag|>") == "llama3"
    assert pick_dialect("```tool_code") == "gemma"


CALL_TEXT = ('Sure. <tool_call>\n{"name": "f", "arguments": {"x": "a}b\\"{", "y": [1, {"z": 2}]}}\n'
             '</tool_call> Done.')


def _stream_deltas(out: ChatOutput, text: str, step: int) -> list[dict]:
    deltas = []
    for i in range(0, len(text), step):
        deltas += out.push(text[i:i + step])
    return deltas + out.finish()


def test_call_arguments_stream_in_pieces_like_openai():
    # Braces and quotes inside strings must not end the arguments early, whatever the piece size.
    for step in (1, 2, 5, len(CALL_TEXT)):
        out = ChatOutput(ToolCallStream("hermes", {"f"}))
        calls = [d["tool_calls"][0] for d in _stream_deltas(out, CALL_TEXT, step) if "tool_calls" in d]
        first, rest = calls[0], calls[1:]
        assert first["id"].startswith("call_") and first["function"]["name"] == "f" and first["type"] == "function"
        assert all("id" not in c and "name" not in c["function"] and c["index"] == 0 for c in rest)
        if step < 10:
            assert len(rest) > 3  # really in pieces
        args = "".join(c["function"]["arguments"] for c in calls)
        assert json.loads(args) == {"x": 'a}b"{', "y": [1, {"z": 2}]}
        assert out.message()["tool_calls"][0]["function"]["arguments"] == args
        assert out.content == "Sure.  Done." and "<tool_call>" not in out.content


def test_forced_bare_json_call_streams():
    out = ChatOutput(ToolCallStream("llama3", {"get"}, forced_prefix=True))
    deltas = _stream_deltas(out, '{"name":"get","parameters":{"q":"a b"}}', 3)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get" and len(calls) > 2
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"q": "a b"}


def test_unknown_tool_name_is_parsed_whole():
    out = ChatOutput(ToolCallStream("hermes", {"f"}))
    deltas = _stream_deltas(out, '<tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>', 4)
    (d,) = [d for d in deltas if "tool_calls" in d]
    call = d["tool_calls"][0]
    assert call["function"]["name"] == "g" and json.loads(call["function"]["arguments"]) == {"a": 1}
    assert call["id"].startswith("call_")


def test_unforced_bare_json_is_a_call_only_when_it_is_the_whole_reply():
    out = ChatOutput(ToolCallStream("hermes", {"get"}))
    assert out.push('{"name": "get", "arguments": {"q": 1}}') == []  # held to the end
    out.push('\n{"result": 2}')
    out.finish()
    assert not out.calls and out.content == '{"name": "get", "arguments": {"q": 1}}\n{"result": 2}'
