"""Paged KV under memory pressure: a KV budget in bytes, and preemption by recompute (swap:
test_swap_preemption.py).

When the pool runs out of blocks the scheduler preempts the newest running sequence and later
computes its prompt and output again (scheduler.h); greedy outputs must not change: every
request's tokens equal those of the same request run alone in a pool large enough for it.
``kv_cache_bytes`` sizes the cache from memory, the same bytes for every KV mode.
"""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams
from pycacheflow.errors import InvalidArgumentError

pytestmark = pytest.mark.e2e


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def token_bytes(llm) -> int:
    return llm.info.kv_bytes_per_token


def test_preempted_requests_match_their_runs_alone(tiny_model_path, make_llm):
    # 6 requests of 40..90 prompt tokens + 100 output tokens (about 1,000 tokens) over a pool of
    # 256 rows: they cannot all grow at once, so some are preempted and recomputed.
    prompts = [list(range(1000 + 300 * i, 1040 + 300 * i + 10 * i)) for i in range(6)]
    roomy = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=1, n_ctx=512)
    alone = [roomy.generate([p], greedy(100))[0].token_ids for p in prompts]

    llm = make_llm(
        tiny_model_path, kv_mode="paged", max_num_seqs=6, n_ctx=256, preemption_mode="recompute"
    )
    assert llm.info.n_ctx == 256
    outs = llm.generate(prompts, greedy(100))
    assert [o.token_ids for o in outs] == alone
    assert all(o.finish_reason == "length" and len(o.token_ids) == 100 for o in outs)
    preempted = sum(o.metrics.num_preemptions for o in outs)
    assert preempted > 0 and llm.stats().num_preemptions == preempted
    s = llm.stats()
    assert s.kv_blocks_used == 0 and s.num_running == 0 and s.num_waiting == 0


def test_real_model_preemption_keeps_greedy_outputs(real_model_path, make_llm):
    # The default model, 8 prompts x 64 output tokens in a pool of 256 rows (16 blocks).
    prompts = [f"Question {i}: name {i + 2} animals that live in the sea." for i in range(8)]
    roomy = make_llm(real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=8 * 256)
    expected = [o.token_ids for o in roomy.generate(prompts, greedy(64))]
    tight = make_llm(
        real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=256, preemption_mode="recompute"
    )
    outs = tight.generate(prompts, greedy(64))
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == expected


@pytest.mark.parametrize(
    ("kv_mode", "max_num_seqs", "rows"),
    [
        ("paged", 3, 1000 // 256 * 256),  # whole budget, in 256-row steps
        ("stock-unified", 3, 1000 // 256 * 256),
        ("stock", 3, 1000 // 3 // 256 * 256 * 3),  # each of the 3 slices in 256-row steps
    ],
)
def test_kv_cache_bytes_sizes_every_mode_alike(
    kv_mode, max_num_seqs, rows, tiny_model_path, make_llm
):
    probe = make_llm(tiny_model_path, max_num_seqs=1, n_ctx=256)
    budget = 1000 * token_bytes(probe)
    llm = make_llm(
        tiny_model_path, kv_mode=kv_mode, max_num_seqs=max_num_seqs, kv_cache_bytes=budget
    )
    assert llm.info.n_ctx == rows
    assert llm.info.n_ctx * token_bytes(llm) <= budget


def test_kv_cache_bytes_too_small_is_a_clear_error(tiny_model_path, make_llm):
    probe = make_llm(tiny_model_path, max_num_seqs=1, n_ctx=256)
    budget = 300 * token_bytes(probe)  # 300 rows: one 256-row stream, not two
    with pytest.raises(InvalidArgumentError, match=r"stock split mode needs 256 rows per sequence"):
        make_llm(tiny_model_path, kv_mode="stock", max_num_seqs=2, kv_cache_bytes=budget)
    with pytest.raises(InvalidArgumentError, match=r"kv_cache_bytes=\d+ holds \d+ KV rows"):
        make_llm(
            tiny_model_path,
            kv_mode="paged",
            max_num_seqs=2,
            kv_cache_bytes=token_bytes(probe) * 100,
        )
    with pytest.raises(ValueError, match="set n_ctx or kv_cache_bytes, not both"):
        make_llm(tiny_model_path, n_ctx=512, kv_cache_bytes=budget)
