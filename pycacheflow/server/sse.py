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


def members(obj: dict[str, object]) -> bytes:
    """The JSON members of an object without its braces (``"a":1,"b":2``), to splice into a
    template; the same bytes as inside ``orjson.dumps(obj)``."""
    return orjson.dumps(obj)[1:-1]


_COMPLETION_PARTIAL = (b'data: {"index":%d,"content":%b,"tokens":%b,"stop":false,"id_slot":%d,'
                       b'"tokens_predicted":%d}\n\n')  # fmt: skip
_OAI_COMPLETION_CHUNK = (b'data: {"choices":[{"text":%b,"index":%d,"logprobs":null,'
                         b'"finish_reason":null}],%b}\n\n')  # fmt: skip
_CHAT_CHUNK = b'data: {"choices":[{"finish_reason":null,"index":%d,"delta":%b}],%b}\n\n'


def completion_partial_event(
    index: int, text: str, token_ids: tuple[int, ...], num_decoded: int, slot_id: int
) -> bytes:
    """``event(responses.completion_partial(index, text, token_ids, num_decoded, slot_id))``
    (a chunk without probabilities)."""
    return _COMPLETION_PARTIAL % (index, orjson.dumps(text), orjson.dumps(token_ids), slot_id,
                                  num_decoded)  # fmt: skip


def oai_completion_chunk_event(envelope: bytes, index: int, text: str) -> bytes:
    """``event(responses.oai_completion_chunk(ids, index, text, None))``; ``envelope``:
    ``members(ids.envelope("text_completion"))``."""
    return _OAI_COMPLETION_CHUNK % (orjson.dumps(text), index, envelope)


def chat_chunk_event(envelope: bytes, delta: dict[str, object], index: int) -> bytes:
    """``event(responses.chat_chunk(ids, delta, None, index))`` (no probabilities);
    ``envelope``: ``members(ids.envelope("chat.completion.chunk"))``."""
    return _CHAT_CHUNK % (index, orjson.dumps(delta), envelope)
