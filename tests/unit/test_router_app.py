"""Pieces of the data-parallel router that need no replica: merging the replicas' Prometheus
texts, and the arguments the replicas get."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cli.serve_router import replica_args
from pycacheflow.server.router_app import merge_metrics

TEXT = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {n}
# HELP cacheflow:requests_finished_total Finished requests by reason
# TYPE cacheflow:requests_finished_total counter
cacheflow:requests_finished_total{{reason="stop"}} {n}
"""


def test_merged_metrics_keep_each_family_together_with_a_replica_label():
    merged = merge_metrics([(0, TEXT.format(n=1)), (1, TEXT.format(n=2))])
    assert merged.count("# TYPE llamacpp:requests_processing gauge") == 1
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(merged)
        for s in family.samples
    }
    assert samples[("llamacpp:requests_processing", (("replica", "1"),))] == 2
    key = ("cacheflow:requests_finished_total", (("reason", "stop"), ("replica", "0")))
    assert samples[key] == 1
    assert merge_metrics([]) == ""


def test_replicas_get_every_argument_but_the_router_s():
    given = ["-m", "x.gguf", "-dp", "2", "--port", "8080", "--host=0.0.0.0", "-np", "4",
             "--router-policy", "round-robin", "--router-slack=3", "--data-parallel", "2",
             "--metrics"]  # fmt: skip
    assert replica_args(given) == ["-m", "x.gguf", "-np", "4", "--metrics"]
