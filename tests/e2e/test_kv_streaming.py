"""KV streaming (issue 16) on the CPU: with kv_streaming="on" and a device pool too small for the running
set (or for one prompt, up to the longest a sequence may be, with the default step budget), greedy outputs
equal a roomy pool's token for token, also when sequences holding host-resident blocks are swapped out; the
profiler records the moves; bad values and combinations fail clearly (by flag name on the command line)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli.main import cacheflow
from pycacheflow import LLM, SamplingParams
from pycacheflow import profiler as prof
from pycacheflow.config import EngineConfig
from pycacheflow.errors import InvalidArgumentError

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


@pytest.fixture(scope="module")
def roomy_tokens(model_path: str) -> list[list[int]]:
    """PROMPTS' 100 greedy tokens each in a pool that holds them all (no preemption, no streaming)."""
    roomy = LLM(model_path, n_ctx=4096, preemption_mode="swap", **COMMON)
    want = _tokens(roomy, PROMPTS, 100)
    assert roomy.stats().num_preemptions == 0
    roomy.close()
    return want


def test_streamed_running_set_equals_roomy_pool(model_path: str, roomy_tokens: list[list[int]]) -> None:
    want = roomy_tokens
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


def test_long_prompts_with_the_default_step_budget(model_path: str) -> None:
    """A 256-token pool (16 blocks) and the default 512-token step budget: a prefill chunk is capped to what
    the device pool can give one sequence, so prompts up to n_ctx_per_seq - 1 tokens run (before the cap a
    ~700-token prompt ended at once with no token)."""
    text = " ".join(f"item {i} is a {'red' if i % 2 else 'blue'} box;" for i in range(150))
    roomy = LLM(model_path, n_ctx=4096, n_threads=2)
    llm = LLM(model_path, n_ctx=256, kv_streaming="on", n_threads=2)
    n_ctx_per_seq = llm.info.n_ctx_per_seq
    assert n_ctx_per_seq == (16 + 64) * 16  # the device pool plus R = 64 host-resident blocks
    ids = roomy.tokenize(text)
    assert len(ids) >= n_ctx_per_seq
    cases = [(ids[:540], 16), (ids[: n_ctx_per_seq - 17], 16), (ids[: n_ctx_per_seq - 1], 1)]
    for prompt, n in cases:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        want = roomy.generate([prompt], params)[0]
        got = llm.generate([prompt], params)[0]
        assert (len(prompt), got.finish_reason, got.error) == (len(prompt), "length", None)
        assert list(got.token_ids) == list(want.token_ids) and len(got.token_ids) == n
    st = llm.stats()
    assert st.kv_stream_demotions > 0 and st.num_preemptions == 0
    assert st.kv_streamed_blocks == 0 and st.swap_blocks_used == 0  # every host slot came back
    roomy.close()
    llm.close()


def test_swap_out_of_streamed_sequences(model_path: str, roomy_tokens: list[list[int]]) -> None:
    """R = 4 host-resident blocks for 8 sequences in 16 device blocks: once R is reached sequences are swapped
    out, some while holding host-resident blocks (they keep those slots and copy only their device blocks).
    Outputs equal the roomy pool's; the profiler's KV_DEMOTE / KV_PROMOTE events show which held blocks on
    the host when swapped out; every host slot comes back."""
    llm = LLM(model_path, n_ctx=256, kv_streaming="on", kv_stream_blocks=4, preemption_mode="swap",
              profile=True, **COMMON)  # fmt: skip
    assert _tokens(llm, PROMPTS, 100) == roomy_tokens
    st = llm.stats()
    assert st.num_preemptions_swap > 0 and st.num_preemptions_recompute == 0
    assert st.kv_streamed_blocks == 0 and st.swap_blocks_used == 0
    events = llm.profile().events  # in time order
    host_tokens: dict[int, int] = {}
    num_swapped_streamed = 0
    for e in events:
        if e.kind == prof.REQUEST_KV_DEMOTE:
            host_tokens[e.request_id] = host_tokens.get(e.request_id, 0) + e.num_tokens
        elif e.kind == prof.REQUEST_KV_PROMOTE:
            host_tokens[e.request_id] -= e.num_tokens
        elif e.kind == prof.REQUEST_SWAP_OUT:
            num_swapped_streamed += 1 if host_tokens.get(e.request_id, 0) > 0 else 0
            host_tokens[e.request_id] = 0  # it comes back whole (swap-in fills device blocks)
    assert num_swapped_streamed >= 1
    demoted = [e for e in events if e.kind == prof.REQUEST_KV_DEMOTE]
    block_bytes = llm.info.kv_bytes_per_token * 16
    assert sum(e.num_tokens for e in demoted) == st.kv_stream_demotions * 16
    assert all(e.num_bytes == e.num_tokens // 16 * block_bytes for e in demoted)
    trace = llm.profile().chrome_trace()
    prof.check_chrome_trace(trace)
    assert any(e.get("name") == "KV demoted to host" for e in trace["traceEvents"])
    llm.close()


def test_refused_with_rpc(model_path: str) -> None:
    with pytest.raises(InvalidArgumentError, match="kv_streaming=on does not work with rpc_servers"):
        LLM(model_path, n_ctx=256, kv_streaming="on", rpc_servers=("127.0.0.1:1",), **COMMON)
    result = CliRunner().invoke(cacheflow, ["generate", "-m", model_path, "--ctx-size", "256", "--kv-streaming",
                                            "on", "--rpc", "127.0.0.1:1", "hi"])  # fmt: skip
    assert result.exit_code == 2
    assert ("Invalid value for --kv-streaming: --kv-streaming on does not work with --rpc: the paged attention "
            "op of an rpc-server cannot read the engine's host memory") in result.output


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
    with pytest.raises(InvalidArgumentError, match="kv_stream_blocks=64 needs as many host slots .*, but "
                       r"swap_space_bytes=1048576 holds 2; raise swap_space_bytes or lower kv_stream_blocks"):
        LLM(model_path, n_ctx=256, kv_streaming="on", kv_stream_blocks=64, **dict(COMMON, swap_space_bytes=1 << 20))


def test_refused_with_stock_kv(model_path: str) -> None:
    with pytest.raises(Exception, match="kv_streaming=on needs the paged KV cache"):
        LLM(model_path, n_ctx=256, kv_mode="stock", kv_streaming="on", **COMMON)


# ---------------------------------------------------------------------------- the command line


def _generate(model_path: str, *args: str):
    return CliRunner().invoke(cacheflow, ["generate", "-m", model_path, "--ctx-size", "256", "-t", "2", "-n",
                                          "2", *args, "Hello"])  # fmt: skip


def test_cli_host_slots_checked_before_the_pool_is_allocated(model_path: str) -> None:
    """R = 65536 needs 22.5 GiB of host slots: refused by flag name before the KV cache (pool + R staging
    blocks on the CPU, 23.7 GiB) is allocated."""
    result = _generate(model_path, "--kv-streaming", "on", "--kv-stream-blocks", "65536")
    assert result.exit_code == 2
    assert ("Invalid value for --kv-stream-blocks: --kv-stream-blocks 65536 needs as many host slots of the "
            "swap space, one KV block of 368640 bytes each (22.5 GiB), but --swap-space 4 holds 11650; "
            "raise --swap-space or lower --kv-stream-blocks") in result.output


def test_cli_tuning_flags_that_do_nothing_are_noted(model_path: str) -> None:
    off = _generate(model_path, "--kv-stream-blocks", "8")  # auto: off on the CPU
    assert off.exit_code == 0, off.output
    assert ("cacheflow: warning: --kv-stream-blocks has no effect: KV streaming is off (--kv-streaming auto "
            "leaves it off on this device for now; --kv-streaming on turns it on)") in off.stderr
    assert "KV streaming:" not in off.stderr
    on = _generate(model_path, "--kv-streaming", "on", "--kv-stream-depth", "4")
    assert on.exit_code == 0, on.output
    assert "cacheflow: warning: --kv-stream-depth has no effect on the CPU" in on.stderr
    assert "KV streaming: 0 blocks demoted to the host, 0 promoted back, 0 staged" in on.stderr
    quiet = _generate(model_path, "--kv-streaming", "on", "--kv-stream-blocks", "8")
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr


def test_cli_long_prompt_streams_with_the_default_budget(model_path: str) -> None:
    """The reported case: a ~700-token prompt, --ctx-size 256, --kv-streaming on, -n 16 gave 0 tokens."""
    prompt = " ".join(f"item {i} is a {'red' if i % 2 else 'blue'} box;" for i in range(80))
    result = CliRunner().invoke(cacheflow, ["generate", "-m", model_path, "--ctx-size", "256", "-t", "2",
                                            "--kv-streaming", "on", "-n", "16", "--ignore-eos", "--json",
                                            prompt])  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["metrics"]["num_output_tokens"] == 16 and record["finish_reason"] == "length"
    assert "KV streaming: " in result.stderr and " 0 blocks demoted" not in result.stderr
