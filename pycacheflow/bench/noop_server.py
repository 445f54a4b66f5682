"""A no-op streaming server: measures what the load client itself can take.

It answers POST /completion, /v1/completions and /v1/chat/completions like a llama-server
compatible server, streaming ``n_predict`` (or ``max_tokens``) SSE chunks of one token each with
chunked transfer coding, as uvicorn does, but without any model: every chunk is precomputed and
written at once, one chunk per stream per turn of its event loop (streams interleave as on a
real server); chat streams end with OpenAI's usage chunk. Anything else is answered 404. It runs in its own process (plain asyncio streams, no HTTP framework), so its
cost is not counted against the client's; a run against it is the client's ceiling.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import orjson

ENDPOINTS = ("/completion", "/v1/completions", "/v1/chat/completions")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + orjson.dumps(obj) + b"\n\n")


_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
         b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")  # fmt: skip
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TOKEN = {
    "/completion": _event({"content": "x", "tokens": [1], "stop": False}),
    "/v1/completions": _event({"choices": [{"index": 0, "text": "x", "finish_reason": None}]}),
    "/v1/chat/completions": _event(
        {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    ),
}


def _last(path: str, n: int) -> bytes:
    if path == "/completion":
        return _event({"content": "", "stop": True, "tokens_predicted": n}) + b"0\r\n\r\n"
    if path == "/v1/chat/completions":  # the finish chunk, then OpenAI's usage chunk
        finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        last = {"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": 0,
                                         "prompt_tokens_details": {"cached_tokens": 0}}}
        return _event(finish) + _event(last) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"completion_tokens": n}}  # fmt: skip
    return _event(last) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length) if length else b""
        parts = request_line.split()
        path = parts[1].decode() if len(parts) > 1 else ""
        if path not in ENDPOINTS:
            writer.write(_NOT_FOUND)
            return
        fields = orjson.loads(body) if body else {}
        n = int(fields.get("n_predict") or fields.get("max_tokens") or 16)
        writer.write(_HEAD)
        token = _TOKEN[path]
        for _ in range(n):
            writer.write(token)
            await writer.drain()
            await asyncio.sleep(0)  # one chunk per stream per turn of the loop
        writer.write(_last(path, n))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


def _serve(port: int) -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass

    async def main() -> None:
        server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()

    asyncio.run(main())


class NoopServer:
    """The no-op server on 127.0.0.1 in a child process (``python -m
    pycacheflow.bench.noop_server PORT``), for a ``with`` block (``url``)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> NoopServer:
        cmd = [sys.executable, "-m", "pycacheflow.bench.noop_server", str(self.port)]
        self._proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("the no-op server did not start within 60 s")

    def __exit__(self, *exc_info: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
