"""Token probabilities in the HTTP API: llama-server's ``n_probs`` / ``post_sampling_probs`` and
OpenAI's ``logprobs`` / ``top_logprobs``, read from request bodies and written in llama-server's
JSON shapes (tools/server/server-task.cpp of the pinned tree):

    /completion           "completion_probabilities": [entry, ...]
    /v1/completions,chat  choice "logprobs": {"content": [entry, ...]}
    entry                 {"id", "token", "bytes", "logprob", "top_logprobs": [{"id", "token",
                          "bytes", "logprob"}, ...]}; with post_sampling_probs "prob" and
                          "top_probs" instead (probabilities, not their logs)

Streams carry one entry per chunk (one chunk per token). The engine computes the numbers
(``SamplingParams.logprobs``); this module only parses and renders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pycacheflow.sampling_params import MAX_LOGPROBS

if TYPE_CHECKING:
    from pycacheflow.llm import LLM
    from pycacheflow.outputs import TokenLogprobs

DEFAULT_TOP_LOGPROBS = 20  # llama-server's top_logprobs when a chat request sets logprobs only


def read_completion_logprobs(body: Mapping[str, object]) -> tuple[int | None, bool]:
    """(``SamplingParams.logprobs``, ``post_sampling_probs``) of a /completion or
    /v1/completions body: ``n_probs``, or OpenAI's integer ``logprobs`` when n_probs is absent
    (llama-server's alias); None = no probabilities.

    As llama-server (tools/server/server-schema.cpp, "If greater than 0"): a count of 0 asks
    for none, and a boolean counts as 0 or 1 (its JSON library converts them; clients send
    ``"logprobs": false`` to /v1/completions). Unlike llama-server, a negative count is a 400,
    as chat's negative top_logprobs is (llama-server reads it as none: a client bug hidden).
    Unlike llama-server, which lists up to the whole
    vocabulary, a count above ``MAX_LOGPROBS`` (20, OpenAI's and vLLM's limit; llama.cpp's own
    server tests ask for 10) is a 400: tens of thousands of entries per token held a core
    rendering them. A number with a fraction is a 400 here too (llama-server truncates it):
    "2.5 tokens" is a client bug worth naming.

    Raises:
        ProtocolError: not a number, a fractional one, a negative one, one above MAX_LOGPROBS,
            or a non-boolean post_sampling_probs.
    """
    from pycacheflow.server.protocol import INT32_MAX, ProtocolError, read_bool, read_int

    names = tuple(name for name in ("n_probs", "logprobs") if body.get(name) is not None)
    if names and isinstance(body[names[0]], bool):
        n_probs = int(body[names[0]])
    else:
        n_probs = read_int(body, names, 0, high=INT32_MAX)
    if n_probs < 0:
        raise ProtocolError(f"Field '{names[0]}': value must be at least 0 (token probabilities "
                            f"per position; 0 = none), got {n_probs}")  # fmt: skip
    if n_probs > MAX_LOGPROBS:
        raise ProtocolError(f"Field '{names[0]}': value must be at most {MAX_LOGPROBS} (token "
                            f"probabilities per position), got {n_probs}")  # fmt: skip
    post_sampling = read_bool(body, "post_sampling_probs", False)
    return (n_probs if n_probs > 0 else None), post_sampling


def read_chat_logprobs(body: Mapping[str, object]) -> int | None:
    """``SamplingParams.logprobs`` of a chat body: ``top_logprobs`` (default 20 as
    llama-server) when ``logprobs`` is true, else None.

    Where llama-server is silent, this follows OpenAI, which a chat client is written for:
    top_logprobs 0 gives each sampled token's logprob with no alternatives (llama-server
    returns no logprobs at all), a negative top_logprobs is a 400 (llama-server returns none),
    and a top_logprobs or logprobs of the wrong type is a 400 (llama-server uses its default,
    20, or reads a numeric logprobs as n_probs). As OpenAI, and unlike llama-server (no upper
    limit), top_logprobs is at most ``MAX_LOGPROBS`` (20).

    Raises:
        ProtocolError: a non-boolean logprobs, top_logprobs outside [0, 20], not an integer or
            without logprobs, or logprobs with tools in a stream (llama-server's rules and
            messages).
    """
    from pycacheflow.server.protocol import ProtocolError, _present, read_bool, read_int

    if not read_bool(body, "logprobs", False):
        if _present(body, "top_logprobs"):
            raise ProtocolError("top_logprobs requires logprobs to be set to true")
        return None
    if body.get("tools") and read_bool(body, "stream", False):
        raise ProtocolError("logprobs is not supported with tools + stream")
    return read_int(body, ("top_logprobs",), DEFAULT_TOP_LOGPROBS, low=0, high=MAX_LOGPROBS)


def _valid_utf8_prefix(data: bytes) -> bytes:
    """``data`` without a multi-byte character cut at its end (llama-server's validate_utf8)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the lead byte of the last character
            return data[:-back] if _utf8_length(byte) > back else data
    return data


def ends_mid_character(data: bytes) -> bool:
    """True when ``data`` ends inside a multi-byte UTF-8 character (llama-server's
    ``validate_utf8(text) < text.size()``)."""
    return len(_valid_utf8_prefix(data)) < len(data)


def _utf8_length(lead: int) -> int:
    """Bytes of the UTF-8 character that starts with byte ``lead`` (1 for ASCII or invalid)."""
    if lead >> 5 == 0b110:
        return 2
    if lead >> 4 == 0b1110:
        return 3
    return 4 if lead >> 3 == 0b11110 else 1


class TokenPieces:
    """Each token's text as llama-server shows it in probabilities (special tokens as
    nothing), cached per token id (the vocabulary is fixed).

    Args:
        llm: the engine whose vocabulary is read.
    """

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """(text, bytes) of one token: its valid UTF-8 prefix decoded, and all its raw bytes."""
        piece = self._cache.get(token_id)
        if piece is None:
            raw = self._llm.token_piece(token_id, special=False)
            text = _valid_utf8_prefix(raw).decode("utf-8", errors="replace")
            piece = self._cache[token_id] = (text, list(raw))
        return piece

    def raw(self, token_id: int) -> bytes:
        """All raw bytes of one token (a piece of a multi-byte character may be among them)."""
        return bytes(self(token_id)[1])


def _entry(token_id: int, logprob: float, post_sampling: bool, pieces: TokenPieces) -> dict:
    text, raw = pieces(token_id)
    value = math.exp(logprob) if post_sampling else logprob
    key = "prob" if post_sampling else "logprob"
    return {"id": token_id, "token": text, "bytes": raw, key: value}


def probs_json(
    entries: Sequence[TokenLogprobs], post_sampling: bool, pieces: TokenPieces
) -> list[dict[str, object]]:
    """llama-server's list of per-token probabilities (``completion_probabilities`` and
    ``logprobs.content``), one object per entry in order.

    Args:
        entries: the tokens' probabilities (``RequestOutput.logprobs`` or a stream delta's).
        post_sampling: write probabilities ("prob", "top_probs") instead of their logs.
        pieces: the token texts.
    """
    top_key = "top_probs" if post_sampling else "top_logprobs"
    out = []
    for lp in entries:
        item = _entry(lp.token_id, lp.logprob, post_sampling, pieces)
        item[top_key] = [_entry(t, v, post_sampling, pieces) for t, v in lp.top]
        out.append(item)
    return out
