"""The HTTP load client of `cacheflow bench serve`: lean enough not to be what it measures.

Each request is one HTTP/1.1 connection written and read with asyncio streams (no HTTP library
in the loop): the SSE body is read chunk by chunk (chunked transfer coding, or until the server
closes), split into events, and every ``data:`` payload is parsed once with orjson to count the
tokens it carries (``tokens`` on /completion; one per chunk with text on /v1/completions, the
final ``usage`` filling in tokens that arrived coalesced). Each event is stamped with
``time.perf_counter_ns`` (CLOCK_MONOTONIC: one clock for every process of the machine).

Above a few hundred streams one Python process becomes the bottleneck, so the requests can be
spread round-robin over several client processes (``num_procs``), each with its own event loop
and its share of the concurrency; they start together (the parent releases them once all are
ready) and their results are merged. Client processes are ``python -m`` children fed through
their stdin (no multiprocessing: it would re-import the caller's main script).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import queue as queue_module
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

from pycacheflow.outputs import RequestMetrics

_READ_LIMIT = 1 << 20  # asyncio stream buffer per connection (bytes)


@dataclass
class ClientRun:
    """What one client process measured (merged over processes by ``run_requests``).

    Attributes:
        metrics: one per finished request, in completion order (client clock).
        errors: one message per failed request.
        start_s, end_s: perf_counter seconds of the first send and the last response.
        client_busy_s: seconds spent in the client's own code (parsing, bookkeeping).
        num_chunks: SSE data chunks received.
    """

    metrics: list[RequestMetrics] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    start_s: float = 0.0
    end_s: float = 0.0
    client_busy_s: float = 0.0
    num_chunks: int = 0


def chunk_text(data: dict, endpoint: str) -> str:
    """The new output text of one SSE chunk ("" for none): ``content`` on /completion,
    ``choices[0].text`` on /v1/completions, ``choices[0].delta.content`` on
    /v1/chat/completions."""
    if endpoint == "/completion":
        return data.get("content") or ""
    choices = data.get("choices") or []
    if not choices:
        return ""
    if endpoint == "/v1/chat/completions":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def chunk_tokens(data: dict, endpoint: str) -> int:
    """Output tokens one SSE chunk carries (0 for a chunk without new text)."""
    if endpoint == "/completion":
        tokens = data.get("tokens")
        if tokens:
            return len(tokens)
    return 1 if chunk_text(data, endpoint) else 0


def cached_prompt_tokens(data: dict) -> int | None:
    """Prompt tokens the server reused from its cache, as a final chunk reports them: OpenAI's
    ``usage.prompt_tokens_details.cached_tokens``, else llama-server's ``timings.cache_n``;
    None if the chunk says neither. (``tokens_cached`` is not it: llama-server puts the slot's
    whole KV length there, prompt and output.)"""
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    if "cached_tokens" in details:
        return int(details["cached_tokens"])
    timings = data.get("timings") or {}
    return int(timings["cache_n"]) if "cache_n" in timings else None


class _Stream:
    """SSE events of one response: token times, the final usage and cache counts, and the
    text when ``keep_text`` (multi-turn clients send it back)."""

    def __init__(self, endpoint: str, run: ClientRun, keep_text: bool = False) -> None:
        self.endpoint = endpoint
        self.run = run
        self.buf = bytearray()
        self.token_times: list[int] = []
        self.usage_tokens: int | None = None
        self.usage_prompt_tokens: int | None = None
        self.num_cached_tokens: int | None = None
        self.keep_text = keep_text
        self.text_parts: list[str] = []

    def feed(self, data: bytes, now_ns: int) -> None:
        self.buf += data
        start = 0
        while (end := self.buf.find(b"\n\n", start)) >= 0:
            self._event(bytes(self.buf[start:end]), now_ns)
            start = end + 2
        del self.buf[:start]

    def _event(self, event: bytes, now_ns: int) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # a comment (keep-alive ping) or another field
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            self.run.num_chunks += 1
            data = orjson.loads(payload)
            if "error" in data:
                raise RuntimeError(f"error event: {payload[:200].decode(errors='replace')}")
            self.token_times += [now_ns] * chunk_tokens(data, self.endpoint)
            if self.keep_text:
                self.text_parts.append(chunk_text(data, self.endpoint))
            usage = data.get("usage")
            if usage:
                self.usage_tokens = usage.get("completion_tokens")
                self.usage_prompt_tokens = usage.get("prompt_tokens")
            cached = cached_prompt_tokens(data)
            if cached is not None:
                self.num_cached_tokens = cached

    def finish(self) -> list[int]:
        """Token times, padded to the reported usage (tokens that came coalesced)."""
        missing = (self.usage_tokens or 0) - len(self.token_times)
        if missing > 0 and self.token_times:
            self.token_times += [self.token_times[-1]] * missing
        return self.token_times

    @property
    def text(self) -> str:
        """The output text (needs keep_text)."""
        return "".join(self.text_parts)


class HttpStatusError(Exception):
    """The server answered with another status than 200 ("HTTP <status>: <body start>")."""


@dataclass(frozen=True)
class _Job:
    """One request to send: its body, its send offset (s) and its prompt length."""

    body: bytes
    offset_s: float
    num_prompt_tokens: int


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection without an answer")
    status = int(status_line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[bytes, bytes]):
    """The response body as it arrives (chunked, by length, or until the server closes)."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                return
            yield (await reader.readexactly(size + 2))[:-2]
    elif b"content-length" in headers:
        yield await reader.readexactly(int(headers[b"content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


# A bearer token sent with every request when set (`cacheflow bench serve --api-key`, for servers
# started with --api-key); the client's worker processes inherit it from the environment.
API_KEY_ENV = "CACHEFLOW_BENCH_API_KEY"


class _Client:
    def __init__(self, host: str, port: int, path: str, endpoint: str, timeout_s: float) -> None:
        self.host, self.port, self.path, self.endpoint = host, port, path, endpoint
        self.timeout_s = timeout_s
        self.run = ClientRun()
        key = os.environ.get(API_KEY_ENV, "")
        self._auth = f"Authorization: Bearer {key}\r\n" if key else ""

    def request_bytes(self, body: bytes) -> bytes:
        head = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self._auth}"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        return head.encode() + body

    async def one(self, job: _Job, keep_text: bool = False) -> _Stream | None:
        """Send one request and record its metrics (prompt length: the server's usage where it
        reports one, else the job's); the stream, or None if the request failed."""
        arrival = time.perf_counter_ns()
        try:
            stream = await asyncio.wait_for(self._exchange(job.body, keep_text), self.timeout_s)
        except HttpStatusError as exc:
            self.run.errors.append(str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - any failure fails this request only
            self.run.errors.append(f"{type(exc).__name__}: {exc}")
            return None
        self.run.metrics.append(RequestMetrics.from_times_ns(
            arrival_ns=arrival, first_scheduled_ns=0, token_times_ns=stream.finish(),
            finish_ns=time.perf_counter_ns(),
            num_prompt_tokens=stream.usage_prompt_tokens or job.num_prompt_tokens,
            num_cached_tokens=stream.num_cached_tokens or 0))  # fmt: skip
        return stream

    async def _exchange(self, body: bytes, keep_text: bool = False) -> _Stream:
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=_READ_LIMIT)
        try:
            writer.write(self.request_bytes(body))
            status, headers = await _read_head(reader)
            stream = _Stream(self.endpoint, self.run, keep_text)
            if status != 200:
                text = b"".join([piece async for piece in _body_pieces(reader, headers)])
                raise HttpStatusError(f"HTTP {status}: {text[:200].decode(errors='replace')}")
            async for piece in _body_pieces(reader, headers):
                now = time.perf_counter_ns()
                busy0 = time.perf_counter()
                stream.feed(piece, now)
                self.run.client_busy_s += time.perf_counter() - busy0
            return stream
        finally:
            writer.close()


def make_client(url: str, endpoint: str, timeout_s: float) -> _Client:
    """A client of ``endpoint`` under the base URL http://host:port[/prefix].

    Raises:
        ValueError: the URL is not plain http with a host.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the load client speaks plain http://host:port only; got {url!r}")
    path = (parts.path.rstrip("/") or "") + endpoint
    return _Client(parts.hostname, parts.port or 80, path, endpoint, timeout_s)


async def _run_jobs(
    url: str, endpoint: str, jobs: Sequence[_Job], max_concurrency: int, timeout_s: float,
    on_finish: Callable[[], None] | None,
) -> ClientRun:  # fmt: skip
    client = make_client(url, endpoint, timeout_s)
    limit = asyncio.Semaphore(max(1, max_concurrency))
    start = time.perf_counter()
    client.run.start_s = start

    async def send(job: _Job) -> None:
        delay = start + job.offset_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with limit:
            await client.one(job)
        if on_finish is not None:
            on_finish()

    await asyncio.gather(*(send(job) for job in jobs))
    client.run.end_s = time.perf_counter()
    return client.run


def _raise_fd_limit() -> None:
    """Every stream is a socket: lift the soft open-files limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _worker_main() -> None:
    """A client process (``python -m pycacheflow.bench.load_client``): read its share from
    stdin (pickled), answer "R", wait for a "go" line, run, write "D" per finished request and
    then "X" + its pickled ClientRun to stdout."""
    _raise_fd_limit()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    url, endpoint, jobs, concurrency, timeout_s = pickle.load(stdin)
    stdout.write(b"R\n")
    stdout.flush()
    stdin.readline()

    def done() -> None:
        stdout.write(b"D\n")
        stdout.flush()

    # Through the imported module, not __main__: the parent unpickles its classes by that name.
    from pycacheflow.bench import load_client

    run = asyncio.run(load_client._run_jobs(url, endpoint, jobs, concurrency, timeout_s, done))
    stdout.write(b"X" + pickle.dumps(run))
    stdout.flush()


def run_requests(
    url: str,
    endpoint: str,
    bodies: Sequence[dict],
    offsets_s: Sequence[float],
    prompt_lens: Sequence[int],
    max_concurrency: int,
    timeout_s: float = 600.0,
    num_procs: int = 1,
    on_finish: Callable[[], None] | None = None,
) -> ClientRun:
    """Send every request (its body at its offset, at most ``max_concurrency`` in flight over
    all processes) and measure each one on the client.

    Args:
        url: base URL, http://host:port.
        endpoint: "/completion" or "/v1/completions" (how tokens are counted).
        bodies: [num_requests] JSON bodies (streaming requests).
        offsets_s: [num_requests] send times, seconds from the start.
        prompt_lens: [num_requests] prompt tokens (for the metrics).
        max_concurrency: requests in flight at most, >= 1.
        timeout_s: per request.
        num_procs: client processes (requests are dealt round-robin; each gets its share of
            the concurrency); 1 = run in this process.
        on_finish: called after each request (progress bars), in this process.

    Returns:
        The merged ClientRun (start/end over all processes).
    """
    _raise_fd_limit()
    jobs = [_Job(orjson.dumps(b), o, n) for b, o, n in zip(bodies, offsets_s, prompt_lens)]
    num_procs = max(1, min(num_procs, len(jobs)))
    if num_procs == 1:
        return asyncio.run(_run_jobs(url, endpoint, jobs, max_concurrency, timeout_s, on_finish))
    per_proc = -(-max_concurrency // num_procs)
    procs = [subprocess.Popen([sys.executable, "-m", "pycacheflow.bench.load_client"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for _ in range(num_procs)]  # fmt: skip
    try:
        for i, proc in enumerate(procs):
            share = (url, endpoint, jobs[i::num_procs], per_proc, timeout_s)
            proc.stdin.write(pickle.dumps(share))
            proc.stdin.flush()
        return _collect(procs, on_finish, timeout_s)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _collect(procs: list, on_finish: Callable[[], None] | None, timeout_s: float) -> ClientRun:
    """Start the ready processes together, relay their progress, merge their runs."""
    for proc in procs:
        if proc.stdout.readline() != b"R\n":
            raise RuntimeError("a client process failed to start")
    messages: queue_module.SimpleQueue = queue_module.SimpleQueue()
    readers = [threading.Thread(target=_relay, args=(proc, messages), daemon=True) for proc in procs]
    for proc, reader in zip(procs, readers):
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        reader.start()
    runs = []
    while len(runs) < len(procs):
        item = messages.get()
        if item is None:
            raise RuntimeError("a client process ended without its results")
        if item == "done":
            if on_finish is not None:
                on_finish()
        else:
            runs.append(item)
    merged = ClientRun(start_s=min(r.start_s for r in runs), end_s=max(r.end_s for r in runs))
    for r in runs:
        merged.metrics += r.metrics
        merged.errors += r.errors
        merged.client_busy_s += r.client_busy_s
        merged.num_chunks += r.num_chunks
    return merged


def _relay(proc: subprocess.Popen, messages: queue_module.SimpleQueue) -> None:
    while (line := proc.stdout.readline()) == b"D\n":
        messages.put("done")
    rest = line + proc.stdout.read() if line.startswith(b"X") else b""
    messages.put(pickle.loads(rest[1:]) if rest else None)


if __name__ == "__main__":
    _worker_main()
