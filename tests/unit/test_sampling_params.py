"""SamplingParams: defaults, normalisation and validation messages."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pycacheflow import SamplingParams
from pycacheflow.sampling_params import MAX_LOGPROBS


def test_defaults_are_greedy_and_deterministic():
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (16, 0.0, 0, 1.0, 0.0)
    assert p.seed is None and p.stop == () and p.stop_token_ids == () and not p.ignore_eos
    assert p.greedy


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().max_tokens = 3  # type: ignore[misc]


def test_lists_become_tuples_and_single_stop_string_is_wrapped():
    p = SamplingParams(stop=["\n\n", "END"], stop_token_ids=[2, 7])
    assert p.stop == ("\n\n", "END") and p.stop_token_ids == (2, 7)
    assert SamplingParams(stop="END").stop == ("END",)
    assert hash(p) == hash(SamplingParams(stop=("\n\n", "END"), stop_token_ids=(2, 7)))
    with pytest.raises(TypeError, match=r"stop must be a string or a list of strings, got 5"):
        SamplingParams(stop=5)
    with pytest.raises(TypeError, match=r"stop_token_ids must be a list, got 5"):
        SamplingParams(stop_token_ids=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"temperature": -1.0}, "temperature must be finite and >= 0, got -1"),
        ({"temperature": math.nan}, "temperature must be finite and >= 0, got nan"),
        ({"temperature": math.inf}, "temperature must be finite and >= 0, got inf"),
        ({"top_k": -1}, "top_k must be >= 0, got -1"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"min_p": -0.1}, "min_p must be in [0, 1], got -0.1"),
        ({"min_p": 2}, "min_p must be in [0, 1], got 2"),
        ({"seed": -1}, "seed must be in [0, 2**63) or None, got -1"),
        ({"seed": 2**63}, "seed must be in [0, 2**63)"),
        # the Python argument's name, not cf_sampling_params' (stop_strings, top_logprobs)
        ({"stop": ["a", ""]}, "stop[1] must be a non-empty string"),
        ({"logprobs": -1}, "logprobs must be >= 0 (or None for no probabilities), got -1"),
        ({"stop": ["a\ud800"]}, "stop string is not valid UTF-8 text: lone surrogate U+D800"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0] = -1 must be >= 0"),
        # OpenAI's and vLLM's cap (was accepted: the whole vocabulary for every token)
        ({"logprobs": 21}, "logprobs must be at most 20 (token probabilities per position, as "
                           "OpenAI's top_logprobs and vLLM's max_logprobs), got 21"),
        ({"logprobs": 10**6}, "logprobs must be at most 20"),
        # Beyond the C ABI's int32_t / int64_t / float (these overflowed in cffi)
        ({"max_tokens": 2**40}, "max_tokens must fit a C int32_t ([-2**31, 2**31)), got 1099511627776"),
        ({"top_k": 2**31}, "top_k must fit a C int32_t ([-2**31, 2**31)), got 2147483648"),
        ({"stop_token_ids": [2**40]}, "stop_token_ids entry must fit a C int32_t ([-2**31, 2**31)), got 1099511627776"),
        ({"seed": 2**70}, "seed must be in [0, 2**63) or None, got 1180591620717411303424"),
        ({"temperature": 1e300}, "temperature must fit a C float (magnitude at most 3.403e+38), got 1e+300"),
    ],
)
def test_out_of_range_values_name_the_value(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)
    assert "stop_strings" not in str(info.value) and "top_logprobs must" not in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 1.5},
        {"max_tokens": True},
        {"temperature": "hot"},
        {"top_k": 2.0},
        {"seed": 1.0},
        {"stop": [3]},
        {"stop": 5},
        {"stop_token_ids": ["a"]},
        {"ignore_eos": 1},
    ],
)
def test_wrong_types_raise_type_error(kwargs):
    with pytest.raises(TypeError):
        SamplingParams(**kwargs)


def test_boundaries_accepted():
    p = SamplingParams(
        max_tokens=1,
        temperature=0.7,
        top_k=40,
        top_p=1.0,
        min_p=1.0,
        seed=2**63 - 1,
        ignore_eos=True,
        stop_token_ids=[2**31 - 1],
    )
    assert not p.greedy and p.seed == 2**63 - 1
    assert SamplingParams(seed=0, min_p=0.0, top_p=1e-6).seed == 0
    assert SamplingParams(max_tokens=2**31 - 1, top_k=2**31 - 1, temperature=3.4e38).top_k > 0
    assert SamplingParams(logprobs=MAX_LOGPROBS).logprobs == MAX_LOGPROBS == 20


def test_penalties_and_logit_bias():
    p = SamplingParams(repeat_penalty=1.3, repeat_last_n=-1, presence_penalty=-0.5,
                       frequency_penalty=2.0, logit_bias={5: -100, 7: float("-inf"), 9: 1e300})  # fmt: skip
    assert p.logit_bias == ((5, -100.0), (7, float("-inf")), (9, 3.4028234663852886e38))
    assert SamplingParams(logit_bias=[(1, 2)]).logit_bias == ((1, 2.0),)
    assert SamplingParams().repeat_last_n == 64 and SamplingParams().logit_bias == ()


@pytest.mark.parametrize(
    "kwargs,message",
    [({"repeat_penalty": 0.0}, "repeat_penalty must be > 0"),
     ({"presence_penalty": float("nan")}, "presence_penalty must be finite"),
     ({"repeat_last_n": -2}, "repeat_last_n must be >= -1, got -2"),
     ({"logit_bias": {-1: 1.0}}, r"logit_bias\[0\] token id = -1 must be >= 0"),
     ({"logit_bias": {1: float("inf")}}, r"logit_bias\[0\] bias must be finite or -INFINITY"),
     ({"logit_bias": [(1, 2, 3)]}, "pairs")],
)  # fmt: skip
def test_bad_penalties_and_logit_bias(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        SamplingParams(**kwargs)


def test_reasoning_budget_fields():
    from pycacheflow import ReasoningBudget

    budget = ReasoningBudget(4, [1, 2], [3], prefill=[1, 2])
    assert (budget.start, budget.end, budget.forced, budget.prefill) == ((1, 2), (3,), (3,), (1, 2))
    assert SamplingParams(reasoning_budget=budget).reasoning_budget is budget
    with pytest.raises(ValueError, match="reasoning budget tokens must be >= 0, got -1"):
        ReasoningBudget(-1, (1,), (2,))
    with pytest.raises(ValueError, match="needs start and end token sequences"):
        ReasoningBudget(0, (1,), ())
    with pytest.raises(TypeError, match="reasoning budget forced entry must be an int"):
        ReasoningBudget(0, (1,), (2,), forced=("x",))
    with pytest.raises(TypeError, match="reasoning_budget must be a ReasoningBudget"):
        SamplingParams(reasoning_budget=4)


def test_other_samplers_default_to_llama_servers_off_values():
    p = SamplingParams()
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (
        0.0, 1.75, 2, 64)  # fmt: skip
    assert p.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (p.xtc_probability, p.xtc_threshold, p.typical_p) == (0.0, 0.1, 1.0)
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta) == (0, 5.0, 0.1)
    assert (p.dynatemp_range, p.dynatemp_exponent, p.top_n_sigma, p.min_keep) == (0.0, 1.0, -1.0, 0)
    q = SamplingParams(dry_sequence_breakers=["a", "bc"])
    assert q.dry_sequence_breakers == ("a", "bc")
    assert SamplingParams(dry_sequence_breakers="x").dry_sequence_breakers == ("x",)
    assert SamplingParams(dry_sequence_breakers=()).dry_sequence_breakers == ()
    # accepted edges: values llama.cpp takes (disabled or clamped there), as llama-server sends them
    SamplingParams(dry_multiplier=-1.0, dry_base=1.0, dry_allowed_length=0, dry_penalty_last_n=-1,
                   xtc_probability=1.0, xtc_threshold=1.0, typical_p=-3.0, mirostat=2,
                   dynatemp_range=-1.0, top_n_sigma=0.0, min_keep=2**31 - 1)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dry_multiplier": math.nan}, "dry_multiplier must be finite, got nan"),
        ({"dry_multiplier": math.inf}, "dry_multiplier must be finite, got inf"),
        ({"dry_base": 0.5}, "dry_base must be finite and >= 1, got 0.5"),
        ({"dry_base": math.inf}, "dry_base must be finite and >= 1, got inf"),
        ({"dry_allowed_length": -1}, "dry_allowed_length must be >= 0, got -1"),
        ({"dry_penalty_last_n": -2}, "dry_penalty_last_n must be >= -1, got -2"),
        ({"dry_sequence_breakers": ["\n", ""]}, "dry_sequence_breakers[1] must be a non-empty string"),
        ({"dry_sequence_breakers": ["a\ud800"]},
         "dry sequence breaker is not valid UTF-8 text: lone surrogate U+D800 at character 1"),
        ({"xtc_probability": -0.1}, "xtc_probability must be in [0, 1], got -0.1"),
        ({"xtc_probability": 1.5}, "xtc_probability must be in [0, 1], got 1.5"),
        ({"xtc_threshold": 2.0}, "xtc_threshold must be in [0, 1], got 2"),
        ({"typical_p": math.nan}, "typical_p must be finite, got nan"),
        ({"mirostat": 3}, "mirostat must be 0, 1 or 2, got 3"),
        ({"mirostat": -1}, "mirostat must be 0, 1 or 2, got -1"),
        ({"mirostat_tau": math.inf}, "mirostat_tau must be finite, got inf"),
        ({"mirostat_eta": math.nan}, "mirostat_eta must be finite, got nan"),
        ({"dynatemp_range": math.inf}, "dynatemp_range must be finite, got inf"),
        ({"dynatemp_exponent": -math.inf}, "dynatemp_exponent must be finite, got -inf"),
        ({"top_n_sigma": math.nan}, "top_n_sigma must be finite, got nan"),
        ({"min_keep": -1}, "min_keep must be >= 0, got -1"),
        ({"min_keep": 2**31}, "min_keep must fit a C int32_t ([-2**31, 2**31)), got 2147483648"),
        ({"dry_base": 1e300}, "dry_base must fit a C float (magnitude at most 3.403e+38), got 1e+300"),
    ],
)  # fmt: skip
def test_other_samplers_out_of_range_values_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "kwargs",
    [{"mirostat": 1.0}, {"min_keep": True}, {"dry_base": "2"}, {"dry_sequence_breakers": [1]},
     {"dry_sequence_breakers": 5}, {"dry_allowed_length": 2.0}],
)  # fmt: skip
def test_other_samplers_wrong_types(kwargs):
    with pytest.raises(TypeError):
        SamplingParams(**kwargs)


def test_equal_params_are_checked_natively_once(monkeypatch):
    from pycacheflow import _native

    calls = []
    check_now = _native._check_sampling_params_now
    monkeypatch.setattr(_native, "_check_sampling_params_now",
                        lambda p: (calls.append(p), check_now(p)))  # fmt: skip
    _native._check_sampling_params_once.cache_clear()
    p = SamplingParams(max_tokens=7, temperature=0.5, stop=["x"], logit_bias={3: -math.inf})
    assert dataclasses.replace(p, max_tokens=7) == p
    assert len(calls) == 1  # the equal replace was not checked again
    dataclasses.replace(p, max_tokens=8)
    assert len(calls) == 2


def test_failed_checks_are_not_remembered():
    for _ in range(2):
        with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
            SamplingParams(max_tokens=0)
    p = SamplingParams(max_tokens=3)
    with pytest.raises(ValueError, match="top_p must be in"):
        dataclasses.replace(p, top_p=0.0)
