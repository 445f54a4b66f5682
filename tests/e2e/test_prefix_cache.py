"""Automatic prefix caching (issue 14) on the default model: outputs, sharing and lifecycle.

Greedy outputs with the cache on equal those with it off (the default attention kernel is
invariant to chunking and batching, so KV rows computed by another request are the rows this
request would have computed): for prompts sharing exactly one block, one block +- 1 token and two
blocks; a warm repeat equals the cold run; concurrent requests with a common system prompt hold one
physical copy of it; cancelling shared-prefix requests mid-prefill corrupts nobody; preempted
requests resume on their cached blocks. Prompts are random characters, so the model is unsure of
every continuation and any wrong KV row would change a greedy token.
"""

from __future__ import annotations

import math
import random
import string

import pytest

from pycacheflow import SamplingParams

pytestmark = [pytest.mark.e2e]

BLOCK = 16  # the default block_size
MAX_TOKENS = 24


def random_tokens(llm, n: int, rng: random.Random) -> list[int]:
    """n token ids of random printable characters."""
    alphabet = string.ascii_letters + string.digits + string.punctuation + " "
    ids = llm.tokenize("".join(rng.choice(alphabet) for _ in range(4 * n)))
    assert len(ids) >= n
    return ids[:n]


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def run(llm, prompts: list[list[int]], max_tokens: int = MAX_TOKENS):
    outs = llm.generate(prompts, greedy(max_tokens))
    assert all(len(o.token_ids) == max_tokens for o in outs)
    return outs


@pytest.fixture
def llms(real_model_path, make_llm):
    """(cache on, cache off): the same engine configuration but for enable_prefix_caching."""
    on = make_llm(real_model_path, max_num_seqs=8, n_ctx=8 * 512)
    off = make_llm(real_model_path, max_num_seqs=8, n_ctx=8 * 512, enable_prefix_caching=False)
    assert on.info.kv_mode_name == "paged"
    return on, off


@pytest.mark.parametrize("shared", [BLOCK, BLOCK - 1, BLOCK + 1, 2 * BLOCK])
def test_cache_on_equals_off_for_shared_prefixes(llms, shared):
    on, off = llms
    rng = random.Random(shared)
    prefix = random_tokens(on, shared, rng)
    prompts = [prefix + random_tokens(on, 20 + i, rng) for i in range(4)]
    want = [o.token_ids for o in run(off, prompts)]
    assert len(set(want)) == 4  # distinct continuations: the comparison bites
    first = run(on, prompts[:1])  # fills the cache
    rest = run(on, prompts[1:])
    assert first[0].metrics.num_cached_tokens == 0
    assert [o.token_ids for o in first + rest] == want
    for o in rest:  # the shared tokens came from the cache (a common next token may add one)
        assert shared <= o.metrics.num_cached_tokens < o.metrics.num_prompt_tokens
    stats = on.stats()
    assert stats.prefix_cache_hit_tokens >= 3 * shared and stats.prefix_cache_blocks > 0
    assert off.stats().prefix_cache_hit_tokens == 0 and off.stats().prefix_cache_blocks == 0


def test_warm_repeat_equals_cold_run(llms):
    on, off = llms
    rng = random.Random(7)
    prompts = [random_tokens(on, n, rng) for n in (40, 100, 257, 31, 16)]
    cold = run(on, prompts)
    assert all(o.metrics.num_cached_tokens == 0 for o in cold)
    for _ in range(2):
        warm = run(on, prompts)
        assert [o.token_ids for o in warm] == [o.token_ids for o in cold]
        # everything but the last prompt token, which is computed again for its logits
        assert [o.metrics.num_cached_tokens for o in warm] == [len(p) - 1 for p in prompts]
    assert [o.token_ids for o in run(off, prompts)] == [o.token_ids for o in cold]
    # per request: cache_prompt=False neither reads nor fills the cache
    fresh = random_tokens(on, 50, rng)
    before = on.stats().prefix_cache_blocks
    outs = on.generate([prompts[1], fresh], SamplingParams(max_tokens=4, cache_prompt=False))
    assert [o.metrics.num_cached_tokens for o in outs] == [0, 0]
    assert outs[0].token_ids == cold[1].token_ids[:4]
    assert on.stats().prefix_cache_blocks == before


def test_common_system_prompt_is_held_once(real_model_path):
    """8 requests with a 10-block system prompt, all submitted at once: while they all decode,
    the pool holds the system prompt's blocks once plus each request's own blocks, and the KV
    rows counted as used (stats.kv_tokens_used) count the shared rows once."""
    from pycacheflow._native import Engine
    from pycacheflow.config import EngineConfig

    with Engine(EngineConfig(model=real_model_path, max_num_seqs=8, n_ctx=8 * 256)) as engine:
        rng = random.Random(3)
        system = random_tokens(engine, 10 * BLOCK, rng)
        prompts = [system + random_tokens(engine, BLOCK, rng) for _ in range(8)]
        for p in prompts:
            engine.add_request(p, greedy(8))
        outputs: dict[int, int] = {}
        checked = 0
        while engine.has_work():
            engine.step()
            for e in engine.drain():
                if e.token_id >= 0:
                    outputs[e.request_id] = outputs.get(e.request_id, 0) + 1
                if e.finish_reason:
                    outputs[e.request_id] = -1  # finished: holds nothing
            stats = engine.stats()
            live = [n for n in outputs.values() if n > 0]
            if len(live) == 8 and stats.num_running == 8:  # all prefilled, none finished
                # a request with g output tokens has 11 * 16 + g - 1 tokens in the KV cache
                own = sum(math.ceil((11 * BLOCK + g - 1) / BLOCK) - 10 for g in live)
                assert stats.kv_blocks_used == 10 + own, (stats, live)
                # KV rows holding a token: the system prompt's once, then each request's own
                assert stats.kv_tokens_used == 10 * BLOCK + sum(BLOCK + g - 1 for g in live)
                assert stats.kv_tokens_used <= stats.kv_blocks_used * BLOCK
                checked += 1
        assert checked >= 3
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.prefix_cache_hit_tokens >= 5 * 10 * BLOCK


@pytest.mark.parametrize("wait", [True, False])
def test_requests_arriving_together_compute_a_shared_prefix_once(
    real_model_path, make_llm, monkeypatch, wait
):
    """8 requests with a common 10-block prefix submitted at once to a cold cache: the first
    computes the prefix and the others wait for its step to commit it (scheduler.h, shared
    prefixes in flight), then take it from the cache; with the wait off
    (CACHEFLOW_SHARED_PREFIX_WAIT=0) all 8 compute it in the same step. The greedy tokens are
    the cache-off engine's either way."""
    monkeypatch.setenv("CACHEFLOW_SHARED_PREFIX_WAIT", "64" if wait else "0")
    on = make_llm(real_model_path, max_num_seqs=8, n_ctx=8 * 256, max_num_batched_tokens=2048)
    off = make_llm(real_model_path, max_num_seqs=8, n_ctx=8 * 256, enable_prefix_caching=False)
    rng = random.Random(11)
    system = random_tokens(on, 10 * BLOCK, rng)
    prompts = [system + random_tokens(on, 20 + i, rng) for i in range(8)]
    outs = run(on, prompts)
    assert [o.token_ids for o in outs] == [o.token_ids for o in run(off, prompts)]
    cached = [o.metrics.num_cached_tokens for o in outs]
    if wait:
        assert cached[0] == 0 and all(n >= 10 * BLOCK for n in cached[1:]), cached
        assert on.stats().prefix_cache_hit_tokens >= 7 * 10 * BLOCK
    else:
        assert cached == [0] * 8


def test_cancelling_shared_prefix_requests_mid_prefill(real_model_path, make_llm):
    """Requests sharing a prefix are aborted while their prompts are half computed (32-token
    steps), then submitted again; every request that completes matches the cache-off run."""
    from pycacheflow._native import Engine
    from pycacheflow.config import EngineConfig

    off = make_llm(real_model_path, max_num_seqs=4, n_ctx=4 * 256, enable_prefix_caching=False)
    rng = random.Random(5)
    system = random_tokens(off, 5 * BLOCK + 3, rng)
    prompts = [system + random_tokens(off, 30, rng) for _ in range(4)]
    want = [o.token_ids for o in run(off, prompts, 8)]
    config = EngineConfig(model=real_model_path, max_num_seqs=4, n_ctx=4 * 256, max_num_batched_tokens=32)
    with Engine(config) as engine:
        ids = [engine.add_request(p, greedy(8)) for p in prompts]
        engine.step()
        engine.step()
        engine.abort(ids[0])  # the one computing the shared prefix first
        engine.abort(ids[2])
        engine.step()
        retry = {engine.add_request(prompts[0], greedy(8)): 0, engine.add_request(prompts[2], greedy(8)): 2}
        expected = {ids[1]: 1, ids[3]: 3, **retry}
        got: dict[int, list[int]] = {}
        aborted = set()
        while engine.has_work():
            engine.step()
            for e in engine.drain():
                if e.token_id >= 0:
                    got.setdefault(e.request_id, []).append(e.token_id)
                if e.finish_reason == 3:
                    aborted.add(e.request_id)
        assert aborted == {ids[0], ids[2]}
        for request_id, i in expected.items():
            assert tuple(got[request_id]) == want[i], f"prompt {i} (request {request_id})"
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.prefix_cache_hit_tokens > 0


def test_preempted_requests_resume_on_cached_blocks(real_model_path, make_llm):
    """A 256-token pool for 6 requests sharing a 3-block prefix: requests are preempted and
    recomputed; their outputs equal the cache-off run without preemption."""
    rng = random.Random(9)
    roomy = make_llm(real_model_path, max_num_seqs=6, n_ctx=6 * 256, enable_prefix_caching=False)
    system = random_tokens(roomy, 3 * BLOCK, rng)
    prompts = [system + random_tokens(roomy, 10 + i, rng) for i in range(6)]
    want = [o.token_ids for o in run(roomy, prompts, 40)]
    tight = make_llm(real_model_path, max_num_seqs=6, n_ctx=256)
    outs = run(tight, prompts, 40)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == want
    stats = tight.stats()
    assert stats.kv_blocks_used == 0 and stats.prefix_cache_hit_tokens > 0
