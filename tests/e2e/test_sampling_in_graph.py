"""Stochastic sampling in-graph (llama.cpp backend sampling) next to the CPU path.

Stochastic sequences whose chain starts with top_k <= 64 (llama-server's default is 40) are
reduced in-graph to their 64 largest logits (patch 0006) and sampled by their own llama.cpp chain
on the CPU from those; other sequences with temperature > 0 and a random seed are sampled by a
backend chain attached to their slot, other seeded ones on the CPU from the whole row
(llama_session.h). top_k = 1 makes a stochastic chain deterministic, so its tokens must equal
greedy decoding, whatever else shares the batch.
"""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams

pytestmark = pytest.mark.e2e

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "2 + 2 ="]


@pytest.mark.xfail(strict=False, reason="on an AMD EPYC CI-kind machine under pytest (not in a plain "
                   "script) the top_k=1 row and the greedy run part at a near-tie of the tiny random model "
                   "(token 33906 vs 33907 at step 15), also on the session's first commit a6f36c3: open")
def test_top_k_1_equals_greedy_in_a_mixed_batch(tiny_model_path, make_llm):
    llm = make_llm(tiny_model_path, max_num_seqs=8)
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
    top1 = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, top_k=1)
    noisy = SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.5, top_p=0.9)
    seeded = SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=7)
    ids = [llm.add_request(p, top1) for p in PROMPTS]
    ids += [llm.add_request(p, noisy) for p in PROMPTS]
    ids += [llm.add_request(p, seeded) for p in PROMPTS[:2]]
    outs = [list(llm.iter_outputs(i))[-1].output for i in ids]
    assert [o.token_ids for o in outs[:4]] == expected
    n_vocab = llm.info.n_vocab
    assert all(len(o.token_ids) == 24 and all(0 <= t < n_vocab for t in o.token_ids) for o in outs)
    # the seeded ones sample on the CPU: the same tokens as each alone
    alone = [llm.generate([p], seeded)[0].token_ids for p in PROMPTS[:2]]
    assert [o.token_ids for o in outs[8:]] == alone


def test_batched_argmax_equals_host_greedy(real_model_path, make_llm, monkeypatch):
    """Greedy rows are sampled by one argmax over all output rows (patch 0005); with in-graph
    sampling off (CACHEFLOW_HOST_SAMPLING=1) the engine takes the argmax of each row's copied
    logits on the CPU. Both give the same tokens for a batch of 16 ragged prompts."""
    prompts = [f"{PROMPTS[i % 4]} {'and so on ' * i}" for i in range(16)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    batched = [o.token_ids for o in make_llm(real_model_path, max_num_seqs=16).generate(prompts, params)]
    monkeypatch.setenv("CACHEFLOW_HOST_SAMPLING", "1")
    host = [o.token_ids for o in make_llm(real_model_path, max_num_seqs=16).generate(prompts, params)]
    assert batched == host


LLAMA_SERVER_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def test_top_k_candidates_sample_what_the_whole_row_samples(real_model_path, make_llm, monkeypatch):
    """A seeded request with llama-server's default sampling gets the same tokens from the 64
    in-graph candidates as from its whole logits row on the CPU (CACHEFLOW_HOST_SAMPLING=1):
    top_k(40) keeps the same 40 tokens from either, and the rest of the chain and its random
    generator see the same numbers. 12 seeds over 4 prompts, batched with greedy rows."""
    prompts = [PROMPTS[i % 4] for i in range(12)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True, seed=100 + i, **LLAMA_SERVER_DEFAULTS)
              for i in range(12)]  # fmt: skip
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    llm = make_llm(real_model_path, max_num_seqs=16)
    candidates = [o.token_ids for o in llm.generate(prompts + PROMPTS, params + [greedy] * 4)]
    monkeypatch.setenv("CACHEFLOW_HOST_SAMPLING", "1")
    host = [o.token_ids for o in make_llm(real_model_path, max_num_seqs=16).generate(prompts, params)]
    assert candidates[:12] == host
    assert len({tuple(t) for t in host}) > 6  # the seeds drew different continuations
    assert candidates[12:] == [o.token_ids for o in llm.generate(PROMPTS, greedy)]


def test_sampling_threads_do_not_change_the_tokens(real_model_path, make_llm, monkeypatch):
    """The top-k candidate rows of a step are sampled on the engine's sampling pool, each by its own
    chain on one thread (sampling_pool.h): 20 seeded requests with llama-server's defaults and 4
    more with its ignore_eos bias (more than the pool's 16-row threshold each step), beside greedy
    rows and a penalties row (both off the pool), get the same tokens on 1 and on 4 threads, and
    the seeded plain ones the same as from their whole logits row on the CPU."""
    prompts = [f"{PROMPTS[i % 4]} {'and ' * (i // 4)}" for i in range(29)]
    base = {"max_tokens": 16, "ignore_eos": True}
    seeded = [SamplingParams(seed=300 + i, **base, **LLAMA_SERVER_DEFAULTS) for i in range(20)]
    llm = make_llm(real_model_path, max_num_seqs=32, sampling_threads=1)
    eog = {t: float("-inf") for t in llm.eog_token_ids()}
    biased = [SamplingParams(seed=400 + i, logit_bias=eog, **base, **LLAMA_SERVER_DEFAULTS)
              for i in range(4)]  # fmt: skip
    penalized = SamplingParams(seed=9, repeat_penalty=1.3, **base, **LLAMA_SERVER_DEFAULTS)
    params = seeded + biased + [SamplingParams(**base)] * 4 + [penalized]
    serial = [o.token_ids for o in llm.generate(prompts, params)]
    assert llm.stats().num_rows_sampled_top_k == 24 * 16  # every token of the 24, the first included
    pooled = make_llm(real_model_path, max_num_seqs=32, sampling_threads=4)
    assert [o.token_ids for o in pooled.generate(prompts, params)] == serial
    assert len({tuple(t) for t in serial[:24]}) > 12  # the seeds drew different continuations
    monkeypatch.setenv("CACHEFLOW_HOST_SAMPLING", "1")
    host = make_llm(real_model_path, max_num_seqs=32, sampling_threads=4)
    assert [o.token_ids for o in host.generate(prompts[:20], seeded)] == serial[:20]


def test_top_k_candidates_for_a_seed_do_not_depend_on_the_batch(real_llm):
    """The candidates of a row, and so a seeded row's tokens, are the same alone and among 8."""
    params = [SamplingParams(max_tokens=16, ignore_eos=True, seed=7 + i, **LLAMA_SERVER_DEFAULTS)
              for i in range(8)]  # fmt: skip
    prompts = [PROMPTS[i % 4] for i in range(8)]
    together = [o.token_ids for o in real_llm.generate(prompts, params)]
    alone = [real_llm.generate([p], q)[0].token_ids for p, q in zip(prompts, params)]
    assert together == alone


def test_top_k_above_the_vocabulary_keeps_every_token(real_llm):
    """top_k >= n_vocab is top_k off (llama.cpp's top_k clamps k to the candidates): the same tokens
    for a seed, where the in-graph top-k would have aborted the process on k > n_vocab."""
    n_vocab = real_llm.info.n_vocab
    base = {"max_tokens": 12, "ignore_eos": True, "temperature": 0.8, "seed": 5}
    off = real_llm.generate([PROMPTS[0]], SamplingParams(top_k=0, **base))[0].token_ids
    for k in (n_vocab, n_vocab + 1, 10**6):
        assert real_llm.generate([PROMPTS[0]], SamplingParams(top_k=k, **base))[0].token_ids == off


def test_random_seed_sampling_varies(tiny_model_path, make_llm):
    llm = make_llm(tiny_model_path, max_num_seqs=8)
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=2.0, top_k=50)
    outs = llm.generate(["Once upon a time"] * 8, params)
    assert all(len(o.token_ids) == 16 for o in outs)
    assert len({tuple(o.token_ids) for o in outs}) > 1  # 8 draws at temperature 2 differ


def test_logit_bias_and_penalties_leave_the_graph_only_for_their_rows(real_llm):
    """A logit bias or a penalty (llama.cpp's samplers) changes a greedy row's tokens, which
    are then the argmax of the changed logits on the CPU; plain greedy rows in the same batch
    keep their in-graph tokens."""
    prompt = "List the numbers: one, two, three, one, two, three, one, two,"
    plain = SamplingParams(max_tokens=16, ignore_eos=True)
    expected = real_llm.generate([prompt], plain)[0].token_ids
    banned = SamplingParams(max_tokens=16, ignore_eos=True, logit_bias={expected[0]: float("-inf")})
    boosted = SamplingParams(max_tokens=16, ignore_eos=True, logit_bias={expected[3]: 100.0})
    penalized = SamplingParams(max_tokens=16, ignore_eos=True, repeat_penalty=1.5,
                               presence_penalty=1.0, repeat_last_n=-1)  # fmt: skip
    outs = real_llm.generate([prompt] * 4, [plain, banned, boosted, penalized])
    assert outs[0].token_ids == expected  # the greedy row beside them is unchanged
    assert outs[1].token_ids[0] != expected[0] and expected[0] not in outs[1].token_ids
    assert set(outs[2].token_ids) == {expected[3]}  # +100 wins every step
    assert outs[3].token_ids != expected
    # each alone gives the same tokens: the CPU route does not depend on the batch
    assert real_llm.generate([prompt], penalized)[0].token_ids == outs[3].token_ids


def test_grammar_constrains_the_output(real_llm):
    from pycacheflow.errors import InvalidArgumentError
    from pycacheflow.server.json_schema import json_object_grammar

    five_a = SamplingParams(max_tokens=8, grammar='root ::= "a"{5,5}')
    as_json = SamplingParams(max_tokens=24, grammar=json_object_grammar(), temperature=0.8, seed=3)
    plain = SamplingParams(max_tokens=8)
    outs = real_llm.generate(["Say something", "Describe a cat in JSON:", "Say something"],
                             [five_a, as_json, plain])  # fmt: skip
    assert outs[0].text == "aaaaa" and outs[0].finish_reason == "stop"  # EOS once complete
    assert outs[1].text.startswith("{")
    assert outs[2].text != "aaaaa"
    with pytest.raises(InvalidArgumentError, match="grammar"):
        real_llm.generate(["x"], SamplingParams(max_tokens=2, grammar="root ::= (unclosed"))


def test_logit_bias_in_graph_equals_host_sampling(real_model_path, make_llm, monkeypatch):
    """A logit bias alone stays in-graph (llama.cpp's backend logit_bias sampler ahead of the
    greedy or stochastic chain; llama-server's ignore_eos is such a bias): the tokens equal
    those of the CPU samplers (CACHEFLOW_HOST_SAMPLING=1), in a batch with plain rows."""
    prompt = "List the numbers: one, two, three, one, two, three, one, two,"
    plain = SamplingParams(max_tokens=12, ignore_eos=True)
    in_graph = make_llm(real_model_path, max_num_seqs=4)
    expected = in_graph.generate([prompt], plain)[0].token_ids
    eog = {t: float("-inf") for t in in_graph.eog_token_ids()}
    params = [plain,
              SamplingParams(max_tokens=12, ignore_eos=True, logit_bias={**eog, expected[0]: -1e9}),
              SamplingParams(max_tokens=12, ignore_eos=True, logit_bias={expected[2]: 100.0}),
              SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.7, top_k=1,
                             logit_bias={expected[1]: float("-inf")})]  # fmt: skip
    outs = [o.token_ids for o in in_graph.generate([prompt] * 4, params)]
    monkeypatch.setenv("CACHEFLOW_HOST_SAMPLING", "1")
    host = make_llm(real_model_path, max_num_seqs=4)
    assert outs == [o.token_ids for o in host.generate([prompt] * 4, params)]
    assert outs[0] == expected and expected[0] not in outs[1] and set(outs[2]) == {expected[2]}
    assert expected[1] not in outs[3]


def test_ignore_eos_bias_takes_the_argmax_without_eog(real_model_path, make_llm, monkeypatch):
    """A greedy row whose logit bias bans exactly the EOG tokens (llama-server's ignore_eos) is
    sampled by the batched argmax without EOG tokens (patch 0005), not by a chain per row: where
    plain greedy ends, it goes on, with the same tokens as the chain logit_bias -> greedy (a
    bias with one more, neutral entry keeps a row on the chain) and as the CPU samplers."""
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    llm = make_llm(real_model_path, max_num_seqs=4)
    ends = llm.generate([prompt], SamplingParams(max_tokens=64))[0]
    assert ends.finish_reason == "stop" and len(ends.token_ids) < 40  # greedy ends early here
    eog = {t: float("-inf") for t in llm.eog_token_ids()}
    no_eog = SamplingParams(max_tokens=48, logit_bias=eog)
    chained = SamplingParams(max_tokens=48, logit_bias={**eog, 100: 0.0})
    plain = SamplingParams(max_tokens=48, ignore_eos=True)
    outs = llm.generate([prompt] * 3, [no_eog, chained, plain])
    assert outs[0].finish_reason == "length" and len(outs[0].token_ids) == 48
    assert not set(outs[0].token_ids) & set(eog)
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].token_ids[: len(ends.token_ids) - 1] == ends.token_ids[:-1]
    monkeypatch.setenv("CACHEFLOW_HOST_SAMPLING", "1")
    host = make_llm(real_model_path, max_num_seqs=4)
    assert host.generate([prompt], no_eog)[0].token_ids == outs[0].token_ids


def _routes(llm) -> tuple[int, int, int]:
    s = llm.stats()
    return s.num_rows_sampled_in_graph, s.num_rows_sampled_top_k, s.num_rows_sampled_host


def test_lowering_biases_sample_from_the_top_k_candidates(real_model_path, make_llm, monkeypatch):
    """A row whose logit bias only lowers tokens (llama-server's ignore_eos bans the EOG tokens)
    is still sampled from its 64 in-graph candidates when top_k + the biased tokens fit in 64
    (a lowered token can only leave the top k, so the chain's picks are among the raw top 64):
    seeded llama-server defaults with the EOG ban, with finite penalties on 3 more tokens, and
    greedy rows with an -inf and a finite penalty get the same tokens as the chain over the whole
    row on the CPU. A bias too large to fit (40 + 30 tokens) or a positive one takes the host route
    and the same tokens."""
    prompt = "List the numbers: one, two, three, one, two, three, one, two,"
    llm = make_llm(real_model_path, max_num_seqs=8)
    expected = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    eog = {t: float("-inf") for t in llm.eog_token_ids()}
    lowered = {**eog, expected[0]: -2.0, expected[1]: -5.0, expected[2]: -1e4}
    many = {**eog, **{t: -3.0 for t in range(1000, 1030)}}
    base = {"max_tokens": 12, "ignore_eos": True}
    fits = [SamplingParams(seed=11, logit_bias=eog, **base, **LLAMA_SERVER_DEFAULTS),
            SamplingParams(seed=12, logit_bias=lowered, **base, **LLAMA_SERVER_DEFAULTS),
            SamplingParams(logit_bias={expected[0]: float("-inf"), expected[3]: -0.5}, **base),
            SamplingParams(logit_bias=lowered, **base)]  # fmt: skip
    before = _routes(llm)
    outs = [o.token_ids for o in llm.generate([prompt] * 4, fits)]
    after = _routes(llm)
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (0, 48, 0)
    host_route = [SamplingParams(seed=13, logit_bias=many, **base, **LLAMA_SERVER_DEFAULTS),
                  SamplingParams(seed=14, logit_bias={**eog, expected[0]: 0.5}, **base,
                                 **LLAMA_SERVER_DEFAULTS)]  # fmt: skip
    outs += [o.token_ids for o in llm.generate([prompt] * 2, host_route)]
    assert _routes(llm)[1] == after[1]  # none of those from the candidates
    monkeypatch.setenv("CACHEFLOW_HOST_SAMPLING", "1")
    host = make_llm(real_model_path, max_num_seqs=8)
    assert outs == [o.token_ids for o in host.generate([prompt] * 6, fits + host_route)]
    assert expected[0] not in outs[2] and expected[2] not in outs[3]  # the biases applied


def test_reasoning_budget_forces_the_end_of_the_block(real_llm):
    """llama.cpp's reasoning-budget sampler, first in the chain (llama-server's
    --reasoning-budget): after ``tokens`` tokens inside the block the forced sequence follows
    token for token, and before it the tokens are the unconstrained greedy ones. The block opens
    either in the prompt (prefill: counting from the first token; budget 0 forces at once) or
    when the output itself writes the start sequence (the sampler watched for it), in a batch
    with a plain greedy row."""
    from pycacheflow import ReasoningBudget
    from pycacheflow.errors import InvalidArgumentError

    prompt = "Explain why the sky is blue."
    plain = SamplingParams(max_tokens=24, ignore_eos=True)
    free = real_llm.generate([prompt], plain)[0].token_ids
    end = tuple(real_llm.tokenize("</think>", False, True))
    forced = tuple(real_llm.tokenize(" Enough.", False, True)) + end
    think = tuple(real_llm.tokenize("<think>", False, True))

    def budget(tokens: int, **fields: object) -> SamplingParams:
        fields = {"start": think, "end": end, "forced": forced, **fields}
        return SamplingParams(max_tokens=24, ignore_eos=True,
                              reasoning_budget=ReasoningBudget(tokens, **fields))  # fmt: skip

    params = [budget(5, prefill=think), budget(0, prefill=think),
              budget(3, start=tuple(free[:2])), plain]  # fmt: skip
    outs = [o.token_ids for o in real_llm.generate([prompt] * 4, params)]
    n = len(forced)
    assert outs[0][:5] == free[:5] and tuple(outs[0][5 : 5 + n]) == forced
    assert tuple(outs[1][:n]) == forced
    # opened by its own first two tokens: three more, then the forced sequence
    assert outs[2][:5] == free[:5] and tuple(outs[2][5 : 5 + n]) == forced
    assert outs[3] == free
    # no block ever opens: nothing is forced, the greedy tokens
    never = budget(0, start=tuple(real_llm.tokenize("<never-written>", False, True)))
    assert real_llm.generate([prompt], never)[0].token_ids == free
    assert ReasoningBudget(2, think, end).forced == end  # the end marker alone by default
    with pytest.raises(ValueError, match="start and end"):
        ReasoningBudget(2, (), end)
    with pytest.raises(InvalidArgumentError, match=r"reasoning_end_tokens\[0\] = 99999999"):
        real_llm.generate([prompt], budget(2, end=(99999999,)))


def test_a_grammar_with_no_token_left_ends_only_its_request(real_llm):
    """llama.cpp's grammar aborts the process when it must accept a token it does not allow (an
    end-of-generation token before it is complete); CacheFlow's guard ends that request alone
    with "error" while the others of the batch run on."""
    # the bias bans every token the grammar allows first (the pieces that begin "Hello"), so the
    # only candidates left are -inf and the one taken is not the grammar's
    starts = {"H", "He", "Hel", "Hell", "Hello"}
    banned = {t: float("-inf") for t in range(real_llm.info.n_vocab)
              if real_llm.detokenize([t]) in starts}  # fmt: skip
    dead_end = SamplingParams(max_tokens=6, grammar='root ::= "Hello"', logit_bias=banned)
    plain = SamplingParams(max_tokens=6, ignore_eos=True)
    outs = real_llm.generate(["Say hello", "Say a letter"], [dead_end, plain])
    assert outs[0].finish_reason == "error" and len(outs[0].token_ids) == 0
    assert outs[0].error.startswith("grammar: no token the grammar allows was left to sample")
    assert outs[1].error is None
    assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == 6
    assert real_llm.generate(["Say a letter"], plain)[0].token_ids == outs[1].token_ids


def test_a_reasoning_budget_holds_the_grammar_off_inside_the_block(real_llm):
    """With a reasoning budget the grammar constrains only the tokens outside the block (as
    llama-server holds its grammar off while the budget runs): the block's tokens are the free
    greedy ones, the forced end marker is not fought, and the answer after it follows the
    grammar."""
    from pycacheflow import ReasoningBudget

    prompt = "Is the sky blue?"
    think = tuple(real_llm.tokenize("<think>", False, True))
    end = tuple(real_llm.tokenize("</think>", False, True))
    free = real_llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    budget = ReasoningBudget(4, think, end, prefill=think)
    # ignore_eos: the free tokens may hold an end-of-generation token (the raw prompt's first
    # greedy token is <|im_end|>); after the grammar completes only such tokens are allowed
    params = SamplingParams(max_tokens=12, grammar='root ::= "yes" | "no"', ignore_eos=True,
                            reasoning_budget=budget)  # fmt: skip
    out = real_llm.generate([prompt], params)[0]
    n = len(end)
    assert out.token_ids[:4] == free and tuple(out.token_ids[4 : 4 + n]) == end
    # the answer, then end-of-generation tokens (no text)
    assert real_llm.detokenize(out.token_ids[4 + n :]) in ("yes", "no")
