"""RequestMetrics and the run aggregates of pycacheflow.metrics from synthetic timestamps,
checked against hand-computed values."""

from __future__ import annotations

import pytest

from pycacheflow import metrics as M
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


# ---------------------------------------------------------------------------- run aggregates
# pycacheflow.metrics over RequestMetrics built from synthetic timestamps (values by hand).


def test_percentile_interpolates_between_ranks():
    values = [40, 10, 30, 20]  # sorted: 10 20 30 40, ranks 0..3
    assert M.percentile(values, 0) == 10 and M.percentile(values, 100) == 40
    assert M.percentile(values, 50) == pytest.approx(25.0)  # rank 1.5
    assert M.percentile(values, 90) == pytest.approx(37.0)  # rank 2.7: 30 + 0.7 * 10
    assert M.percentile(values, 99) == pytest.approx(39.7)  # rank 2.97
    assert M.percentile([5.0], 99) == 5.0


def test_percentile_errors():
    with pytest.raises(ValueError, match="no values"):
        M.percentile([], 50)
    with pytest.raises(ValueError, match="q must be"):
        M.percentile([1], 101)


def test_distribution():
    d = M.Distribution.of([0.010, 0.030, None, 0.020])  # None skipped
    assert d.count == 3 and d.mean == pytest.approx(0.020) and d.median == pytest.approx(0.020)
    assert d.p90 == pytest.approx(0.028)  # rank 1.8: 20 + 0.8 * 10 ms
    assert (d.min, d.max) == (0.010, 0.030)
    ms = d.scaled(1000)
    assert ms.count == 3 and ms.p99 == pytest.approx(29.8)  # rank 1.98
    empty = M.Distribution.of([])
    assert empty.count == 0 and empty.mean != empty.mean  # NaN


def two_requests():
    # A: arrival 0, tokens at 100, 120, 150 ms. B: arrival 50, tokens at 250, 300 ms.
    a = metrics([100, 120, 150], arrival_ms=0, scheduled_ms=10, finish_ms=150, num_prompt_tokens=10)
    b = metrics([250, 300], arrival_ms=50, scheduled_ms=60, finish_ms=300, num_prompt_tokens=20)
    return a, b


def test_run_metrics_by_hand():
    a, b = two_requests()
    r = M.run_metrics([a, b])
    assert r.duration_s == pytest.approx(0.300)  # arrival 0 ms -> last finish 300 ms
    assert (r.num_requests, r.num_prompt_tokens, r.num_output_tokens) == (2, 30, 5)
    assert r.request_throughput == pytest.approx(2 / 0.3)
    assert r.output_throughput == pytest.approx(5 / 0.3)
    assert r.total_token_throughput == pytest.approx(35 / 0.3)
    # TTFT: A 100 ms, B 200 ms. TPOT: A (150 - 100) / 2 = 25 ms, B (250 - 200) / 1 = 50 ms.
    assert r.ttft.mean == pytest.approx(0.150) and r.ttft.p90 == pytest.approx(0.190)
    assert r.tpot.mean == pytest.approx(0.0375) and r.tpot.median == pytest.approx(0.0375)
    # ITL pools every gap: A 20, 30 ms; B 50 ms.
    assert r.itl.count == 3 and r.itl.median == pytest.approx(0.030)
    assert r.itl.mean == pytest.approx(0.100 / 3)
    # E2E: A 150 ms, B 250 ms.
    assert r.e2e.max == pytest.approx(0.250) and r.e2e.p99 == pytest.approx(0.249)
    assert r.goodput == r.request_throughput  # no SLO: every request counts
    row = r.to_row()
    assert row["ttft_ms_mean"] == pytest.approx(150.0) and row["itl_ms_median"] == pytest.approx(30)
    assert "ttft_ms_count" not in row


def test_goodput_counts_requests_within_every_slo():
    a, b = two_requests()
    assert M.goodput([a, b], 0.5, M.Slo(ttft_s=0.150)) == pytest.approx(2.0)  # only A: 1 / 0.5
    assert M.goodput([a, b], 0.5, M.Slo(tpot_s=0.030)) == pytest.approx(2.0)  # only A
    assert M.goodput([a, b], 0.5, M.Slo(e2e_s=0.300)) == pytest.approx(4.0)  # both
    assert M.goodput([a, b], 0.5, M.Slo(ttft_s=0.050)) == 0.0
    single = metrics([120], finish_ms=120)  # no TPOT: cannot miss a TPOT objective
    assert M.Slo(tpot_s=0.001).met_by(single)
    assert not M.Slo(ttft_s=1.0).met_by(metrics([], finish_ms=130))  # no first token


def test_run_metrics_with_given_duration_and_no_requests():
    a, b = two_requests()
    assert M.run_metrics([a, b], duration_s=1.0).output_throughput == pytest.approx(5.0)
    empty = M.run_metrics([])
    assert empty.duration_s == 0 and empty.output_throughput == 0 and empty.ttft.count == 0


def test_bandwidth_ceiling_by_hand():
    # SmolLM2-135M: 30 layers, n_embd 576, 9 heads, 3 KV heads -> head_dim 64; f16 K and V.
    assert M.kv_bytes_per_token(30, 576, 9, 3) == 2 * 30 * 3 * 64 * 2 == 23040
    assert M.decode_step_bytes(100, context_tokens=10, kv_token_bytes=3) == 130
    # 1000 B/s, weights 100 B, batch 4 with 5 tokens of context each at 10 B/token:
    # a step reads 100 + 4 * 5 * 10 = 300 B -> 1000 / 300 steps/s, 4 tokens each.
    assert M.decode_ceiling_tok_s(1000, 100, 4, 5, 10) == pytest.approx(4 * 1000 / 300)
    assert M.decode_ceiling_tok_s(1000, 0, 0, 0, 10) == 0.0
