"""CORS as llama-server does it (tools/server/server-http.cpp, its pre-routing handler).

Every response gets ``Access-Control-Allow-Origin``:
  - origins "*" with credentials on (the default): the request's Origin, echoed;
  - origins "localhost": the request's Origin when its host is localhost, 127.0.0.1 or ::1,
    else no header;
  - origins "*" without credentials: "*";
  - a list of origins: the request's Origin when it is in the list, else no header.
Every OPTIONS request (a browser's preflight carries no API key) is answered at once with 200,
an empty body, and Allow-Credentials / Allow-Methods / Allow-Headers from the --cors-* flags.
Header names are sent capitalized as llama-server sends them (HTTP does not care; some clients'
dict lookups do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pycacheflow.server.config import CORS_ANY, CORS_LOCALHOST

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from pycacheflow.server.config import ServerConfig

LOCALHOST_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def origin_is_localhost(origin: str) -> bool:
    """True when the Origin's host is a loopback name (scheme and port do not matter)."""
    try:
        return urlsplit(origin).hostname in LOCALHOST_NAMES
    except ValueError:
        return False


class CorsMiddleware:
    """ASGI middleware answering preflights and adding the CORS headers (see module doc).

    Args:
        app: the wrapped app.
        config: the server's --cors-* settings.
    """

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self._origins = config.cors_origins
        self._preflight = [
            (b"Access-Control-Allow-Credentials", b"true" if config.cors_credentials else b"false"),
            (b"Access-Control-Allow-Methods", ", ".join(config.cors_methods).encode()),
            (b"Access-Control-Allow-Headers", ", ".join(config.cors_headers).encode()),
        ]
        self._echo_any = config.cors_origins == (CORS_ANY,) and config.cors_credentials

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request's Origin (None: no header)."""
        if self._echo_any:
            return origin
        if self._origins == (CORS_LOCALHOST,):
            return origin if origin and origin_is_localhost(origin) else None
        if self._origins == (CORS_ANY,):
            return CORS_ANY
        return origin if origin in self._origins else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = dict(scope["headers"]).get(b"origin")
        allowed = self.allow_origin(origin.decode("latin-1") if origin is not None else None)
        cors = [(b"Access-Control-Allow-Origin", allowed.encode("latin-1"))] if allowed else []
        if scope["method"] == "OPTIONS":
            headers = [*cors, *self._preflight, (b"content-type", b"text/html"),
                       (b"content-length", b"0")]  # fmt: skip
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return

        if not cors:  # nothing to add: no wrapper on the sends (one per stream chunk)
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)
