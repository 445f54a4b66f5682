"""`cacheflow serve --data-parallel 2` on the tiny model (issue 17): two CPU replicas behind the
router. Requests sharing a long prefix stay on one replica and new prefixes spread; streams and
greedy outputs through the router equal a direct server's; a killed replica fails its request in
flight with an error naming it and the other one takes the next requests; SIGTERM leaves no
replica behind. The routing policy alone is tested in tests/unit/test_router_policy.py.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import httpx
import pytest
from serve_helpers import ServerProcess, parse_metrics, sse_data, stream_events

pytestmark = pytest.mark.e2e

REPLICA_HEADER = "x-cacheflow-replica"
SMALL = ["-np", "4", "-c", "2048"]  # 4 slots of 512 tokens per replica
LONG = ["-np", "2", "-c", "8192"]  # 2 slots of 4,096 tokens: a long request runs for seconds


def start_router(tiny_model_path, engine_args, *extra: str) -> ServerProcess:
    proc = ServerProcess(["-m", str(tiny_model_path), "-dp", "2", *engine_args, *extra])
    proc.wait_ready()
    return proc


@pytest.fixture(scope="module")
def router(tiny_model_path):
    proc = start_router(tiny_model_path, SMALL, "--metrics")
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def direct(tiny_model_path):
    proc = ServerProcess(["-m", str(tiny_model_path), *SMALL, "-t", "1"])
    proc.wait_ready()
    yield proc
    proc.close()


def prefix(tag: str) -> str:
    """About 600 characters (9 routing chunks) that start with a tag of their own."""
    return f"[{tag}] " + "The archive keeps every shipment record for seven years. " * 10


def greedy(prompt: object, n: int = 6, **extra: object) -> dict[str, object]:
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, **extra}


def router_stats(proc: ServerProcess) -> dict:
    return httpx.get(proc.base_url + "/router").json()


def replica_of(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return int(response.headers[REPLICA_HEADER])


def test_a_shared_prefix_stays_on_one_replica_and_new_prefixes_spread(router):
    shared = prefix(uuid.uuid4().hex)
    with httpx.Client(base_url=router.base_url, timeout=60) as client:
        before = router_stats(router)
        on = [replica_of(client.post("/completion", json=greedy(f"{shared}\nQuestion {i}?")))
              for i in range(4)]  # fmt: skip
        middle = router_stats(router)
        routed = [r["num_requests"] for r in middle["replicas"]]
        fresh = [replica_of(client.post("/completion", json=greedy(prefix(uuid.uuid4().hex))))
                 for _ in range(abs(routed[0] - routed[1]) + 2)]  # fmt: skip
    assert len(set(on)) == 1
    assert middle["num_prefix_hits"] == before["num_prefix_hits"] + 3  # all but the first
    assert set(fresh) == {0, 1}  # no match: the replica with fewer requests so far
    after = router_stats(router)
    assert after["num_prefix_hits"] == middle["num_prefix_hits"]
    assert after["prefix_hit_rate"] == after["num_prefix_hits"] / after["num_requests"]


def test_chat_requests_route_by_their_system_and_first_user_message(router):
    system = {"role": "system", "content": prefix(uuid.uuid4().hex)}
    with httpx.Client(base_url=router.base_url, timeout=60) as client:
        on = {
            replica_of(client.post("/v1/chat/completions", json={
                "messages": [system, {"role": "user", "content": f"question {i}"}],
                "max_tokens": 3, "temperature": 0,
            }))
            for i in range(3)
        }  # fmt: skip
    assert len(on) == 1


def _shape(value: object) -> object:
    """The structure of a JSON value: the keys of objects, the types of scalars, and for a list
    the distinct structures of its items (an event's token list is as long as the tokens it
    carries, which depends on timing)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        items = {json.dumps(_shape(v), sort_keys=True): _shape(v) for v in value}
        return [items[k] for k in sorted(items)]
    return type(value).__name__


def _shapes(events: list) -> list[str]:
    return sorted({json.dumps(_shape(e), sort_keys=True) for e in events})


def _text(events: list, key: str) -> str:
    if key == "content":
        return "".join(e.get("content", "") for e in events if isinstance(e, dict))
    pieces = []
    for e in events:
        if isinstance(e, dict):
            for choice in e.get("choices", []):
                pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(pieces)


@pytest.mark.parametrize(
    "path, body, key",
    [
        ("/completion", greedy("Streaming through the router", 8, stream=True), "content"),
        ("/v1/completions", {"prompt": "Streams of the OpenAI kind", "max_tokens": 8,
                             "temperature": 0, "stream": True}, "choices"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Stream, please"}],
                                  "max_tokens": 8, "temperature": 0, "stream": True}, "choices"),
    ],
)  # fmt: skip
def test_streams_through_the_router_equal_a_direct_server_s(router, direct, path, body, key):
    with httpx.Client(base_url=router.base_url, timeout=60) as client:
        routed = stream_events(client, path, body)
    with httpx.Client(base_url=direct.base_url, timeout=60) as client:
        alone = stream_events(client, path, body)
    # The server writes one event per stream per drain of the engine's output, so how many
    # tokens an event carries depends on timing: compare the kinds of events, first and last.
    assert _shapes(routed) == _shapes(alone)
    assert _shape(routed[0]) == _shape(alone[0]) and _shape(routed[-1]) == _shape(alone[-1])
    assert _text(routed, key) == _text(alone, key) != ""


def test_greedy_outputs_through_the_router_equal_a_direct_server_s(router, direct):
    bodies = [
        ("/completion", greedy("The capital of France is", 12, return_tokens=True)),
        ("/completion", greedy([200, 4000, 91, 17, 333], 12, return_tokens=True)),
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}),
    ]
    for path, body in bodies:
        routed = httpx.post(router.base_url + path, json=body, timeout=60).json()
        alone = httpx.post(direct.base_url + path, json=body, timeout=60).json()
        if path == "/completion":
            assert routed["content"] == alone["content"] and routed["tokens"] == alone["tokens"]
        else:
            assert routed["choices"][0]["text"] == alone["choices"][0]["text"]


def test_aggregated_props_slots_metrics_and_models(router, tiny_model_path):
    with httpx.Client(base_url=router.base_url, timeout=30) as client:
        models = client.get("/v1/models").json()  # forwarded: counts as a routed request
        props = client.get("/props").json()
        slots = client.get("/slots").json()
        metrics = parse_metrics(client.get("/metrics").text)
    assert props["total_slots"] == 8
    assert props["cacheflow"]["data_parallel"] == {"num_replicas": 2, "num_live": 2,
                                                   "policy": "prefix"}  # fmt: skip
    assert [s["id"] for s in slots] == list(range(8))
    assert [(s["replica"], s["replica_slot_id"]) for s in slots] == [
        (r, i) for r in range(2) for i in range(4)
    ]
    stats = router_stats(router)
    for r in stats["replicas"]:
        label = f'replica="{r["id"]}"'
        assert metrics[f"cacheflow:router_requests_total{{{label}}}"] == r["num_requests"]
        assert metrics[f"cacheflow:router_replica_up{{{label}}}"] == 1
        assert f"llamacpp:requests_processing{{{label}}}" in metrics
    assert models["data"][0]["id"] == str(tiny_model_path)


def _pid(proc: ServerProcess, replica_id: int) -> int:
    return router_stats(proc)["replicas"][replica_id]["pid"]


def _wait_out_of_rotation(proc: ServerProcess, replica_id: int, timeout_s: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = router_stats(proc)
        if not stats["replicas"][replica_id]["alive"]:
            return stats
        time.sleep(0.05)
    raise AssertionError(f"replica {replica_id} still in rotation: {stats}")


def test_a_killed_replica_fails_its_requests_in_flight_and_the_other_takes_over(tiny_model_path):
    proc = start_router(tiny_model_path, LONG)
    try:
        with httpx.Client(base_url=proc.base_url, timeout=60) as client:
            # a stream in flight: its replica is killed after the first chunk
            long = greedy("A long story:", 4000, stream=True)
            with client.stream("POST", "/completion", json=long) as response:
                victim = replica_of(response)
                events = sse_data(response.iter_lines())
                next(events)
                os.kill(_pid(proc, victim), signal.SIGKILL)
                start = time.monotonic()
                rest = list(events)
            assert time.monotonic() - start < 5.0
            error = rest[-1]["error"]
            assert error["code"] == 502 and error["replica"] == victim
            assert f"replica {victim}" in error["message"]
            stats = _wait_out_of_rotation(proc, victim)
            assert "exited with status -9" in stats["replicas"][victim]["death_reason"]
            survivor = 1 - victim
            later = [replica_of(client.post("/completion", json=greedy(f"after {i}")))
                     for i in range(3)]  # fmt: skip
            assert later == [survivor] * 3

            # a JSON request in flight on the survivor: killed too, 502 naming it, then 503
            answer: dict[str, httpx.Response] = {}
            thread = threading.Thread(target=lambda: answer.update(
                r=client.post("/completion", json=greedy("Another long story:", 4000))))
            thread.start()
            _wait_in_flight(proc, survivor)
            os.kill(_pid(proc, survivor), signal.SIGKILL)
            thread.join(10)
            assert answer["r"].status_code == 502
            assert answer["r"].json()["error"]["replica"] == survivor
            _wait_out_of_rotation(proc, survivor)
            none_left = client.post("/completion", json=greedy("anyone?"))
            assert none_left.status_code == 503
            assert "no replica is alive" in none_left.json()["error"]["message"]
            assert client.get("/health").status_code == 503
    finally:
        proc.close()


def _wait_in_flight(proc: ServerProcess, replica_id: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while router_stats(proc)["replicas"][replica_id]["num_in_flight"] == 0:
        assert time.monotonic() < deadline, "the request never reached the replica"
        time.sleep(0.02)
    time.sleep(0.2)  # past the prompt: generating


def test_sigterm_stops_the_router_and_every_replica(tiny_model_path):
    proc = start_router(tiny_model_path, SMALL, "--router-policy", "round-robin")
    try:
        stats = router_stats(proc)
        assert stats["policy"] == "round-robin"
        pids = [r["pid"] for r in stats["replicas"]]
        assert proc.stop(signal.SIGTERM) == 0, proc.log()
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        proc.close()
