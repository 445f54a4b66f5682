"""Server-sent events in llama-server's framing: ``data: <json>\\n\\n`` per event.

OpenAI-style endpoints end the stream with ``data: [DONE]``; /completion does not. An error
after the stream started is sent as ``data: {"error": {...}}`` and ends the stream.
"""

from __future__ import annotations

import json

MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
PING = b":\n\n"  # an SSE comment: keeps idle connections (long queue or prefill) alive
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(obj: object) -> str:
    """Compact JSON with UTF-8 text kept as is (as llama-server writes it)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def event(data: object) -> bytes:
    """One SSE event carrying ``data`` as JSON."""
    return f"data: {dumps(data)}\n\n".encode()


def events(items: list[object]) -> bytes:
    """Several events in one write."""
    return b"".join(event(item) for item in items)
