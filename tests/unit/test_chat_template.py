"""Jinja chat templates (pycacheflow/chat_template.py) and the GGUF metadata reader they use
(pycacheflow/gguf_metadata.py), without a model."""

from __future__ import annotations

import struct

import pytest

from pycacheflow.chat_template import (
    CHATML_SOURCE,
    ChatFormatter,
    ChatTemplate,
    TemplateRenderError,
)
from pycacheflow.errors import InvalidArgumentError
from pycacheflow.gguf_metadata import chat_template_of, read_string_metadata

SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nDefault system<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
USER = [{"role": "user", "content": "Hi"}]


def _gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path, pairs: list[tuple[str, int, bytes]]) -> None:
    """A GGUF v3 header with the given (key, value type, encoded value) pairs, no tensors."""
    body = b"".join(_gguf_string(k) + struct.pack("<I", t) + v for k, t, v in pairs)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)) + body)


def test_reads_the_template_past_arrays_and_scalars(tmp_path):
    path = tmp_path / "m.gguf"
    tokens = struct.pack("<IQ", 8, 2) + _gguf_string("a") + _gguf_string("bc")
    write_gguf(path, [("general.architecture", 8, _gguf_string("llama")),
                      ("llama.context_length", 4, struct.pack("<I", 2048)),
                      ("tokenizer.ggml.tokens", 9, tokens),
                      ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2) + b"\0" * 8),
                      ("tokenizer.chat_template", 8, _gguf_string(SMOL))])  # fmt: skip
    assert chat_template_of(path) == SMOL
    assert read_string_metadata(path, ["general.architecture", "missing"]) == {
        "general.architecture": "llama"
    }


def test_no_template_and_bad_files(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, [("general.architecture", 8, _gguf_string("llama"))])
    assert chat_template_of(path) is None
    path.write_bytes(b"GGUF")
    with pytest.raises(InvalidArgumentError, match="truncated"):
        chat_template_of(path)
    path.write_bytes(b"NOPE" + b"\0" * 20)
    with pytest.raises(InvalidArgumentError, match="not a GGUF file"):
        chat_template_of(path)


def test_renders_as_transformers_does():
    template = ChatTemplate(SMOL, "<|im_start|>", "<|im_end|>")
    assert template.render(USER) == (
        "<|im_start|>system\nDefault system<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(USER, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_tools_kwargs_and_bos_reach_the_template():
    source = ("{{ bos_token }}{% if tools %}{{ tools | tojson }}{% endif %}{{ greeting }}"
              "{% for m in messages %}{{ m.content }}{% endfor %}")  # fmt: skip
    template = ChatTemplate(source, "<s>", "</s>")
    tools = [{"type": "function", "function": {"name": "f", "description": "é"}}]
    text = template.render(USER, tools=tools, kwargs={"greeting": "hey "})
    assert text == '<s>[{"type": "function", "function": {"name": "f", "description": "é"}}]hey Hi'


def test_continue_final_message_appends_the_prefill():
    template = ChatTemplate(SMOL)
    messages = [*USER, {"role": "assistant", "content": "Once upon"}]
    text = template.render(messages, False, continue_final_message=True)
    assert text.endswith("Hi<|im_end|>\n<|im_start|>assistant\nOnce upon")
    with pytest.raises(InvalidArgumentError, match="Cannot set both"):
        template.render(messages, True, continue_final_message=True)
    with pytest.raises(InvalidArgumentError, match="assistant message at the end"):
        template.render(USER, False, continue_final_message=True)


def test_template_errors_are_invalid_arguments():
    with pytest.raises(TemplateRenderError, match="does not compile"):
        ChatTemplate("{% for %}")
    raising = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateRenderError, match="roles must alternate"):
        raising.render(USER)
    sandboxed = ChatTemplate("{{ messages.append(1) }}")  # immutable sandbox
    with pytest.raises(TemplateRenderError):
        sandboxed.render(USER)


def test_formatter_picks_jinja_or_the_builtin_matcher(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, [("tokenizer.chat_template", 8, _gguf_string(SMOL))])
    calls = []

    def native(roles, contents, add, template):
        calls.append((list(roles), list(contents), add, template))
        return "native"

    formatter = ChatFormatter(str(path), native, "", "")
    assert formatter.apply(USER).startswith("<|im_start|>system\nDefault system")  # the GGUF's
    assert formatter.apply(USER, template="{{ messages[0].content }}!") == "Hi!"
    assert formatter.apply(USER, template="chatml") == "native"  # a built-in name
    assert formatter.apply(USER, jinja=False) == "native"
    assert calls == [(["user"], ["Hi"], True, "chatml"), (["user"], ["Hi"], True, None)]
    with pytest.raises(InvalidArgumentError, match="tools need a Jinja"):
        formatter.apply(USER, jinja=False, tools=[{"type": "function"}])
    prefill = [*USER, {"role": "assistant", "content": "Sure"}]
    assert formatter.apply(prefill, False, jinja=False, continue_final_message=True) == "nativeSure"


def test_formatter_without_readable_metadata_uses_llama_cpp(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF")  # llama.cpp loaded it somehow; we cannot read its template
    formatter = ChatFormatter(str(path), lambda r, c, a, t: "native", "", "")
    assert formatter.model_template is None and formatter.apply(USER) == "native"


def test_a_model_without_a_template_gets_chatml_as_in_llama_server(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, [("general.architecture", 8, _gguf_string("llama"))])
    calls = []
    formatter = ChatFormatter(str(path), lambda r, c, a, t: calls.append(t) or "native", "", "")
    assert formatter.apply(USER) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert formatter.apply(USER, jinja=False) == "native" and calls == ["chatml"]
    assert formatter.reported_source(None) == CHATML_SOURCE


def test_a_tool_use_variant_renders_requests_with_tools(tmp_path):
    path = tmp_path / "m.gguf"
    tool_use = _gguf_string("{{ 'tools' }}")
    write_gguf(path, [("tokenizer.chat_template", 8, _gguf_string("plain")),
                      ("tokenizer.chat_template.tool_use", 8, tool_use)])  # fmt: skip
    formatter = ChatFormatter(str(path), lambda r, c, a, t: "native", "", "")
    assert formatter.apply(USER, template="{{ 'x' }}") == "x"
    assert formatter.apply(USER, tools=[{"type": "function"}]) == "tools"
    assert formatter.reported_source(None) == "plain"
    assert formatter.tool_use_source() == "{{ 'tools' }}"


def test_reported_source_follows_llama_servers_props(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, [("tokenizer.chat_template", 8, _gguf_string(SMOL))])
    formatter = ChatFormatter(str(path), lambda r, c, a, t: "native", "", "")
    assert formatter.reported_source(None) == SMOL
    assert formatter.reported_source("llama3") == "llama3"  # a built-in name stays a name
    assert formatter.reported_source("chatml") == CHATML_SOURCE
    unreadable = tmp_path / "fake.gguf"
    unreadable.write_bytes(b"GGUF")
    assert ChatFormatter(str(unreadable), lambda r, c, a, t: "", "", "").reported_source(None) == ""


NO_CAPS = dict.fromkeys(
    ("supports_typed_content", "supports_tools", "supports_tool_calls",
     "supports_parallel_tool_calls", "supports_preserve_reasoning", "supports_reasoning_effort",
     "supports_object_arguments"), False)  # fmt: skip
# A template that renders every probe: typed parts, tools, object arguments, several calls,
# reasoning kept in the history, and a reasoning_effort variable.
CAPABLE = (
    "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}"
    "{% for m in messages %}{{ m.role }}:"
    "{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}"
    "{% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments.arg }}"
    "{% endfor %}{{ m.reasoning_content or '' }}{% endfor %}"
    "{% if reasoning_effort %}{{ reasoning_effort }}{% endif %}"
)


def test_caps_of_plain_and_capable_templates():
    assert ChatTemplate(SMOL).caps == {
        "supports_string_content": True, "supports_system_role": True, **NO_CAPS}  # fmt: skip
    # a built-in name read as Jinja is plain text: it reads nothing (llama-server's answer too)
    assert ChatTemplate("llama3").caps == {
        "supports_string_content": True, "supports_system_role": False, **NO_CAPS}  # fmt: skip
    assert all(ChatTemplate(CAPABLE).caps.values())
    # content used only as parts: string content fails (no Python repr of a list counts)
    parts_only = ("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}"
                  "{% endfor %}")
    caps = ChatTemplate(parts_only).caps
    assert caps["supports_typed_content"] and not caps["supports_string_content"]


def test_python_errors_of_a_template_are_render_errors():
    template = ChatTemplate("{{ messages[0]['content'] + 1 }}")  # str + int: a TypeError
    with pytest.raises(TemplateRenderError, match="TypeError"):
        template.render(USER)
    with pytest.raises(TemplateRenderError, match="chat template failed"):
        ChatTemplate("{{ messages[5]['content'] }}").render(USER)
