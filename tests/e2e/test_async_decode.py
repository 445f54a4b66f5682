"""Async decode (CACHEFLOW_ASYNC_DECODE=1, engine_step.cpp "Lookahead") changes no greedy output.

With it the engine launches the decode it expects the next step to be (every sequence one position
on, token ids taken on the device from this step's argmax: patches 0017 and 0018) before it reads
this step's tokens, and adopts it when the scheduler's next plan is that one, or waits for it and
drops it when not. On the CPU the decodes run synchronously, so this checks the bookkeeping: the
same greedy tokens with and without, while requests end at different steps (max_tokens, EOS),
arrive during decoding (prompt chunks in between), stop on a stop string or ignore EOS (the feed's
argmax without EOG tokens), with decodes adopted; a decode launched ahead and dropped (the request
ended at its context's end) is checked alone; one adopted by the requests left when others stopped
(no drop); rows sampled on the host (logprobs) are never launched ahead.
"""

from __future__ import annotations

import pytest

from engine_helpers import staggered_tokens

from pycacheflow import SamplingParams

pytestmark = [pytest.mark.e2e]

PROMPTS = [("async %d decode " % i) * (2 + 5 * i) for i in range(8)]


def params_for(i: int) -> SamplingParams:
    if i % 4 == 1:
        return SamplingParams(max_tokens=24, ignore_eos=True)
    if i % 4 == 2:  # ends at its first token holding an "e" (possibly the prompt step's)
        return SamplingParams(max_tokens=30, stop=["e"])
    return SamplingParams(max_tokens=10 + 3 * i)


def run(make_llm, model, monkeypatch, async_decode: str):
    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", async_decode)
    llm = make_llm(model, kv_mode="paged", max_num_seqs=8, n_ctx=4096, max_num_batched_tokens=64)
    return staggered_tokens(llm, PROMPTS, params_for, num_first=4), llm.stats()


def test_async_decode_gives_the_same_greedy_tokens(real_model_path, make_llm, monkeypatch):
    want, plain = run(make_llm, real_model_path, monkeypatch, "0")
    got, ahead = run(make_llm, real_model_path, monkeypatch, "1")
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"prompt {i}"
    assert plain.num_lookahead_decodes == 0
    assert ahead.num_lookahead_adopted > 0, ahead


def test_async_decode_alone_matches_generate(real_model_path, make_llm, monkeypatch):
    """One request decoding alone until its context is full (256 tokens): every step after the
    prompt's is launched ahead, block boundaries included (the next row in a reserved block); the last
    one, launched for a step that never comes (the stop checker ends the request at the context's
    end, which the launch does not foresee), is waited for and dropped."""
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", "1")
    llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=1, n_ctx=256)
    (out,) = llm.generate(["The capital of France is"], params)
    stats = llm.stats()
    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", "0")
    (want,) = make_llm(real_model_path, kv_mode="paged", max_num_seqs=1, n_ctx=256).generate(
        ["The capital of France is"], params)  # fmt: skip
    assert list(out.token_ids) == list(want.token_ids) and out.finish_reason == want.finish_reason == "length"
    assert stats.num_lookahead_decodes == stats.num_lookahead_adopted + 1, stats
    # every step but the prompt's and the first decode (nothing is launched ahead during a prompt's step)
    assert stats.num_lookahead_adopted == stats.num_steps - 2 == len(out.token_ids) - 2, stats


def test_async_decode_crosses_block_boundaries(real_model_path, make_llm, monkeypatch):
    """Eight requests decoding together from prompts of different lengths: some sequence's next row
    starts a new block at most steps (16-token blocks), and the decode launched ahead takes that
    block early (BlockManager::reserve_next_block). Nearly every decode step is adopted: all but the
    first (its prompts' step launches nothing ahead) and the last (the requests end at max_tokens,
    which the launch foresees, so nothing is launched for a step that never comes)."""
    prompts = [("boundary %d " % i) * (3 + 2 * i) for i in range(8)]
    params = SamplingParams(max_tokens=48, ignore_eos=True)

    def run(async_decode: str):
        monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", async_decode)
        llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=2048, block_size=16)
        return [list(o.token_ids) for o in llm.generate(prompts, params)], llm.stats()

    want, _ = run("0")
    got, stats = run("1")
    assert got == want
    assert all(len(t) == 48 for t in got)
    # 47 decode steps after the prompts' step; every one but the last has a successor to launch ahead
    assert stats.num_lookahead_decodes == stats.num_lookahead_adopted == 46, stats


def test_rows_sampled_on_the_host_are_never_launched_ahead(real_model_path, make_llm, monkeypatch):
    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", "1")
    llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=2, n_ctx=1024)
    params = SamplingParams(max_tokens=12, logprobs=2)
    got = llm.generate(PROMPTS[:2], params)
    assert llm.stats().num_lookahead_decodes == 0
    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", "0")
    want = make_llm(real_model_path, kv_mode="paged", max_num_seqs=2, n_ctx=1024).generate(PROMPTS[:2], params)
    assert [list(o.token_ids) for o in got] == [list(o.token_ids) for o in want]


@pytest.mark.parametrize(("value", "config", "says"), [
    ("true", {"kv_mode": "paged"}, "CACHEFLOW_ASYNC_DECODE=true is not a whole number from 0 to 1; ignored"),
    ("1", {"kv_mode": "stock"}, "CACHEFLOW_ASYNC_DECODE=1 ignored: async decode needs the paged KV cache"),
    # strtol would take these as 1 (a new-user review saw them turn it on silently)
    (" 1", {"kv_mode": "paged"}, "CACHEFLOW_ASYNC_DECODE= 1 is not a whole number from 0 to 1; ignored"),
    ("01", {"kv_mode": "paged"}, "CACHEFLOW_ASYNC_DECODE=01 is not a whole number from 0 to 1; ignored"),
    ("1", {"kv_mode": "paged", "kv_streaming": "on", "kv_stream_blocks": 64},
     "CACHEFLOW_ASYNC_DECODE=1 ignored: async decode does not run with KV streaming"),
])  # fmt: skip
def test_a_setting_async_decode_cannot_take_is_named_on_stderr(real_model_path, make_llm, monkeypatch, capfd, value,
                                                               config, says):
    """Only the value 1 turns async decode on, and only in paged mode without KV streaming: anything else is said, not
    silently dropped."""
    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", value)
    llm = make_llm(real_model_path, max_num_seqs=2, n_ctx=1024, **config)
    llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4))
    assert says in capfd.readouterr().err
    assert llm.stats().num_lookahead_decodes == 0


def test_a_decode_launched_ahead_is_adopted_by_the_requests_left_when_one_stops(real_model_path, make_llm,
                                                                                monkeypatch):
    """Three requests end on a stop string, which no launch foresees, while five go on: the decode launched ahead
    before each of those ends is adopted for the requests left (its rows of the ended ones are never read) instead
    of being waited for and dropped. None is dropped, and the step of such an adoption launches the next decode for
    the requests left (the batch reduced to their rows, each token fed from its row in the decode adopted), so all 46
    decode steps after the first launch one ahead (the last step has nothing to launch)."""
    prompts = [("stop %d here " % i) * (2 + i) for i in range(8)]
    stops = {0: "5 here", 1: "7 here", 2: " base case"}  # the model counts, pairs, then explains recursion

    def params(i: int) -> SamplingParams:
        if i in stops:
            return SamplingParams(max_tokens=48, stop=[stops[i]])
        return SamplingParams(max_tokens=48, ignore_eos=True)

    def run(async_decode: str):
        monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", async_decode)
        llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=2048)
        outs = llm.generate(prompts, [params(i) for i in range(8)])
        return [list(o.token_ids) for o in outs], [o.finish_reason for o in outs], llm.stats()

    want, _, _ = run("0")
    got, reasons, stats = run("1")
    assert got == want
    assert reasons == ["stop"] * 3 + ["length"] * 5
    assert sorted({len(t) for t in got[:3]}) == sorted(len(t) for t in got[:3]), "the stops fall on three steps"
    assert stats.num_lookahead_decodes == stats.num_lookahead_adopted == 46, stats


def test_a_decode_launched_ahead_survives_prefix_cache_block_moves(real_model_path, make_llm, monkeypatch):
    """The same eight prompts twice on one engine, prefix cache on: the second time, each block that fills holds the
    same tokens after the same prefix as a cached block of the first run, and the table moves onto that block
    (BlockManager::commit_full_block). The decode launched ahead read the block given back (the same KV), so it is
    adopted all the same: no drop in either run (a new-user review found 15 of 46 dropped the second time), and the
    greedy tokens equal those without async decode."""
    prompts = ["The capital of France is", "Write a poem about the sea.", "1, 2, 3, 4,", "Once upon a time",
               "def fibonacci(n):", "The best way to learn is", "Q: What is 2+2?\nA:", "List three colors:"]
    params = SamplingParams(max_tokens=48, ignore_eos=True)

    def run(async_decode: str):
        monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", async_decode)
        llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=4096)
        first = [list(o.token_ids) for o in llm.generate(prompts, params)]
        before = llm.stats()
        second = [list(o.token_ids) for o in llm.generate(prompts, params)]
        return first, second, before, llm.stats()

    want_first, want_second, _, _ = run("0")
    first, second, before, after = run("1")
    assert first == want_first and second == want_second
    assert before.num_lookahead_decodes == before.num_lookahead_adopted == 46, before
    launched = after.num_lookahead_decodes - before.num_lookahead_decodes
    adopted = after.num_lookahead_adopted - before.num_lookahead_adopted
    assert launched == adopted == 46, after


@pytest.mark.parametrize("padding", ["0", "1"])
def test_requests_ending_at_max_tokens_on_consecutive_steps(real_model_path, make_llm, monkeypatch, padding):
    """Eight requests whose max_tokens are 20, 21, ..., 27 end on eight consecutive steps. A step whose token is a
    request's last still launches the next decode ahead while any request goes on; the requests left adopt it without
    the ended one's row and launch the next one for themselves alone. So 25 of the 26 decode steps after the prompts'
    step had a decode launched ahead, all adopted (all but the first: the prompts' step launches nothing ahead).
    Before stop 45 a step where any request ended launched nothing (18 of 26); with that fixed but no launch
    at an adoption for fewer sequences, 22 of 26. Greedy tokens equal those without async decode. With step padding
    (CACHEFLOW_STEP_PADDING=1, as on CUDA) each reduced batch is padded again to its bucket (8 rows, then 4 at 4
    rows left, ...) with padding rows in a slot no request holds."""
    prompts = [("last %d token " % i) * (2 + i) for i in range(8)]
    params = [SamplingParams(max_tokens=20 + i, ignore_eos=True) for i in range(8)]
    monkeypatch.setenv("CACHEFLOW_STEP_PADDING", padding)

    def run(async_decode: str):
        monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", async_decode)
        llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=8, n_ctx=2048)
        outs = llm.generate(prompts, params)
        return [list(o.token_ids) for o in outs], llm.stats()

    want, _ = run("0")
    got, stats = run("1")
    assert got == want
    assert [len(t) for t in got] == [20 + i for i in range(8)]
    assert stats.num_steps == 27, stats
    assert stats.num_lookahead_decodes == stats.num_lookahead_adopted == 25, stats
    assert (stats.num_padding_tokens > 0) == (padding == "1"), stats


def test_async_decode_with_every_slot_taken_and_requests_waiting(real_model_path, make_llm, monkeypatch):
    """Twelve requests at once on four slots: eight wait in the queue while four decode. A decode is still launched
    ahead while every slot is taken and no request ends at that step by max_tokens, and the step that adopts it admits
    nothing (Scheduler::hold_admissions): the waiting requests could not get in there anyway, but for a slot freed by a
    stop token, whose admission then comes one step later. Before, nothing was launched ahead while one waited. Every
    third request stops at a token of its output without stops (position 3 + i), which no launch foresees. The greedy
    tokens and finish reasons equal those without async decode."""
    prompts = [("waiting %d " % i) * (2 + i) for i in range(12)]
    lengths = [14 + 5 * (i % 4) for i in range(12)]

    def run(async_decode: str, stops: list[list[int]]):
        monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", async_decode)
        llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=4, n_ctx=4096)
        params = [SamplingParams(max_tokens=n, ignore_eos=True, stop_token_ids=s) for n, s in zip(lengths, stops)]
        outs = llm.generate(prompts, params)
        return [(list(o.token_ids), o.finish_reason) for o in outs], llm.stats()

    plain, _ = run("0", [[] for _ in prompts])
    stops = [[plain[i][0][3 + i]] if i % 3 == 0 else [] for i in range(12)]
    want, _ = run("0", stops)
    got, stats = run("1", stops)
    assert got == want
    assert sum(reason == "stop" for _, reason in got) == 4, [reason for _, reason in got]
    assert stats.num_lookahead_decodes == stats.num_lookahead_adopted, stats
    print("launched ahead and adopted:", stats.num_lookahead_adopted, "of", stats.num_steps, "steps")
    assert stats.num_lookahead_adopted >= stats.num_steps // 2, stats
