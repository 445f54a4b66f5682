"""RequestMetrics from synthetic timestamps, checked against hand-computed values."""

from __future__ import annotations

import pytest

from pycacheflow.outputs import RequestMetrics

MS = 1_000_000  # ns


def metrics(token_ms, arrival_ms=100, scheduled_ms=105, finish_ms=None, **kwargs):
    return RequestMetrics.from_times_ns(
        arrival_ns=arrival_ms * MS,
        first_scheduled_ns=scheduled_ms * MS,
        token_times_ns=[t * MS for t in token_ms],
        finish_ns=(finish_ms or 0) * MS,
        num_prompt_tokens=kwargs.pop("num_prompt_tokens", 7),
        **kwargs,
    )


def test_four_tokens():
    # arrival 100 ms, tokens at 150, 160, 175, 180 ms, finish 180 ms.
    m = metrics([150, 160, 175, 180], finish_ms=180, num_cached_tokens=4, num_preemptions=1)
    assert m.ttft_s == pytest.approx(0.050)  # 150 - 100
    assert m.e2e_s == pytest.approx(0.080)  # 180 - 100
    assert m.tpot_s == pytest.approx((0.080 - 0.050) / 3)  # 10 ms
    assert m.itl_s == pytest.approx((0.010, 0.015, 0.005))
    assert m.queue_s == pytest.approx(0.005)
    assert (m.num_prompt_tokens, m.num_output_tokens, m.num_cached_tokens, m.num_preemptions) == (
        7,
        4,
        4,
        1,
    )
    assert m.arrival_time_s == pytest.approx(0.100)
    assert m.first_token_time_s == pytest.approx(0.150)
    assert m.finish_time_s == pytest.approx(0.180)


def test_finish_after_last_token():
    # A final event without a token (e.g. abort) at 200 ms counts in e2e and tpot.
    m = metrics([150, 170], finish_ms=200)
    assert m.e2e_s == pytest.approx(0.100)
    assert m.tpot_s == pytest.approx(0.050)  # (100 - 50) / 1
    assert m.itl_s == pytest.approx((0.020,))


def test_missing_finish_uses_last_token():
    m = metrics([130, 140, 160])
    assert m.finish_time_s == pytest.approx(0.160) and m.e2e_s == pytest.approx(0.060)


def test_single_token_has_no_tpot():
    m = metrics([120], finish_ms=120)
    assert m.ttft_s == pytest.approx(0.020) and m.tpot_s is None and m.itl_s == ()


def test_no_tokens():
    m = metrics([], scheduled_ms=0, finish_ms=130)
    assert m.ttft_s is None and m.tpot_s is None and m.first_token_time_s is None
    assert m.first_scheduled_time_s is None and m.queue_s is None
    assert m.e2e_s == pytest.approx(0.030) and m.num_output_tokens == 0


def test_to_dict_is_json_ready():
    import json

    d = metrics([150, 160], finish_ms=160).to_dict()
    assert isinstance(d["itl_s"], list)
    json.dumps(d)
