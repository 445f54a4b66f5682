"""Text in and out of the engine: tokenizer round trips, stop strings and ids, streaming."""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams

pytestmark = pytest.mark.e2e

ROUND_TRIP_TEXTS = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "line one\nline two\ttabbed\r\n",
    "héllo wörld, ça va? naïve façade",
    "日本語のテキストと中文",
    "emoji: 🦙🚀👩‍💻 and flags 🇫🇷",
    "math: ∑ x² ≤ ∞ — done…",
]


def greedy(max_tokens: int, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kwargs)


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenize_round_trip(text, tiny_llm):
    token_ids = tiny_llm.tokenize(text)
    assert token_ids and all(0 <= t < tiny_llm.info.n_vocab for t in token_ids)
    assert tiny_llm.detokenize(token_ids) == text
    assert tiny_llm.detokenize(tiny_llm.tokenize(text, add_special=False)) == text


def test_tiny_model_tokenizes_like_the_real_one(tiny_llm, real_llm):
    for text in ROUND_TRIP_TEXTS + ["<|im_start|>user\nHi<|im_end|>"]:
        assert tiny_llm.tokenize(text) == real_llm.tokenize(text)
    assert tiny_llm.info.n_vocab == real_llm.info.n_vocab
    assert (tiny_llm.info.token_bos, tiny_llm.info.token_eos) == (
        real_llm.info.token_bos, real_llm.info.token_eos)


def test_special_tokens_parse_and_render(tiny_llm):
    text = "<|im_start|>user"
    special = tiny_llm.tokenize(text, add_special=False, parse_special=True)
    plain = tiny_llm.tokenize(text, add_special=False, parse_special=False)
    assert special[0] == tiny_llm.info.token_bos  # SmolLM2: BOS is <|im_start|>
    assert len(plain) > len(special)
    assert tiny_llm.detokenize(special, skip_special=False) == text
    assert tiny_llm.detokenize(plain) == text
    assert tiny_llm.detokenize(special, skip_special=True) == "user"


def first_fresh_piece(llm, token_ids, start: int) -> tuple[int, str]:
    """(k, piece): the first k >= start whose token text is >= 2 visible chars not seen before."""
    text_so_far = llm.detokenize(token_ids[:start])
    for k in range(start, len(token_ids)):
        piece = llm.detokenize([token_ids[k]])
        usable = len(piece.strip()) >= 2 and piece.isprintable() and "\ufffd" not in piece
        if usable and piece not in text_so_far:
            return k, piece
        text_so_far = llm.detokenize(token_ids[: k + 1])
    raise AssertionError(f"no usable stop piece in {token_ids}")


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_stop_string_truncates_text(model, request):
    llm = request.getfixturevalue(f"{model}_llm")
    prompt = "Write a short story about a robot:"
    full = llm.generate([prompt], greedy(32))[0]
    k, piece = first_fresh_piece(llm, list(full.token_ids), start=4)
    out = llm.generate([prompt], greedy(32, stop=[piece]))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(piece)]
    assert piece not in out.text
    # Generation is the same up to the stop; it may run a few tokens past the stop's start.
    assert k < len(out.token_ids) < 32
    assert out.token_ids == full.token_ids[: len(out.token_ids)]


def straddling_stop(llm, token_ids, start: int) -> str:
    """A stop string made of the end of one token's text and the start of the next one's."""
    for k in range(start, len(token_ids) - 1):
        left, right = llm.detokenize([token_ids[k]]), llm.detokenize([token_ids[k + 1]])
        joined = left + right
        if len(left) >= 2 and len(right) >= 2 and joined.isprintable() and "\ufffd" not in joined:
            return left[-2:] + right[:2]
    raise AssertionError(f"no two printable neighbouring tokens in {token_ids}")


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_stop_string_spanning_two_tokens(how, tiny_llm):
    prompt = "A stop string across a token boundary"
    full = tiny_llm.generate([prompt], greedy(32))[0]
    stop = straddling_stop(tiny_llm, list(full.token_ids), start=3)
    params = greedy(32, stop=[stop])
    if how == "generate":
        out = tiny_llm.generate([prompt], params)[0]
        assert out.finish_reason == "stop" and len(out.token_ids) < 32
        text = out.text
    else:
        text = "".join(tiny_llm.stream(prompt, params))
    assert text == full.text[: full.text.index(stop)]


def test_earliest_of_several_stop_strings_wins(tiny_llm):
    prompt = "Several stop strings"
    full = tiny_llm.generate([prompt], greedy(32))[0]
    k1, early = first_fresh_piece(tiny_llm, list(full.token_ids), start=3)
    _, late = first_fresh_piece(tiny_llm, list(full.token_ids), start=k1 + 2)
    out = tiny_llm.generate([prompt], greedy(32, stop=[late, early]))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(early)]


def test_stop_token_id_ends_generation(tiny_llm):
    prompt = "Stop on a token"
    full = list(tiny_llm.generate([prompt], greedy(32))[0].token_ids)
    k = next(k for k in range(5, 32) if full[k] not in full[:k])
    out = tiny_llm.generate([prompt], greedy(32, stop_token_ids=[full[k]]))[0]
    assert out.finish_reason == "stop"
    assert list(out.token_ids) == full[: k + 1]  # the stop token is kept
    assert out.text == tiny_llm.detokenize(full[: k + 1])


def test_eos_stops_unless_ignored(real_llm):
    eos = real_llm.info.token_eos
    prompt = "Answer with one word only: what color is the sky?"
    out = real_llm.generate([prompt], SamplingParams(max_tokens=48), use_chat_template=True)[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == eos
    assert "<|im_end|>" not in out.text and out.text.strip()
    ignored = real_llm.generate([prompt], greedy(48), use_chat_template=True)[0]
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 48
    # Same tokens up to the EOS (whether ignore_eos may still sample EOS is not specified).
    assert ignored.token_ids[: len(out.token_ids) - 1] == out.token_ids[:-1]


@pytest.mark.parametrize(
    ("model", "prompt"),
    [
        ("tiny", "Stream this please"),
        ("tiny", "日本語 🦙"),  # random tokens: pieces of multi-byte characters get split
        ("real", "Reply with three emoji and their names:"),
    ],
)
def test_stream_pieces_concatenate_to_generate_text(model, prompt, request):
    llm = request.getfixturevalue(f"{model}_llm")
    params = greedy(40)
    pieces = list(llm.stream(prompt, params))
    expected = llm.generate([prompt], params)[0].text
    assert "".join(pieces) == expected
    assert all(pieces)  # stream() yields no empty pieces


def test_stream_stops_before_stop_string(tiny_llm):
    prompt = "Streaming with a stop string"
    full = tiny_llm.generate([prompt], greedy(32))[0]
    _, piece = first_fresh_piece(tiny_llm, list(full.token_ids), start=4)
    params = greedy(32, stop=[piece])
    streamed = "".join(tiny_llm.stream(prompt, params))
    assert streamed == tiny_llm.generate([prompt], params)[0].text
    assert streamed == full.text[: full.text.index(piece)]


def test_token_id_prompts_match_text_prompts(tiny_llm):
    prompt = "Token ids or text"
    params = greedy(12)
    by_text = tiny_llm.generate([prompt], params)[0]
    by_ids = tiny_llm.generate([tiny_llm.tokenize(prompt)], params)[0]
    assert by_ids.token_ids == by_text.token_ids
    assert by_ids.prompt is None and by_ids.prompt_token_ids == by_text.prompt_token_ids
