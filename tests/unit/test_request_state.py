"""RequestState (chunks -> deltas and RequestOutput) and split_by_request (a drain's arrays ->
one RequestChunk per request), without the native library."""

from __future__ import annotations

import numpy as np
import pytest

from pycacheflow.engine import split_by_request
from pycacheflow.outputs import FINISH_REASONS, TOKEN_NONE, FinalInfo, PromptProgress, RequestChunk
from pycacheflow.request_state import RequestState

MS = 1_000_000
EVENT_DTYPE = np.dtype([
    ("request_id", np.int64), ("token_id", np.int32), ("finish_reason", np.int32),
    ("time_ns", np.int64), ("arrival_ns", np.int64), ("first_scheduled_ns", np.int64),
    ("num_prompt_tokens", np.int32), ("num_cached_tokens", np.int32),
    ("num_output_tokens", np.int32), ("num_preemptions", np.int32), ("slot_id", np.int32),
    ("text_len", np.int32), ("text_offset", np.int64), ("stop_string_index", np.int32),
    ("prompt_progress", np.int32), ("num_prompt_processed", np.int32), ("error_len", np.int32),
])  # fmt: skip


def reason(name):
    return FINISH_REASONS.index(name) + 1


def final(name, t_ms, stop_index=-1):
    return FinalInfo(reason(name), t_ms * MS, 10 * MS, 12 * MS, 5, 2, 0, 0, stop_index)


def chunk(ids, times_ms, text, fin=None, slot=3):
    return RequestChunk(7, list(ids), [t * MS for t in times_ms], text, slot, fin)


def test_deltas_and_final_output_are_the_engine_text_concatenated():
    s = RequestState(7, "prompt", [1, 2])
    d1 = s.add(chunk([1, 2], [20, 25], "Hi there"))
    d2 = s.add(chunk([6], [30], ""))  # the first byte of "é": held back by the engine
    d3 = s.add(chunk([7], [40], "é", final("length", 40)))
    assert (d1.text, d1.token_ids, d1.finished, d1.slot_id) == ("Hi there", (1, 2), False, 3)
    assert (d2.text, d3.text) == ("", "é")
    out = d3.output
    assert d3.finished and s.finished and out is s.output
    assert out.text == "Hi thereé" and out.token_ids == (1, 2, 6, 7)
    assert out.finish_reason == "length" and out.prompt == "prompt" and out.stop_string is None
    assert out.prompt_token_ids == (1, 2)
    m = out.metrics
    assert m.ttft_s == pytest.approx(0.010) and m.e2e_s == pytest.approx(0.030)
    assert m.tpot_s == pytest.approx(0.020 / 3) and m.num_output_tokens == 4
    assert (m.num_prompt_tokens, m.num_cached_tokens) == (5, 2)


def test_several_chunks_become_one_delta_and_the_stop_string_is_named():
    s = RequestState(7, None, [1], stop=["x", " END"])
    d = s.add([chunk([1], [20], "Hi"), chunk([4, 5], [21, 22], "", final("stop", 22, 1))])
    assert d.text == "Hi" and d.token_ids == (1, 4, 5)
    assert d.output.text == "Hi" and d.output.finish_reason == "stop"
    assert d.output.stop_string == " END"


def test_abort_without_tokens():
    s = RequestState(7, None, [1])
    out = s.add(chunk([], [], "", final("abort", 15), slot=-1)).output
    assert out.text == "" and out.token_ids == () and out.finish_reason == "abort"
    assert out.metrics.ttft_s is None and out.metrics.e2e_s == pytest.approx(0.005)


def test_chunks_after_final_are_ignored():
    s = RequestState(7, None, [1])
    d = s.add([chunk([1], [20], "a", final("stop", 20)), chunk([2], [21], "b")])
    assert d.token_ids == (1,) and d.output.token_ids == (1,) and d.output.text == "a"


def events(rows):
    """rows: (request_id, token_id, finish_reason, time_ms, slot_id, text bytes)."""
    array = np.zeros(len(rows), EVENT_DTYPE)
    text = b""
    for i, (rid, tok, fin, t_ms, slot, piece) in enumerate(rows):
        array[i]["request_id"], array[i]["token_id"], array[i]["finish_reason"] = rid, tok, fin
        array[i]["time_ns"], array[i]["slot_id"] = t_ms * MS, slot
        array[i]["text_offset"], array[i]["text_len"] = len(text), len(piece)
        array[i]["stop_string_index"] = -1
        text += piece
    return array, text


def test_split_by_request_merges_each_requests_events_in_order():
    array, text = events([
        (5, 10, 0, 1, 0, b"a"),
        (6, 20, 0, 1, 1, "\u00e9".encode()),
        (5, 11, 0, 2, 0, b""),
        (6, 21, 0, 2, 1, b"\xe2\x82\xac"),  # a whole character per event, as the engine sends
        (5, 12, reason("length"), 3, 0, b"bc"),
        (7, TOKEN_NONE, reason("abort"), 3, -1, b""),
    ])  # fmt: skip
    chunks = split_by_request(array, text)
    assert [c.request_id for c in chunks] == [5, 6, 7]
    first, second, aborted = chunks
    assert (first.token_ids, first.text, first.slot_id) == ([10, 11, 12], "abc", 0)
    assert first.token_times_ns == [1 * MS, 2 * MS, 3 * MS]
    assert first.final is not None and first.final.finish_reason == reason("length")
    assert (second.token_ids, second.text, second.final) == ([20, 21], "\u00e9\u20ac", None)
    assert aborted.token_ids == [] and aborted.token_times_ns == [] and aborted.text == ""
    assert aborted.final.finish_reason == reason("abort") and aborted.slot_id == -1


def test_split_by_request_of_one_request():
    array, text = events([(9, 1, 0, 1, 2, b"x"), (9, 2, 0, 2, 2, b"yz")])
    (only,) = split_by_request(array, text)
    assert (only.token_ids, only.text, only.final) == ([1, 2], "xyz", None)


LOGPROB_DTYPE = np.dtype([("token_id", np.int32), ("logprob", np.float32)])
EVENT_WITH_LOGPROBS_DTYPE = np.dtype(
    EVENT_DTYPE.descr + [("num_logprobs", np.int32), ("logprobs_offset", np.int64)]
)


def test_split_by_request_gives_token_probabilities_to_the_requests_that_have_them():
    plain, text = events([
        (5, 10, 0, 1, 0, b"a"),
        (6, 20, 0, 1, 1, b"x"),
        (5, 11, 0, 2, 0, b"b"),
        (6, 21, reason("length"), 2, 1, "\u00e9".encode()),
    ])  # fmt: skip
    array = np.zeros(len(plain), EVENT_WITH_LOGPROBS_DTYPE)
    for name in EVENT_DTYPE.names:
        array[name] = plain[name]
    # request 6 asked for 1 top token: entries (sampled, top) per token, in drain order
    array["num_logprobs"] = [0, 2, 0, 2]
    array["logprobs_offset"] = [0, 0, 0, 2]
    logprobs = np.array([(20, -0.5), (20, -0.5), (21, -1.0), (3, -0.25)], LOGPROB_DTYPE)
    plain_chunk, probs_chunk = split_by_request(array, text, logprobs)
    assert plain_chunk.request_id == 5 and plain_chunk.logprobs is None
    first, second = probs_chunk.logprobs
    assert (first.token_id, first.logprob, first.top, first.text) == (20, -0.5, ((20, -0.5),), "x")
    assert (second.token_id, second.top, second.text) == (21, ((3, -0.25),), "\u00e9")
    state = RequestState(6, None, [1], logprobs=True)
    delta = state.add(probs_chunk)
    assert delta.logprobs == (first, second) and delta.output.logprobs == (first, second)
    assert RequestState(5, None, [1]).add(plain_chunk).logprobs is None


def test_split_by_request_gives_prompt_progress_to_the_requests_that_asked():
    # request 5 (20-token prompt, 4 cached) reports before its first chunk, after each chunk
    # (the last one in the step that samples its first token), then decodes; request 6 did not ask
    array, text = events([
        (5, TOKEN_NONE, 0, 1, 0, b""),
        (6, 30, 0, 1, 1, b"x"),
        (5, TOKEN_NONE, 0, 2, 0, b""),
        (5, TOKEN_NONE, 0, 3, 0, b""),
        (5, 10, 0, 3, 0, b"a"),
        (5, 11, 0, 4, 0, b"b"),
    ])  # fmt: skip
    rows = [0, 2, 3]
    array["prompt_progress"][rows] = 1
    array["num_prompt_processed"][rows] = [4, 12, 20]
    array["num_prompt_tokens"][rows], array["num_cached_tokens"][rows] = 20, 4
    array["first_scheduled_ns"][rows] = 1 * MS
    asked, plain = split_by_request(array, text)
    assert (asked.token_ids, asked.text, plain.progress) == ([10, 11], "ab", ())
    assert asked.token_times_ns == [3 * MS, 4 * MS]
    assert asked.progress == tuple(
        PromptProgress(20, 4, processed, t_ms * MS, 1 * MS)
        for processed, t_ms in ((4, 1), (12, 2), (20, 3))
    )
    assert [p.elapsed_ms for p in asked.progress] == [0.0, 1.0, 2.0]
    state = RequestState(5, None, [1] * 20)
    first = state.add(RequestChunk(5, [], [], "", 0, progress=asked.progress[:1]))
    rest = state.add(asked._replace(progress=asked.progress[1:]))
    assert first.progress == asked.progress[:1] and first.token_ids == ()
    assert rest.progress == asked.progress[1:] and rest.token_ids == (10, 11)
    assert state.add(RequestChunk(5, [12], [5 * MS], "c", 0)).progress == ()
