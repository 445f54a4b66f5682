"""Reasoning blocks (pycacheflow/reasoning.py): the markers llama-server's differential
analyzer finds in a chat template, and its lenient parse of the output. No engine."""

from __future__ import annotations

import pytest

from pycacheflow.chat_template import CHATML_SOURCE, ChatTemplate
from pycacheflow.reasoning import (
    ReasoningMarkers,
    ReasoningSplit,
    detect_markers,
    generation_prompt,
    open_tail,
    split_reasoning,
)

# Qwen3's template, shortened: reasoning_content of the last assistant turn in <think>, and an
# empty block in the generation prompt when enable_thinking is false
QWEN3 = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n'"
    " + m.content + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
# DeepSeek-R1-Distill's: strips </think> from history, opens <think> in the generation prompt
R1 = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{'<｜User｜>' + m['content']}}"
    "{% else %}{% set content = m['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
)
# only the end of the block is marked (the reasoning runs from the start of the turn)
DELIMITED = (
    "{% for m in messages %}{{ m.role }}: {% if m.reasoning_content %}{{ m.reasoning_content }}"
    " [END_THINKING] {% endif %}{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
THINK = ReasoningMarkers("<think>", "</think>")


@pytest.mark.parametrize(
    "source,markers",
    [
        (QWEN3, ReasoningMarkers("<think>\n", "\n</think>\n\n")),
        (R1, THINK),  # llama.cpp's workaround for old Qwen/DeepSeek templates
        (DELIMITED, ReasoningMarkers("", "[END_THINKING] ")),
        (CHATML_SOURCE, None),  # no reasoning (SmolLM2's template is ChatML with a system turn)
        ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
    ],
)
def test_markers_are_what_the_template_writes_around_reasoning(source, markers):
    assert detect_markers(ChatTemplate(source)) == markers
    assert ChatTemplate(source).reasoning_markers == markers  # cached on the template


@pytest.mark.parametrize(
    "text,split",
    [
        ("<think>hmm</think>Hello", ("hmm", "Hello")),
        ("  \n<think>hmm</think>Hello", ("hmm", "Hello")),  # space() before the block
        ("Hello <think>x</think>", ("", "Hello <think>x</think>")),  # only at the start
        ("<think>still thinking", ("still thinking", "")),  # unclosed: all reasoning
        ("<think>abc</thi", ("abc", "")),  # a piece of the end marker is held back
        ("<thi", ("", "")),  # a piece of the start marker: nothing yet
        ("<b>bold</b>", ("", "<b>bold</b>")),
        ("<think> \n</think>Hi", ("", "Hi")),  # whitespace-only reasoning is none
        ("", ("", "")),
    ],
)
def test_split_as_llama_servers_lenient_parser(text, split):
    assert split_reasoning(text, THINK) == ReasoningSplit(*split)


def test_whitespace_of_the_markers_is_optional():
    """optspace(): the whitespace around a marker's core may be there or not; the reasoning
    keeps what the model wrote inside the block."""
    qwen = ReasoningMarkers("<think>\n", "\n</think>\n\n")
    assert split_reasoning("<think>\nhmm\n</think>\n\nHello", qwen) == ("hmm\n", "Hello")
    assert split_reasoning("<think>hmm</think>Hello", qwen) == ("hmm", "Hello")
    delimited = ReasoningMarkers("", "[END_THINKING] ")
    assert split_reasoning("plan [END_THINKING] answer", delimited) == ("plan ", "answer")


def test_none_keeps_the_block_in_the_content():
    """reasoning_format none: no split, but the leading whitespace goes (the template is a
    reasoning one: llama-server's parser has a space() in front)."""
    assert split_reasoning(" <think>a</think>b", THINK, extract=False) == ("", "<think>a</think>b")
    assert split_reasoning("x", ReasoningMarkers("<think>", ""), extract=True) == ("", "x")


def test_a_generation_prompt_that_opens_the_block():
    """DeepSeek-R1's generation prompt ends in "<think>\\n": the output starts inside the
    block, so what comes before </think> is reasoning (with none: the content starts with the
    opened marker, as llama-server's). The workaround's markers have no whitespace, so the
    reasoning keeps the prompt's newline."""
    template = ChatTemplate(R1)
    messages = [{"role": "user", "content": "hi"}]
    gen = generation_prompt(template.render(messages, True), template.render(messages, False))
    assert gen == "<｜Assistant｜><think>\n"
    tail = open_tail(THINK, gen)
    assert tail == "<think>\n"
    assert split_reasoning(tail + "hmm</think>Hi", THINK) == ("\nhmm", "Hi")
    assert split_reasoning(tail + "hmm</think>Hi", THINK, extract=False).content == (
        "<think>\nhmm</think>Hi")  # fmt: skip
    assert open_tail(THINK, "<|im_start|>assistant\n") == ""
