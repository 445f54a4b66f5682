"""The native profiler end to end on the tiny model: LLM(profile=True), the events of a batched
run, the exported Chrome trace (format and content), and `cacheflow generate --trace`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli.main import cacheflow
from pycacheflow import SamplingParams, errors
from pycacheflow import profiler as prof
from pycacheflow.profiler import check_chrome_trace

pytestmark = pytest.mark.e2e

NUM_REQUESTS = 5
MAX_TOKENS = 6


def prompts(n: int) -> list[list[int]]:
    return [[100 + i] * (8 + 3 * i) for i in range(n)]


@pytest.fixture
def profiled_llm(make_llm, tiny_model_path):
    return make_llm(
        tiny_model_path, max_num_seqs=2, n_ctx=2 * 256, max_num_batched_tokens=16, profile=True
    )


def test_profile_records_every_request_and_step(profiled_llm):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = profiled_llm.generate(prompts(NUM_REQUESTS), params)
    p = profiled_llm.profile()
    assert p.num_dropped == 0 and p.kv_tokens_capacity == profiled_llm.info.n_ctx

    spans = {r.request_id: r for r in p.requests()}
    assert set(spans) == {o.request_id for o in outputs}
    for o in outputs:
        r = spans[o.request_id]
        assert r.num_prompt_tokens == len(o.prompt_token_ids)
        assert r.num_output_tokens == MAX_TOKENS and r.finish_reason == "length"
        assert r.arrival_ns <= r.first_scheduled_ns <= r.first_token_ns <= r.finish_ns
        # The profiler and the output events read the same clock.
        assert r.arrival_ns / 1e9 == pytest.approx(o.metrics.arrival_time_s, abs=1e-9)
        assert r.first_token_ns / 1e9 == pytest.approx(o.metrics.first_token_time_s, abs=1e-9)

    steps = p.steps()
    assert [s.step_id for s in steps] == list(range(1, len(steps) + 1))
    assert profiled_llm.stats().num_steps == len(steps)
    assert all(1 <= s.num_seqs <= 2 and s.begin_ns <= s.end_ns for s in steps)
    assert all(s.num_decode_tokens + s.num_prefill_tokens <= 16 for s in steps)  # the budget
    prompt_total = sum(len(t) for t in prompts(NUM_REQUESTS))
    assert sum(s.num_prefill_tokens for s in steps) == prompt_total
    assert sum(s.num_decode_tokens for s in steps) == NUM_REQUESTS * (MAX_TOKENS - 1)
    assert max(s.kv_tokens_used for s in steps) > 0 and steps[-1].kv_tokens_used == 0
    # nothing is shared here: the rows attended are the rows holding tokens
    assert all(s.kv_tokens_attended == s.kv_tokens_used for s in steps)


def test_export_trace_is_valid(profiled_llm, tmp_path):
    profiled_llm.generate(prompts(3), SamplingParams(max_tokens=4, ignore_eos=True))
    path = tmp_path / "trace.json"
    profiled_llm.export_trace(path)
    trace = json.loads(path.read_text())
    check_chrome_trace(trace)
    phases = {(e["ph"], e["name"]) for e in trace["traceEvents"]}
    assert {("X", "step"), ("X", "queued"), ("X", "prefill"), ("X", "decode")} <= phases
    assert {("C", "KV cache (tokens)"), ("C", "batch")} <= phases


def test_profile_clear_starts_over(profiled_llm):
    profiled_llm.generate(prompts(1), SamplingParams(max_tokens=2, ignore_eos=True))
    assert profiled_llm.profile(clear=True).events
    assert profiled_llm.profile().events == []


def test_profiling_is_off_by_default(make_llm, tiny_model_path):
    llm = make_llm(tiny_model_path, max_num_seqs=1, n_ctx=256)
    assert llm.config.profile_capacity == 0
    with pytest.raises(errors.UnsupportedError, match="profil"):
        llm.profile()
    with pytest.raises(errors.UnsupportedError, match="profile_capacity"):
        llm._engine.profile_drain()


def test_full_ring_drops_and_counts(make_llm, tiny_model_path):
    llm = make_llm(tiny_model_path, max_num_seqs=1, n_ctx=256, profile_capacity=4)
    llm._profiler.close()  # nobody drains: the ring fills up
    llm.generate(prompts(2), SamplingParams(max_tokens=4, ignore_eos=True))
    events, dropped = llm._engine.profile_drain()
    assert len(events) == 4 and dropped > 0
    assert events[0].kind == prof.REQUEST_ARRIVAL


def test_cli_generate_trace(tiny_model_path, tmp_path):
    path = tmp_path / "gen.json"
    result = CliRunner().invoke(
        cacheflow,
        [
            "generate",
            "-m",
            str(tiny_model_path),
            "-n",
            "3",
            "--ignore-eos",
            "-q",
            "--trace",
            str(path),
            "one",
            "two",
        ],
    )
    assert result.exit_code == 0, result.output
    trace = json.loads(path.read_text())
    check_chrome_trace(trace)
    requests = {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "request"}
    assert len(requests) == 2


def test_step_time_split_adds_up(make_llm, tiny_model_path):
    """cf_engine_stats' step split: every decoding step's prepare_ns (to llama_decode) and launch_ns
    (inside it) lie within its step_ns; decode_ns (llama_decode to device done, sampling steps) holds
    at least their launch, and all grow with each step."""
    llm = make_llm(tiny_model_path, max_num_seqs=4)
    llm.generate(["Hello", "Water boils at"], SamplingParams(max_tokens=8, ignore_eos=True))
    s = llm.stats()
    assert s.num_steps >= 8
    assert 0 < s.prepare_ns and 0 < s.launch_ns and 0 < s.sample_ns
    assert s.prepare_ns + s.launch_ns <= s.step_ns
    assert s.launch_ns <= s.decode_ns <= s.step_ns  # every step here samples: decode_ns covers each launch
    before = s
    llm.generate(["2 + 2 ="], SamplingParams(max_tokens=4, ignore_eos=True))
    s = llm.stats()
    assert s.step_ns > before.step_ns and s.launch_ns > before.launch_ns and s.prepare_ns > before.prepare_ns


def test_llama_graph_reuse_is_counted(make_llm, tiny_model_path):
    """cf_engine_stats.num_llama_decodes counts llama_decode calls (the warm-up one included) and
    num_llama_graphs_reused the ubatches whose graph llama.cpp reused: one request's decode steps
    after the first keep the same graph shape, so nearly all of them reuse it."""
    llm = make_llm(tiny_model_path, max_num_seqs=1)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    llm.generate(["Hello"], params)
    first = llm.stats()  # published after each step: the warm-up decode and every step's
    assert first.num_llama_decodes == 1 + first.num_steps
    llm.generate(["Water boils at"], params)
    s = llm.stats()
    steps = s.num_steps - first.num_steps
    assert s.num_llama_decodes - first.num_llama_decodes == steps
    reused = s.num_llama_graphs_reused - first.num_llama_graphs_reused
    assert steps - 3 <= reused < steps  # the prefill and the first decode step build graphs
