"""RequestState: events -> stream deltas and RequestOutput, with a fake detokenizer."""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams
from pycacheflow.outputs import FINISH_REASONS, TOKEN_NONE, OutputEvent
from pycacheflow.request_state import RequestState

VOCAB = {1: b"Hi", 2: b" there", 3: b".", 4: b" END", 5: b" more", 6: b"\xc3", 7: b"\xa9"}
MS = 1_000_000


def detok(ids):
    return b"".join(VOCAB[i] for i in ids)


def reason(name):
    return FINISH_REASONS.index(name) + 1


def ev(token_id, t_ms, finish=0, request_id=7):
    final = finish != 0
    return OutputEvent(
        request_id,
        token_id,
        finish,
        t_ms * MS,
        10 * MS if final else 0,
        12 * MS if final else 0,
        5 if final else 0,
        2 if final else 0,
        0,
        0,
    )


def make(stop=(), streaming=True):
    return RequestState(7, "prompt", [1, 2], SamplingParams(stop=list(stop)), detok, streaming)


def test_streaming_deltas_and_final_output():
    s = make()
    d1 = s.add([ev(1, 20), ev(2, 25)])
    d2 = s.add([ev(6, 30)])
    d3 = s.add([ev(7, 40, finish=reason("length"))])
    assert (d1.text, d1.token_ids, d1.finished) == ("Hi there", (1, 2), False)
    assert (d2.text, d3.text) == ("", "é")
    out = d3.output
    assert d3.finished and s.finished and out is s.output
    assert out.text == "Hi thereé" and out.token_ids == (1, 2, 6, 7)
    assert out.finish_reason == "length" and out.prompt == "prompt"
    assert out.prompt_token_ids == (1, 2)
    m = out.metrics
    assert m.ttft_s == pytest.approx(0.010) and m.e2e_s == pytest.approx(0.030)
    assert m.tpot_s == pytest.approx(0.020 / 3) and m.num_output_tokens == 4
    assert (m.num_prompt_tokens, m.num_cached_tokens) == (5, 2)


def test_stop_string_truncates_and_reports_stop():
    s = make(stop=[" END"])
    texts = [s.add([ev(1, 20)]).text, s.add([ev(4, 30)]).text]
    assert s.hit_stop_string and not s.finished
    d = s.add([ev(5, 40), ev(TOKEN_NONE, 41, finish=reason("abort"))])
    assert texts == ["Hi", ""] and d.text == ""
    assert d.output.text == "Hi" and d.output.finish_reason == "stop"


def test_non_streaming_only_decodes_at_the_end():
    calls = []

    def counting(ids):
        calls.append(list(ids))
        return detok(ids)

    s = RequestState(7, None, [1], SamplingParams(stop=["."]), counting, streaming=False)
    assert s.add([ev(1, 20), ev(2, 21)]).text == ""
    d = s.add([ev(3, 22), ev(5, 23, finish=reason("stop"))])
    assert calls == [[1, 2, 3, 5]]
    assert d.output.text == "Hi there" and d.output.finish_reason == "stop"


def test_abort_without_tokens():
    s = make()
    d = s.add([ev(TOKEN_NONE, 15, finish=reason("abort"))])
    out = d.output
    assert out.text == "" and out.token_ids == () and out.finish_reason == "abort"
    assert out.metrics.ttft_s is None and out.metrics.e2e_s == pytest.approx(0.005)


def test_events_after_final_are_ignored():
    s = make()
    d = s.add([ev(1, 20, finish=reason("stop")), ev(2, 21)])
    assert d.token_ids == (1,) and d.output.token_ids == (1,)
