"""Chat templates: rendering locked to llama.cpp's (tests/fixtures/templates.json), plus the
behaviour around it (fallback, errors, tojson, tool-call arguments)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import pytest

from infr.chat import ChatTemplate, TemplateError, ToolCallArguments
from infr.errors import InfrError
from infr.gguf_file import open_gguf

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "templates.json").read_text())
PATH_FIXTURE = {"smollm2": "smollm2_path", "qwen_coder": "qwen_coder_path"}


@lru_cache(maxsize=None)
def _load(path: Path) -> tuple[ChatTemplate, str]:
    gf = open_gguf(path)
    tokens = gf.metadata["tokenizer.ggml.tokens"]
    bos = tokens[gf.metadata["tokenizer.ggml.bos_token_id"]]
    eos = tokens[gf.metadata["tokenizer.ggml.eos_token_id"]]
    return ChatTemplate.from_gguf(gf, bos, eos), gf.get("tokenizer.chat_template") or ""


def template_for(request, key: str) -> ChatTemplate:
    tmpl, source = _load(request.getfixturevalue(PATH_FIXTURE[key]))
    model = FIXTURES["models"][key]
    assert hashlib.sha256(source.encode()).hexdigest() == model["template_sha256"], (
        f"{model['file']}'s template differs from the one the fixtures were made with"
    )
    assert (tmpl.bos_token, tmpl.eos_token) == (model["bos_token"], model["eos_token"])
    return tmpl


@pytest.mark.parametrize("case", FIXTURES["cases"], ids=[c["name"] for c in FIXTURES["cases"]])
def test_render_matches_llama_cpp(request, case):
    tmpl = template_for(request, case["model"])
    assert not tmpl.is_fallback
    got = tmpl.render(case["messages"], add_generation_prompt=case["add_generation_prompt"], tools=case["tools"])
    assert got == case["expected"]


def test_fixtures_cover_the_brief():
    names = {c["name"] for c in FIXTURES["cases"]}
    for model in ("smollm2", "qwen_coder"):
        for kind in ("single_user", "system_user", "multi_turn", "single_user_no_generation_prompt"):
            assert f"{model}/{kind}" in names
    assert {"qwen_coder/tools_one", "qwen_coder/tools_two_with_system", "qwen_coder/tool_call_round_trip"} <= names
    assert FIXTURES["oracle"] in ("server", "python")


def test_gemma_without_template_gets_fallback(gemma3_path):
    gf = open_gguf(gemma3_path)
    assert "tokenizer.chat_template" not in gf.metadata
    tokens = gf.metadata["tokenizer.ggml.tokens"]
    tmpl = ChatTemplate.from_gguf(gf, tokens[gf.metadata["tokenizer.ggml.bos_token_id"]],
                                  tokens[gf.metadata["tokenizer.ggml.eos_token_id"]])
    assert tmpl.is_fallback
    assert tmpl.fallback_reason and "\n" not in tmpl.fallback_reason
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell me about owls."}]
    text = tmpl.render(messages)
    assert text.index("Be kind.") < text.index("Tell me about owls.")
    assert text.endswith("assistant:")
    assert not tmpl.render(messages, add_generation_prompt=False).endswith("assistant:")
    # Gemma's tokenizer adds BOS itself; the fallback must not write it a second time.
    assert tmpl.bos_token not in text


def test_raise_exception_message_surfaces():
    tmpl = ChatTemplate(
        "{% if messages[0]['role'] == 'assistant' %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{% endif %}{{ messages[0]['content'] }}"
    )
    assert tmpl.render([{"role": "user", "content": "hi"}]) == "hi"
    with pytest.raises(TemplateError, match="Conversation roles must alternate") as e:
        tmpl.render([{"role": "assistant", "content": "hi"}])
    assert isinstance(e.value, InfrError) and "\n" not in str(e.value)


def test_syntax_error_is_one_line_infr_error():
    with pytest.raises(TemplateError, match="syntax error at line 2") as e:
        ChatTemplate("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    assert "\n" not in str(e.value)


def test_runtime_template_failure_is_infr_error():
    tmpl = ChatTemplate("{{ messages[0]['content'] + 1 }}")
    with pytest.raises(TemplateError, match="chat template failed") as e:
        tmpl.render([{"role": "user", "content": "x"}])
    assert "\n" not in str(e.value)


def test_tojson_does_not_html_escape_and_honours_kwargs():
    value = {"b": "<tag> & 'quote' Zürich", "a": [1, 2]}
    tmpl = ChatTemplate("{{ value | tojson }}")
    out = tmpl.render([], value=value)
    assert out == json.dumps(value, ensure_ascii=False)
    for ch in "<>&'ü":
        assert ch in out
    kwargs = ChatTemplate("{{ value | tojson(indent=2, sort_keys=true, ensure_ascii=true) }}").render([], value=value)
    assert kwargs == json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True)
    compact = ChatTemplate("{{ value | tojson(separators=(',', ':')) }}").render([], value=value)
    assert compact == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_string_arguments_render_like_object_arguments(request):
    tmpl = template_for(request, "qwen_coder")

    def convo(arguments):
        call = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        return [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]

    as_string = tmpl.render(convo('{"city": "Zürich"}'), add_generation_prompt=False)
    as_object = tmpl.render(convo({"city": "Zürich"}), add_generation_prompt=False)
    assert as_string == as_object
    assert '"arguments": {"city": "Zürich"}' in as_string  # an object, not a quoted string


def test_parsed_arguments_still_print_as_the_callers_text():
    text = '{"city":  "Paris"}'
    tmpl = ChatTemplate("{% for c in messages[0].tool_calls %}{{ c.function.arguments }}|"
                        "{{ c.function.arguments | tojson }}{% endfor %}")
    call = {"type": "function", "function": {"name": "f", "arguments": text}}
    out = tmpl.render([{"role": "assistant", "tool_calls": [call]}], add_generation_prompt=False)
    assert out == text + "|" + json.dumps(json.loads(text))
    assert str(ToolCallArguments({"a": 1}, '{"a":1}')) == '{"a":1}'


def test_bad_json_arguments_name_the_tool_call():
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}}
    tmpl = ChatTemplate("{{ messages | length }}")
    with pytest.raises(InfrError, match=r"message 1: tool call 'get_weather'.*not valid JSON"):
        tmpl.render([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}])


def test_non_text_content_part_is_rejected():
    with pytest.raises(InfrError, match="only text content parts"):
        ChatTemplate("{{ messages[0].content }}").render(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        )


def test_tool_use_template_is_chosen_only_with_tools():
    tmpl = ChatTemplate("default:{{ messages[0].content }}", named={"tool_use": "tools:{{ tools | length }}"})
    msgs = [{"role": "user", "content": "x"}]
    tool = {"type": "function", "function": {"name": "f"}}
    assert tmpl.render(msgs) == "default:x"
    assert tmpl.render(msgs, tools=[]) == "default:x"
    assert tmpl.render(msgs, tools=[tool]) == "tools:1"
    lone = ChatTemplate(None, named={"tool_use": "tools:{{ tools is defined }}"})
    assert not lone.is_fallback and lone.render(msgs) == "tools:False"


def test_leading_bos_dropped_only_when_tokenizer_adds_it():
    src = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    msgs = [{"role": "user", "content": "x"}]
    assert ChatTemplate(src, "<s>", "</s>").render(msgs) == "<s>x</s>"
    assert ChatTemplate(src, "<s>", "</s>", add_bos=True).render(msgs) == "x</s>"
    assert ChatTemplate(src, "<s>", "</s>", add_bos=True, add_eos=True).render(msgs) == "x"


def test_strftime_now_uses_the_templates_clock():
    tmpl = ChatTemplate("{{ strftime_now('%d %b %Y') }}", now=lambda: datetime(2025, 1, 15))
    assert tmpl.render([]) == "15 Jan 2025"
