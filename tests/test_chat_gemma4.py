"""Gemma 4's chat template (infr/templates/gemma4.jinja, Google's) rendered by infr.chat: turns,
system, tool declarations, calls and results in the native format Google's Gemma 4
function-calling guide shows (`<|tool>declaration:...<tool|>`, `<|tool_call>call:NAME{...}<tool_call|>`,
`<|tool_response>response:NAME{...}<tool_response|>`), and OpenAI's `role: tool` messages folded
into the calling turn the way the template reads them."""

from __future__ import annotations

import pytest

from infr import chat_gemma4, synth
from infr.chat import ChatTemplate, TemplateError
from infr.gguf_file import open_gguf

Q = '<|"|>'
WEATHER = {"type": "function", "function": {
    "name": "get_current_temperature", "description": "Gets the current temperature for a given location.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city name, e.g. San Francisco"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_current_temperature", "arguments": '{"location": "London"}'}}


@pytest.fixture(scope="module")
def tmpl():
    return ChatTemplate(chat_gemma4.template_source(), "<bos>", "<eos>", add_bos=True)


def test_the_embedded_template_is_googles():
    src = chat_gemma4.template_source()
    assert len(src) == 12133 and src.count("<|tool_call>call:") == 1
    assert chat_gemma4.wants_tool_responses(src)
    # a later template that reads role: tool itself is left alone
    assert not chat_gemma4.wants_tool_responses(src + "{% if message['role'] == 'tool' %}{% endif %}")


def test_plain_turns(tmpl):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": " Tell me a joke. "}]
    assert tmpl.render(msgs) == ("<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
                                 "<|turn>user\nTell me a joke.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")
    assert tmpl.render(msgs[:1], add_generation_prompt=False) == "<|turn>user\nHi<turn|>\n"


def test_system_and_developer_get_a_system_turn(tmpl):
    for role in ("system", "developer"):
        msgs = [{"role": role, "content": "Be brief.\n"}, {"role": "user", "content": "Hi"}]
        assert tmpl.render(msgs, add_generation_prompt=False) == "<|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n"


def test_thinking_in_the_model_history_is_dropped(tmpl):
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>A"}]
    assert tmpl.render(msgs, add_generation_prompt=False).endswith("<|turn>model\nA<turn|>\n")


def test_tool_declaration_matches_googles_native_format(tmpl):
    text = tmpl.render([{"role": "user", "content": "Temperature in London?"}], tools=[WEATHER])
    decl = (f"<|tool>declaration:get_current_temperature{{description:{Q}Gets the current temperature for a given "
            f"location.{Q},parameters:{{properties:{{location:{{description:{Q}The city name, e.g. San Francisco{Q},"
            f"type:{Q}STRING{Q}}},unit:{{enum:[{Q}celsius{Q},{Q}fahrenheit{Q}],type:{Q}STRING{Q}}}}},"
            f"required:[{Q}location{Q}],type:{Q}OBJECT{Q}}}}}<tool|>")
    assert text == (f"<|turn>system\n{decl}<turn|>\n<|turn>user\nTemperature in London?<turn|>\n"
                    "<|turn>model\n<|channel>thought\n<channel|>")


def test_tool_round_trip_stays_in_the_model_turn(tmpl):
    msgs = [{"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Temperature in London?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 15, "weather": "sunny"}'}]
    text = tmpl.render(msgs, tools=[WEATHER])
    assert text.startswith("<|turn>system\nYou are a weather bot.<|tool>declaration:get_current_temperature{")
    # the call, then the result, then the model goes on in the same turn (no <turn|>, no new <|turn>model)
    assert text.endswith(
        "<|turn>user\nTemperature in London?<turn|>\n<|turn>model\n"
        f"<|tool_call>call:get_current_temperature{{location:{Q}London{Q}}}<tool_call|>"
        f"<|tool_response>response:get_current_temperature{{temperature:15,weather:{Q}sunny{Q}}}<tool_response|>"
        "<|channel>thought\n<channel|>")
    # the answer written after the results stays in that turn and closes it: the next prompt
    # begins with the text the model saw and wrote (only the empty thought channel differs)
    done = tmpl.render(msgs + [{"role": "assistant", "content": "15 degrees and sunny."},
                               {"role": "user", "content": "Thanks"}], tools=[WEATHER])
    assert done.endswith("<tool_response|>15 degrees and sunny.<turn|>\n<|turn>user\nThanks<turn|>\n"
                         "<|turn>model\n<|channel>thought\n<channel|>")


def test_several_calls_nested_arguments_and_plain_text_results(tmpl):
    calls = [CALL, {"id": "call_2", "type": "function", "function": {
        "name": "search", "arguments": '{"query": "say \\"hi\\"", "filters": {"n": 2, "tags": ["a", "b"], "ok": true}}'}}]
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_2", "content": "no results"},
            {"role": "tool", "tool_call_id": "call_1", "content": "[1, 2]"}]
    text = tmpl.render(msgs)
    assert (f"<|tool_call>call:get_current_temperature{{location:{Q}London{Q}}}<tool_call|>"
            f"<|tool_call>call:search{{filters:{{n:2,ok:true,tags:[{Q}a{Q},{Q}b{Q}]}},query:{Q}say \"hi\"{Q}}}"
            "<tool_call|>") in text
    # results in the order they came, named by their call ids; a non-object result is one value
    assert text.endswith(f"<|tool_response>response:search{{value:{Q}no results{Q}}}<tool_response|>"
                         f"<|tool_response>response:get_current_temperature{{value:{Q}[1, 2]{Q}}}<tool_response|>"
                         "<|channel>thought\n<channel|>")


def test_fold_names_results_by_name_id_or_position():
    calls = [{"id": "a", "function": {"name": "f"}}, {"id": "b", "function": {"name": "g"}}]
    msgs = [{"role": "assistant", "tool_calls": calls, "content": ""},
            {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"},
            {"role": "tool", "name": "h", "content": '{"k": 1}'}, {"role": "tool", "tool_call_id": "a", "content": "x"}]
    (host,) = chat_gemma4.fold_tool_messages(msgs)
    assert host["tool_responses"] == [{"name": "f", "response": "1"}, {"name": "g", "response": "2"},
                                      {"name": "h", "response": {"k": 1}}, {"name": "f", "response": "x"}]
    assert msgs[0].get("tool_responses") is None  # the caller's messages are not changed
    stray = [{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}]
    assert chat_gemma4.fold_tool_messages(stray) == stray  # nothing to join: left for the template


def test_synthetic_chat_model_carries_the_template(tmp_path):
    gf = open_gguf(synth.write_gguf(synth.PRESETS["tiny-gemma4-chat"], tmp_path / "chat.gguf"))
    assert gf.metadata["tokenizer.chat_template"] == chat_gemma4.template_source()
    tokens = gf.metadata["tokenizer.ggml.tokens"]
    assert tokens[gf.metadata["tokenizer.ggml.bos_token_id"]] == "<bos>"
    for t in synth.PRESETS["tiny-gemma4-chat"].special_tokens:
        assert t in tokens


def test_odd_shapes_fold_without_raising(tmpl):
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": ["junk", {"id": "a", "function": "f"}, {"function": {"name": 3}}]},
            {"role": "tool", "tool_call_id": "a", "content": None}, {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "after"}, {"role": "tool", "content": "late"}]
    (_, host, stray) = chat_gemma4.fold_tool_messages(msgs)
    assert [r["name"] for r in host["tool_responses"]] == ["unknown", "unknown"] and host["content"] == "after"
    assert stray["role"] == "tool"
    with pytest.raises(TemplateError):  # the template itself refuses the junk call: a 400 in the server
        tmpl.render(msgs)


def test_a_second_round_of_calls_opens_its_own_turn(tmpl):
    # Google's first template writes all of a message's calls before its results, so a second round
    # after the first results stays a message of its own (a new model turn), in order
    call_b = {"id": "b", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
            {"role": "assistant", "content": None, "tool_calls": [call_b]},
            {"role": "tool", "tool_call_id": "b", "content": "2"}]
    text = tmpl.render(msgs)
    assert text.index("response:get_current_temperature") < text.index("call:search") < text.index("response:search")
