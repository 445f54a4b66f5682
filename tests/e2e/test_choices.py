"""Choices of one prompt (OpenAI ``n``, ``LLM.add_choices``) on the real model, paged KV: the
choices fork the first one's prompt blocks (copy-on-write) instead of computing the prompt again,
and each samples independently: greedy choices equal the request alone, seeded choices equal
their params alone, and the pool holds the prompt's blocks once.
"""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams
from pycacheflow.profiler import STEP_END

pytestmark = pytest.mark.e2e

# ~100 tokens: 6 full blocks of 16 shared by every choice, plus a partial one
PROMPT = " ".join(f"Item {i} of the list is a word." for i in range(12))
NUM_CHOICES = 3
MAX_TOKENS = 8


def collect(llm, request_ids: list[int]):
    outputs = []
    for request_id in request_ids:
        deltas = list(llm.iter_outputs(request_id, timeout=120))
        outputs.append(deltas[-1].output)
    return outputs


def max_blocks_used(llm) -> int:
    events = llm.profile(clear=True).events
    return max(e.kv_blocks_used for e in events if e.kind == STEP_END)


@pytest.fixture
def llm(real_model_path, make_llm):
    llm = make_llm(real_model_path, max_num_seqs=8, n_ctx=8 * 256, profile=True)
    assert llm.info.kv_mode_name == "paged" and llm.info.block_size == 16
    return llm


def test_greedy_choices_share_the_prompt_blocks(llm):
    greedy = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    num_prompt_tokens = len(llm.tokenize_prompt(PROMPT))
    assert 80 <= num_prompt_tokens <= 150
    # three requests, three prompt copies: the prefix cache, which would share them too, is off for
    # this baseline (it neither reads nor fills the cache), so the choices below find nothing cached
    unshared = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, cache_prompt=False)
    alone = llm.generate([PROMPT] * NUM_CHOICES, unshared)
    unshared_blocks = max_blocks_used(llm)
    choices = collect(llm, llm.add_choices(PROMPT, [greedy] * NUM_CHOICES))
    shared_blocks = max_blocks_used(llm)
    assert [c.token_ids for c in choices] == [a.token_ids for a in alone]
    # the first computes the prompt; the others reuse all of it but the last token
    assert [c.metrics.num_cached_tokens for c in choices] == [0] + [num_prompt_tokens - 1] * 2
    full_blocks = (num_prompt_tokens - 1) // 16
    assert shared_blocks <= unshared_blocks - (NUM_CHOICES - 1) * full_blocks
    assert llm.stats().kv_blocks_used == 0  # every shared block went back to the pool


def test_seeded_choices_sample_independently(llm):
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=2.0, seed=40 + i, ignore_eos=True)
              for i in range(NUM_CHOICES)]  # fmt: skip
    choices = collect(llm, llm.add_choices(PROMPT, params))
    each_alone = [llm.generate(PROMPT, p)[0].token_ids for p in params]
    assert [c.token_ids for c in choices] == each_alone
    assert len({tuple(t) for t in each_alone}) == NUM_CHOICES  # they do differ


def test_a_choice_differs_from_its_parent_in_sampling_only(llm):
    with pytest.raises(ValueError, match="at least one"):
        llm.add_choices(PROMPT, [])
    one = collect(llm, llm.add_choices(PROMPT, [SamplingParams(max_tokens=2)]))
    assert one[0].metrics.num_cached_tokens == 0 and len(one[0].token_ids) == 2
