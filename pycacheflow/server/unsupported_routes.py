"""llama-server routes that CacheFlow answers without serving them: a feature llama-server
turns off unless started with a flag gets llama-server's answer for that case (its status and
error type; the message says what CacheFlow lacks where llama-server names a flag CacheFlow does
not take), and a llama-server API CacheFlow does not have fails by name with 501, instead of a
404 that reads like a typo in the path.

    GET/POST /cors-proxy               403 feature_disabled (llama-server without --ui-mcp-proxy)
    POST /props                        501 (llama-server without --props)
    POST /slots/{id_slot}              501 (llama-server without --slot-save-path)
    POST /embedding(s), /v1/embeddings 501 (llama-server without --embeddings)
    POST /rerank, /reranking, /v1/...  501 (llama-server without --reranking)
    GET  /lora-adapters                [] (no adapter loaded, as llama-server without --lora)
    POST /lora-adapters, /infill, /v1/responses, /v1/messages, /v1/audio/transcriptions,
         /v1/chat/completions/control, /v1/stream, /v1/streams/lookup, ...   501 by name

Handlers are ``(request, state) -> Response`` as in app.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response

from pycacheflow.server import responses

if TYPE_CHECKING:
    from starlette.requests import Request

    from pycacheflow.server.state import ServerState

Handler = Callable[["Request", "ServerState"], Awaitable[Response]]

_TEXT_ONLY = "CacheFlow serves text generation only"


def _not_supported(message: str) -> Handler:
    async def handler(request: Request, state: ServerState) -> Response:
        body = responses.error_body(message, 501, "not_supported_error")
        return JSONResponse(body, 501)

    return handler


async def _feature_disabled(request: Request, state: ServerState) -> Response:
    """llama-server's answer for a disabled feature (server.cpp's res_403): no "code" field."""
    body = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
    return JSONResponse(body, 403)


async def _no_lora_adapters(request: Request, state: ServerState) -> Response:
    return JSONResponse([])


def _paths(method: str, paths: tuple[str, ...], handler: Handler) -> list[tuple[str, str, Handler]]:
    return [(method, path, handler) for path in paths]


_EMBEDDINGS = _not_supported(f"This server does not support embeddings ({_TEXT_ONLY})")
_RERANK = _not_supported(f"This server does not support reranking ({_TEXT_ONLY})")
_RESPONSES = _not_supported(
    "CacheFlow does not implement the OpenAI Responses API; use /v1/chat/completions"
)
_ANTHROPIC = _not_supported(
    "CacheFlow does not implement the Anthropic Messages API; use /v1/chat/completions"
)
_AUDIO = _not_supported(f"The current model does not support audio input ({_TEXT_ONLY})")
_STREAMS = _not_supported("CacheFlow does not implement resumable streams")

ROUTES: tuple[tuple[str, str, Handler], ...] = (
    *_paths("GET", ("/cors-proxy",), _feature_disabled),
    *_paths("POST", ("/cors-proxy",), _feature_disabled),
    ("POST", "/props", _not_supported(
        "This server does not support changing global properties (llama-server's --props, "
        "which CacheFlow does not implement)")),
    ("POST", "/slots/{id_slot}", _not_supported(
        "This server does not support slots action (llama-server's --slot-save-path, which "
        "CacheFlow does not implement)")),
    *_paths("POST", ("/embedding", "/embeddings", "/v1/embeddings"), _EMBEDDINGS),
    *_paths("POST", ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"), _RERANK),
    ("GET", "/lora-adapters", _no_lora_adapters),
    ("POST", "/lora-adapters", _not_supported("CacheFlow does not implement LoRA adapters")),
    ("POST", "/infill", _not_supported(
        "CacheFlow does not implement infill (fill-in-the-middle); use /completion")),
    *_paths("POST", ("/v1/responses", "/responses", "/v1/responses/input_tokens",
                     "/responses/input_tokens"), _RESPONSES),  # fmt: skip
    *_paths("POST", ("/v1/messages", "/v1/messages/count_tokens"), _ANTHROPIC),
    *_paths("POST", ("/v1/audio/transcriptions", "/audio/transcriptions"), _AUDIO),
    ("POST", "/v1/chat/completions/control", _not_supported(
        "CacheFlow does not implement reasoning control (/v1/chat/completions/control)")),
    *_paths("GET", ("/v1/stream",), _STREAMS),
    *_paths("DELETE", ("/v1/stream",), _STREAMS),
    *_paths("POST", ("/v1/streams/lookup",), _STREAMS),
)
