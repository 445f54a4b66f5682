"""uvicorn's httptools HTTP/1.1 protocol with llama-server's header-name casing.

uvicorn's httptools protocol (the fast one: it frames SSE chunks in a few bytes operations, where
its h11 protocol spends about 2.5 us more per chunk in h11's state machine, measured with
``timeit`` on one 50-byte SSE chunk) lower-cases every response header name. HTTP header names are
case-insensitive (RFC 9110, section 5.1), but llama-server (cpp-httplib) sends them capitalized
(``Access-Control-Allow-Origin``, ``Process-Start-Time-Unix``), and clients that look them up in
a plain dict, as llama.cpp's own server test suite does, see the difference. A drop-in keeps the
bytes: this protocol re-capitalizes the names in each response head, once per response.

How: ``HttpToolsProtocol`` hands its transport to each request/response cycle, which writes the
status line and all header lines in one ``transport.write``. The transport is wrapped; a write
that is a response head (starts with ``HTTP/1.1 `` and ends with the blank line; bodies are
separate writes, chunked ones start with their hex length) has each ``name:`` rewritten as
``Name-Parts:``. Everything else is passed through untouched.

``protocol_class()`` returns the class for ``uvicorn.Config(http=...)``, or "h11" when httptools
is not installed (h11 keeps the names' case by itself).
"""

from __future__ import annotations

import re
import socket
from typing import Any

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"
# A header line's name: at a line start, up to the colon (token characters of RFC 9110 5.6.2).
_NAME = re.compile(rb"\r\n([!#$%&'*+.^_`|~0-9A-Za-z-]+):")


def _capitalize(match: re.Match[bytes]) -> bytes:
    name = b"-".join(part[:1].upper() + part[1:] for part in match.group(1).split(b"-"))
    return b"\r\n" + name + b":"


def capitalize_head(data: bytes) -> bytes:
    """A response head (status line + header lines + blank line) with header names capitalized
    per dash-separated part (``content-type`` -> ``Content-Type``); other data unchanged."""
    if data.startswith(_HEAD_START) and data.endswith(_HEAD_END):
        return _NAME.sub(_capitalize, data)
    return data


class _CapitalizingTransport:
    """Delegates to an asyncio transport; ``write`` capitalizes response heads."""

    __slots__ = ("_transport",)

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        self._transport.write(capitalize_head(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def set_nodelay(transport: Any) -> None:
    """Turn off Nagle's algorithm on the connection's TCP socket (no-op for other sockets).

    A response goes out as several writes (the head, then each body part or SSE chunk). With
    Nagle on, a write waits while an earlier segment is unacknowledged, and the client's
    delayed ACK holds that acknowledgement for up to ~40 ms: on a kept-alive connection every
    response after the first paid it (a 1-token /completion took 45 ms instead of 4, measured
    against the fake engine, and a stream's first token likewise: 45 -> 4 ms at one stream, 54 ->
    16 ms at 16). The event loop's transports left Nagle on.
    """
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):  # a closed connection, or a socket without options
        pass


def protocol_class() -> Any:
    """The uvicorn ``http`` setting: the capitalizing httptools protocol, or "h11"."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools missing (it is a dependency, but not on every platform)
        return "h11"

    class CapitalizedHeadersHttpTools(HttpToolsProtocol):  # type: ignore[misc]
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            set_nodelay(transport)
            self.transport = _CapitalizingTransport(transport)

    return CapitalizedHeadersHttpTools
