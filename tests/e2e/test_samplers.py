"""llama-server's other samplers on the real model: DRY, XTC, typical_p, mirostat 1/2, the
dynamic temperature and top_n_sigma change the output where they should, are deterministic under
a seed, give the same tokens batched as alone, and their default (off) values change nothing.
That each picks the tokens llama-server's own chain picks is native/tests/test_sampler_chain.cpp.
"""

from __future__ import annotations

import dataclasses

import pytest

from pycacheflow import SamplingParams

pytestmark = pytest.mark.e2e

REPEATING = "List: apple, banana, apple, banana, apple, banana,"
PROMPTS = [REPEATING, "The capital of France is", "Once upon a time, there was a"]
SERVER = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}  # llama-server's
# every new field at its default value, spelled out
DEFAULTS = {"dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
            "dry_penalty_last_n": 64, "dry_sequence_breakers": ("\n", ":", '"', "*"),
            "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": 1.0, "mirostat": 0,
            "mirostat_tau": 5.0, "mirostat_eta": 0.1, "dynatemp_range": 0.0,
            "dynatemp_exponent": 1.0, "top_n_sigma": -1.0, "min_keep": 0}  # fmt: skip


def params(**kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=24, ignore_eos=True, **kw)


def texts(llm, p: SamplingParams, prompts=PROMPTS) -> list[str]:
    return [o.text for o in llm.generate(prompts, p)]


def tokens(llm, p: SamplingParams, prompts=PROMPTS) -> list[tuple[int, ...]]:
    return [tuple(o.token_ids) for o in llm.generate(prompts, p)]


def test_default_values_change_nothing(real_llm):
    """Passing every new field at its default gives the same tokens, greedy and seeded; min_keep 1
    is min_keep 0 (both keep at least one token)."""
    for base in ({}, {**SERVER, "seed": 7}, {"temperature": 1.0, "seed": 3},
                 {"repeat_penalty": 1.3}):  # fmt: skip
        expected = tokens(real_llm, params(**base))
        assert tokens(real_llm, params(**base, **DEFAULTS)) == expected, base
        assert tokens(real_llm, params(**base, min_keep=1)) == expected, base
    # "off" values other than the defaults are off too
    off = {"xtc_threshold": 0.6, "xtc_probability": 0.9, "typical_p": 1.5, "top_n_sigma": 0.0,
           "dynatemp_range": -1.0, "dry_multiplier": 3.0, "dry_penalty_last_n": 0}  # fmt: skip
    seeded = tokens(real_llm, params(**SERVER, seed=7))
    assert tokens(real_llm, params(**SERVER, seed=7, **off)) == seeded


def test_dry_stops_a_repetition_that_greedy_decoding_makes(real_llm):
    greedy = texts(real_llm, params(), [REPEATING])[0]
    assert greedy.count("apple, banana") >= 4  # the model just goes on
    dry = texts(real_llm, params(dry_multiplier=2.0), [REPEATING])[0]
    assert dry != greedy and dry.count("apple, banana") < 2
    # a long allowed length lets the repetition through; the breaker "," cuts every repetition
    # short (no sequence reaches past a comma), so nothing is penalised either
    long_allowed = params(dry_multiplier=2.0, dry_allowed_length=64)
    assert texts(real_llm, long_allowed, [REPEATING])[0] == greedy
    assert texts(real_llm, params(dry_multiplier=2.0, dry_sequence_breakers=[","]),
                 [REPEATING])[0] == greedy  # fmt: skip
    # the window: DRY over the last 4 tokens sees no repeated sequence longer than 2
    short_window = params(dry_multiplier=2.0, dry_penalty_last_n=4)
    assert texts(real_llm, short_window, [REPEATING])[0] == greedy
    # -1: the whole context, as a window longer than the prompt
    whole = texts(real_llm, params(dry_multiplier=2.0, dry_penalty_last_n=-1), [REPEATING])[0]
    assert whole == texts(real_llm, params(dry_multiplier=2.0, dry_penalty_last_n=4096),
                          [REPEATING])[0]  # fmt: skip


def test_xtc_removes_the_top_choices(real_llm):
    """XTC acts before the temperature: with probability 1 it changes a greedy output (the argmax
    of what it leaves) and a seeded low-temperature one; the same seed gives the same tokens."""
    greedy = tokens(real_llm, params())
    xtc = tokens(real_llm, params(xtc_probability=1.0, xtc_threshold=0.1))
    assert all(a != b for a, b in zip(xtc, greedy))
    cold = {"temperature": 0.1, "seed": 5}
    cold_xtc = tokens(real_llm, params(**cold, xtc_probability=1.0, xtc_threshold=0.1))
    assert cold_xtc != tokens(real_llm, params(**cold))
    assert cold_xtc == tokens(real_llm, params(**cold, xtc_probability=1.0, xtc_threshold=0.1))
    half = params(**SERVER, seed=9, xtc_probability=0.5)
    assert tokens(real_llm, half) == tokens(real_llm, half)
    assert tokens(real_llm, half) != tokens(real_llm, params(**SERVER, seed=9))


def test_typical_p_greedy_and_sampled(real_llm):
    """typical_p may drop the most likely token, so it changes greedy outputs too."""
    greedy = tokens(real_llm, params())
    typical = tokens(real_llm, params(typical_p=0.5))
    assert typical != greedy and typical == tokens(real_llm, params(typical_p=0.5))
    sampled = params(temperature=1.0, seed=11, typical_p=0.5)
    assert tokens(real_llm, sampled) == tokens(real_llm, sampled)
    assert tokens(real_llm, sampled) != tokens(real_llm, params(temperature=1.0, seed=11))


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_is_seeded_and_replaces_the_chain(real_llm, version):
    p = params(temperature=0.8, seed=21, mirostat=version)
    first = tokens(real_llm, p)
    assert tokens(real_llm, p) == first  # seeded: deterministic
    assert first != tokens(real_llm, params(temperature=0.8, seed=21))
    assert first != tokens(real_llm, params(temperature=0.8, seed=22, mirostat=version))
    # its parameters matter
    assert first != tokens(real_llm, params(temperature=0.8, seed=21, mirostat=version,
                                            mirostat_tau=1.0, mirostat_eta=0.5))  # fmt: skip
    # llama-server's mirostat drops top_k and the penalties
    assert tokens(real_llm, dataclasses.replace(p, top_k=5, repeat_penalty=1.5)) == first
    # greedy stays greedy
    assert tokens(real_llm, params(mirostat=version)) == tokens(real_llm, params())


def test_top_n_sigma_and_dynamic_temperature(real_llm):
    hot = {"temperature": 1.5, "seed": 31}
    plain = tokens(real_llm, params(**hot))
    for extra in ({"top_n_sigma": 1.0}, {"dynatemp_range": 1.0}, {"dynatemp_range": 1.0,
                                                                  "dynatemp_exponent": 3.0}):
        p = params(**hot, **extra)
        assert tokens(real_llm, p) == tokens(real_llm, p), extra
        assert tokens(real_llm, p) != plain, extra
    assert tokens(real_llm, params(**hot, dynatemp_range=1.0)) != tokens(
        real_llm, params(**hot, dynatemp_range=1.0, dynatemp_exponent=3.0))
    # top_n_sigma always keeps the argmax and the dynamic temperature needs a temperature > 0:
    # greedy requests are unchanged by them (llama-server: greedy stays greedy for both)
    greedy = tokens(real_llm, params())
    assert tokens(real_llm, params(top_n_sigma=0.5, dynatemp_range=0.5)) == greedy


def test_batched_with_other_rows_as_alone(real_llm):
    """Rows with the new samplers are sampled on the host from their whole row, next to greedy
    and in-graph sampled rows: each request gets the tokens it gets alone."""
    kinds = [params(dry_multiplier=1.5), params(xtc_probability=1.0), params(typical_p=0.6),
             params(temperature=0.9, seed=3, mirostat=2), params(**SERVER, seed=4, top_n_sigma=1.0),
             params(temperature=1.0, seed=5, dynatemp_range=0.5), params(), params(**SERVER)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(kinds))]
    ids = [real_llm.add_request(prompt, p) for prompt, p in zip(prompts, kinds)]
    batched = [tuple(list(real_llm.iter_outputs(i))[-1].output.token_ids) for i in ids]
    for prompt, p, got in zip(prompts[:6], kinds[:6], batched[:6]):
        assert got == tokens(real_llm, p, [prompt])[0], p
