"""The router of ``cacheflow serve --data-parallel N``: one HTTP front for N engine replicas.

Each replica is a ``cacheflow serve`` of its own (a child process on a local port, started by
cli/serve_router.py); the router speaks the same HTTP API on the public address:

    POST /completion /completions /v1/completions /chat/completions /v1/chat/completions
         routed by the policy (server/router_policy.py: prefix-aware by default) and forwarded;
         the answer (JSON or SSE) streams back byte for byte, plus ``X-CacheFlow-Replica: <id>``
    GET  /health /v1/health     {"status": "ok"} while a replica is alive, else 503
    GET  /props                 the first live replica's, total_slots summed over live replicas,
                                cacheflow.data_parallel = {num_replicas, num_live, policy}
    GET  /slots                 every live replica's slots in one list: ids renumbered (replica
                                0's first), each with its ``replica`` and ``replica_slot_id``
    GET  /metrics               every live replica's metrics with a ``replica`` label, then the
                                router's own (cacheflow:router_*); 501 without --metrics
    GET  /router                routing statistics as JSON (always on)
    anything else               forwarded to the least-loaded live replica (/v1/models, /tokenize)

Failures: a replica whose process exits, whose connection is refused, or whose GET /health fails
``HEALTH_FAILURES`` times in a row is taken out of rotation for good (no restart). Its requests
in flight end at once with an OpenAI-style error naming it (502 before the answer started, an
SSE ``data: {"error": ...}`` event after it); a request that could not even connect is sent to
another live replica once. With no live replica every request gets 503.

The router holds no engine; all state lives on the event loop thread (no locks). The routes and
the gathered answers are in server/router_app.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pycacheflow.server import responses
from pycacheflow.server.config import DEFAULT_MAX_BODY_BYTES
from pycacheflow.server.router_policy import DEFAULT_SLACK, make_policy, routing_keys

logger = logging.getLogger("cacheflow.router")

REPLICA_HEADER = b"X-CacheFlow-Replica"
HEALTH_INTERVAL_S = 1.0  # between two GET /health of each live replica
HEALTH_TIMEOUT_S = 5.0  # a /health slower than this counts as failed
HEALTH_FAILURES = 3  # failed /health in a row that take a replica out of rotation
PROCESS_POLL_S = 0.2  # between two looks at whether a replica's process still runs
CONNECT_TIMEOUT_S = 5.0  # to open a connection to a replica (reads wait as long as generation)
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})

# Hop-by-hop headers, and what httpx or the router's own server sets again.
_REQUEST_DROP = frozenset({b"host", b"content-length", b"connection", b"keep-alive",
                           b"transfer-encoding", b"upgrade"})  # fmt: skip
_RESPONSE_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"date",
                            b"server"})  # fmt: skip


@dataclass
class Replica:
    """One engine replica as the router sees it.

    Attributes:
        replica_id: 0-based index (CUDA_VISIBLE_DEVICES=replica_id on a GPU machine).
        base_url: e.g. "http://127.0.0.1:41234".
        pid: the process id of its ``cacheflow serve`` (0 = not a child of ours).
        exit_status: returns the process's exit status, None while it runs.
    """

    replica_id: int
    base_url: str
    pid: int = 0
    exit_status: Callable[[], int | None] = lambda: None
    alive: bool = True
    death_reason: str | None = None
    num_in_flight: int = 0
    num_requests: int = 0  # routing decisions that chose it
    num_prefix_hits: int = 0  # of those, by a prefix-key match
    num_failed: int = 0  # requests that ended with a router error because it failed
    num_health_failures: int = 0  # consecutive
    forwards: set[asyncio.Task] = field(default_factory=set)

    def describe(self) -> str:
        """'replica 1 (pid 123, http://127.0.0.1:41234)' for error messages."""
        return f"replica {self.replica_id} (pid {self.pid}, {self.base_url})"


@dataclass(frozen=True)
class RouterConfig:
    """Settings of the router.

    Attributes:
        policy: one of router_policy.POLICY_NAMES.
        slack: in-flight requests of the prefix policy's slack (router_policy module docstring).
        enable_metrics: serve /metrics (as --metrics does for one server).
        api_keys: keys the router checks too (the replicas check them again).
        max_body_bytes: the largest request body the router reads (413 above it, as a server's
            ``ServerConfig.max_body_bytes``); 0 = no limit.
    """

    policy: str = "prefix"
    slack: int = DEFAULT_SLACK
    enable_metrics: bool = False
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


class _Head:
    """The status and headers of a replica's answer (the first item of a forward's queue)."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.raw_headers = [(k, v) for k, v in response.headers.raw
                            if k.lower() not in _RESPONSE_DROP]  # fmt: skip
        self.is_sse = response.headers.get("content-type", "").startswith("text/event-stream")


@dataclass(frozen=True)
class _Failure:
    message: str
    can_retry: bool = False  # nothing reached the replica: another one may take the request


_END = object()


@dataclass
class _Forward:
    """One request on its way through a replica: the pump task fills ``queue`` with a _Head,
    then body chunks (bytes), then _END or a _Failure."""

    replica: Replica
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    cancel_reason: str | None = None


class Router:
    """Routes requests over ``replicas`` and keeps their health and statistics.

    Args:
        replicas: the replicas, ids 0..N-1 in order.
        config: the router's settings.
    """

    def __init__(self, replicas: list[Replica], config: RouterConfig) -> None:
        self.replicas = replicas
        self.config = config
        self.policy = make_policy(config.policy, config.slack)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self.shutting_down = False
        self._monitors: list[asyncio.Task] = []

    # ------------------------------------------------------------------ rotation

    def live(self) -> list[Replica]:
        """The replicas in rotation."""
        return [r for r in self.replicas if r.alive]

    def take_out(self, replica: Replica, reason: str) -> None:
        """Take ``replica`` out of rotation for good and fail its requests in flight (idempotent).

        Args:
            reason: why, for the log and the error messages, e.g. "its process exited with -9".
        """
        if not replica.alive:
            return
        replica.alive, replica.death_reason = False, reason
        self.policy.forget(replica.replica_id)
        if not self.shutting_down:
            logger.warning("%s taken out of rotation: %s", replica.describe(), reason)
        for task in list(replica.forwards):
            task.cancel()

    def start_monitors(self) -> None:
        """Start watching the replicas' processes and /health (call on the serving loop)."""
        self._monitors = [asyncio.create_task(self._watch_processes()),
                          asyncio.create_task(self._watch_health())]  # fmt: skip

    async def close(self) -> None:
        """Stop the monitors and close the connections to the replicas."""
        for task in self._monitors:
            task.cancel()
        await self.client.aclose()

    async def _watch_processes(self) -> None:
        while True:
            # every replica, also those already out of rotation: polling reaps an exited child
            for replica in self.replicas:
                status = replica.exit_status()
                if status is not None and replica.alive:
                    self.take_out(replica, f"its process exited with status {status}")
            await asyncio.sleep(PROCESS_POLL_S)

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await asyncio.gather(*(self._check_health(r) for r in self.live()))

    async def _check_health(self, replica: Replica) -> None:
        try:
            response = await self.client.get(replica.base_url + "/health",
                                              timeout=HEALTH_TIMEOUT_S)  # fmt: skip
            healthy = response.status_code == 200
        except httpx.HTTPError:
            healthy = False
        replica.num_health_failures = 0 if healthy else replica.num_health_failures + 1
        if replica.num_health_failures >= HEALTH_FAILURES:
            self.take_out(replica, f"GET /health failed {HEALTH_FAILURES} times in a row")

    # ------------------------------------------------------------------ forwarding

    async def forward(self, request: Request) -> Response:
        """Route ``request`` to a live replica and answer with what the replica answers."""
        body = await request.body()
        keys = routing_keys(request.url.path, _json_or_none(body)) if body else []
        for attempt in range(2):
            live = {r.replica_id: r.num_in_flight for r in self.live()}
            if not live:
                return self.none_alive()
            decision = self.policy.choose(keys, live)
            replica = self.replicas[decision.replica_id]
            replica.num_requests += 1
            replica.num_prefix_hits += decision.prefix_hit
            forward = self._start(replica, request, body)
            first = await forward.queue.get()
            if isinstance(first, _Head):
                return self._streaming(forward, first)
            if first.can_retry and attempt == 0:
                self.take_out(replica, first.message)
                continue
            replica.num_failed += 1
            return error_response(first.message, 502, "server_error", replica)
        raise AssertionError("unreachable")

    def none_alive(self) -> JSONResponse:
        """503: no replica left, with why each one went."""
        why = "; ".join(f"replica {r.replica_id}: {r.death_reason}" for r in self.replicas)
        return error_response(f"no replica is alive ({why})", 503, "unavailable_error")

    def _start(self, replica: Replica, request: Request, body: bytes) -> _Forward:
        forward = _Forward(replica)
        url = replica.base_url + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _REQUEST_DROP]
        upstream = self.client.build_request(request.method, url, headers=headers, content=body)
        forward.task = asyncio.create_task(self._pump(forward, upstream))
        replica.forwards.add(forward.task)
        replica.num_in_flight += 1
        return forward

    async def _pump(self, forward: _Forward, upstream: httpx.Request) -> None:
        """Copy the replica's answer into ``forward.queue`` (the task owns the connection)."""
        replica, queue = forward.replica, forward.queue
        try:
            response = await self.client.send(upstream, stream=True)
            try:
                queue.put_nowait(_Head(response))
                async for chunk in response.aiter_raw():
                    queue.put_nowait(chunk)
            finally:
                await response.aclose()
            queue.put_nowait(_END)
        except asyncio.CancelledError:  # taken out of rotation, or the client went away
            reason = replica.death_reason or "the request was cancelled"
            queue.put_nowait(_Failure(f"{replica.describe()} was taken out of rotation during "
                                      f"the request: {reason}"))  # fmt: skip
        except httpx.ConnectError as exc:
            queue.put_nowait(_Failure(f"{replica.describe()} refused the connection: {exc}",
                                      can_retry=True))  # fmt: skip
        except httpx.HTTPError as exc:
            queue.put_nowait(_Failure(f"{replica.describe()} failed during the request: "
                                      f"{type(exc).__name__}: {exc}"))  # fmt: skip
        finally:
            replica.num_in_flight -= 1
            replica.forwards.discard(asyncio.current_task())

    def _streaming(self, forward: _Forward, head: _Head) -> StreamingResponse:
        response = StreamingResponse(self._body(forward, head), status_code=head.status)
        response.raw_headers = [*head.raw_headers,
                                (REPLICA_HEADER, str(forward.replica.replica_id).encode())]
        return response

    async def _body(self, forward: _Forward, head: _Head) -> AsyncIterator[bytes]:
        try:
            while True:
                item = await forward.queue.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    forward.replica.num_failed += 1
                    logger.warning("%s", item.message)
                    if head.is_sse:  # the status went out already: end the stream with an error
                        body = error_body(item.message, 502, "server_error", forward.replica)
                        yield b"data: " + orjson.dumps(body) + b"\n\n"
                    return
                yield item
        finally:
            if forward.task is not None and not forward.task.done():
                forward.task.cancel()  # the client went away: hang up on the replica too

    # ------------------------------------------------------------------ fan-out

    async def fan_out(self, request: Request, path: str) -> list[tuple[Replica, httpx.Response]]:
        """GET ``path`` (with the request's query and headers) from every live replica.

        Returns:
            (replica, response) of each replica that answered, in replica order.
        """
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _REQUEST_DROP]
        url_tail = path + ("?" + request.url.query if request.url.query else "")
        live = self.live()
        answers = await asyncio.gather(
            *(self.client.get(r.base_url + url_tail, headers=headers, timeout=HEALTH_TIMEOUT_S)
              for r in live),
            return_exceptions=True,
        )  # fmt: skip
        return [(r, a) for r, a in zip(live, answers) if isinstance(a, httpx.Response)]

    # ------------------------------------------------------------------ statistics

    def stats(self) -> dict[str, object]:
        """GET /router: the policy, and requests and prefix hits per replica."""
        num_requests = sum(r.num_requests for r in self.replicas)
        num_hits = sum(r.num_prefix_hits for r in self.replicas)
        return {
            "policy": self.policy.name,
            "slack": self.config.slack,
            "num_requests": num_requests,
            "num_prefix_hits": num_hits,
            "prefix_hit_rate": num_hits / num_requests if num_requests else 0.0,
            "num_live": len(self.live()),
            "replicas": [
                {
                    "id": r.replica_id,
                    "url": r.base_url,
                    "pid": r.pid,
                    "alive": r.alive,
                    "death_reason": r.death_reason,
                    "num_in_flight": r.num_in_flight,
                    "num_requests": r.num_requests,
                    "num_prefix_hits": r.num_prefix_hits,
                    "num_failed": r.num_failed,
                }
                for r in self.replicas
            ],
        }

    def metric_families(self) -> list[Metric]:
        """The router's own Prometheus families (cacheflow:router_*)."""
        labels = ["replica"]
        families = {
            "requests": CounterMetricFamily("cacheflow:router_requests",
                                            "Requests routed to each replica", labels=labels),
            "hits": CounterMetricFamily(
                "cacheflow:router_prefix_hits",
                "Requests routed to the replica that last served their longest prefix key",
                labels=labels),
            "failed": CounterMetricFamily(
                "cacheflow:router_failed_requests",
                "Requests that ended with a router error because their replica failed",
                labels=labels),
            "in_flight": GaugeMetricFamily("cacheflow:router_requests_in_flight",
                                           "Requests in flight on each replica", labels=labels),
            "up": GaugeMetricFamily("cacheflow:router_replica_up",
                                    "1 while the replica is in rotation", labels=labels),
        }  # fmt: skip
        for r in self.replicas:
            label = [str(r.replica_id)]
            families["requests"].add_metric(label, r.num_requests)
            families["hits"].add_metric(label, r.num_prefix_hits)
            families["failed"].add_metric(label, r.num_failed)
            families["in_flight"].add_metric(label, r.num_in_flight)
            families["up"].add_metric(label, int(r.alive))
        hit_rate = self.stats()["prefix_hit_rate"]
        return [*families.values(),
                GaugeMetricFamily("cacheflow:router_prefix_hit_rate",
                                  "Share of routed requests that were prefix hits", value=hit_rate)]


def _json_or_none(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def error_body(message: str, status: int, error_type: str, replica: Replica | None) -> dict:
    extra = {"replica": replica.replica_id} if replica is not None else None
    return responses.error_body(message, status, error_type, extra)


def error_response(
    message: str, status: int, error_type: str, replica: Replica | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, status, error_type, replica), status)
