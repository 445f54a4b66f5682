"""Pieces of the data-parallel router that need no replica: merging the replicas' Prometheus
texts, the arguments the replicas get, and the limit on request bodies."""

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


def test_the_router_refuses_a_body_over_the_limit_before_reading_it():
    """It reads a body whole to pick a replica: the servers' --max-body-size applies to it too."""
    import asyncio

    import httpx

    from pycacheflow.server.router import Router, RouterConfig
    from pycacheflow.server.router_app import create_router_app

    async def post(size: int, chunked: bool = False) -> httpx.Response:
        async def chunks():  # no length: sent chunked
            for _ in range(size // 10):
                yield b" " * 10

        app = create_router_app(Router([], RouterConfig(max_body_bytes=100)))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            return await client.post("/completion", content=chunks() if chunked else b" " * size)

    answer = asyncio.run(post(101))
    assert answer.status_code == 413 and answer.json()["error"]["message"] == (
        "Request body of 101 bytes is larger than the server's limit of 100 bytes "
        "(--max-body-size)")  # fmt: skip
    answer = asyncio.run(post(110, chunked=True))
    assert answer.status_code == 413 and answer.json()["error"]["message"] == (
        "Request body is larger than the server's limit of 100 bytes (--max-body-size)")
    assert asyncio.run(post(100)).status_code == asyncio.run(post(100, chunked=True)).status_code
    assert asyncio.run(post(100)).status_code == 503  # on to the router: no replica left
