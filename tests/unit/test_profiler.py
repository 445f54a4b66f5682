"""pycacheflow.profiler over synthetic events: request and step spans, the Chrome trace format
(checked by check_chrome_trace, itself tested on broken traces), per-request CSV and summary.
No engine is needed."""

from __future__ import annotations

import csv
import json

import pytest

from pycacheflow import profiler as prof
from pycacheflow.profiler import Profile, ProfileEvent, check_chrome_trace

MS = 1_000_000  # ns
T0 = 5_000 * MS  # an arbitrary clock origin


def ev(kind: int, t_ms: float, **fields: int) -> ProfileEvent:
    values = dict.fromkeys(ProfileEvent._fields, 0)
    values.update(kind=kind, time_ns=T0 + int(t_ms * MS), **fields)
    return ProfileEvent(**values)


def step(
    step_id: int,
    begin_ms: float,
    end_ms: float,
    seqs: int,
    decode: int,
    prefill: int,
    kv_used: int,
    kv_free: int,
    waiting: int = 0,
) -> list[ProfileEvent]:
    return [
        ev(
            prof.STEP_BEGIN,
            begin_ms,
            step_id=step_id,
            num_seqs=seqs,
            num_decode_tokens=decode,
            num_prefill_tokens=prefill,
        ),
        ev(
            prof.STEP_END,
            end_ms,
            step_id=step_id,
            num_waiting=waiting,
            kv_tokens_used=kv_used,
            kv_tokens_free=kv_free,
        ),
    ]


def two_request_events() -> list[ProfileEvent]:
    """Request 1 (4 prompt tokens) and request 2 (3 prompt tokens) arrive at 0 and 1 ms.
    Step 1 [2, 12): prefill of 1. Step 2 [12, 20): decode 1 + prefill 2.
    Step 3 [20, 26): decode both; request 1 finishes (3 tokens). Step 4 [26, 30): request 2
    finishes (2 tokens). KV capacity 32 rows, 16 per sequence (split streams)."""
    R = prof
    return [
        ev(R.REQUEST_ARRIVAL, 0, request_id=1, num_tokens=4),
        ev(R.REQUEST_ARRIVAL, 1, request_id=2, num_tokens=3),
        *step(1, 2, 12, seqs=1, decode=0, prefill=4, kv_used=4, kv_free=16, waiting=1),
        ev(R.REQUEST_FIRST_SCHEDULED, 2, step_id=1, request_id=1, num_tokens=4),
        ev(R.REQUEST_FIRST_TOKEN, 11, step_id=1, request_id=1, num_tokens=1),
        *step(2, 12, 20, seqs=2, decode=1, prefill=3, kv_used=8, kv_free=0),
        ev(R.REQUEST_FIRST_SCHEDULED, 12, step_id=2, request_id=2, num_tokens=3),
        ev(R.REQUEST_FIRST_TOKEN, 19, step_id=2, request_id=2, num_tokens=1),
        *step(3, 20, 26, seqs=2, decode=2, prefill=0, kv_used=4, kv_free=16),
        ev(R.REQUEST_FINISH, 25, step_id=3, request_id=1, num_tokens=3, finish_reason=2),
        *step(4, 26, 30, seqs=1, decode=1, prefill=0, kv_used=0, kv_free=32),
        ev(R.REQUEST_FINISH, 29, step_id=4, request_id=2, num_tokens=2, finish_reason=1),
    ]


@pytest.fixture
def profile() -> Profile:
    events = two_request_events()
    return Profile(list(reversed(events)), kv_tokens_capacity=32, metadata={"model": "m"})


def test_events_are_sorted_by_time(profile):
    times = [e.time_ns for e in profile.events]
    assert times == sorted(times) and profile.start_ns == T0


def test_request_spans(profile):
    r1, r2 = profile.requests()
    assert (r1.request_id, r1.num_prompt_tokens, r1.num_output_tokens) == (1, 4, 3)
    assert r1.first_scheduled_ns - r1.arrival_ns == 2 * MS
    assert r1.finish_reason == "length" and r2.finish_reason == "stop"
    assert r2.first_token_ns - r2.arrival_ns == 18 * MS


def test_step_spans(profile):
    steps = profile.steps()
    assert [s.step_id for s in steps] == [1, 2, 3, 4]
    s2 = steps[1]
    assert (s2.end_ns - s2.begin_ns, s2.num_seqs, s2.num_decode_tokens) == (8 * MS, 2, 1)
    assert (s2.num_prefill_tokens, s2.kv_tokens_used, s2.kv_tokens_free) == (3, 8, 0)


def test_chrome_trace_is_valid_and_complete(profile):
    trace = json.loads(json.dumps(profile.chrome_trace()))  # survives a JSON round trip
    check_chrome_trace(trace)
    events = trace["traceEvents"]
    steps = [e for e in events if e["ph"] == "X" and e["name"] == "step"]
    assert [s["ts"] for s in steps] == [2000.0, 12000.0, 20000.0, 26000.0]  # us from T0
    assert steps[1]["dur"] == 8000.0 and steps[1]["args"]["prefill tokens"] == 3
    spans = {(e["tid"], e["name"]): e for e in events if e.get("cat") == "request"}
    assert spans[(1, "queued")]["ts"] == 0.0 and spans[(1, "queued")]["dur"] == 2000.0
    assert spans[(1, "prefill")]["dur"] == 9000.0  # 2 -> 11 ms
    assert spans[(1, "decode")]["dur"] == 14000.0  # 11 -> 25 ms
    assert spans[(2, "queued")]["ts"] == 1000.0 and spans[(2, "decode")]["dur"] == 10000.0
    kv = [e for e in events if e["ph"] == "C" and e["name"] == "KV cache (tokens)"]
    assert kv[1]["args"] == {"used": 8, "reserved": 32}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"steps", "request 1", "request 2"} <= names
    assert trace["otherData"]["model"] == "m"


def test_kv_moves_are_instant_events_on_the_request_track():
    events = [
        *two_request_events(),
        ev(prof.REQUEST_KV_DEMOTE, 21, step_id=3, request_id=2, num_tokens=32, num_bytes=2 * 368640),
        ev(prof.REQUEST_SWAP_OUT, 22, step_id=3, request_id=2, num_tokens=9),
        ev(prof.REQUEST_SWAP_IN, 24, step_id=3, request_id=2, num_tokens=9),
        ev(prof.REQUEST_KV_PROMOTE, 27, step_id=4, request_id=2, num_tokens=16, num_bytes=368640),
    ]
    trace = json.loads(json.dumps(Profile(events, kv_tokens_capacity=32).chrome_trace()))
    check_chrome_trace(trace)
    moves = [e for e in trace["traceEvents"] if e.get("cat") == "kv"]
    assert [(e["name"], e["ph"], e["tid"], e["ts"]) for e in moves] == [
        ("KV demoted to host", "i", 2, 21000.0),
        ("swapped out", "i", 2, 22000.0),
        ("swapped in", "i", 2, 24000.0),
        ("KV promoted to device", "i", 2, 27000.0),
    ]
    assert moves[0]["args"] == {"step_id": 3, "tokens": 32, "bytes": 2 * 368640}
    assert moves[1]["args"] == {"step_id": 3, "tokens": 9}
    assert prof.EVENT_KIND_NAMES[prof.REQUEST_KV_DEMOTE] == "request_kv_demote"


def test_unfinished_request_runs_to_the_last_event():
    events = two_request_events()[:10]  # request 2 has its first token, nothing after
    trace = Profile(events, kv_tokens_capacity=32).chrome_trace()
    check_chrome_trace(trace)
    decode = [e for e in trace["traceEvents"] if e.get("tid") == 2 and e["name"] == "decode"]
    assert decode[0]["args"]["unfinished"] is True
    assert decode[0]["ts"] + decode[0]["dur"] == pytest.approx(20000.0)  # step 2 end, 20 ms


def test_requests_csv(profile, tmp_path):
    path = tmp_path / "requests.csv"
    profile.write_requests_csv(path)
    rows = list(csv.DictReader(path.open()))
    assert [r["request_id"] for r in rows] == ["1", "2"]
    r1 = rows[0]
    assert float(r1["queue_ms"]) == 2.0 and float(r1["prefill_ms"]) == 9.0
    assert float(r1["ttft_ms"]) == 11.0 and float(r1["e2e_ms"]) == 25.0
    assert float(r1["tpot_ms"]) == 7.0  # (25 - 11) / (3 - 1)
    assert r1["finish_reason"] == "length"


def test_summary(profile, tmp_path):
    s = profile.summary()
    assert (s["num_requests"], s["num_finished"], s["num_steps"]) == (2, 2, 4)
    assert s["duration_s"] == pytest.approx(0.030)  # first event 0 ms, last 30 ms
    assert s["num_decode_only_steps"] == 2
    assert s["decode_only_tok_s"] == pytest.approx(3 / 0.010)  # 2 + 1 tokens in 6 + 4 ms
    assert s["ttft_ms"]["mean"] == pytest.approx((11 + 18) / 2)
    kv = s["kv"]
    assert kv["utilization_peak"] == pytest.approx(8 / 32)
    assert kv["utilization_mean"] == pytest.approx((4 + 8 + 4 + 0) / 4 / 32)
    assert kv["reserved_mean"] == pytest.approx((16 + 32 + 16 + 0) / 4 / 32)
    assert kv["reserved_per_used"] == pytest.approx((16 + 32 + 16) / (4 + 8 + 4))
    path = tmp_path / "summary.json"
    profile.write_summary(path)
    assert json.loads(path.read_text())["num_steps"] == 4


def test_empty_profile():
    p = Profile([], kv_tokens_capacity=0)
    check_chrome_trace(p.chrome_trace())
    assert p.summary()["num_requests"] == 0 and p.kv_summary() == {}


# ---------------------------------------------------------------------------- the checker


def x(ts, dur, tid=1, name="a"):
    return {"name": name, "ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_checker_accepts_an_array_with_nested_spans_and_balanced_pairs():
    check_chrome_trace(
        [
            x(0, 10),
            x(2, 3),
            x(10, 5),  # nested, then adjacent
            {"name": "b", "ph": "B", "pid": 1, "tid": 2, "ts": 1},
            {"name": "c", "ph": "B", "pid": 1, "tid": 2, "ts": 2},
            {"ph": "E", "pid": 1, "tid": 2, "ts": 3},
            {"ph": "E", "pid": 1, "tid": 2, "ts": 4},
            {"name": "kv", "ph": "C", "pid": 1, "ts": 0, "args": {"used": 3}},
        ]
    )


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ({"events": []}, "traceEvents"),
        ([{"ph": "Q", "pid": 1}], "known 'ph'"),
        ([{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0}], "missing dur"),
        ([x(-1, 2)], "ts must be"),
        ([x(0, float("nan"))], "dur must be"),
        ([x(0, 10), x(5, 10)], "partly overlaps"),
        ([{"ph": "E", "pid": 1, "tid": 1, "ts": 0}], "without an open"),
        ([{"name": "b", "ph": "B", "pid": 1, "tid": 1, "ts": 0}], "never closed"),
        (
            [
                {"name": "b", "ph": "B", "pid": 1, "tid": 1, "ts": 5},
                {"ph": "E", "pid": 1, "tid": 1, "ts": 4},
            ],
            "before its 'B'",
        ),
        ([{"name": "kv", "ph": "C", "pid": 1, "ts": 0, "args": {"used": "3"}}], "numbers"),
    ],
)
def test_checker_rejects(trace, message):
    with pytest.raises(ValueError, match=message):
        check_chrome_trace(trace)


def test_spans_on_different_tracks_may_overlap():
    check_chrome_trace([x(0, 10, tid=1), x(5, 10, tid=2)])
