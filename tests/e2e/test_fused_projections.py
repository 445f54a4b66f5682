"""Fused projections (patches/0019, llama_model_fuse_projections) change no greedy output on the CPU.

At load the engine fuses each layer's Q/K/V weights and its FFN gate/up weights into one matrix
each where they lie back to back in the loaded buffer (views, nothing copied). The CPU computes
every output element of a matmul with the same dot product whatever the matrix's height, so the
greedy tokens must be identical with and without (CACHEFLOW_FUSE_PROJECTIONS=0), in prompt steps
(the fused gate/up path runs for ubatches of more than one token) and in decode steps of several
sequences, in both KV modes.

What fuses depends on the file's tensor order (the CPU reads weights through mmap):
SmolLM2's GGUF stores ffn_gate and ffn_up together but attn_k, attn_output, attn_q, attn_v apart,
so only gate/up fuse (one per layer); scripts/make_tiny_gguf.py writes q, k, v and gate, up, down
in order, so both fuse.
"""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams

pytestmark = [pytest.mark.e2e]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time " * 6, "1, 2, 3, 4,"]


def greedy(make_llm, model, monkeypatch, fuse: str, kv_mode: str):
    monkeypatch.setenv("CACHEFLOW_FUSE_PROJECTIONS", fuse)
    llm = make_llm(model, kv_mode=kv_mode, max_num_seqs=4, n_ctx=1024)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    return [list(o.token_ids) for o in outs], llm.info


@pytest.mark.parametrize("kv_mode", ["paged", "stock"])
@pytest.mark.parametrize(("model_fixture", "fused_per_layer"), [("real_model_path", 1), ("tiny_model_path", 2)])
def test_fused_projections_keep_greedy_tokens(request, make_llm, monkeypatch, kv_mode, model_fixture,
                                              fused_per_layer):  # fmt: skip
    model = request.getfixturevalue(model_fixture)
    want, unfused = greedy(make_llm, model, monkeypatch, "0", kv_mode)
    got, fused = greedy(make_llm, model, monkeypatch, "1", kv_mode)
    assert unfused.num_fused_projections == 0
    assert fused.num_fused_projections == fused_per_layer * fused.n_layer
    assert got == want


def test_a_value_other_than_0_or_1_is_named_and_fusion_stays_on(real_model_path, make_llm, monkeypatch, capfd):
    """CACHEFLOW_FUSE_PROJECTIONS=off is not 0: the engine says it ignores it, and fuses as by default."""
    monkeypatch.setenv("CACHEFLOW_FUSE_PROJECTIONS", "off")
    info = make_llm(real_model_path, max_num_seqs=1, n_ctx=512).info
    assert "CACHEFLOW_FUSE_PROJECTIONS=off is not a whole number from 0 to 1; ignored" in capfd.readouterr().err
    assert info.num_fused_projections == info.n_layer  # SmolLM2: gate/up in every layer (module docstring)
