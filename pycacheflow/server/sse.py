"""Server-sent events in llama-server's framing: ``data: <json>\\n\\n`` per event.

OpenAI-style endpoints end the stream with ``data: [DONE]``; /completion does not. An error
after the stream started is sent as ``data: {"error": {...}}`` and ends the stream. JSON is
written by orjson (compact, UTF-8 kept as is, as llama-server writes it): the streaming path
formats one event per stream per drain, so this runs for every chunk a client receives.
"""

from __future__ import annotations

import orjson

MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
PING = b":\n\n"  # an SSE comment: keeps idle connections (long queue or prefill) alive
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(obj: object) -> str:
    """Compact JSON with UTF-8 text kept as is (as llama-server writes it)."""
    return orjson.dumps(obj).decode()


def event(data: object) -> bytes:
    """One SSE event carrying ``data`` as JSON."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


def events(items: list[object]) -> bytes:
    """Several events in one write."""
    return b"".join(event(item) for item in items)
