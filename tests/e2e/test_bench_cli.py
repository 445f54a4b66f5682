"""`cacheflow bench` end to end on the tiny model with tiny workloads: result files, rows per
variant and iteration, stock baselines in the same command, and the serve client against the
built-in no-op server."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from click.testing import CliRunner

from cli.main import cacheflow
from pycacheflow.bench import online, results

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def run_bench(*args: str):
    result = CliRunner().invoke(cacheflow, ["bench", *args])
    assert result.exit_code == 0, result.output
    return result


def test_throughput_with_stock_baseline(tiny_model_path, tmp_path):
    out = run_bench(
        "throughput",
        "-m",
        str(tiny_model_path),
        "-n",
        "3",
        "-p",
        "8",
        "-o",
        "3",
        "-c",
        "2",
        "-i",
        "2",
        "--baseline",
        "stock",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    )
    assert "cacheflow / stock-unified" in out.output
    rows = results.read_csv(tmp_path / "throughput_results.csv")
    assert sorted((r["variant"], r["iteration"]) for r in rows) == [
        (v, i) for v in ("cacheflow", "stock", "stock-unified") for i in ("0", "1")
    ]
    for r in rows:
        assert int(r["num_requests"]) == 3 and int(r["num_output_tokens"]) == 9
        assert float(r["output_throughput"]) > 0 and float(r["decode_tok_s"]) > 0
        assert 0 < float(r["ceiling_fraction"])
    assert {r["kv_mode"] for r in rows} == {"paged", "stock", "stock-unified"}  # auto: paged
    summary = json.loads((tmp_path / "throughput_summary.json").read_text())
    assert summary["environment"]["threads"] == 1 and summary["parameters"]["num_requests"] == 3
    assert summary["hardware"]["copy_bandwidth_bytes_s"] > 0
    assert {r["baseline"] for r in summary["ratios_cacheflow_over_baseline"]} == {
        "stock",
        "stock-unified",
    }
    assert len(results.read_csv(tmp_path / "throughput_requests.csv")) == 3 * 2 * 3
    assert results.read_csv(tmp_path / "throughput_kv_timeseries.csv")


def test_scaling_and_kv_cache(tiny_model_path, tmp_path):
    run_bench(
        "scaling",
        "-m",
        str(tiny_model_path),
        "-n",
        "2",
        "-p",
        "8",
        "-o",
        "2",
        "--concurrency-list",
        "1,2",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    )
    rows = results.read_csv(tmp_path / "scaling_results.csv")
    assert [(r["variant"], r["concurrency"]) for r in rows] == [
        ("cacheflow", "1"),
        ("cacheflow", "2"),
    ]
    out = run_bench(
        "kv-cache",
        "-m",
        str(tiny_model_path),
        "-n",
        "6",
        "-p",
        "8",
        "-o",
        "5",
        "-c",
        "3",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    )
    (row,) = results.read_csv(tmp_path / "kv_cache_results.csv")
    assert 0 < float(row["kv_utilization_peak"]) <= 1
    assert float(row["kv_reserved_peak"]) >= float(row["kv_utilization_peak"])
    # the KV table is printed too, with the CSV's figures
    (line,) = [ln for ln in out.output.splitlines() if "used/capacity" in ln]
    assert line.split()[2:] == ["used/capacity", "used", "peak", "reserved/capacity",
                                "unused/reserved", "preemptions"]  # fmt: skip
    (kv_row,) = [ln for ln in out.output.splitlines()[out.output.splitlines().index(line):]
                 if ln.startswith("cacheflow ")]  # fmt: skip
    assert f"{float(row['kv_utilization_peak']):.2f}" in kv_row.split()


def test_kv_cache_with_a_budget_and_shared_prefixes(tiny_model_path, make_llm, tmp_path):
    """--kv-cache-memory sizes the paged engine's pool (the stock baselines keep room for every
    sequence); with a shared system prompt the rows counted as used count its blocks once, so
    used <= reserved on every step; a budget too small for the cache or for the longest request
    is a usage error naming the option."""
    per_token = make_llm(tiny_model_path, max_num_seqs=1).info.kv_bytes_per_token
    args = ["kv-cache", "-m", str(tiny_model_path), "-n", "12", "-p", "48", "-o", "32", "-c", "8",
            "--dataset", "shared-prefix", "--threads", "1", "--baseline", "stock", "--out", str(tmp_path)]  # fmt: skip
    run_bench(*args, "--kv-cache-memory", str(256 * per_token))
    rows = {r["variant"]: r for r in results.read_csv(tmp_path / "kv_cache_results.csv")}
    assert int(float(rows["cacheflow"]["kv_capacity_tokens"])) == 256  # the budget's rows
    assert int(float(rows["stock"]["kv_capacity_tokens"])) > 256
    for row in rows.values():
        assert 0 <= float(row["kv_reserved_unused_mean"]) < 1, row
        assert float(row["kv_utilization_peak"]) <= float(row["kv_reserved_peak"]), row
    for series in results.read_csv(tmp_path / "kv_cache_kv_timeseries.csv"):
        assert float(series["kv_used_frac"]) <= float(series["kv_reserved_frac"]), series
    small = CliRunner().invoke(cacheflow, ["bench", *args, "--kv-cache-memory", str(16 * per_token)])
    assert small.exit_code == 2
    assert "Invalid value for --kv-cache-memory" in small.output and "Traceback" not in small.output
    # refused in the user's units before the bandwidth probe and the engines' loading
    assert f"{16 * per_token} bytes" in small.output and "MiB) hold 16 KV rows of this model" in small.output
    assert "the cache needs at least 256" in small.output and "measuring memory copy bandwidth" not in small.output
    stock = CliRunner().invoke(cacheflow, ["bench", *args, "--kv-mode", "stock", "--kv-cache-memory", "6MiB"])
    assert stock.exit_code == 2 and "--kv-cache-memory sizes the paged KV mode's pool" in stock.output
    # a pool that holds fewer tokens than the longest request: refused, not silently cut short
    long = CliRunner().invoke(cacheflow, ["bench", *args, "-p", "300", "--kv-cache-memory", str(256 * per_token)])
    assert long.exit_code == 2, long.output
    assert "Invalid value for --kv-cache-memory" in long.output and "holds 256 tokens per sequence" in long.output
    # a budget between two 256-row multiples: the notice names the option, once, not the library's field
    rounded = CliRunner().invoke(cacheflow, ["bench", *args, "--kv-cache-memory", str(300 * per_token)])
    assert rounded.exit_code == 0, rounded.output
    assert rounded.output.count(f"cacheflow: --kv-cache-memory {300 * per_token} bytes fits 300 tokens") == 1
    assert "kv_cache_bytes" not in rounded.output


def test_serve_against_the_noop_server(tiny_model_path, tmp_path):
    pytest.importorskip("httpx")
    with online.NoopServer() as server:
        out = run_bench(
            "serve",
            server.url,
            "-m",
            str(tiny_model_path),
            "-n",
            "4",
            "-p",
            "8",
            "-o",
            "3",
            "--request-rate",
            "50",
            "--arrivals",
            "fixed",
            "--client-check",
            "--out",
            str(tmp_path),
        )
    assert "client busy" in out.output
    rows = results.read_csv(tmp_path / "serve_results.csv")
    assert [r["variant"] for r in rows] == ["no-op server", server.url]
    assert all(r["num_errors"] == "0" and r["num_output_tokens"] == "12" for r in rows)


class _FailingHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with 503 (reachable, but no request succeeds)."""

    def _fail(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _fail

    def log_message(self, *args: object) -> None:
        pass


def test_serve_where_every_request_fails_exits_1(tiny_model_path, tmp_path):
    pytest.importorskip("httpx")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FailingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        result = CliRunner().invoke(cacheflow, ["bench", "serve", url, "-m", str(tiny_model_path),
                                                "-n", "3", "-p", "4", "-o", "2",
                                                "--out", str(tmp_path)])  # fmt: skip
    finally:
        server.shutdown()
        thread.join()
    assert result.exit_code == 1, result.output
    assert f"Error: {url}: all 3 requests failed; first: HTTP 503" in result.output
    assert not (tmp_path / "serve_results.csv").exists()


def test_unknown_baseline_is_a_usage_error(tiny_model_path, tmp_path):
    result = CliRunner().invoke(
        cacheflow,
        [
            "bench",
            "latency",
            "-m",
            str(tiny_model_path),
            "--baseline",
            "vllm",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "unknown baseline" in result.output


def test_a_prompt_longer_than_the_model_holds_is_refused_up_front(tiny_model_path, make_llm, tmp_path):
    """Before the bandwidth probe and the engines: the engine would refuse every one of its requests."""
    n_ctx_train = make_llm(tiny_model_path, max_num_seqs=1).info.n_ctx_train
    result = CliRunner().invoke(cacheflow, ["bench", "throughput", "-m", str(tiny_model_path), "-n", "2", "-o", "2",
                                            "-p", str(n_ctx_train), "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "Invalid value for -p/--prompt-len" in result.output
    assert f"holds at most {n_ctx_train}" in result.output
    assert "measuring memory copy bandwidth" not in result.output


def test_a_file_that_is_not_a_model_is_one_line_not_a_traceback(tmp_path):
    bad = tmp_path / "not_a_model.gguf"
    bad.write_text("hello\n")
    result = CliRunner().invoke(
        cacheflow, ["bench", "throughput", "-m", str(bad), "-n", "2", "-p", "8", "-o", "4", "-i", "1",
                    "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert "Error: ModelLoadError: failed to load model from" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # click's own exit, not the loader's exception



def test_an_output_len_no_sequence_holds_is_refused_before_anything_loads(tiny_model_path, make_llm,
                                                                          tmp_path):
    """-o was not checked: -o 100000000 sized a KV cache for it and ran out of memory (naming
    n_ctx, not -o)."""
    n_ctx_train = make_llm(tiny_model_path, max_num_seqs=1).info.n_ctx_train
    out = tmp_path / "out"
    result = CliRunner().invoke(cacheflow, ["bench", "throughput", "-m", str(tiny_model_path),
                                            "-n", "2", "-p", "8", "-o", "100000000",
                                            "--out", str(out)])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert (f"Invalid value for -p/--prompt-len + -o/--output-len: 8 + 100000000 = 100000008 "
            f"tokens: a sequence of this model holds at most {n_ctx_train} tokens (prompt + "
            f"output), so every request would stop after {n_ctx_train - 8} output tokens; lower "
            f"-p or -o (-p + -o <= {n_ctx_train})") in result.output  # fmt: skip
    assert "measuring memory copy bandwidth" not in result.output
    assert not out.exists()  # a usage error leaves no --out folder behind


def test_prompt_plus_output_over_the_context_is_a_usage_error(tiny_model_path, make_llm, tmp_path):
    """Was exit 0 with every request stopped short of -o, without a word."""
    n_ctx_train = make_llm(tiny_model_path, max_num_seqs=1).info.n_ctx_train
    p = n_ctx_train - 100
    result = CliRunner().invoke(cacheflow, ["bench", "latency", "-m", str(tiny_model_path),
                                            "-n", "1", "-p", str(p), "-o", "101",
                                            "--out", str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert (f"Invalid value for -p/--prompt-len + -o/--output-len: {p} + 101 = {n_ctx_train + 1} "
            f"tokens: a sequence of this model holds at most {n_ctx_train} tokens (prompt + "
            "output), so every request would stop after 100 output tokens; lower -p or -o"
            ) in result.output  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_usage_errors_leave_no_out_folder(tiny_model_path, tmp_path):
    out, model = tmp_path / "out", str(tiny_model_path)
    for args in (["latency", "-m", model, "--baseline", "vllm"],
                 ["kv-cache", "-m", model, "--kv-mode", "stock", "--kv-cache-memory", "1MiB"],
                 ["throughput", "-m", model, "--kv-cache-memory", "1KiB"],
                 ["scaling", "-m", model, "--concurrency-list", "0"]):  # fmt: skip
        result = CliRunner().invoke(cacheflow, ["bench", *args, "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert not out.exists(), args
    result = CliRunner().invoke(cacheflow, ["bench", "serve", "http://127.0.0.1:1", "-m", model,
                                            "--out", str(out)])  # fmt: skip
    assert result.exit_code == 1 and "cannot reach http://127.0.0.1:1" in result.output
    assert not out.exists()
