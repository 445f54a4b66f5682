"""Every bad input gets its own error, with a message that names what was wrong.

Python validates prompts before submitting them (LLM._validate_tokens); the native engine checks
the same things again (cf_engine_add_request). Both layers are tested: the second by driving
pycacheflow._native.Engine directly with values the Python layer would have refused.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import pytest

from pycacheflow import EngineConfig, SamplingParams
from pycacheflow.errors import (
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    OutOfMemoryError,
    PromptTooLongError,
    ShutdownError,
)

pytestmark = pytest.mark.e2e

# Small context: llama.cpp pads each sequence's context to a multiple of 256 tokens, so this
# gives 2 sequences of 256 tokens; "too long" stays cheap to build.
SMALL_CTX = {"max_num_seqs": 2, "n_ctx": 2 * 128}


def greedy(max_tokens: int, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kwargs)


# ---------------------------------------------------------------------------- model files


def test_missing_model_file(tmp_path, make_llm):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(ModelLoadError, match="no-such-model.gguf") as info:
        make_llm(missing)
    assert str(missing) in str(info.value)


@pytest.mark.parametrize(
    "kind", ["garbage", "empty", "truncated", "bad-magic"],
)
def test_corrupt_model_file(kind, tmp_path, tiny_model_path, make_llm):
    path = tmp_path / f"corrupt-{kind}.gguf"
    good = tiny_model_path.read_bytes()
    if kind == "garbage":
        path.write_bytes(bytes(range(256)) * 64)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":  # valid header and metadata, tensor data cut short
        path.write_bytes(good[: len(good) // 2])
    else:
        path.write_bytes(b"GGUX" + good[4:])
    with pytest.raises(ModelLoadError) as info:
        make_llm(path)
    assert str(path) in str(info.value)


def test_directory_as_model(tmp_path, make_llm):
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        make_llm(tmp_path)


@pytest.mark.parametrize("kv_mode", ["paged", "stock"])
def test_kv_cache_beyond_memory_is_out_of_memory(kv_mode, real_model_path, make_llm):
    """2**31 - 1 rows of 23 KiB (46 TiB): OutOfMemoryError naming the size and what to lower
    (the paged mode raised UnsupportedError)."""
    with pytest.raises(OutOfMemoryError) as info:
        make_llm(real_model_path, n_ctx=2**31 - 1, max_num_seqs=2, kv_mode=kv_mode)
    message = str(info.value)
    assert "the KV cache of 2147483647 tokens alone needs 46080.0 GiB" in message
    assert "lower n_ctx or kv_cache_bytes" in message


def test_bad_engine_config_names_the_field(tiny_model_path, make_llm):
    with pytest.raises(ValueError, match="kv_mode"):
        make_llm(tiny_model_path, kv_mode="bogus")
    with pytest.raises(ValueError, match="max_num_seqs"):
        make_llm(tiny_model_path, max_num_seqs=0)


# The engine owns these ranges and rules (EngineConfig checks only types and C widths): its message
# comes back as is, as an InvalidArgumentError (a ValueError), before the model is loaded.
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_ctx": -1}, "n_ctx must be >= 0, got -1"),
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1, got 0"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be >= 1, got 0"),
        ({"n_threads": -2}, "n_threads must be in [0, 512], got -2"),
        ({"n_threads": 100000}, "n_threads must be in [0, 512], got 100000"),
        ({"n_gpu_layers": -2}, "n_gpu_layers must be >= -1, got -2"),
        ({"block_size": 0}, "block_size must be >= 1, got 0"),
        ({"profile_capacity": -1}, "profile_capacity must be >= 0, got -1"),
        ({"sampling_threads": -1}, "sampling_threads must be in [0, 64], got -1"),
        ({"sampling_threads": 65}, "sampling_threads must be in [0, 64], got 65"),
        ({"kv_cache_bytes": -1}, "kv_cache_bytes must be >= 0, got -1"),
        ({"max_num_batched_tokens": 4}, "max_num_batched_tokens (4) must be at least max_num_seqs (16)"),
        ({"n_ctx": 512, "kv_cache_bytes": 2**20}, "set n_ctx or kv_cache_bytes, not both"),
    ],
)
def test_engine_config_ranges_come_from_the_engine(kwargs, message, tmp_path, make_llm):
    not_a_model = tmp_path / "m.gguf"  # never opened: the config is checked first
    not_a_model.write_bytes(b"GGUF")
    with pytest.raises(InvalidArgumentError) as info:
        make_llm(not_a_model, **kwargs)
    assert message in str(info.value)


# ---------------------------------------------------------------------------- prompts


def test_a_rounded_n_ctx_is_logged(tiny_model_path, make_llm, caplog):
    caplog.set_level(logging.WARNING, logger="pycacheflow.llm")
    llm = make_llm(tiny_model_path, n_ctx=800, max_num_seqs=2)
    assert llm.info.n_ctx == 1024
    assert "n_ctx 800 rounded to 1024 tokens of KV cache" in caplog.text
    caplog.clear()
    make_llm(tiny_model_path, n_ctx=1024, max_num_seqs=2)
    assert "rounded" not in caplog.text


def test_prompt_length_limits(tiny_model_path, make_llm):
    llm = make_llm(tiny_model_path, **SMALL_CTX)
    limit = llm.info.n_ctx_per_seq
    assert limit == 256  # 128 requested, padded by llama.cpp
    with pytest.raises(PromptTooLongError, match=str(limit)):
        llm.generate([[100] * limit], greedy(4))
    # The longest prompt that fits leaves room for exactly one token.
    out = llm.generate([[100] * (limit - 1)], greedy(4))[0]
    assert (len(out.token_ids), out.finish_reason) == (1, "length")
    # A sequence that fills its context stops with "length" before max_tokens.
    out = llm.generate([[100] * (limit - 10)], greedy(50))[0]
    assert (len(out.token_ids), out.finish_reason) == (10, "length")


def test_too_long_prompt_does_not_disturb_a_running_request(tiny_model_path, make_llm):
    llm = make_llm(tiny_model_path, **SMALL_CTX)
    expected = llm.generate(["A valid request"], greedy(40))[0]
    request_id = llm.add_request("A valid request", greedy(40))
    too_long = "word " * 400
    with pytest.raises(PromptTooLongError):
        llm.generate([too_long], greedy(4))
    with pytest.raises(PromptTooLongError):
        llm.add_request(too_long, greedy(4))
    # A batch with one bad prompt is refused whole, before anything is submitted.
    with pytest.raises(PromptTooLongError, match=r"prompts\[1\]"):
        llm.generate(["fine", too_long], greedy(4))
    out = list(llm.iter_outputs(request_id))[-1].output
    assert out.token_ids == expected.token_ids and out.finish_reason == "length"


@pytest.mark.parametrize("prompt", ["", []], ids=["empty-text", "empty-ids"])
def test_empty_prompt(prompt, tiny_llm):
    with pytest.raises(InvalidArgumentError, match="empty"):
        tiny_llm.generate([prompt], greedy(4))


def test_token_id_out_of_range(tiny_llm):
    n_vocab = tiny_llm.info.n_vocab
    with pytest.raises(InvalidArgumentError, match=str(n_vocab)):
        tiny_llm.generate([[1, 2, n_vocab]], greedy(4))
    with pytest.raises(InvalidArgumentError, match="-1"):
        tiny_llm.generate([[1, -1]], greedy(4))


def test_single_prompt_calls_name_the_prompt_and_check_the_priority(tiny_llm):
    """add_request / add_choices take one prompt: their errors say "prompt", not prompts[0];
    a priority that is not an int32 is refused before anything is submitted."""
    limit = tiny_llm.info.n_ctx_per_seq
    with pytest.raises(PromptTooLongError, match=rf"^prompt has {limit} tokens"):
        tiny_llm.add_request([1] * limit, greedy(4))
    with pytest.raises(InvalidArgumentError, match=r"^prompt: token id -1 out of range"):
        tiny_llm.add_choices([1, -1], [greedy(4), greedy(4)])
    with pytest.raises(TypeError, match=r"priority must be an int, got 1\.5"):
        tiny_llm.add_request([1, 2], greedy(4), priority=1.5)
    with pytest.raises(TypeError, match="priority must be an int"):
        tiny_llm.add_request([1, 2], greedy(4), priority=True)
    with pytest.raises(InvalidArgumentError, match=r"priority 1099511627776 is out of range"):
        tiny_llm.add_choices([1, 2], [greedy(4)], priority=2**40)
    assert tiny_llm.stats().num_waiting == 0 and tiny_llm.stats().num_running == 0


def test_text_without_a_utf8_form(tiny_llm, tiny_model_path, tmp_path, make_llm):
    """Lone surrogates (undecodable bytes escaped by surrogateescape, or "\\ud800" in JSON) are
    an InvalidArgumentError naming the value, not a UnicodeEncodeError from deep inside."""
    undecodable = b"caf\xe9".decode("utf-8", errors="surrogateescape")
    with pytest.raises(InvalidArgumentError, match=r"prompts\[1\] is not valid UTF-8 text: "
                       "undecodable byte 0xe9 at character 3"):  # fmt: skip
        tiny_llm.generate(["fine", undecodable], greedy(2))
    with pytest.raises(InvalidArgumentError, match="lone surrogate U\\+D800"):
        tiny_llm.tokenize("\ud800")
    with pytest.raises(InvalidArgumentError, match="chat message is not valid UTF-8"):
        tiny_llm.apply_chat_template([{"role": "user", "content": "\ud800"}])
    # A file name that is not UTF-8 is a valid path all the same.
    path = tmp_path / os.fsdecode(b"tiny-\xff.gguf")
    path.write_bytes(tiny_model_path.read_bytes())
    assert make_llm(path, **SMALL_CTX).generate(["hi"], greedy(2))[0].finish_reason == "length"


def test_bad_prompt_types(tiny_llm):
    with pytest.raises(TypeError):
        tiny_llm.generate([1, 2, 3], greedy(4))
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        tiny_llm.generate(["a"], [greedy(1), greedy(2)])


# ---------------------------------------------------------------------------- sampling values
# SamplingParams itself (ValueError naming the field): tests/unit/test_sampling_params.py.


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 0), ("temperature", -1.0), ("top_k", -2), ("top_p", 1.5), ("min_p", 2.0)],
)
def test_native_rejects_invalid_sampling_value(field, value, tiny_model_path):
    from pycacheflow._native import Engine

    params = SamplingParams()
    object.__setattr__(params, field, value)  # bypass Python validation on purpose
    with Engine(EngineConfig(model=tiny_model_path, **SMALL_CTX)) as engine:
        with pytest.raises(InvalidArgumentError, match=field):
            engine.add_request([1, 2, 3], params)
        assert not engine.has_work()  # a failed call queues nothing


def test_native_rejects_bad_prompts(tiny_model_path):
    from pycacheflow._native import Engine

    with Engine(EngineConfig(model=tiny_model_path, **SMALL_CTX)) as engine:
        limit = engine.info().n_ctx_per_seq
        n_vocab = engine.info().n_vocab
        with pytest.raises(PromptTooLongError):
            engine.add_request([5] * limit, greedy(1))
        with pytest.raises(InvalidArgumentError):
            engine.add_request([], greedy(1))
        with pytest.raises(InvalidArgumentError):
            engine.add_request([5, n_vocab], greedy(1))
        assert not engine.has_work()
        with pytest.raises(NotFoundError):
            engine.abort(12345)
        # The engine still works after the refusals (stepped synchronously, no step thread).
        request_id = engine.add_request([5] * (limit - 1), greedy(4))
        while engine.has_work():
            engine.step()
        events = [e for e in engine.drain() if e.request_id == request_id]
        assert [e.finish_reason for e in events][-1] == 2  # CF_FINISH_REASON_LENGTH
        assert sum(e.token_id >= 0 for e in events) == 1


def test_closed_llm_refuses_requests(tiny_model_path, make_llm):
    llm = make_llm(tiny_model_path, **SMALL_CTX)
    llm.close()
    with pytest.raises(ShutdownError):
        llm.generate(["too late"], greedy(2))
    llm.close()  # idempotent


def test_abort_unknown_request(tiny_llm):
    assert tiny_llm.abort(987654321) is False
    with pytest.raises(NotFoundError):
        list(tiny_llm.iter_outputs(987654321))


def test_sampling_params_are_immutable():
    params = SamplingParams(max_tokens=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 4


def test_close_while_a_request_runs(tiny_model_path, make_llm):
    llm = make_llm(tiny_model_path, max_num_seqs=2, n_ctx=2 * 2048)
    request_id = llm.add_request("Runs until closed", greedy(2000))
    deltas = llm.iter_outputs(request_id)
    next(d for d in deltas if d.token_ids)  # it is running
    llm.close()
    with pytest.raises(ShutdownError):
        list(deltas)
    with pytest.raises(ShutdownError):
        llm.add_request("after close", greedy(1))
