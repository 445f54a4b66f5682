"""The limit on HTTP request bodies (``cacheflow serve --max-body-size``): a body over it is
answered 413 in the server's error format, and is never held in memory.

Without a limit a 200 MB prompt was read whole, parsed and tokenized: it held a core for minutes
and reached 16 GB RSS. llama-server has no flag for it; its HTTP library (cpp-httplib) answers 413
above a compile-time CPPHTTPLIB_PAYLOAD_MAX_LENGTH of 100 MB, after skipping the body.

How, as ASGI middleware in front of every route:

    Content-Length > limit        413 before the app runs: no byte of the body is kept
    no Content-Length (chunked)   the bytes are counted as the app receives them; the message that
                                  passes the limit raises BodyTooLarge inside the app's
                                  ``receive``, which this middleware turns into the 413

uvicorn reads a body only as the app asks for it (it pauses the socket past 64 KiB), so nothing
beyond the limit is buffered. Before answering, the rest of the body is read and dropped, as
cpp-httplib skips it: Python's HTTP clients send the whole body before they read the answer, and
a connection closed under them loses the 413 to a reset. A body declared or found larger than
``_MAX_DRAIN_BYTES``, or one the client waits to send (``Expect: 100-continue``), is not read at
all: its 413 closes the connection (``Connection: close``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import JSONResponse

from pycacheflow.server import responses

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

_MAX_DRAIN_BYTES = 256 * 2**20  # read and dropped at most, to answer a too large body cleanly


class BodyTooLarge(Exception):
    """Raised by the ``receive`` of a chunked request whose body passed the limit.

    Attributes:
        num_bytes: the bytes received so far (more than the limit).
        more_body: the client has more of the body to send.
    """

    def __init__(self, num_bytes: int, more_body: bool) -> None:
        super().__init__(f"request body over the limit after {num_bytes} bytes")
        self.num_bytes = num_bytes
        self.more_body = more_body


class BodyLimitMiddleware:
    """Answers 413 to a request whose body is larger than ``max_body_bytes`` (see the module
    docstring); 0 = no limit.

    Args:
        app: the wrapped app.
        max_body_bytes: the largest body accepted, bytes, >= 0.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self._max = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._max <= 0:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            # the server ends the body at Content-Length: one within the limit needs no counting
            if declared > self._max:
                can_drain = declared <= _MAX_DRAIN_BYTES and not _expects_continue(scope)
                await self._reject(scope, receive, send, declared, True, can_drain)
                return
            await self.app(scope, receive, send)
            return
        counter = _Counter(receive, self._max)
        try:
            await self.app(scope, counter.receive, send)
        except BodyTooLarge as exc:  # raised while the app read the body: nothing was answered
            await self._reject(scope, receive, send, None, exc.more_body, True, exc.num_bytes)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, declared: int | None,
                      more_body: bool, can_drain: bool, num_bytes: int = 0) -> None:  # fmt: skip
        """Send the 413; first read the rest of the body (``more_body``) and drop it where
        ``can_drain``, else close the connection after the answer.

        Args:
            declared: the body's Content-Length, bytes; None = chunked.
            num_bytes: the bytes of the body read so far.
        """
        close = more_body and (not can_drain or not await _drain(receive, num_bytes))
        size = f" of {declared} bytes" if declared is not None else ""
        message = (f"Request body{size} is larger than the server's limit of {self._max} bytes "
                   "(--max-body-size)")  # fmt: skip
        response = JSONResponse(
            responses.error_body(message, 413, "invalid_request_error"), 413,
            headers={"Connection": "close"} if close else None,
        )  # fmt: skip
        await response(scope, receive, send)


class _Counter:
    """A ``receive`` that counts the body's bytes and raises BodyTooLarge past the limit."""

    __slots__ = ("_receive", "_max", "num_bytes")

    def __init__(self, receive: Receive, max_body_bytes: int) -> None:
        self._receive = receive
        self._max = max_body_bytes
        self.num_bytes = 0

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.num_bytes += len(message.get("body", b""))
            if self.num_bytes > self._max:
                raise BodyTooLarge(self.num_bytes, bool(message.get("more_body", False)))
        return message


async def _drain(receive: Receive, num_bytes: int) -> bool:
    """Read the rest of a body and drop it; False when it passed _MAX_DRAIN_BYTES (counting the
    ``num_bytes`` already read) or the client went away, so the connection must close."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return False
        num_bytes += len(message.get("body", b""))
        if num_bytes > _MAX_DRAIN_BYTES:
            return False
        if not message.get("more_body", False):
            return True


def _content_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None when it has none (a chunked body) or it is not a
    number (the HTTP server refuses those itself)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _expects_continue(scope: Scope) -> bool:
    """The client waits for ``100 Continue`` before it sends the body (uvicorn sends it when the
    app first receives)."""
    return any(name == b"expect" and value.lower() == b"100-continue"
               for name, value in scope["headers"])  # fmt: skip
