"""Token probabilities in the HTTP API (pycacheflow/server/logprobs.py and the streamers' split
into one chunk per token): request fields and llama-server's JSON shapes. No engine."""

from __future__ import annotations

import math

import pytest

from pycacheflow.outputs import StreamDelta, TokenLogprobs
from pycacheflow.server.logprobs import TokenPieces, _valid_utf8_prefix, probs_json
from pycacheflow.server.pieces import Piece, delta_pieces
from pycacheflow.server.protocol import ProtocolError, parse_chat, parse_completion

MESSAGES = [{"role": "user", "content": "hi"}]


def completion(**body: object):
    return parse_completion({"prompt": "hi", **body}).params


def chat(**body: object):
    return parse_chat({"messages": MESSAGES, **body}).params


def test_completion_n_probs_and_its_openai_alias():
    assert completion().logprobs is None
    assert completion(n_probs=0).logprobs is None  # llama-server: 0 = none
    assert completion(n_probs=5).logprobs == 5
    assert completion(logprobs=3).logprobs == 3  # /v1/completions' integer logprobs
    assert completion(n_probs=2, logprobs=7).logprobs == 2  # n_probs wins
    p = completion(n_probs=4, post_sampling_probs=True)
    assert p.logprobs == 4 and p.post_sampling_probs
    # as llama-server: 0 asks for none, booleans count 0 / 1
    assert completion(logprobs=False).logprobs is None
    assert completion(logprobs=True).logprobs == 1 and completion(n_probs=True).logprobs == 1
    assert completion(n_probs=None, logprobs=6).logprobs == 6  # null = not set
    assert completion(n_probs=20).logprobs == 20  # MAX_LOGPROBS, OpenAI's and vLLM's cap
    for bad, fragment in ((2.5, "expected an integer, got 2.5"), ("3", "expected an integer"),
                          (2**31, "value must be between"),
                          (21, "value must be at most 20 \\(token probabilities per position\\), "
                               "got 21"),
                          (100_000, "value must be at most 20")):  # fmt: skip
        with pytest.raises(ProtocolError, match=f"Field 'n_probs': {fragment}"):
            completion(n_probs=bad)
    for name in ("n_probs", "logprobs"):  # were 200 with no probabilities, as llama-server
        with pytest.raises(ProtocolError) as info:
            completion(**{name: -1})
        assert str(info.value) == (f"Field '{name}': value must be at least 0 (token "
                                   "probabilities per position; 0 = none), got -1")  # fmt: skip
        assert info.value.status == 400
    with pytest.raises(ProtocolError, match="Field 'logprobs': value must be at most 20") as info:
        completion(logprobs=10**6)  # the review's request: it got the whole vocabulary per token
    assert info.value.status == 400


def test_chat_logprobs_and_top_logprobs():
    assert chat().logprobs is None
    assert chat(logprobs=False).logprobs is None
    assert chat(logprobs=True).logprobs == 20  # llama-server's default top_logprobs
    assert chat(logprobs=True, top_logprobs=3).logprobs == 3
    assert chat(logprobs=True, top_logprobs=0).logprobs == 0  # the sampled token's only
    assert chat(logprobs=True, top_logprobs=20).logprobs == 20  # OpenAI's cap, MAX_LOGPROBS


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"logprobs": 3}, "Field 'logprobs': expected a boolean, got number"),
        ({"logprobs": True, "top_logprobs": 21},
         "Field 'top_logprobs': value must be between 0 and 20, got 21"),  # as OpenAI
        ({"logprobs": True, "top_logprobs": 2**31},
         "Field 'top_logprobs': value must be between 0 and 20"),
        ({"logprobs": True, "top_logprobs": -1}, "Field 'top_logprobs'"),
        ({"logprobs": True, "top_logprobs": "5"}, "Field 'top_logprobs': expected an integer"),
        ({"top_logprobs": 5}, "top_logprobs requires logprobs to be set to true"),
        ({"logprobs": True, "stream": True, "tools": [{"type": "function"}]},
         "logprobs is not supported with tools \\+ stream"),
    ],
)  # fmt: skip
def test_bad_chat_logprobs_are_400(body, fragment):
    with pytest.raises(ProtocolError, match=fragment) as info:
        chat(**body)
    assert info.value.status == 400


def test_a_cut_multibyte_character_is_left_out_of_the_token_text():
    assert _valid_utf8_prefix(b"ab") == b"ab"
    assert _valid_utf8_prefix("é".encode()) == "é".encode()
    assert _valid_utf8_prefix(b"a\xe2\x82") == b"a"  # 2 of the 3 bytes of "€"
    assert _valid_utf8_prefix(b"\xf0\x9f") == b""


class FakeLLM:
    """token_piece of a three-token vocabulary: 7 = " the", 8 = the first byte of "é", 9 = EOS."""

    def token_piece(self, token_id: int, special: bool = True) -> bytes:
        return {7: b" the", 8: b"\xc3", 9: b"</s>" if special else b""}[token_id]


def test_probs_json_has_llama_servers_shape():
    entries = [TokenLogprobs(7, -0.5, ((7, -0.5), (8, -1.5)), " the"), TokenLogprobs(9, -2.0, ())]
    out = probs_json(entries, False, TokenPieces(FakeLLM()))
    assert out[0] == {
        "id": 7, "token": " the", "bytes": list(b" the"), "logprob": -0.5,
        "top_logprobs": [
            {"id": 7, "token": " the", "bytes": list(b" the"), "logprob": -0.5},
            {"id": 8, "token": "", "bytes": [0xC3], "logprob": -1.5},
        ],
    }  # fmt: skip
    assert out[1]["token"] == "" and out[1]["top_logprobs"] == []  # special tokens as nothing


def test_post_sampling_probs_are_probabilities():
    out = probs_json([TokenLogprobs(7, math.log(0.25), ((7, math.log(0.25)),))], True,
                     TokenPieces(FakeLLM()))  # fmt: skip
    assert set(out[0]) == {"id", "token", "bytes", "prob", "top_probs"}
    assert out[0]["prob"] == pytest.approx(0.25)
    assert out[0]["top_probs"][0]["prob"] == pytest.approx(0.25)


def test_a_delta_with_probabilities_streams_one_chunk_per_token():
    lps = (TokenLogprobs(7, -0.1, (), " the"), TokenLogprobs(8, -0.2, (), ""),
           TokenLogprobs(9, -0.3, (), "é"))  # fmt: skip
    delta = StreamDelta(1, " theé!", (7, 8, 9), logprobs=lps)  # "!": flushed by a final event
    pieces = delta_pieces(delta)
    assert pieces == [Piece(" the", (7,), lps[:1]), Piece("", (8,), lps[1:2]),
                      Piece("é", (9,), lps[2:]), Piece("!", ())]  # fmt: skip
    plain = StreamDelta(1, "abc", (1, 2))
    assert delta_pieces(plain) == [Piece("abc", (1, 2))]
