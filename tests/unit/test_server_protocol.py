"""Request parsing of `cacheflow serve` (pycacheflow/server/protocol.py): no engine (JSON schemas
go through the native library's converter, which needs no model)."""

from __future__ import annotations

import pytest

from pycacheflow.server.json_schema import json_object_grammar
from pycacheflow.server.protocol import (
    DEFAULT_TEMPERATURE,
    ProtocolError,
    parse_chat,
    parse_completion,
    read_mixed,
)


def completion(**body: object):
    return parse_completion({"prompt": "hi", **body}, default_n_predict=-1)


def test_defaults_follow_llama_server():
    req = completion()
    assert req.n_predict == -1 and not req.stream and req.priority == 0
    p = req.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed) == (DEFAULT_TEMPERATURE, 40, 0.95,
                                                                  0.05, None)  # fmt: skip


def test_n_predict_aliases_and_server_default():
    assert completion(max_tokens=7).n_predict == 7
    assert completion(max_tokens=7, n_predict=3).n_predict == 3  # n_predict wins
    assert completion(max_completion_tokens=5).n_predict == 5
    assert parse_completion({"prompt": "x"}, default_n_predict=12).n_predict == 12
    assert completion(n_predict=None).n_predict == -1  # null = absent
    assert completion(n_predict=16.0).n_predict == 16
    assert completion(n_predict=4).with_max_tokens(9).max_tokens == 9


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"n_predict": -2}, "Field 'n_predict'"),
        ({"n_predict": "3"}, "expected an integer, got string"),
        ({"n_predict": True}, "got boolean"),
        ({"n_predict": 2.5}, "expected an integer"),
        ({"temperature": [1]}, "Field 'temperature': expected a number"),
        ({"stream": "yes"}, "Field 'stream': expected a boolean"),
        ({"seed": -7}, "Field 'seed'"),
        ({"stop": [1]}, "Field 'stop'"),
        ({"n": 129}, "Field 'n': value must be between 1 and 128"),
        ({"n_probs": "5"}, "Field 'n_probs': expected an integer, got string"),
        ({"post_sampling_probs": 1}, "Field 'post_sampling_probs': expected a boolean"),
        ({"json_schema": {"type": "hiccup"}}, "(?s)json_schema: .*unrecognized type hiccup"),
        ({"json_schema": 123}, "(?s)json_schema: .*schema must be an object"),
        ({"grammar": 5}, "Field 'grammar'"),
        ({"echo": True}, "no echo"),
        ({"suffix": "x"}, "Unsupported param: suffix"),
        ({"stream_options": 1}, "stream_options"),
        ({"id_slot": "x"}, "Field 'id_slot': expected an integer, got string"),
        ({"id_slot": -2}, "Field 'id_slot'"),
    ],
)
def test_bad_fields_name_the_field(body, fragment):
    with pytest.raises(ProtocolError, match=fragment) as info:
        completion(**body)
    assert info.value.status == 400


def test_soft_limits_are_clamped():
    p = completion(top_p=3, min_p=-1, temperature=-2, top_k=-5).params
    assert (p.top_p, p.min_p, p.temperature, p.top_k) == (1.0, 0.0, 0.0, 0)


def test_prompt_shapes():
    assert completion(prompt="a").prompts == ("a",)
    assert completion(prompt=[1, 2, 3]).prompts == ([1, 2, 3],)
    assert completion(prompt=[1, "a", 2]).prompts == ([1, "a", 2],)  # one mixed prompt
    assert completion(prompt=["a", "b"]).prompts == ("a", "b")  # two prompts
    assert completion(prompt=[[1, 2], "b"]).prompts == ([1, 2], "b")
    assert completion(prompt={"prompt_string": "z"}).prompts == ("z",)
    for bad in ([], 5, [None], {"prompt_string": "z", "multimodal_data": ["x"]}):
        with pytest.raises(ProtocolError):
            completion(prompt=bad)
    with pytest.raises(ProtocolError, match='"prompt" is required'):
        parse_completion({}, -1)
    with pytest.raises(ProtocolError, match="an object prompt needs a 'prompt_string' field"):
        completion(prompt={"a": 1})
    with pytest.raises(ProtocolError, match="got null"):
        completion(prompt={"prompt_string": None})


def test_stop_seed_priority_and_ignored_options():
    req = completion(stop="END", seed=4294967295, priority=-3, n_keep=5, lora=None,
                     repeat_penalty=1.3)  # fmt: skip
    assert req.params.stop == ("END",) and req.params.seed is None and req.priority == -3
    assert req.ignored_fields == ("n_keep",)  # null is absent
    assert completion(id_slot=-1).ignored_fields == () and completion(id_slot=3).ignored_fields == ("id_slot",)
    assert req.params.repeat_penalty == 1.3  # implemented: llama.cpp's penalties sampler
    assert completion(seed=42).params.seed == 42


def test_llama_servers_other_samplers_are_read_not_ignored():
    req = completion(dry_multiplier=0.8, dry_base=2, dry_allowed_length=3, dry_penalty_last_n=32,
                     dry_sequence_breakers=["\n", "", "ab"], xtc_probability=0.5,
                     xtc_threshold=0.2, typical_p=0.9, mirostat=2, mirostat_tau=4,
                     mirostat_eta=0.2, dynatemp_range=0.5, dynatemp_exponent=2.0,
                     top_n_sigma=1.5, min_keep=3)  # fmt: skip
    assert req.ignored_fields == ()
    p = req.params
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (
        0.8, 2.0, 3, 32)  # fmt: skip
    assert p.dry_sequence_breakers == ("\n", "ab")  # empty breakers skipped, as llama.cpp does
    assert (p.xtc_probability, p.xtc_threshold, p.typical_p) == (0.5, 0.2, 0.9)
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta) == (2, 4.0, 0.2)
    assert (p.dynatemp_range, p.dynatemp_exponent, p.top_n_sigma, p.min_keep) == (0.5, 2.0, 1.5, 3)


def test_other_samplers_default_to_llama_servers():
    p = completion().params
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (
        0.0, 1.75, 2, 64)  # fmt: skip
    assert p.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (p.xtc_probability, p.xtc_threshold, p.typical_p, p.mirostat) == (0.0, 0.1, 1.0, 0)
    assert (p.mirostat_tau, p.mirostat_eta, p.dynatemp_range, p.dynatemp_exponent) == (
        5.0, 0.1, 0.0, 1.0)  # fmt: skip
    assert (p.top_n_sigma, p.min_keep) == (-1.0, 0)
    assert completion(dry_multiplier=None, mirostat=None).params == p  # null = absent


def test_other_samplers_soft_limits_and_dry_base():
    """As llama-server's server-schema.cpp: xtc_* clamped to [0, 1], mirostat to [0, 2]; a
    dry_base below 1 is the server's dry_base."""
    p = completion(xtc_probability=3, xtc_threshold=-1, mirostat=7).params
    assert (p.xtc_probability, p.xtc_threshold, p.mirostat) == (1.0, 0.0, 2)
    assert completion(mirostat=-3).params.mirostat == 0
    assert completion(dry_base=0.5).params.dry_base == 1.75
    from pycacheflow.server.config import RequestDefaults

    server = RequestDefaults(dry_base=3.0, dry_sequence_breakers=("q",), mirostat=1)
    p = parse_completion({"prompt": "x", "dry_base": 0.2}, -1, server).params
    assert (p.dry_base, p.dry_sequence_breakers, p.mirostat) == (3.0, ("q",), 1)
    # no limits where llama-server sets none
    p = completion(typical_p=-2, top_n_sigma=-5, dynatemp_range=-1, dry_multiplier=-0.5).params
    assert (p.typical_p, p.top_n_sigma, p.dynatemp_range, p.dry_multiplier) == (-2, -5, -1, -0.5)


# llama-server's words (server-schema.cpp's handler inside handle_with_catch)
BREAKERS_ERROR = ("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a "
                  "non-empty array of strings")  # fmt: skip


@pytest.mark.parametrize(
    "body,message",
    [
        ({"dry_sequence_breakers": []}, BREAKERS_ERROR),
        ({"dry_sequence_breakers": "\n"}, BREAKERS_ERROR),
        ({"dry_sequence_breakers": ["a", 1]}, BREAKERS_ERROR),
        ({"dry_allowed_length": -1}, "Field 'dry_allowed_length': value must be between 0 and "
         "2147483647, got -1"),
        ({"dry_penalty_last_n": -2}, "Field 'dry_penalty_last_n': value must be between -1 and "
         "2147483647, got -2"),
        ({"min_keep": -1}, "Field 'min_keep': value must be between 0 and 2147483647, got -1"),
        ({"mirostat": 1.5}, "Field 'mirostat': expected an integer, got 1.5"),
        ({"typical_p": "0.5"}, "Field 'typical_p': expected a number, got string"),
        ({"dry_multiplier": 1e400}, "Field 'dry_multiplier': must be finite, got inf"),
        ({"top_n_sigma": [1]}, "Field 'top_n_sigma': expected a number, got array"),
    ],
)  # fmt: skip
def test_other_samplers_bad_fields(body, message):
    with pytest.raises(ProtocolError) as info:
        completion(**body)
    assert str(info.value) == message and info.value.status == 400


def test_chat_reads_the_other_samplers_too():
    body = {"messages": [{"role": "user", "content": "hi"}], "dry_multiplier": 1.0,
            "xtc_probability": 0.4, "mirostat": 1, "top_n_sigma": 2.0}  # fmt: skip
    req = parse_chat(body)
    p = req.params
    assert (p.dry_multiplier, p.xtc_probability, p.mirostat, p.top_n_sigma) == (1.0, 0.4, 1, 2.0)
    assert req.ignored_fields == ()


def test_chat_messages():
    req = parse_chat(
        {
            "messages": [
                {"role": "system", "content": None},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                          "text": "b"}]},
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        default_n_predict=-1,
    )  # fmt: skip
    assert req.messages == ({"role": "system", "content": ""}, {"role": "user", "content": "ab"})
    assert req.stream and req.include_usage and req.prompts == ()
    for bad in ([], [{"content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}]):
        with pytest.raises(ProtocolError, match="messages"):
            parse_chat({"messages": bad}, -1)
    user = [{"role": "user", "content": "x"}]
    json_object = parse_chat({"messages": user, "response_format": {"type": "json_object"}})
    assert json_object.params.grammar == json_object_grammar()
    assert parse_completion({"prompt": "x", "grammar": 'root ::= "a"'}).params.grammar
    for bad, message in (({"type": "sound"}, "must be one of .*but got: sound"),
                         ("json", "response_format"),
                         ({"type": "json_object", "schema": {"type": 123}}, "must be a string"),
                         ({"type": "json_object", "schema": 123}, "schema must be an object")):
        with pytest.raises(ProtocolError, match=message):
            parse_chat({"messages": user, "response_format": bad})


def test_read_mixed():
    assert read_mixed({"content": "a"}, "content") == ["a"]
    assert read_mixed({"content": [1, "b"]}, "content") == [1, "b"]
    assert read_mixed({}, "content") == []
    with pytest.raises(ProtocolError, match="content"):
        read_mixed({"content": [1.5]}, "content")


@pytest.mark.parametrize(
    "parse,body,message",
    [
        (parse_completion, {"prompt": "a\ud800"}, ("Field 'prompt' is not valid UTF-8 text: "
         "lone surrogate U+D800 at character 1")),
        (parse_completion, {"prompt": ["ok", "\udcff"]}, "Field 'prompt[1]' is not valid UTF-8"),
        (parse_completion, {"prompt": [1, "\ud800"]}, "Field 'prompt' (piece 1) is not valid"),
        (parse_completion, {"prompt": "a", "stop": "\ud800"}, "stop string is not valid UTF-8"),
        (parse_chat, {"messages": [{"role": "user", "content": "\ud800"}]},
         "Field 'messages[0]'.content is not valid UTF-8"),
        (parse_chat, {"messages": [{"role": "\ud800", "content": "x"}]},
         "Field 'messages[0]'.role is not valid UTF-8"),
    ],
)  # fmt: skip
def test_text_without_a_utf8_form_is_a_400(parse, body, message):
    """JSON can spell lone surrogates ("\\ud800"); they have no UTF-8 form for the engine."""
    with pytest.raises(ProtocolError) as info:
        parse(body, -1)
    assert info.value.status == 400 and message in str(info.value)
    with pytest.raises(ProtocolError, match="Field 'content' is not valid UTF-8"):
        read_mixed({"content": ["a", "\ud800"]}, "content")


def test_server_defaults_apply_under_the_request():
    from pycacheflow.server.config import RequestDefaults

    defaults = RequestDefaults(temperature=0.0, seed=42, top_k=5, repeat_penalty=1.2)
    p = parse_completion({"prompt": "x"}, -1, defaults).params
    assert (p.temperature, p.seed, p.top_k, p.repeat_penalty) == (0.0, 42, 5, 1.2)
    p = parse_completion({"prompt": "x", "seed": 7, "temperature": None}, -1, defaults).params
    assert (p.seed, p.temperature) == (7, 0.0)  # null = not set: the server's default


def test_logit_bias_shapes():
    read = lambda value: parse_completion({"prompt": "x", "logit_bias": value}).logit_bias  # noqa: E731
    assert read([[5, -1], [" a", False], ["bad"], [3, "x"]]) == ((5, -1.0), (" a", float("-inf")))
    assert read({"12": 2, "hi": False}) == ((12, 2.0), ("hi", float("-inf")))
    with pytest.raises(ProtocolError, match="logit_bias"):
        read("nope")


def test_logit_bias_keys_and_biases_as_llama_server_reads_them():
    def read(value: object) -> tuple:
        return parse_completion({"prompt": "x", "logit_bias": value}).logit_bias

    # object keys: an id when strtol reads all of the key, else a text to tokenize
    keys = {" 7": 1, "+8": 1, "-1": 1, "9 ": 1, "1_0": 1, "\u0663": 1, "": 1, "0x5": 1}
    assert [k for k, _ in read(keys)] == [7, 8, -1, "9 ", "1_0", "\u0663", "", "0x5"]
    # array keys: integers are ids, strings always texts; floats, bools, others skipped
    assert read([[5.0, 1], [True, 1], [" 7", 1], [None, 1]]) == ((" 7", 1.0),)
    # biases: numbers, false = ban; true, strings, null skipped; -inf (-1e400) also bans
    assert read([[1, True], [2, "1"], [3, None], [4, -1e400]]) == ((4, float("-inf")),)
    for bad in (float("inf"), float("nan")):  # JSON 1e400 overflows to inf
        with pytest.raises(ProtocolError, match="Field 'logit_bias': a bias must be a finite"):
            read({"5": bad})


def test_chat_options():
    request = parse_chat({"messages": [{"role": "user", "content": "x"}],
                          "tools": [{"type": "function"}], "chat_template_kwargs": {"a": 1},
                          "add_generation_prompt": False, "continue_final_message": True})  # fmt: skip
    assert request.tools == ({"type": "function"},) and request.template_kwargs == {"a": 1}
    assert request.continue_final_message is True and not request.add_generation_prompt
    with pytest.raises(ProtocolError, match="Cannot set both"):
        parse_chat({"messages": [{"role": "user", "content": "x"}],
                    "continue_final_message": True})  # fmt: skip


def test_json_schemas_become_grammars_with_llama_cpps_converter():
    from pycacheflow._native import json_schema_to_grammar

    user = [{"role": "user", "content": "x"}]
    const = json_schema_to_grammar('{"const": "42"}')
    assert 'root ::= "\\"42\\""' in const
    # /completion and /v1/completions: json_schema, unless a grammar is given
    assert parse_completion({"prompt": "x", "json_schema": {"const": "42"}}).params.grammar == const
    both = {"prompt": "x", "json_schema": {"const": "42"}, "grammar": 'root ::= "a"'}
    assert parse_completion(both).params.grammar == 'root ::= "a"'
    # chat: json_schema, response_format json_object with a schema, json_schema wrapper
    for fields in ({"json_schema": {"const": "42"}},
                   {"response_format": {"type": "json_object", "schema": {"const": "42"}}},
                   {"response_format": {"type": "json_schema",
                                        "json_schema": {"schema": {"const": "42"}}}}):  # fmt: skip
        assert parse_chat({"messages": user, **fields}).params.grammar == const
    # an empty schema is any object; "text" is no grammar
    any_object = parse_chat({"messages": user, "json_schema": {}}).params.grammar
    assert any_object == json_object_grammar() == json_schema_to_grammar('{"type": "object"}')
    assert parse_chat({"messages": user, "response_format": {"type": "text"}}).params.grammar == ""
    with pytest.raises(ProtocolError, match="Cannot use both json_schema and grammar"):
        parse_chat({"messages": user, "json_schema": {}, "grammar": 'root ::= "a"'})


@pytest.mark.parametrize(
    "messages,fragment",
    [
        ([{"role": "user"}], r"messages\[0\]'?: all non-assistant messages must contain 'content'"),
        ([{"role": "user", "content": "a"}, {}], r"messages\[1\].*must contain 'content'"),
        ([{"role": "assistant"}], "must contain either 'content' or 'tool_calls'"),
        ([{"content": "a"}], "'role' must be a non-empty string"),
        ([{"role": 123, "content": "a"}], "'role' must be a non-empty string"),
        ([{"role": "system", "content": 123}], "'content' must be a string or an array"),
        ([{"role": "user", "content": [{"text": "a"}]}], r"content\[0\].*'type'"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "unsupported content part"),
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], r"content\[0\]\.text"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}], "tool call type"),
        ([{"role": "assistant", "tool_calls": [{"type": "x"}]}], "unsupported tool call type"),
        ([{"role": "assistant", "tool_calls": [{"type": "function"}]}], "tool call function"),
        ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}],
         "tool call name"),  # fmt: skip
        ([{"role": "assistant", "tool_calls": {}}], "tool_calls"),
    ],
)
def test_malformed_messages_are_rejected_as_llama_server_does(messages, fragment):
    with pytest.raises(ProtocolError, match=fragment) as info:
        parse_chat({"messages": messages})
    assert info.value.status == 400


def test_messages_llama_server_accepts():
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    ok = [{"role": "system", "content": None},  # a null content is present, and empty
          {"role": "user", "content": [{"type": "text", "text": "a"},
                                       {"type": "text", "text": "b"}]},
          {"role": "assistant", "tool_calls": [call]},  # no content: tool calls instead
          {"role": "tool", "content": "42", "tool_call_id": "1"}]  # fmt: skip
    messages = parse_chat({"messages": ok}).messages
    assert [m["content"] for m in messages] == ["", "ab", "", "42"]
    assert messages[2]["tool_calls"] == [call] and messages[3]["tool_call_id"] == "1"
