"""Paged mode has no 256-sequence cap; the stock KV modes keep llama.cpp's and say so.

llama.cpp keys its sequences by ids below LLAMA_MAX_SEQ = 256. In paged mode a sequence's llama.cpp
slot is only its row in one decode, and a step with more sequences runs as several decodes
(native/src/engine/batch_builder.h): 512 requests on the tiny model run together (steps of more
than 256 sequences) and each ends with exactly its max_tokens.
"""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams
from pycacheflow.errors import InvalidArgumentError

pytestmark = pytest.mark.e2e

NUM_SEQS = 512


def prompts(n: int) -> list[list[int]]:
    """n distinct token-id prompts of 2 to 5 tokens."""
    return [[100 + (i * 7 + j) % 900 for j in range(2 + i % 4)] for i in range(n)]


def max_tokens(i: int) -> int:
    """12 to 19: long enough that most requests run at the same time."""
    return 12 + i % 8


def params(n: int) -> list[SamplingParams]:
    """Greedy, EOS ignored: each output's length is known."""
    return [SamplingParams(max_tokens=max_tokens(i), ignore_eos=True) for i in range(n)]


@pytest.mark.slow
def test_paged_runs_512_sequences_at_once(make_llm, tiny_model_path):
    llm = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=NUM_SEQS, n_ctx=NUM_SEQS * 32,
                   max_num_batched_tokens=NUM_SEQS, profile=True)
    outs = llm.generate(prompts(NUM_SEQS), params(NUM_SEQS))
    assert [len(o.token_ids) for o in outs] == [max_tokens(i) for i in range(NUM_SEQS)]
    assert all(o.finish_reason == "length" for o in outs)
    busiest = max(s.num_seqs for s in llm.profile().steps())
    assert busiest > 256, busiest  # steps of more than 256 sequences: several decodes each
    stats = llm.stats()
    assert stats.num_running == 0 and stats.num_finished == NUM_SEQS


@pytest.mark.parametrize("kv_mode", ["stock", "stock-unified"])
def test_stock_modes_keep_llama_cpp_limit(make_llm, tiny_model_path, kv_mode):
    with pytest.raises(InvalidArgumentError, match=r"max_num_seqs must be <= 256 with the stock KV cache"):
        make_llm(tiny_model_path, kv_mode=kv_mode, max_num_seqs=257, n_ctx=257 * 256,
                 max_num_batched_tokens=512)


def test_auto_mode_on_a_stock_only_model_says_why(make_llm, tiny_gemma3_model_path):
    with pytest.raises(InvalidArgumentError, match=r"max_num_seqs=257 needs kv_mode=paged, but the paged "
                       r"KV path does not cover this model \(it has sliding-window attention layers\); "
                       r"the stock KV cache holds at most 256 sequences"):
        make_llm(tiny_gemma3_model_path, max_num_seqs=257, n_ctx=257 * 256, max_num_batched_tokens=512)
