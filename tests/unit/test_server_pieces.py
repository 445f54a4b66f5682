"""Stream pieces (pycacheflow/server/pieces.py): a token that ends inside a UTF-8 character sends
no chunk, as in llama-server; its tokens and probabilities go out with the next chunk. No engine."""

from __future__ import annotations

from pycacheflow.outputs import TokenLogprobs
from pycacheflow.server.pieces import Piece, PieceJoiner

# token id -> its bytes: "a", "b", the 3 bytes of "€" one per token, a stop-string start "X"
TOKEN_BYTES = {1: b"a", 2: b"b", 3: b"\xe2", 4: b"\x82", 5: b"\xac", 6: b"X"}


def lp(token_id: int, text: str) -> TokenLogprobs:
    return TokenLogprobs(token_id, -float(token_id), (), text)


def joiner(hold_all_empty: bool = False) -> PieceJoiner:
    return PieceJoiner(TOKEN_BYTES.__getitem__, hold_all_empty)


def test_tokens_inside_a_character_join_the_next_chunk():
    """"a€b" as tokens a, e2, 82, ac, b: the engine releases "€" with its last byte; the two
    tokens before it send nothing and ride along with it, probabilities in order."""
    pieces = [Piece("a", (1,), (lp(1, "a"),)), Piece("", (3,), (lp(3, ""),)),
              Piece("", (4,), (lp(4, ""),)), Piece("€", (5,), (lp(5, "€"),)),
              Piece("b", (2,), (lp(2, "b"),))]  # fmt: skip
    j = joiner()
    out = j.join(pieces[:2]) + j.join(pieces[2:3])  # the cut character spans two deltas
    assert [p.text for p in out] == ["a"] and j.holding
    out += j.join(pieces[3:])
    assert [(p.text, p.token_ids, p.num_decoded) for p in out] == [
        ("a", (1,), 1), ("€", (3, 4, 5), 4), ("b", (2,), 5)]  # fmt: skip
    assert [e.token_id for e in out[1].logprobs] == [3, 4, 5]
    assert not j.holding and j.flush() == []


def test_a_possible_stop_string_still_sends_an_empty_chunk():
    """llama-server sends "" for a token held back as a possible stop string (whole
    characters): only a cut character is held."""
    out = joiner().join([Piece("a", (1,)), Piece("", (6,)), Piece("Xb", (2,))])
    assert [(p.text, p.token_ids) for p in out] == [("a", (1,)), ("", (6,)), ("Xb", (2,))]


def test_coalesced_deltas_and_the_end_of_a_stream():
    """Without probabilities a piece is a whole delta of several tokens; one whose tokens end
    inside a character waits for the next. Tokens still held at the end go out in a last
    piece, so that no token is lost."""
    j = joiner()
    assert j.join([Piece("", (3, 4))]) == []
    (piece,) = j.join([Piece("€a", (5, 1))])
    assert (piece.text, piece.token_ids, piece.num_decoded) == ("€a", (3, 4, 5, 1), 4)
    assert j.join([Piece("", (3,))]) == []
    (last,) = j.flush()
    assert (last.text, last.token_ids, last.num_decoded) == ("", (3,), 5)


def test_chat_holds_every_empty_piece():
    """A chat stream sends only chunks that change the message (llama-server sends one per
    diff): a stop-string start is held too, and joins the next chunk with text."""
    out = joiner(hold_all_empty=True).join(
        [Piece("", (6,), (lp(6, ""),)), Piece("Xb", (2,), (lp(2, "Xb"),))]
    )
    assert [(p.text, p.token_ids) for p in out] == [("Xb", (6, 2))]
    assert [e.token_id for e in out[0].logprobs] == [6, 2]
