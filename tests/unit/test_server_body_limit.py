"""server/body_limit.py without a server: the 413 of a declared or chunked body over the limit, the
body read and dropped (or not read, and the connection closed), and no limit at 0."""

from __future__ import annotations

import asyncio
import json

import pytest

from pycacheflow.server import body_limit
from pycacheflow.server.body_limit import BodyLimitMiddleware
from pycacheflow.server.config import DEFAULT_MAX_BODY_BYTES, ServerConfig

LIMIT = 1000


class Client:
    """The ASGI side of one request: its body in ``chunks``, what was sent back in ``sent``."""

    def __init__(self, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> None:
        self.scope = {"type": "http", "method": "POST", "path": "/completion", "headers": headers}
        self.messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                         for i, c in enumerate(chunks)]  # fmt: skip
        self.num_received = 0
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if self.num_received == len(self.messages):
            return {"type": "http.disconnect"}
        self.num_received += 1
        return self.messages[self.num_received - 1]

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    def json(self) -> object:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


async def echo_app(scope, receive, send) -> None:
    """Reads the whole body and answers 200 with its size."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def run(chunks: list[bytes], declared: bool = True, limit: int = LIMIT,
        extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> Client:  # fmt: skip
    headers = [(b"content-length", str(sum(map(len, chunks))).encode())] if declared else []
    client = Client(chunks, [*headers, *extra_headers])
    asyncio.run(BodyLimitMiddleware(echo_app, limit)(client.scope, client.receive, client.send))
    return client


def test_a_body_up_to_the_limit_reaches_the_app():
    assert run([b"x" * LIMIT]).status == 200
    assert run([b"x" * 600, b"x" * 400], declared=False).status == 200


def test_a_declared_body_over_the_limit_is_dropped_and_answered_413():
    client = run([b"x" * 600, b"x" * 401])
    assert client.status == 413 and client.json()["error"] == {
        "code": 413, "type": "invalid_request_error",
        "message": "Request body of 1001 bytes is larger than the server's limit of 1000 bytes "
                   "(--max-body-size)"}  # fmt: skip
    assert client.num_received == 2  # read to its end and dropped: the connection stays usable
    assert b"connection" not in client.headers


def test_a_chunked_body_is_counted_and_answered_413_where_it_passes_the_limit():
    client = run([b"x" * 600, b"x" * 401, b"x" * 5000], declared=False)
    assert client.status == 413
    assert client.json()["error"]["message"] == (
        "Request body is larger than the server's limit of 1000 bytes (--max-body-size)")
    assert client.num_received == 3 and b"connection" not in client.headers


def test_a_body_not_worth_reading_closes_the_connection(monkeypatch):
    monkeypatch.setattr(body_limit, "_MAX_DRAIN_BYTES", 3000)
    for client in (run([b"x" * 4000]),  # declared above what is read and dropped
                   run([b"x" * 1500] * 3, declared=False),  # found to be
                   run([b"x" * 2000], extra_headers=((b"expect", b"100-continue"),))):  # fmt: skip
        assert client.status == 413 and client.headers[b"connection"] == b"close"
    assert run([b"x" * 4000]).num_received == 0  # not a byte of it read


def test_no_limit_at_0_and_the_default():
    assert run([b"x" * 10_000], limit=0).status == 200
    assert ServerConfig(model_name="m").max_body_bytes == DEFAULT_MAX_BODY_BYTES == 16 * 2**20
    with pytest.raises(ValueError, match="max_body_bytes must be >= 0"):
        ServerConfig(model_name="m", max_body_bytes=-1)
