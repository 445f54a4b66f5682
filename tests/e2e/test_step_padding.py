"""Step padding (native/src/engine/batch_builder.h) changes no greedy output.

In paged mode on CUDA the engine pads each decode of at most 512 tokens to a few token counts, so
that its CUDA graphs replay; CACHEFLOW_STEP_PADDING=1 turns the same padding on here, on the CPU,
where the default model's quantized matmuls and the invariant paged kernel are row-invariant: a
real row must come out bit-identical, and so must every greedy token. The requests arrive while
others decode and their prompts are chunked (a small token budget), so padded steps hold decode
rows, prompt chunks and the padding sequence together, with logit rows padded too.
"""

from __future__ import annotations

import pytest

from engine_helpers import staggered_tokens

from pycacheflow import SamplingParams

pytestmark = [pytest.mark.e2e]

PROMPTS = [("step %d padding " % i) * (2 + 9 * i) for i in range(11)]  # 11 prompts, 7 to ~400 tokens


def run(make_llm, model, monkeypatch, padding: str):
    monkeypatch.setenv("CACHEFLOW_STEP_PADDING", padding)
    llm = make_llm(model, kv_mode="paged", max_num_seqs=16, n_ctx=8192, max_num_batched_tokens=96)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    tokens = staggered_tokens(llm, PROMPTS, lambda i: params, num_first=5)
    return tokens, llm.stats()


def test_padded_steps_give_the_unpadded_greedy_tokens(real_model_path, make_llm, monkeypatch):
    want, plain = run(make_llm, real_model_path, monkeypatch, "0")
    got, padded = run(make_llm, real_model_path, monkeypatch, "1")
    assert plain.num_padding_tokens == 0 and padded.num_padding_tokens > 0
    # the scratch block of the padding is taken on top of the 8,192 tokens asked for
    assert plain.kv_blocks_total == 8192 // 16 and padded.kv_blocks_total >= plain.kv_blocks_total
    assert all(len(t) == 20 for t in got)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"prompt {i}"


def test_padding_keeps_every_token_of_a_context_asked_for(real_model_path, make_llm, monkeypatch):
    """n_ctx=256 for one 128-token prompt and 128 output tokens: llama.cpp's 256 rows leave no spare
    block for the scratch block, so the engine asks for one more rather than cut the request short
    (it stopped at 112 output tokens when padding took the 16th of 16 blocks)."""
    monkeypatch.setenv("CACHEFLOW_STEP_PADDING", "1")
    llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=1, n_ctx=256, max_num_batched_tokens=512)
    prompt = [100 + (7 * i) % 5000 for i in range(128)]
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=128, ignore_eos=True))
    assert len(out.token_ids) == 128 and out.finish_reason == "length"
    assert llm.stats().kv_blocks_total * 16 >= 256
