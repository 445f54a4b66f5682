"""Reasoning in chat answers (pycacheflow/server/chat_reasoning.py, the request field and the
serve flags): streamed deltas add up to the message, as llama-server's diffs. No engine."""

from __future__ import annotations

import random

import pytest

from pycacheflow.outputs import TokenLogprobs
from pycacheflow.reasoning import ReasoningMarkers
from pycacheflow.server import responses
from pycacheflow.server.chat_reasoning import ChatReasoning
from pycacheflow.server.generation import _ChatDeltas
from pycacheflow.server.pieces import Piece
from pycacheflow.server.protocol import ProtocolError, parse_chat, parse_completion

QWEN = ReasoningMarkers("<think>\n", "\n</think>\n\n")
OUTPUTS = [
    "<think>\nLet me see.\n</think>\n\nThe answer is 4.",
    "<think>\nunfinished",
    "No reasoning at all.",
    "  <think></think>Empty block.",
    "<thi",
]


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("extract", [True, False])
def test_streamed_deltas_add_up_to_the_message(output, extract):
    """However the output is cut into deltas, the reasoning and content deltas concatenated
    are the non-streamed message's (the parse only ever extends both)."""
    reasoning = ChatReasoning(QWEN, extract)
    final = reasoning.split(output)
    rng = random.Random(7)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(output)), min(4, len(output) - 1)))
        pieces = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)])]
        stream = reasoning.stream()
        deltas = [stream.feed(p) for p in pieces]
        assert "".join(d.reasoning for d in deltas) == final.reasoning
        assert "".join(d.content for d in deltas) == final.content


def test_chat_deltas_send_reasoning_then_content_and_hold_probabilities():
    deltas = _ChatDeltas(ChatReasoning(QWEN, True))
    lp = [TokenLogprobs(i, -1.0, (), "") for i in range(3)]
    assert deltas.deltas(Piece("<thi", (0,), (lp[0],))) == []  # no change yet: held
    out = deltas.deltas(Piece("nk>\nhm\n</think>\n\nOK", (1,), (lp[1],)))
    assert out == [({"reasoning_content": "hm\n"}, ()), ({"content": "OK"}, (lp[0], lp[1]))]
    assert _ChatDeltas(None).deltas(Piece("x", (2,), (lp[2],))) == [({"content": "x"}, (lp[2],))]


def test_message_has_reasoning_content_only_when_there_is_some():
    done = [_completion("a"), _completion("b")]
    splits = [ChatReasoning(QWEN, True).split(t) for t in ("<think>\nr\n</think>\n\nc", "c")]
    body = responses.chat_completion(responses.ResponseIds("chatcmpl", "m"), done, splits)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "c",
                                             "reasoning_content": "r\n"}  # fmt: skip
    assert body["choices"][1]["message"] == {"role": "assistant", "content": "c"}


def test_reasoning_format_and_effort_fields():
    messages = [{"role": "user", "content": "hi"}]
    assert parse_chat({"messages": messages}).reasoning_format == "deepseek"  # llama-server's
    assert parse_chat({"messages": messages, "reasoning_format": "none"}).reasoning_format == "none"
    assert parse_completion({"prompt": "x", "reasoning_format": "auto"}).reasoning_format == "auto"
    with pytest.raises(ProtocolError, match="Unknown reasoning format: think"):
        parse_chat({"messages": messages, "reasoning_format": "think"})
    # OpenAI's reasoning_effort, as llama-server: "none" turns thinking off, a level goes to
    # the template
    off = parse_chat({"messages": messages, "reasoning_effort": "none"}).template_kwargs
    assert off == {"enable_thinking": False}
    high = parse_chat({"messages": messages, "reasoning_effort": "high",
                       "chat_template_kwargs": {"x": 1}}).template_kwargs  # fmt: skip
    assert high == {"x": 1, "reasoning_effort": "high"}
    settings = responses.generation_settings(
        parse_chat({"messages": messages, "stream": True, "reasoning_format": "deepseek-legacy"}),
        512, "m")  # fmt: skip
    assert settings["reasoning_format"] == "deepseek-legacy" and settings["reasoning_in_content"]


def _completion(text: str) -> responses.Completion:
    from pycacheflow.outputs import RequestMetrics, RequestOutput

    metrics = RequestMetrics(num_prompt_tokens=1, num_output_tokens=1, num_cached_tokens=0,
                             num_preemptions=0, arrival_time_s=0.0, first_scheduled_time_s=0.0,
                             first_token_time_s=0.0, finish_time_s=0.0, ttft_s=0.0, e2e_s=0.0,
                             tpot_s=None, queue_s=0.0, itl_s=())  # fmt: skip
    output = RequestOutput(request_id=1, prompt="", prompt_token_ids=(1,), text=text,
                           token_ids=(2,), finish_reason="stop", metrics=metrics)  # fmt: skip
    return responses.Completion(output, "eos", "", 0)
