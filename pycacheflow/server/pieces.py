"""Stream pieces: the text, tokens and probabilities one SSE chunk of a streamed answer carries.

A delta of the engine (``StreamDelta``) becomes one piece, or one piece per token when the
request asked for token probabilities (llama-server sends one chunk per token, each with its own
probabilities). The engine releases text in whole UTF-8 characters only, so a token that ends in
the middle of a character releases no text. llama-server sends no chunk for such a token (its
``process_token`` skips the partial response while ``validate_utf8`` finds the generated text cut
inside a character); the bytes go out with the next token's chunk. ``PieceJoiner`` does the same:
it holds such a piece back and puts its tokens and probabilities in front of the next piece it
lets through, so that no tokens or probabilities are lost either. A piece whose text is empty for
another reason (the engine holds back a possible stop string) still goes out empty, as
llama-server's does; ``hold_all_empty`` (chat) holds those back too, since a chat stream only
sends chunks that change the message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from pycacheflow.server.logprobs import ends_mid_character

if TYPE_CHECKING:
    from pycacheflow.outputs import StreamDelta, TokenLogprobs

_UTF8_MAX_BYTES = 4  # the longest UTF-8 character; llama-server's validate_utf8 looks this far back


class Piece(NamedTuple):
    """What one stream chunk carries (a NamedTuple: one is made per chunk of every stream).

    Attributes:
        text: the text released with it (whole characters; may be "").
        token_ids: its tokens, in order.
        logprobs: the probabilities of those tokens (one entry each) when the request asked
            for them, else ().
        num_decoded: tokens of the stream up to and including its last one (llama-server's
            ``tokens_predicted``); set by ``PieceJoiner``, 0 before.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...] = ()
    num_decoded: int = 0


def delta_pieces(delta: StreamDelta) -> list[Piece]:
    """The pieces of one delta: the delta whole when it has no token probabilities, else one
    piece per token, then any text no token released (an aborted request's last flush)."""
    if not delta.logprobs:
        return [Piece(delta.text, delta.token_ids)]
    pieces = [Piece(lp.text, (lp.token_id,), (lp,)) for lp in delta.logprobs]
    rest = delta.text[sum(len(lp.text) for lp in delta.logprobs) :]
    if rest:
        pieces.append(Piece(rest, ()))
    return pieces


class PieceJoiner:
    """Holds back the empty pieces of one stream that llama-server would not send and joins
    them to the next piece (state of one choice of one stream; the event loop's thread).

    Args:
        token_bytes: the raw bytes of a token (``TokenPieces``); read only for empty pieces.
        hold_all_empty: hold every piece without text, not only those that end inside a
            character (chat streams).
    """

    def __init__(self, token_bytes: Callable[[int], bytes], hold_all_empty: bool = False) -> None:
        self._token_bytes = token_bytes
        self._hold_all_empty = hold_all_empty
        self._recent: tuple[int, ...] = ()  # the last tokens seen, enough for 4 bytes
        self._held: list[Piece] = []
        self._num_tokens = 0  # tokens seen

    @property
    def holding(self) -> bool:
        """Pieces are held back."""
        return bool(self._held)

    def join(self, pieces: Iterable[Piece]) -> list[Piece]:
        """The pieces to send now, in order, with ``num_decoded`` set; held ones come in front
        of the next one sent."""
        out = []
        for piece in pieces:
            self._num_tokens += len(piece.token_ids)
            self._recent = (self._recent + piece.token_ids)[-_UTF8_MAX_BYTES:]
            if not piece.text and self._hold(piece.token_ids):
                self._held.append(piece)
            else:
                out.append(self._with_held(piece))
        return out

    def join_delta(self, delta: StreamDelta) -> list[Piece]:
        """``join(delta_pieces(delta))``: the same pieces, without the intermediate ones for a
        delta without token probabilities (the common case, once per chunk of a stream)."""
        if delta.logprobs:
            return self.join(delta_pieces(delta))
        token_ids = delta.token_ids
        self._num_tokens += len(token_ids)
        self._recent = (self._recent + token_ids)[-_UTF8_MAX_BYTES:]
        if not delta.text and self._hold(token_ids):
            self._held.append(Piece("", token_ids))
            return []
        if self._held:
            return [self._with_held(Piece(delta.text, token_ids))]
        return [Piece(delta.text, token_ids, (), self._num_tokens)]

    def flush(self) -> list[Piece]:
        """The held pieces as one piece without text ([] if none), at the end of the stream."""
        return [self._with_held(Piece("", ()))] if self._held else []

    def _hold(self, token_ids: tuple[int, ...]) -> bool:
        """Hold back a piece without text and with these tokens."""
        if self._hold_all_empty:
            return True
        if not token_ids:
            return False
        # Tokens of one byte or more each: the last 4 tokens hold the generated text's last 4
        # bytes (special tokens, which have no bytes, aside).
        tail = b"".join(self._token_bytes(t) for t in self._recent)[-_UTF8_MAX_BYTES:]
        return ends_mid_character(tail)

    def _with_held(self, piece: Piece) -> Piece:
        if not self._held:
            return Piece(piece.text, piece.token_ids, piece.logprobs, self._num_tokens)
        held, self._held = self._held, []
        token_ids = tuple(t for p in held for t in p.token_ids) + piece.token_ids
        logprobs = tuple(lp for p in held for lp in p.logprobs) + piece.logprobs
        return Piece(piece.text, token_ids, logprobs, self._num_tokens)
