"""The ASGI app of ``cacheflow serve``: llama-server's routes, API-key check and error format.

    GET  /                             a chat page (webui.html; no API key needed; --no-ui: 404)
    GET  /health /v1/health            {"status": "ok"} (no API key needed)
    GET  /props /models /v1/models /slots /metrics
    POST /completion /completions      llama-server's native completion (JSON or SSE)
    POST /v1/completions               OpenAI text completions
    POST /chat/completions /v1/chat/completions
    POST /tokenize /detokenize /apply-template
    POST /chat/completions/input_tokens /v1/chat/completions/input_tokens
    the routes of features CacheFlow lacks: 403 or 501 (server/unsupported_routes.py)

Errors are ``{"error": {"code", "message", "type"}}`` with the HTTP status in ``code``. Every
route answers CORS preflights (OPTIONS) and sets Access-Control-Allow-Origin as llama-server's
--cors-* flags say (server/cors.py; by default any Origin is echoed, credentials on). A request
body over ``ServerConfig.max_body_bytes`` is a 413 (server/body_limit.py).
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import secrets
import string
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from pycacheflow import errors
from pycacheflow.server import generation, protocol, responses, unsupported_routes
from pycacheflow.server.body_limit import BodyLimitMiddleware
from pycacheflow.server.cors import CorsMiddleware
from pycacheflow.server.generation import Api, ClientDisconnected
from pycacheflow.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from pycacheflow.server.protocol import ProtocolError
from pycacheflow.server.state import ServerState

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from pycacheflow.llm import LLM
    from pycacheflow.server.config import ServerConfig

logger = logging.getLogger("cacheflow.server")

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# llama-server's get_media_marker(): LLAMA_MEDIA_MARKER, else "<__media_" + 32 random letters and
# digits + "__>", fixed for the process (/props; CacheFlow takes no media, so it marks nothing)
MEDIA_MARKER = os.environ.get("LLAMA_MEDIA_MARKER") or "<__media_{}__>".format(
    "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))
)
_CLIENT_CLOSED_REQUEST = 499  # nginx's status for "client went away"; never reaches a client

Handler = Callable[[Request, ServerState], Awaitable[Response]]


def create_app(llm: LLM, config: ServerConfig) -> Starlette:
    """Build the app serving ``llm`` (which the caller keeps open while it serves and closes
    afterwards).

    Args:
        llm: a loaded engine.
        config: HTTP-side settings (alias, API keys, enabled endpoints, defaults).
    """
    state = ServerState(llm, config)
    routes = [Route(path, _endpoint(fn, state), methods=[method])
              for method, path, fn in _ROUTES + unsupported_routes.ROUTES]  # fmt: skip
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_exception},
    )
    app.state.cacheflow = state
    # Added first, so innermost: behind the CORS and API-key checks, ahead of the router.
    app.add_middleware(GenerationRoutes, state=state)
    if config.api_keys:
        public = PUBLIC_PATHS | ({"/"} if config.enable_ui else set())
        app.add_middleware(ApiKeyMiddleware, api_keys=config.api_keys, public_paths=public)
    # Before any route reads a body: a 413 in the same error format, the body never held.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=config.max_body_bytes)
    # Added last, so outermost: preflights are answered before the API-key check (browsers send
    # no key with them) and every answer, 401 and 413 included, carries the CORS headers.
    app.add_middleware(CorsMiddleware, config=config)
    return app


def abort_in_flight(app: Starlette) -> int:
    """Abort the engine requests of all HTTP requests in flight (call on the app's event loop,
    at shutdown): JSON requests get 503, streams end with an error event.

    Returns:
        The number of HTTP requests affected.
    """
    return app.state.cacheflow.abort_all()


def error_response(
    message: str, status: int, error_type: str, extra: dict[str, object] | None = None
) -> JSONResponse:
    """An error in OpenAI's format."""
    return JSONResponse(responses.error_body(message, status, error_type, extra), status)


def _endpoint(fn: Handler, state: ServerState) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await _answer(lambda: fn(request, state))

    return endpoint


def _engine_error(exc: errors.CacheFlowError) -> JSONResponse:
    if isinstance(exc, errors.ShutdownError):
        return error_response(str(exc), 503, "unavailable_error")
    if isinstance(exc, errors.UnsupportedError):
        return error_response(str(exc), 501, "not_supported_error")
    if isinstance(exc, (errors.InvalidArgumentError, errors.PromptTooLongError)):
        return error_response(str(exc), 400, "invalid_request_error")
    logger.exception("request failed")
    return error_response(f"{type(exc).__name__}: {exc}", 500, "server_error")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = f"{request.method} {request.url.path}: {exc.detail}"
    response = error_response(message, exc.status_code, error_type)
    # starlette's 405 names the route's methods in Allow (RFC 9110, section 15.5.6, requires it)
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


async def _json(request: Request) -> object:
    return _decode_json(await request.body())


def _decode_json(raw: bytes) -> object:
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"Invalid JSON in request body: {exc}") from None
    except RecursionError:
        # Python's parser recurses once per nesting level (about 1,000 allowed); no request field nests deeper
        # than a few levels, so the body is malformed, not the server
        raise ProtocolError("Invalid JSON in request body: arrays or objects nested too deeply") from None


def _reject_constant(name: str) -> object:
    """Python's json module reads NaN, Infinity and -Infinity, which JSON does not have (and
    llama-server's parser refuses): a NaN would pass every range check of a field."""
    raise ProtocolError(f"Invalid JSON in request body: {name} is not a JSON value")


class GenerationRoutes:
    """Answers the generating POST routes (``GENERATION_ROUTES``) itself, as raw ASGI, before
    Starlette's router; every other request goes on to the app.

    Why: these are the requests a loaded server handles hundreds of per second, and Starlette's
    per-request path (the exception middleware, matching the route list, the Request object,
    the endpoint wrapper and their wrapping of ``send``, which runs for every stream chunk) was
    a share of the event loop's time. The answers are the same: the same handler
    (``generation.handle``), the same error responses (``_endpoint``'s), and errors the handler
    does not map still reach Starlette's outer ServerErrorMiddleware (a 500). A request with a
    root path, or another method, takes the router (same answers, the slower way).

    Args:
        app: the wrapped app (the router's side).
        state: the app's state.
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self._state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            api = GENERATION_ROUTES.get(scope["path"])
        if api is None:
            await self.app(scope, receive, send)
            return
        response = await _answer(lambda: _generate(api, receive, self._state))
        await response(scope, receive, send)


async def _read_body(receive: Receive) -> bytes:
    """The request body, as Starlette's ``Request.body`` reads it.

    Raises:
        ClientDisconnect: the client went away first (as Starlette raises it).
    """
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


async def _generate(api: Api, receive: Receive, state: ServerState) -> ASGIApp:
    body = _decode_json(await _read_body(receive))
    return await generation.handle(receive, api, state, body)


async def _answer(work: Callable[[], Awaitable[ASGIApp]]) -> ASGIApp:
    """``work()``'s response, or the error response of what it raised (``_endpoint``)."""
    try:
        return await work()
    except ProtocolError as exc:
        return error_response(str(exc), exc.status, exc.error_type, exc.extra)
    except ClientDisconnected:
        return Response(status_code=_CLIENT_CLOSED_REQUEST)
    except ClientDisconnect:
        # the client went away while sending its body: nothing to answer, and not a server error
        logger.debug("client disconnected before its request body was complete")
        return Response(status_code=_CLIENT_CLOSED_REQUEST)
    except errors.CacheFlowError as exc:
        return _engine_error(exc)


class ApiKeyMiddleware:
    """Rejects requests without a valid key (``Authorization: Bearer KEY`` or ``X-Api-Key``)
    with 401, except the public health endpoints."""

    def __init__(
        self, app: ASGIApp, api_keys: tuple[str, ...], public_paths: frozenset[str] = PUBLIC_PATHS
    ) -> None:
        self.app = app
        self._keys = [key.encode() for key in api_keys]
        self._public = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._public or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        await error_response("Invalid API Key", 401, "authentication_error")(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        key = headers.get(b"authorization") or headers.get(b"x-api-key") or b""
        key = key.removeprefix(b"Bearer ")
        # Compare with every key (no early exit) in constant time: timing reveals nothing.
        matches = [hmac.compare_digest(key, k) for k in self._keys]
        return any(matches)


# ---------------------------------------------------------------------------- info routes


async def web_page(request: Request, state: ServerState) -> Response:
    if not state.config.enable_ui:
        return error_response("File Not Found", 404, "not_found_error")
    return HTMLResponse(_web_page_html())


@functools.lru_cache(maxsize=1)
def _web_page_html() -> str:
    return (Path(__file__).parent / "webui.html").read_text(encoding="utf-8")


async def health(request: Request, state: ServerState) -> Response:
    return JSONResponse({"status": "ok"})


async def props(request: Request, state: ServerState) -> Response:
    info, config = state.info, state.config
    default = state.slots.slot_json(0, state.default_settings(), idle_params=True)
    default.update(is_processing=False, id_task=-1, prompt="")
    return JSONResponse(
        {
            "default_generation_settings": default,
            "total_slots": info.max_num_seqs,
            "model_alias": state.model_name,
            "model_ftype": state.model_ftype,
            "model_path": config.model_path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": MEDIA_MARKER,
            "endpoint_slots": config.enable_slots,
            "endpoint_props": False,
            "endpoint_metrics": config.enable_metrics,
            "ui": config.enable_ui,
            "ui_settings": {},  # llama-server's --ui-config, which serve does not take
            **state.chat_template_props(),
            "bos_token": _token_text(state, info.token_bos),
            "eos_token": _token_text(state, info.token_eos),
            "build_info": responses.SYSTEM_FINGERPRINT,
            "is_sleeping": False,
            "cors_proxy_enabled": False,  # llama-server's --ui-mcp-proxy, not implemented
            "cacheflow": {
                "kv_mode": info.kv_mode_name,
                "block_size": info.block_size,
                "n_ctx": info.n_ctx,
                "n_ctx_per_seq": info.n_ctx_per_seq,
                "max_num_seqs": info.max_num_seqs,
                "max_num_batched_tokens": info.max_num_batched_tokens,
                "n_threads": info.n_threads,
            },
        }
    )


def _token_text(state: ServerState, token_id: int) -> str:
    return "" if token_id < 0 else state.llm.detokenize([token_id], skip_special=False)


async def models(request: Request, state: ServerState) -> Response:
    info, name = state.info, state.model_name
    model = {
        "id": name,
        "aliases": list(state.config.aliases),
        "tags": list(state.config.tags),
        "object": "model",
        "created": int(time.time()),
        "owned_by": "cacheflow",
        "meta": {
            "vocab_type": info.vocab_type,
            "n_vocab": info.n_vocab,
            "n_ctx": state.n_ctx_slot,
            "n_ctx_train": info.n_ctx_train,
            "n_embd": info.n_embd,
            "n_params": info.n_params,
            "size": info.model_size_bytes,
            "ftype": state.model_ftype,
        },
    }
    listing = {"name": name, "model": name, "modified_at": "", "size": "", "digest": "",
               "type": "model", "description": "", "tags": [""],
               "capabilities": ["completion"], "parameters": "",
               "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                           "parameter_size": "", "quantization_level": ""}}  # fmt: skip
    return JSONResponse({"models": [listing], "object": "list", "data": [model]})


async def slots(request: Request, state: ServerState) -> Response:
    if not state.config.enable_slots:
        return error_response("This server does not support slots endpoint. Start it with "
                              "`--slots`", 501, "not_supported_error")  # fmt: skip
    if request.query_params.get("fail_on_no_slot") in ("1", "true") and state.slots.num_free == 0:
        return error_response("no slot available", 503, "unavailable_error")
    return JSONResponse(state.slots.to_json(state.default_settings()))


async def metrics(request: Request, state: ServerState) -> Response:
    if not state.config.enable_metrics:
        return error_response("This server does not support metrics endpoint. Start it with "
                              "`--metrics`", 501, "not_supported_error")  # fmt: skip
    text = state.metrics.render(state.llm.stats())
    response = Response(text, media_type=METRICS_CONTENT_TYPE)
    # raw, so that the name keeps llama-server's capitals (starlette lowercases header names)
    response.raw_headers.append((b"Process-Start-Time-Unix", str(state.start_time_unix).encode()))
    return response


# ---------------------------------------------------------------------------- text routes


async def tokenize(request: Request, state: ServerState) -> Response:
    body = protocol.require_object(await _json(request))
    add_special = protocol.read_bool(body, "add_special", False)
    parse_special = protocol.read_bool(body, "parse_special", True)
    with_pieces = protocol.read_bool(body, "with_pieces", False)
    pieces = protocol.read_mixed(body, "content")
    token_ids = state.tokenize_mixed(pieces, add_special, parse_special)
    if with_pieces:
        pieces = [_piece(state.llm.token_piece(t)) for t in token_ids]
        return JSONResponse({"tokens": [{"id": t, "piece": p} for t, p in zip(token_ids, pieces)]})
    return JSONResponse({"tokens": token_ids})


def _piece(data: bytes) -> str | list[int]:
    """A token's piece as llama-server shows it: text when valid UTF-8, else its byte values."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


async def detokenize(request: Request, state: ServerState) -> Response:
    body = protocol.require_object(await _json(request))
    token_ids = protocol.read_token_ids(body, "tokens")
    return JSONResponse({"content": state.llm.detokenize(token_ids, skip_special=False)})


async def chat_input_tokens(request: Request, state: ServerState) -> Response:
    """llama-server's token count of a chat request's prompt, without generating."""
    body = protocol.require_object(await _json(request))
    prompt = state.render_chat(protocol.read_messages(body), **protocol.read_chat_options(body))
    return JSONResponse({"input_tokens": len(state.resolve_prompt(prompt))})


async def apply_template(request: Request, state: ServerState) -> Response:
    body = protocol.require_object(await _json(request))
    messages = protocol.read_messages(body)
    options = protocol.read_chat_options(body)
    return JSONResponse({"prompt": state.render_chat(messages, **options)})


# ---------------------------------------------------------------------------- generation


def _generating(api: Api) -> Handler:
    """The router's handler of a generating route (``GenerationRoutes`` answers most of
    these requests before the router; this one those it leaves)."""

    async def handler(request: Request, state: ServerState) -> Response:
        return await generation.handle(request.receive, api, state, await _json(request))

    return handler


GENERATION_ROUTES: dict[str, Api] = {
    "/completion": Api.LLAMA,
    "/completions": Api.LLAMA,
    "/v1/completions": Api.OAI_COMPLETION,
    "/chat/completions": Api.OAI_CHAT,
    "/v1/chat/completions": Api.OAI_CHAT,
}
"""POST path -> the generating endpoint's format (also routes of the router, in ``_ROUTES``)."""

_ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/", web_page),
    ("GET", "/health", health),
    ("GET", "/v1/health", health),
    ("GET", "/props", props),
    ("GET", "/models", models),
    ("GET", "/v1/models", models),
    ("GET", "/slots", slots),
    ("GET", "/metrics", metrics),
    *(("POST", path, _generating(api)) for path, api in GENERATION_ROUTES.items()),
    ("POST", "/chat/completions/input_tokens", chat_input_tokens),
    ("POST", "/v1/chat/completions/input_tokens", chat_input_tokens),
    ("POST", "/tokenize", tokenize),
    ("POST", "/detokenize", detokenize),
    ("POST", "/apply-template", apply_template),
)
