"""KV streaming (issue 16) on the CPU: with kv_streaming="on" and a device pool too small for the running
set (or for one prompt), greedy outputs equal a roomy pool's token for token; bad flag values fail clearly."""

from __future__ import annotations

import pytest

from pycacheflow import LLM, SamplingParams
from pycacheflow.config import EngineConfig

COMMON = dict(n_threads=2, max_num_seqs=8, max_num_batched_tokens=64, swap_space_bytes=64 << 20)
PROMPTS = [f"Write a story number {i} about a dragon who loves caching, memory, blocks, pages and the long "
           "history of computers in the old days, and" for i in range(8)]


def _tokens(llm: LLM, prompts: list[str], n: int) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return [list(o.token_ids) for o in outs]


@pytest.fixture(scope="module")
def model_path() -> str:
    from pycacheflow.model_hub import ensure_default_model
    return str(ensure_default_model())


def test_streamed_running_set_equals_roomy_pool(model_path: str) -> None:
    roomy = LLM(model_path, n_ctx=4096, preemption_mode="swap", **COMMON)
    want = _tokens(roomy, PROMPTS, 100)
    assert roomy.stats().num_preemptions == 0
    del roomy
    # 16 device blocks for 8 sequences of ~9 blocks each: blocks stream to the host instead of preempting
    llm = LLM(model_path, n_ctx=256, kv_streaming="on", kv_stream_blocks=64, preemption_mode="swap", **COMMON)
    got = _tokens(llm, PROMPTS, 100)
    st = llm.stats()
    assert got == want
    assert st.kv_streaming == 1 and st.kv_stream_demotions > 0 and st.kv_staged_blocks > 0
    assert st.kv_staging_decodes > 0 and st.kv_streamed_blocks == 0  # all finished: no host entry left
    assert st.swap_blocks_used == 0  # every host slot came back


def test_streamed_running_set_tiny_model(tiny_model_path) -> None:
    """The same equality on the 2-layer random-weight model (other head shapes, F32/F16 weights)."""
    roomy = LLM(str(tiny_model_path), n_ctx=4096, **COMMON)
    want = _tokens(roomy, PROMPTS, 80)
    del roomy
    llm = LLM(str(tiny_model_path), n_ctx=256, kv_streaming="on", kv_stream_blocks=64, **COMMON)
    got = _tokens(llm, PROMPTS, 80)
    assert got == want
    assert llm.stats().kv_stream_demotions > 0 and llm.stats().kv_staged_blocks > 0


def test_prompt_longer_than_device_pool(model_path: str) -> None:
    prompt = " ".join(f"item {i} is a {'red' if i % 2 else 'blue'} box;" for i in range(90))  # ~600 tokens
    roomy = LLM(model_path, n_ctx=4096, **COMMON)
    want = _tokens(roomy, [prompt], 24)
    del roomy
    llm = LLM(model_path, n_ctx=256, kv_streaming="on", kv_stream_blocks=48, **COMMON)
    assert llm.stats().kv_blocks_total * 16 < len(want[0]) + 500  # the device pool alone cannot hold it
    got = _tokens(llm, [prompt], 24)
    assert got == want
    assert llm.stats().kv_stream_demotions > 0


def test_streaming_off_by_default_on_cpu(model_path: str) -> None:
    llm = LLM(model_path, n_ctx=256, **COMMON)
    assert llm.stats().kv_streaming == 0


def test_bad_values() -> None:
    with pytest.raises(ValueError, match="kv_streaming"):
        EngineConfig(model="x.gguf", kv_streaming="sometimes")
    with pytest.raises(ValueError, match="kv_stream_blocks"):
        EngineConfig(model="x.gguf", kv_stream_blocks=0)
    with pytest.raises(ValueError, match="kv_stream_depth"):
        EngineConfig(model="x.gguf", kv_stream_depth=0)


def test_too_few_host_slots(model_path: str) -> None:
    with pytest.raises(Exception, match="kv_stream_blocks=64 needs as many host slots"):
        LLM(model_path, n_ctx=256, kv_streaming="on", kv_stream_blocks=64, **dict(COMMON, swap_space_bytes=1 << 20))


def test_refused_with_stock_kv(model_path: str) -> None:
    with pytest.raises(Exception, match="kv_streaming=on needs the paged KV cache"):
        LLM(model_path, n_ctx=256, kv_mode="stock", kv_streaming="on", **COMMON)
