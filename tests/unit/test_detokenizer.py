"""Incremental detokenization (split UTF-8, space-stripping tokenizers) and stop strings."""

from __future__ import annotations

import pytest

from pycacheflow.detokenizer import IncrementalDetokenizer, StopStringMatcher, truncate_at_stop

# A fake byte-level vocabulary: "é" (c3 a9) and "😀" (f0 9f 98 80) are split over tokens.
VOCAB = {
    0: b"Hello",
    1: b" w",
    2: b"orld",
    3: b"\xc3",
    4: b"\xa9",
    5: b"\xf0\x9f",
    6: b"\x98",
    7: b"\x80",
    8: b"!",
    9: b" ",
    10: b"\xff",
}


def detok(ids):
    return b"".join(VOCAB[i] for i in ids)


def detok_strip_first_space(ids):
    """Like SentencePiece tokenizers in llama.cpp: the first token loses its leading space."""
    data = detok(ids)
    return data[1:] if ids and VOCAB[ids[0]].startswith(b" ") else data


def stream_all(detokenize, ids, step=1):
    d = IncrementalDetokenizer(detokenize)
    pieces = [d.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    return pieces, d.flush()


@pytest.mark.parametrize("step", [1, 2, 3])
def test_pieces_concatenate_to_full_text(step):
    ids = [0, 1, 2, 9, 3, 4, 5, 6, 7, 8]
    pieces, tail = stream_all(detok, ids, step)
    assert "".join(pieces) + tail == "Hello world é😀!"


def test_split_character_is_held_back_until_complete():
    pieces, tail = stream_all(detok, [9, 3, 4, 5, 6, 7])
    assert pieces == [" ", "", "é", "", "", "😀"] and tail == ""


def test_incomplete_character_at_the_end_is_replaced_on_flush():
    pieces, tail = stream_all(detok, [0, 5])
    assert pieces == ["Hello", ""] and tail == "\ufffd"


def test_invalid_byte_does_not_block_the_stream():
    pieces, tail = stream_all(detok, [10, 8])
    assert "".join(pieces) + tail == "\ufffd!"


def test_space_stripping_tokenizer():
    ids = [1, 2, 1, 2]
    pieces, tail = stream_all(detok_strip_first_space, ids)
    assert "".join(pieces) + tail == detok_strip_first_space(ids).decode() == "world world"


def matcher_run(stop, pieces):
    m = StopStringMatcher(stop)
    out = [m.push(p) for p in pieces]
    return out, m.flush(), m


def test_no_stop_strings_pass_through():
    out, tail, m = matcher_run([], ["a", "b"])
    assert out == ["a", "b"] and tail == "" and not m.stopped


def test_stop_string_split_over_pieces_is_never_streamed():
    out, tail, m = matcher_run(["STOP"], ["ab S", "TO", "P tail"])
    assert out == ["ab ", "", ""] and tail == ""
    assert m.stopped and m.stop_string == "STOP" and m.text == "ab "


def test_held_back_prefix_released_when_it_does_not_complete():
    out, tail, m = matcher_run(["STOP"], ["ab S", "TX", "yz"])
    assert "".join(out) == "ab STXyz" and out[0] == "ab " and not m.stopped


def test_held_back_tail_released_on_flush():
    out, tail, _ = matcher_run(["STOP"], ["ab ST"])
    assert out == ["ab "] and tail == "ST"


def test_earliest_of_several_stop_strings_wins():
    out, tail, m = matcher_run(["world", "lo w"], ["Hello world"])
    assert out == ["Hel"] and m.stop_string == "lo w"


def test_stop_string_inside_one_piece():
    out, _, m = matcher_run(["\n\n"], ["one\n\ntwo"])
    assert out == ["one"] and m.text == "one"


def test_nothing_after_stop():
    m = StopStringMatcher(["x"])
    assert m.push("axb") == "a" and m.push("more") == "" and m.flush() == ""


def test_truncate_at_stop():
    assert truncate_at_stop("Hello world", ["o w", "ld"]) == ("Hell", True)
    assert truncate_at_stop("Hello", ["z"]) == ("Hello", False)
    assert truncate_at_stop("Hello", []) == ("Hello", False)
