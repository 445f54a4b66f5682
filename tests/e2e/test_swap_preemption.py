"""Paged KV under memory pressure, preemption by swap (issue 13).

A preempted sequence's KV blocks are copied to host memory and back into free blocks when it
resumes (scheduler.h, kv/paged_kv.h, engine/swapper.h, patches/0007), so nothing is computed
again: every greedy output equals the same request's unconstrained run token for token, and the
engine counts swaps but no recomputed token. Swaps go through the state machine that lets a CUDA
copy stream run them beside compute, on the CPU too: a sequence swapped in at step t joins the
batch at step t + 1 (num_swapped_in, num_resumed), and a swap-out's blocks are free only from the
next step on (num_deferred_seq_steps: sequences that waited a step for them). On the CPU the copies
are synchronous, so nothing overlaps (num_swaps_overlapped and its device time stay 0).
"""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams

pytestmark = pytest.mark.e2e


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def prompts(n: int) -> list[list[int]]:
    """n distinct prompts of 20..51 token ids."""
    return [list(range(500 + 97 * i, 520 + 97 * i + i)) for i in range(n)]


def test_32_swapped_requests_match_their_unconstrained_runs(tiny_model_path, make_llm):
    # 32 requests of 20..51 prompt tokens + 64 output tokens (about 3,600 tokens) in a pool of
    # 512 rows (32 blocks of 16): preempted again and again, each by swap.
    ps = prompts(32)
    roomy = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=32, n_ctx=32 * 256)
    expected = [o.token_ids for o in roomy.generate(ps, greedy(64))]
    assert roomy.stats().num_preemptions == 0

    tight = make_llm(
        tiny_model_path, kv_mode="paged", max_num_seqs=32, n_ctx=512, preemption_mode="swap"
    )
    outs = tight.generate(ps, greedy(64))
    assert [o.request_id for o in outs] == sorted({o.request_id for o in outs})  # none lost or twice
    assert all(o.finish_reason == "length" and len(o.token_ids) == 64 for o in outs)
    assert [o.token_ids for o in outs] == expected
    s = tight.stats()
    assert s.num_preemptions_swap > 0 and s.num_preemptions_recompute == 0
    assert s.num_recomputed_tokens == 0 and s.num_preemptions == s.num_preemptions_swap
    assert sum(o.metrics.num_preemptions for o in outs) == s.num_preemptions
    assert s.swap_out_bytes > 0 and s.swap_in_bytes == s.swap_out_bytes  # all came back
    assert s.swap_on_copy_stream == 0  # the CPU: llama.cpp's copies (the CUDA copy stream: tests/kernels)
    assert s.num_swapped == 0 and s.swap_blocks_used == 0 and s.kv_blocks_used == 0
    assert s.num_running == 0 and s.num_waiting == 0
    # every swap-out came back one step ahead: swapped in at one step, in the batch at the next
    assert s.num_swapped_in == s.num_resumed == s.num_preemptions_swap
    assert s.num_swaps_overlapped == 0 and s.swap_overlapped_ns == 0 and s.num_graphs_beside_copies == 0
    assert s.num_graphs_overlapping_copies == 0 and s.swap_compute_overlap_ns == 0


@pytest.mark.parametrize("n_ctx", [256, 384])
def test_repeated_swaps_are_exact_and_one_step_ahead(tiny_model_path, make_llm, n_ctx):
    # 24 requests of 20..43 prompt tokens + 40 output tokens, arriving in two bursts, in pools of
    # 16 and 24 blocks: swapped out and in many times each. Greedy tokens equal the unconstrained
    # run, none is lost or duplicated, every swap-in resumed at the next step, and some running
    # sequence waited a step for a swap-out's blocks (the deferred free) instead of preempting more.
    ps = prompts(24)
    roomy = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=24, n_ctx=24 * 128)
    expected = [o.token_ids for o in roomy.generate(ps, greedy(40))]
    tight = make_llm(
        tiny_model_path, kv_mode="paged", max_num_seqs=24, n_ctx=n_ctx, preemption_mode="swap"
    )
    ids = [tight.add_request(p, greedy(40)) for p in ps[:12]]
    first = [list(tight.iter_outputs(i, timeout=300))[-1].output for i in ids[:2]]
    ids += [tight.add_request(p, greedy(40)) for p in ps[12:]]
    finals = first + [list(tight.iter_outputs(i, timeout=300))[-1].output for i in ids[2:]]
    assert [f.token_ids for f in finals] == expected
    assert len({f.request_id for f in finals}) == 24
    s = tight.stats()
    assert s.num_preemptions_swap >= 2 and s.num_recomputed_tokens == 0
    assert s.num_swapped_in == s.num_resumed == s.num_preemptions_swap
    assert s.num_deferred_seq_steps > 0
    assert s.num_swapped == 0 and s.swap_blocks_used == 0 and s.kv_blocks_used == 0


def test_real_model_swap_keeps_greedy_outputs(real_model_path, make_llm):
    # The default model, 8 prompts x 64 output tokens in a pool of 256 rows (16 blocks).
    ps = [f"Question {i}: name {i + 2} animals that live in the sea." for i in range(8)]
    roomy = make_llm(real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=8 * 256)
    expected = [o.token_ids for o in roomy.generate(ps, greedy(64))]
    tight = make_llm(
        real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=256, preemption_mode="swap"
    )
    outs = tight.generate(ps, greedy(64))
    s = tight.stats()
    assert s.num_preemptions_swap > 0 and s.num_recomputed_tokens == 0
    assert [o.token_ids for o in outs] == expected


@pytest.mark.parametrize("shared_prefix", [0, 64])
def test_long_prompts_passed_over_are_never_recomputed(tiny_model_path, make_llm, shared_prefix):
    # 12 prompts of 512 tokens, over the long-prefill threshold of 256, in a pool of 2,048 rows: one long
    # prefill computes at a time and the others are passed over, computing nothing. Admission keeps the
    # blocks of their prompts reserved, so it lets in only what fits beside them; a sequence that still
    # gives way before computing anything goes back to the queue uncounted. Before, admission let in
    # sequences whose blocks were not there, and each of their give-ways counted as a recompute
    # preemption (of 0 tokens). With a shared 64-token prefix (prefix caching on, the default) every
    # admitted prompt holds the cached prefix blocks, and the rest of its prompt is reserved all the same.
    # Decode growth then preempts by swap only, and the tokens equal a roomy run.
    head = [100 + (7 * j) % 20000 for j in range(shared_prefix)]
    ps = [head + [100 + (37 * i + 13 * j) % 20000 for j in range(512 - shared_prefix)] for i in range(12)]
    roomy = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=12, n_ctx=12 * 1024,
                     long_prefill_token_threshold=256)
    expected = [o.token_ids for o in roomy.generate(ps, greedy(384))]
    assert roomy.stats().num_preemptions == 0
    tight = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=12, n_ctx=2048, preemption_mode="swap",
                     long_prefill_token_threshold=256)
    outs = tight.generate(ps, greedy(384))
    assert [o.token_ids for o in outs] == expected
    s = tight.stats()
    assert s.num_preemptions_swap > 0 and s.num_preemptions_recompute == 0 and s.num_recomputed_tokens == 0
    assert s.num_preemptions == s.num_preemptions_swap
    assert sum(o.metrics.num_preemptions for o in outs) == s.num_preemptions


def test_swap_space_too_small_falls_back_to_recompute(tiny_model_path, make_llm):
    # No swap space: swap mode recomputes (and counts it); outputs still complete.
    ps = prompts(8)
    llm = make_llm(
        tiny_model_path,
        kv_mode="paged",
        max_num_seqs=8,
        n_ctx=256,
        preemption_mode="swap",
        swap_space_bytes=0,
    )
    outs = llm.generate(ps, greedy(48))
    assert all(len(o.token_ids) == 48 for o in outs)
    s = llm.stats()
    assert s.swap_blocks_total == 0 and s.num_preemptions_swap == 0
    assert s.num_preemptions_recompute > 0 and s.num_recomputed_tokens > 0


def test_auto_mode_swaps_on_the_default_model(real_model_path, make_llm):
    # Moving a block of the default model (368 KiB) costs far less than computing its 16 tokens
    # again on the CPU, so auto (the default) swaps.
    ps = [f"Question {i}: name {i + 2} animals that live in the sea." for i in range(8)]
    llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=256)
    # the copy rate auto starts from was measured at start-up (a round trip of blocks), and that
    # measurement is not counted as swapping
    fresh = llm.stats()
    assert fresh.swap_out_bytes == fresh.swap_in_bytes == fresh.swap_out_ns == fresh.swap_in_ns == 0
    outs = llm.generate(ps, greedy(64))
    assert all(len(o.token_ids) == 64 for o in outs)
    s = llm.stats()
    assert s.num_preemptions > 0 and s.num_preemptions_swap > 0


def test_forked_choices_under_pressure_with_swap(tiny_model_path, make_llm):
    # Two prompts with 4 choices each, sharing their prompt's blocks (copy-on-write fork), in a pool
    # too small for all at once, one choice of each ending early. Nothing crashes, every choice ends
    # with its own length, and greedy choices equal their request's unconstrained run. Whether a
    # choice is swapped here depends on when the step thread sees the second add_choices (seen both
    # ways), so swaps are not asserted; test_scheduler_swap.cpp swaps forked choices deterministically.
    prompt = " ".join(f"Item {i} of the list is a word." for i in range(6))
    lengths = [120, 6, 120, 120]
    roomy = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=8 * 256)
    expected = roomy.generate([prompt], greedy(120))[0].token_ids
    llm = make_llm(
        tiny_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=256, preemption_mode="swap"
    )
    ids = []
    for _ in range(2):
        ids += llm.add_choices(prompt, [greedy(n) for n in lengths])
    finals = [list(llm.iter_outputs(i, timeout=120))[-1].output for i in ids]
    assert [len(f.token_ids) for f in finals] == lengths * 2
    for f in finals:
        assert f.token_ids == expected[: len(f.token_ids)]
    s = llm.stats()
    assert s.num_preemptions_recompute == 0 and s.num_recomputed_tokens == 0
    assert s.kv_blocks_used == 0 and s.swap_blocks_used == 0 and s.num_swapped == 0


def test_stats_account_for_every_request_at_every_moment(tiny_model_path, make_llm):
    """While 24 requests run through a tight pool (preempted by swap), every stats() snapshot
    counts each unfinished request exactly once: running, waiting (queued, in the inbox, or taken
    from it by a step whose snapshot is not out yet) or swapped. The llama-server gauges
    (requests_processing + requests_deferred) are built on these."""
    llm = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=16, n_ctx=512, preemption_mode="swap")
    finished_before = llm.stats().num_finished
    ids = [llm.add_request(p, greedy(48)) for p in prompts(24)]
    while True:
        s = llm.stats()
        in_engine = s.num_running + s.num_waiting + s.num_swapped
        assert in_engine + s.num_finished - finished_before == len(ids), s
        if s.num_finished - finished_before == len(ids):
            break
    outs = [list(llm.iter_outputs(i))[-1].output for i in ids]
    assert all(len(o.token_ids) == 48 for o in outs)
    assert llm.stats().num_preemptions_swap > 0
