"""Online load against a llama-server compatible HTTP server (CacheFlow's or llama-server).

An asyncio client sends each request at its arrival time (Poisson or fixed-rate arrivals, or
all at once), optionally capped at ``max_concurrency`` in flight, streams the SSE response and
stamps every chunk. Endpoints: ``/completion`` (llama-server's own: prompt as token ids or
text, ``n_predict``) and ``/v1/completions`` (OpenAI). EOS is ignored so output lengths are
exact. Times are ``time.perf_counter_ns`` on the client.

The client's own cost is reported (``client_busy_s``: time spent in the client's code between
awaits, i.e. parsing and bookkeeping), and ``noop_server`` gives a server that streams instantly,
so a run against it shows how many tokens/s the client itself can take.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pycacheflow.bench.datasets import BenchRequest
from pycacheflow.outputs import RequestMetrics

ENDPOINTS = ("/completion", "/v1/completions")
ARRIVALS = ("poisson", "fixed")


@dataclass
class OnlineRun:
    """Results of one load run.

    Attributes:
        metrics: per finished request (client clock), in completion order.
        errors: one message per failed request.
        wall_s: first send to last response.
        client_busy_s: seconds the client spent in its own code (parsing, bookkeeping).
        num_chunks: SSE data chunks received.
    """

    metrics: list[RequestMetrics] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    client_busy_s: float = 0.0
    num_chunks: int = 0


def arrival_offsets_s(num: int, rate: float, arrivals: str, seed: int = 0) -> list[float]:
    """Send time of each request, seconds from the start.

    Args:
        num: requests.
        rate: requests per second; inf = all at time 0.
        arrivals: "poisson" (exponential gaps, mean 1 / rate) or "fixed" (gaps of 1 / rate).
        seed: for the Poisson gaps.
    """
    if rate == float("inf"):
        return [0.0] * num
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.expovariate(rate) if arrivals == "poisson" else 1.0 / rate
    return out


def request_body(req: BenchRequest, endpoint: str, model: str = "") -> dict[str, object]:
    """The JSON body: token ids on /completion (text when the workload has text)."""
    if endpoint == "/completion":
        prompt: object = req.prompt if req.prompt is not None else list(req.prompt_token_ids)
        return {
            "prompt": prompt,
            "n_predict": req.max_tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
            "cache_prompt": False,
            "return_tokens": True,
        }
    prompt = req.prompt if req.prompt is not None else list(req.prompt_token_ids)
    return {
        "model": model or "default",
        "prompt": prompt,
        "max_tokens": req.max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }


def chunk_tokens(data: dict, endpoint: str) -> int:
    """Output tokens one SSE chunk carries (0 for a chunk without new text)."""
    if endpoint == "/completion":
        tokens = data.get("tokens")
        if tokens:
            return len(tokens)
        return 1 if data.get("content") else 0
    choices = data.get("choices") or []
    return 1 if choices and choices[0].get("text") else 0


class _Client:
    def __init__(self, base_url: str, endpoint: str, model: str, timeout_s: float) -> None:
        import httpx

        self.url = base_url.rstrip("/") + endpoint
        self.endpoint = endpoint
        self.model = model
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.http = httpx.AsyncClient(timeout=timeout_s, limits=limits)
        self.result = OnlineRun()

    async def one(self, req: BenchRequest) -> None:
        body = request_body(req, self.endpoint, self.model)
        token_times: list[int] = []
        arrival = time.perf_counter_ns()
        try:
            async with self.http.stream("POST", self.url, json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    self.result.errors.append(f"HTTP {resp.status_code}: {text[:200]}")
                    return
                async for line in resp.aiter_lines():
                    now = time.perf_counter_ns()
                    busy0 = time.perf_counter()
                    self._line(line, now, token_times)
                    self.result.client_busy_s += time.perf_counter() - busy0
        except Exception as exc:  # noqa: BLE001 - any transport error fails this request only
            self.result.errors.append(f"{type(exc).__name__}: {exc}")
            return
        finish = time.perf_counter_ns()
        self.result.metrics.append(
            RequestMetrics.from_times_ns(
                arrival_ns=arrival,
                first_scheduled_ns=0,
                token_times_ns=token_times,
                finish_ns=finish,
                num_prompt_tokens=req.num_prompt_tokens,
            )
        )

    def _line(self, line: str, now_ns: int, token_times: list[int]) -> None:
        if not line.startswith("data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == "[DONE]":
            return
        self.result.num_chunks += 1
        n = chunk_tokens(json.loads(payload), self.endpoint)
        token_times.extend([now_ns] * n)


async def _run(
    base_url: str,
    requests: Sequence[BenchRequest],
    endpoint: str,
    offsets: Sequence[float],
    max_concurrency: int | None,
    model: str,
    timeout_s: float,
    on_finish: Callable[[], None] | None,
) -> OnlineRun:
    client = _Client(base_url, endpoint, model, timeout_s)
    limit = asyncio.Semaphore(max_concurrency or len(requests) or 1)
    start = time.perf_counter()

    async def send(req: BenchRequest, offset: float) -> None:
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with limit:
            await client.one(req)
        if on_finish is not None:
            on_finish()

    try:
        await asyncio.gather(*(send(r, o) for r, o in zip(requests, offsets)))
    finally:
        await client.http.aclose()
    client.result.wall_s = time.perf_counter() - start
    return client.result


def check_reachable(base_url: str, timeout_s: float = 5.0) -> None:
    """Check that an HTTP server answers at ``base_url`` (GET /health; any status counts).

    Raises:
        ConnectionError: nothing answers (refused, unknown host, timeout, not an http URL);
            the message names the URL and why.
        RuntimeError: httpx is not installed.
    """
    try:
        import httpx
    except ImportError:
        raise RuntimeError("the HTTP benchmark needs httpx: pip install httpx") from None
    try:
        httpx.get(base_url.rstrip("/") + "/health", timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ConnectionError(f"cannot reach {base_url}: {type(exc).__name__}: {exc}") from None


def run_load(
    base_url: str,
    requests: Sequence[BenchRequest],
    endpoint: str = "/completion",
    rate: float = float("inf"),
    arrivals: str = "poisson",
    max_concurrency: int | None = None,
    seed: int = 0,
    model: str = "",
    timeout_s: float = 600.0,
    on_finish: Callable[[], None] | None = None,
) -> OnlineRun:
    """Send the workload to a server and measure every request on the client.

    Args:
        base_url: e.g. "http://127.0.0.1:8080".
        requests: the workload (sent in order of their arrival times).
        endpoint: "/completion" or "/v1/completions".
        rate: requests/s; inf = all at once.
        arrivals: "poisson" or "fixed".
        max_concurrency: requests in flight at most (None = unlimited).
        seed: Poisson arrivals.
        model: the "model" field of /v1/completions.
        timeout_s: per-request HTTP timeout.
        on_finish: called after each request (progress bars).

    Raises:
        ValueError: unknown endpoint or arrivals. RuntimeError: httpx is not installed.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}; got {endpoint!r}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}; got {arrivals!r}")
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise RuntimeError("the HTTP benchmark needs httpx: pip install httpx") from None
    offsets = arrival_offsets_s(len(requests), rate, arrivals, seed)
    return asyncio.run(
        _run(base_url, requests, endpoint, offsets, max_concurrency, model, timeout_s, on_finish)
    )


# ---------------------------------------------------------------------------- no-op server


def noop_app(tokens_per_chunk: int = 1):  # -> starlette.applications.Starlette
    """A server that answers /completion and /v1/completions by streaming n_predict (or
    max_tokens) chunks at once, without any model: a run against it measures the client."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def completion(request: Request) -> StreamingResponse:
        body = await request.json()
        n = int(body.get("n_predict") or body.get("max_tokens") or 16)
        oai = request.url.path.startswith("/v1")

        async def stream():
            for i in range(n):
                chunk = (
                    {"choices": [{"index": 0, "text": "x"}]}
                    if oai
                    else {"content": "x", "tokens": [1] * tokens_per_chunk, "stop": False}
                )
                yield f"data: {json.dumps(chunk)}\n\n"
            last = (
                {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
                if oai
                else {"content": "", "stop": True, "tokens_predicted": n}
            )
            yield f"data: {json.dumps(last)}\n\n"
            if oai:
                yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    routes = [Route(p, completion, methods=["POST"]) for p in ENDPOINTS]
    return Starlette(routes=routes)


class NoopServer:
    """``noop_app`` served by uvicorn on 127.0.0.1 in a background thread (``with`` block)."""

    def __init__(self) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None
        self._thread = None

    def __enter__(self) -> NoopServer:
        import threading

        import uvicorn

        config = uvicorn.Config(noop_app(), host="127.0.0.1", port=self.port, log_level="error")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
