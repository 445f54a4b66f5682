"""The /metrics text of pycacheflow.server.metrics from hand-made engine stats (no engine):
TTFT by request priority and priority preemptions; llama-server's request gauges."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from pycacheflow.outputs import EngineStats, PriorityTTFT
from pycacheflow.server.metrics import ServerMetrics


def stats(**fields: object) -> EngineStats:
    values = dict.fromkeys(EngineStats._fields[:-1], 0)
    values.update(fields)
    return EngineStats(**values)


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, of the cacheflow: families."""
    lines = text.decode().splitlines()
    body = "\n".join(line for line in lines if "llamacpp:" not in line)
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_ttft_by_priority_and_priority_preemptions():
    table = (PriorityTTFT(0, 3, 0.6, 0.3), PriorityTTFT(5, 2, 4.0, 2.5))
    got = samples(ServerMetrics().render(stats(num_preemptions_priority=4, ttft_by_priority=table)))
    name = "cacheflow:time_to_first_token_by_priority_seconds"
    assert got[(name + "_count", (("priority", "0"),))] == 3
    assert got[(name + "_sum", (("priority", "0"),))] == 0.6
    assert got[(name + "_count", (("priority", "5"),))] == 2
    assert got[(name + "_sum", (("priority", "5"),))] == 4.0
    largest = "cacheflow:time_to_first_token_by_priority_max_seconds"
    assert got[(largest, (("priority", "5"),))] == 2.5
    assert got[("cacheflow:preemptions_priority_total", ())] == 4


def test_no_priority_seen_yet():
    got = samples(ServerMetrics().render(stats()))
    assert not any(name.startswith("cacheflow:time_to_first_token_by_priority") for name, _ in got)
    assert PriorityTTFT(1, 0, 0.0, 0.0).ttft_mean_s == 0.0
    assert PriorityTTFT(1, 4, 2.0, 1.0).ttft_mean_s == 0.5


def test_swapped_requests_count_as_deferred():
    """llama-server's two request gauges cover every request in the engine: a sequence swapped
    out to host memory waits to resume, as a queued one waits to start."""
    text = ServerMetrics().render(stats(num_running=12, num_waiting=3, num_swapped=4)).decode()
    values = dict(line.split() for line in text.splitlines() if line.startswith("llamacpp:requests_"))
    assert values == {"llamacpp:requests_processing": "12", "llamacpp:requests_deferred": "7"}
