"""``cacheflow serve``: an HTTP server compatible with llama.cpp's llama-server.

    from pycacheflow.server import ServerConfig, create_app
    app = create_app(llm, ServerConfig(model_name="smollm2"))  # an ASGI app (Starlette)

Modules: ``app`` (routes, auth, errors, lifespan), ``protocol`` (request parsing and
validation), ``responses`` (response bodies), ``sse`` (event framing), ``streams`` (engine
output on the asyncio loop), ``metrics`` (Prometheus text), ``slots`` (the /slots view),
``config`` (ServerConfig); for ``serve --data-parallel``: ``router_policy`` (which replica
takes a request), ``router`` (forwarding, replica health, statistics) and ``router_app`` (its
routes). Needs starlette (and uvicorn to run; httpx for the router).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pycacheflow.server.config import ServerConfig

if TYPE_CHECKING:
    from pycacheflow.server.app import create_app

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str) -> object:
    # create_app needs starlette; import it on first use so ServerConfig works without it.
    if name == "create_app":
        from pycacheflow.server.app import create_app

        return create_app
    raise AttributeError(f"module 'pycacheflow.server' has no attribute {name!r}")
