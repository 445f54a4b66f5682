"""Long prefills (EngineConfig.long_prefill_token_threshold; core/scheduler.h "Long prefills").

A short prompt submitted together with a long one, behind it, is computed in the first step with the
rule on and finishes before the long prompt's first token; with the rule off it waits for the long
prompt's prefill. Either way both requests get the same greedy tokens (the paged attention is
chunk-invariant, so chunks of other sizes change nothing).
"""

from __future__ import annotations

import pytest

from pycacheflow import EngineConfig, SamplingParams
from pycacheflow.errors import InvalidArgumentError

pytestmark = [pytest.mark.e2e]

BUDGET = 64          # tokens per step: the long prompt takes 10 steps or more
LONG_TOKENS = 600
SHORT_TOKENS = 16


def prompts(llm) -> list[list[int]]:
    text = " ".join(f"item {i} is {i * 7 % 13}" for i in range(400))
    ids = llm.tokenize(text)
    assert len(ids) >= LONG_TOKENS + SHORT_TOKENS
    return [ids[:LONG_TOKENS], ids[LONG_TOKENS:LONG_TOKENS + SHORT_TOKENS]]


def run(make_llm, model, threshold: int):
    llm = make_llm(model, max_num_seqs=4, n_ctx=4096, max_num_batched_tokens=BUDGET,
                   long_prefill_token_threshold=threshold)
    assert llm.info.kv_mode_name == "paged"
    params = [SamplingParams(max_tokens=8, ignore_eos=True), SamplingParams(max_tokens=4, ignore_eos=True)]
    long_out, short_out = llm.generate(prompts(llm), params)
    assert len(long_out.token_ids) == 8 and len(short_out.token_ids) == 4
    return long_out, short_out


def test_a_short_prompt_does_not_wait_for_a_long_prefill(real_model_path, make_llm):
    long_on, short_on = run(make_llm, real_model_path, threshold=32)
    long_off, short_off = run(make_llm, real_model_path, threshold=0)
    # on: the short request is done (4 tokens) before the long prompt's first token
    assert short_on.metrics.finish_time_s < long_on.metrics.first_token_time_s
    # off: its first token comes with or after the long prompt's first token
    assert short_off.metrics.first_token_time_s >= long_off.metrics.first_token_time_s
    assert long_on.token_ids == long_off.token_ids
    assert short_on.token_ids == short_off.token_ids


def test_the_default_threshold_is_half_the_budget_and_changes_no_token(real_model_path, make_llm):
    long_auto, short_auto = run(make_llm, real_model_path, threshold=-1)  # 32 at a budget of 64
    long_off, short_off = run(make_llm, real_model_path, threshold=0)
    assert short_auto.metrics.finish_time_s < long_auto.metrics.first_token_time_s
    assert (long_auto.token_ids, short_auto.token_ids) == (long_off.token_ids, short_off.token_ids)


def test_a_bad_threshold_is_refused_by_name(real_model_path, make_llm):
    EngineConfig(real_model_path, long_prefill_token_threshold=-1)  # auto: accepted
    with pytest.raises(InvalidArgumentError, match="long_prefill_token_threshold"):
        make_llm(real_model_path, long_prefill_token_threshold=-2)
