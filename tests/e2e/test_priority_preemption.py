"""Priority scheduling end to end on the tiny model (native/src/core/scheduler.h, "Priority
preemption"): a pool too small for the load, a burst of low-priority long requests, then urgent
short ones. The urgent requests overtake the waiting ones and preempt running ones (swap mode),
finish first and get their first token sooner; every request completes with its full length and
the greedy tokens of an unconstrained run; the engine's TTFT-by-priority table and priority
preemption counter say so too. No timings are asserted beyond their order.
"""

from __future__ import annotations

import threading
import time

import pytest

from pycacheflow import SamplingParams
from pycacheflow.profiler import REQUEST_PRIORITY_PREEMPT, REQUEST_SWAP_OUT

pytestmark = pytest.mark.e2e

LOW, URGENT = 10, 0  # smaller = more urgent
NUM_LOW, NUM_URGENT = 8, 4
LOW_TOKENS, URGENT_TOKENS = 150, 8


def prompts() -> tuple[list[list[int]], list[list[int]]]:
    low = [list(range(1000 + 50 * i, 1030 + 50 * i)) for i in range(NUM_LOW)]
    urgent = [list(range(3000 + 40 * i, 3020 + 40 * i)) for i in range(NUM_URGENT)]
    return low, urgent


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def collect(llm, request_id: int, results: dict) -> None:
    """Consume one request's outputs; results[request_id] = its RequestOutput."""
    for delta in llm.iter_outputs(request_id, timeout=120):
        if delta.finished:
            results[request_id] = delta.output


def test_urgent_requests_overtake_a_saturated_pool(tiny_model_path, make_llm):
    low, urgent = prompts()
    roomy = make_llm(tiny_model_path, kv_mode="paged", max_num_seqs=12, n_ctx=12 * 256)
    expected = [o.token_ids for o in roomy.generate(low, greedy(LOW_TOKENS))]
    expected += [o.token_ids for o in roomy.generate(urgent, greedy(URGENT_TOKENS))]

    # 16 blocks of 16 rows: 4 running low requests want 4 * 180 rows, so the pool is saturated
    llm = make_llm(
        tiny_model_path, kv_mode="paged", max_num_seqs=4, n_ctx=256, policy="priority",
        preemption_mode="swap", priority_aging_ms=60_000, profile=True,
    )  # fmt: skip
    results: dict[int, object] = {}
    threads = []

    def submit(prompt: list[int], max_tokens: int, priority: int) -> int:
        request_id = llm.add_request(prompt, greedy(max_tokens), priority=priority)
        thread = threading.Thread(target=collect, args=(llm, request_id, results))
        thread.start()
        threads.append(thread)
        return request_id

    low_ids = [submit(p, LOW_TOKENS, LOW) for p in low]
    deadline = time.monotonic() + 30
    while llm.stats().num_running < 4 or llm.stats().num_generated_tokens < 8:
        assert time.monotonic() < deadline, "the low-priority burst never filled the pool"
        time.sleep(0.001)
    urgent_ids = [submit(p, URGENT_TOKENS, URGENT) for p in urgent]
    for thread in threads:
        thread.join(timeout=180)
    ids = low_ids + urgent_ids
    outs = [results[i] for i in ids]

    assert [o.token_ids for o in outs] == expected  # greedy, preempted or not
    assert all(o.finish_reason == "length" for o in outs)
    low_outs, urgent_outs = outs[:NUM_LOW], outs[NUM_LOW:]
    last_urgent_finish = max(o.metrics.finish_time_s for o in urgent_outs)
    assert all(o.metrics.finish_time_s > last_urgent_finish for o in low_outs)
    # the urgent ones overtook the low requests still waiting when they arrived
    urgent_arrival = min(o.metrics.arrival_time_s for o in urgent_outs)
    waiting_low = [o for o in low_outs if o.metrics.first_scheduled_time_s > urgent_arrival]
    assert waiting_low, "no low-priority request was still waiting when the urgent ones came"
    assert max(o.metrics.ttft_s for o in urgent_outs) < min(o.metrics.ttft_s for o in waiting_low)

    s = llm.stats()
    assert s.num_preemptions_priority > 0 and s.num_preemptions_swap >= s.num_preemptions_priority
    assert s.num_preemptions_recompute == 0
    table = {e.priority: e for e in s.ttft_by_priority}
    assert sorted(table) == [URGENT, LOW]
    assert table[URGENT].num_requests == NUM_URGENT and table[LOW].num_requests == NUM_LOW
    assert table[URGENT].ttft_mean_s < table[LOW].ttft_mean_s
    assert s.kv_blocks_used == 0 and s.num_swapped == 0 and s.swap_blocks_used == 0
    # the profiler marks each priority preemption right after its swap-out, for a low request
    events = llm.profile().events
    marks = [e for e in events if e.kind == REQUEST_PRIORITY_PREEMPT]
    assert len(marks) == s.num_preemptions_priority
    assert all(m.request_id in low_ids for m in marks)
    swap_outs = {(e.request_id, e.time_ns) for e in events if e.kind == REQUEST_SWAP_OUT}
    assert all((m.request_id, m.time_ns) in swap_outs for m in marks)
