"""Online load against a llama-server compatible HTTP server (CacheFlow's or llama-server).

The client (load_client.py: raw asyncio HTTP/1.1, orjson, one or several processes) sends each
request at its arrival time (Poisson or fixed-rate arrivals, or all at once), optionally capped
at ``max_concurrency`` in flight, streams the SSE response and stamps every chunk. Endpoints:
``/completion`` (llama-server's own: prompt as token ids or text, ``n_predict``) and
``/v1/completions`` (OpenAI). EOS is ignored so output lengths are exact. Times are
``time.perf_counter_ns`` on the client.

The client's own cost is reported (``client_busy_s``: time spent in the client's code between
awaits, i.e. parsing and bookkeeping), and ``NoopServer`` (noop_server.py) streams without a
model, so a run against it shows how many tokens/s the client itself can take: its ceiling.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pycacheflow.bench import load_client
from pycacheflow.bench.datasets import BenchRequest
from pycacheflow.bench.load_client import chunk_tokens  # noqa: F401 - part of this module's API
from pycacheflow.bench.noop_server import NoopServer  # noqa: F401 - part of this module's API
from pycacheflow.outputs import RequestMetrics

ENDPOINTS = ("/completion", "/v1/completions")
ARRIVALS = ("poisson", "fixed")
STREAMS_PER_PROC = 256  # streams one client process takes before another one is started


@dataclass
class OnlineRun:
    """Results of one load run.

    Attributes:
        metrics: per finished request (client clock), in completion order.
        errors: one message per failed request.
        wall_s: first send to last response.
        client_busy_s: seconds the client spent in its own code (parsing, bookkeeping), summed
            over its processes.
        num_chunks: SSE data chunks received.
        num_procs: client processes that sent the load.
    """

    metrics: list[RequestMetrics] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    client_busy_s: float = 0.0
    num_chunks: int = 0
    num_procs: int = 1


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


def request_body(
    req: BenchRequest, endpoint: str, model: str = "", cache_prompt: bool = False
) -> dict[str, object]:
    """The JSON body: the prompt as text where the workload has text, else as token ids.

    cache_prompt is llama-server's per-request switch of prompt reuse (also CacheFlow's); off by
    default, so that workloads without shared prefixes measure the full prompt work.
    """
    prompt: object = req.prompt if req.prompt is not None else list(req.prompt_token_ids)
    if endpoint == "/completion":
        return {
            "prompt": prompt,
            "n_predict": req.max_tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
            "cache_prompt": cache_prompt,
            "return_tokens": True,
        }
    return {
        "model": model or "default",
        "prompt": prompt,
        "max_tokens": req.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
        "cache_prompt": cache_prompt,
    }


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
    num_procs: int = 1,
    sampling: Mapping[str, object] | None = None,
    cache_prompt: bool = False,
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
        timeout_s: per-request timeout.
        on_finish: called after each request (progress bars).
        num_procs: client processes (see load_client.run_requests); 0 = one per
            STREAMS_PER_PROC streams in flight, at most one per core.
        sampling: body fields that replace the greedy default (``temperature: 0``), e.g.
            llama-server's defaults {"temperature": 0.8, "top_k": 40, "top_p": 0.95,
            "min_p": 0.05}.
        cache_prompt: the requests' ``cache_prompt`` (prompt reuse on the server).

    Raises:
        ValueError: unknown endpoint or arrivals, or a URL that is not http://host:port.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}; got {endpoint!r}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}; got {arrivals!r}")
    offsets = arrival_offsets_s(len(requests), rate, arrivals, seed)
    concurrency = max_concurrency or len(requests) or 1
    if num_procs <= 0:
        num_procs = auto_num_procs(concurrency)
    run = load_client.run_requests(
        base_url,
        endpoint,
        [{**request_body(r, endpoint, model, cache_prompt), **(sampling or {})} for r in requests],
        offsets,
        [r.num_prompt_tokens for r in requests],
        concurrency,
        timeout_s,
        num_procs,
        on_finish,
    )
    return OnlineRun(run.metrics, run.errors, run.end_s - run.start_s, run.client_busy_s,
                     run.num_chunks, num_procs)  # fmt: skip


def auto_num_procs(concurrency: int) -> int:
    """Client processes for ``concurrency`` streams: one per STREAMS_PER_PROC, at most one per
    core (the measured ceiling of one process is in results/serving/README.md)."""
    return max(1, min(os.cpu_count() or 1, -(-concurrency // STREAMS_PER_PROC)))
