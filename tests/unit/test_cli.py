"""CLI parts that need no native library: help, prompts files, usage errors, summary."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from cli.common import ctx_size_notice
from cli.main import cacheflow, format_summary
from cli.prompts import PromptsFileError, read_prompts_file
from pycacheflow.outputs import RequestMetrics, RequestOutput


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["generate", "--help"],
        ["model", "--help"],
        ["model", "pull", "--help"],
        ["model", "path", "--help"],
    ],
)
def test_help(runner, args):
    result = runner.invoke(cacheflow, args)
    assert result.exit_code == 0 and "Usage: cacheflow" in result.output


def test_model_path(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("CACHEFLOW_CACHE_DIR", str(tmp_path))
    result = runner.invoke(cacheflow, ["model", "path"])
    assert result.exit_code == 0
    assert str(tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf") in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "-m", "/no/such.gguf", "hi"], "does not exist"),
        (["generate", "--temperature", "-1", "hi"], "--temperature"),
        (["generate", "--temp", "-1", "hi"], "--temperature"),  # llama.cpp's spelling
        (["generate", "-t", "two", "hi"], "--threads"),
        (["generate", "-t", "-2", "hi"], "-2 is not a thread count (0 or -1: one per physical core)"),
        (["bench", "throughput", "-t", "-2"], "-2 is not a thread count (0 or -1: one per physical core)"),
        (["generate", "-n", "0", "hi"], "--max-tokens"),
        (["generate", "--kv-mode", "fast", "hi"], "--kv-mode"),
        (["generate", "--stream", "--json", "hi"], "cannot be combined"),
        (["generate", "--stop", "", "hi"],
         "Invalid value for --stop: stop[0] must be a non-empty string"),
        (["generate", "--kv-cache-memory", "lots", "hi"], "is not a size"),
        (["generate", "--kv-cache-memory", "-1MiB", "hi"], "is not a size"),
        (["generate", "--kv-cache-memory", "nan", "hi"], "is not a size"),
        (["generate", "--kv-cache-memory", "9" * 27, "hi"], "is too large"),
        (["generate", "--kv-cache-memory", "inf", "hi"], "is not a size"),
        (["generate", "--swap-space", "1e30", "hi"], "--swap-space"),
        (["generate", "", "hi"], "prompt 1 is empty"),
        (["generate", "hi", ""], "prompt 2 is empty"),
        (["bench", "latency", "--out", "/proc/no/such/dir"], "Invalid value for --out: cannot create /proc/no"),
        (["bench", "latency", "--out", ""], "Invalid value for --out: must name a folder"),
        (["bench", "latency", "--out", "/dev/null"], "Invalid value for --out: /dev/null exists and is not a folder"),
        (["bench", "scaling", "--concurrency-list", ""], "--concurrency-list: give at least one level"),
        (["bench", "scaling", "--concurrency-list", "4,0"], "--concurrency-list: levels must be >= 1"),
    ],
)
def test_usage_errors_exit_2_without_traceback(runner, args, message):
    result = runner.invoke(cacheflow, args)
    assert result.exit_code == 2, result.output
    assert "Error:" in result.output and message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "size"),
    [("268435456", 2**28), ("256MiB", 2**28), ("1.5GiB", 3 * 2**29), ("512M", 512 * 10**6),
     ("2g", 2 * 10**9), ("64kib", 65536), ("10TiB", 10 * 2**40), ("1TB", 10**12)],
)
def test_kv_cache_memory_sizes(text, size):
    from cli.common import ByteSize

    assert ByteSize().convert(text, None, None) == size


def test_bad_prompts_file_is_a_usage_error(runner, tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    result = runner.invoke(cacheflow, ["generate", "--prompts-file", str(bad)])
    assert result.exit_code == 2 and "p.jsonl:2" in result.output


def test_empty_prompts_file_is_a_usage_error_not_the_default_prompt(runner, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    result = runner.invoke(cacheflow, ["generate", "--prompts-file", str(empty)])
    assert result.exit_code == 2 and "empty.txt holds no prompt (blank lines only)" in result.output
    result = runner.invoke(cacheflow, ["generate", "--prompts-file", "-"], input="")
    assert result.exit_code == 2 and "standard input holds no prompt" in result.output


def test_prompts_file_text_and_jsonl(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\n  second  \n")
    assert read_prompts_file(text) == ["first prompt", "  second  "]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a", "id": 1}\n\n{"prompt": "b\\nc"}\n')
    assert read_prompts_file(jsonl) == ["a", "b\nc"]
    sniffed = tmp_path / "p.data"
    sniffed.write_text('  {"prompt": "x"}\n')
    assert read_prompts_file(sniffed) == ["x"]
    assert read_prompts_file("<stdin>", "one\ntwo\n") == ["one", "two"]


@pytest.mark.parametrize("line", ["{bad json", '["list"]', '{"prompt": 3}'])
def test_prompts_file_errors_name_the_line(tmp_path, line):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(PromptsFileError, match="p.jsonl:2"):
        read_prompts_file(path)


def _output(n_prompt, token_ms, finish_ms):
    ms = 1_000_000
    metrics = RequestMetrics.from_times_ns(
        arrival_ns=0,
        first_scheduled_ns=ms,
        token_times_ns=[t * ms for t in token_ms],
        finish_ns=finish_ms * ms,
        num_prompt_tokens=n_prompt,
    )
    return RequestOutput(1, "p", (1,), "t", tuple(range(len(token_ms))), "length", metrics)


def test_format_summary():
    outs = [_output(5, [10, 20, 30], 30), _output(7, [20], 20)]
    text = format_summary(outs, wall_s=0.5)
    assert "requests: 2" in text and "prompt tokens: 12" in text and "output tokens: 4" in text
    assert "mean TTFT: 15.0 ms" in text  # (10 + 20) / 2
    assert "mean TPOT: 10.0 ms" in text  # only the 3-token request has a TPOT
    assert "output: 8.0 tok/s" in text and "wall: 0.50 s" in text
    assert "mean TTFT: n/a" in format_summary([], 1.0)


def test_format_summary_names_preemptions():
    stats = SimpleNamespace(num_preemptions=5, num_preemptions_swap=3, num_preemptions_recompute=2,
                            num_recomputed_tokens=140, swap_out_bytes=3 * 2**20, kv_streaming=0,
                            num_lookahead_decodes=0)  # fmt: skip
    assert format_summary([], 1.0, stats).endswith(
        "\npreemptions: 5 (swap 3, recompute 2); 140 tokens recomputed, 3.0 MiB swapped out")
    assert "preemptions" not in format_summary([], 1.0, SimpleNamespace(num_preemptions=0, kv_streaming=0,
                                                                        num_lookahead_decodes=0))  # fmt: skip


def test_format_summary_names_decodes_launched_ahead():
    stats = SimpleNamespace(num_preemptions=0, kv_streaming=0, num_lookahead_decodes=40, num_lookahead_adopted=39,
                            num_steps=45)  # fmt: skip
    assert format_summary([], 1.0, stats).endswith("\nasync decode: 40 decodes launched ahead, 39 adopted, in 45 steps")
    stats.num_lookahead_decodes = 0
    assert "async decode" not in format_summary([], 1.0, stats)


@pytest.mark.parametrize(
    "n_ctx,info,notice",
    [
        (1000, ("stock", 1024, 256), ("cacheflow: --ctx-size 1000 rounded to 1024 tokens of KV "
         "cache (llama.cpp allocates multiples of 256 per sequence); at most 256 tokens per "
         "sequence")),
        (4000, ("paged", 4096, 4096), ("cacheflow: --ctx-size 4000 rounded to 4096 tokens of KV "
         "cache (llama.cpp allocates multiples of 256); at most 4096 tokens per sequence")),
        (272, ("paged", 496, 496), ("cacheflow: --ctx-size 272 rounded to 496 tokens of KV cache "
         "(llama.cpp allocates multiples of 256, less the step padding's scratch block); at most "
         "496 tokens per sequence")),  # paged on a GPU: 512 rows, the last block is the scratch
        (4096, ("paged", 4336, 4336), ("cacheflow: --ctx-size 4096 rounded to 4336 tokens of KV cache "
         "(llama.cpp allocates multiples of 256, less the step padding's scratch block); at most "
         "4336 tokens per sequence")),  # no spare block in 4096: one more asked for, 4352 rows
        (4080, ("paged", 4080, 4080), None),  # 4096 rows, the spare block is the scratch
        (4096, ("stock", 4096, 1024), None),  # used as given
        (0, ("paged", 8192, 2048), None),  # the default
    ],
)  # fmt: skip
def test_ctx_size_notice(n_ctx, info, notice):
    kv_mode_name, info_n_ctx, n_ctx_per_seq = info
    model_info = SimpleNamespace(kv_mode_name=kv_mode_name, n_ctx=info_n_ctx,
                                 n_ctx_per_seq=n_ctx_per_seq, block_size=16)  # fmt: skip
    assert ctx_size_notice(n_ctx, model_info) == notice


def test_ctx_size_notice_of_serve_names_the_slot_context():
    """serve -c 100 -np 4: as llama.cpp pads each slot's share to 256 tokens, the pool holds
    1024 and a slot 256 (as /slots says)."""
    info = SimpleNamespace(kv_mode_name="paged", n_ctx=1024, n_ctx_per_seq=1024, block_size=16)
    assert ctx_size_notice(100, info, n_ctx_slot=256) == (
        "cacheflow: --ctx-size 100 rounded to 1024 tokens of KV cache (llama.cpp allocates "
        "multiples of 256 per slot); at most 256 tokens per slot")
    one_slot = SimpleNamespace(kv_mode_name="paged", n_ctx=256, n_ctx_per_seq=256, block_size=16)
    assert ctx_size_notice(100, one_slot, n_ctx_slot=256) == (
        "cacheflow: --ctx-size 100 rounded to 256 tokens of KV cache (llama.cpp allocates "
        "multiples of 256); at most 256 tokens per slot")


def test_prompts_that_are_not_utf8_are_usage_errors(runner, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")  # never loaded: prompts are checked first
    bad_arg = b"caf\xe9".decode("utf-8", errors="surrogateescape")  # a Latin-1 terminal
    result = runner.invoke(cacheflow, ["generate", "-m", str(model), "ok", bad_arg])
    assert result.exit_code == 2
    assert "prompt 2 is not valid UTF-8 text: undecodable byte 0xe9 at character 3" in result.output
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"fine\nnot \xff fine\n")
    result = runner.invoke(cacheflow, ["generate", "-m", str(model), "--prompts-file", str(prompts)])
    assert result.exit_code == 2
    assert f"{prompts}:2: not UTF-8 text (byte 0xff at offset 9)" in result.output
    result = runner.invoke(cacheflow, ["generate", "-m", str(model), "--prompts-file", "-"],
                           input=b"\xfe")  # fmt: skip
    assert result.exit_code == 2 and "<stdin>:1: not UTF-8 text (byte 0xfe at offset 0)" in result.output
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "a\\ud800"}\n')
    result = runner.invoke(cacheflow, ["generate", "-m", str(model), "--prompts-file", str(jsonl)])
    assert result.exit_code == 2
    assert "prompt 1 is not valid UTF-8 text: lone surrogate U+D800 at character 1" in result.output


def test_trace_into_a_missing_directory_fails_before_the_run(runner, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    trace = tmp_path / "no-such-dir" / "trace.json"
    result = runner.invoke(cacheflow, ["generate", "-m", str(model), "--trace", str(trace), "hi"])
    assert result.exit_code == 2
    assert f"Invalid value for '--trace': directory '{trace.parent}' does not exist" in result.output


@pytest.mark.parametrize(
    "args,option",
    [
        (["-n", str(2**40)], "-n/--max-tokens: max_tokens must fit a C int32_t ([-2**31, 2**31)), got 1099511627776"),
        (["--top-k", str(2**31)], "--top-k: top_k must fit a C int32_t ([-2**31, 2**31)), got 2147483648"),
        (["--seed", str(2**70)], "--seed: seed must be -1 (random) or in [0, 2**63), got 1180591620717411303424"),
        (["--seed", "-7"], "--seed: seed must be -1 (random) or in [0, 2**63), got -7"),
        (["--temperature", "1e300"], "--temperature: temperature must fit a C float (magnitude at most 3.403e+38), got 1e+300"),
        (["--mirostat", "3"], "--mirostat: mirostat must be 0, 1 or 2, got 3"),
        (["--xtc-probability", "2"], "--xtc-probability: xtc_probability must be in [0, 1], got 2"),
        (["--dry-allowed-length", "-1"], "--dry-allowed-length: dry_allowed_length must be >= 0, got -1"),
        (["--min-keep", "-1"], "--min-keep: min_keep must be >= 0, got -1"),
        (["--top-nsigma", "1e300"], "--top-nsigma: top_n_sigma must fit a C float (magnitude at most 3.403e+38), got 1e+300"),
    ],
)
def test_sampling_values_beyond_the_c_types_are_usage_errors(runner, tmp_path, args, option):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")  # never loaded
    result = runner.invoke(cacheflow, ["generate", "-m", str(model), *args, "hi"])
    assert result.exit_code == 2 and f"Invalid value for {option}" in result.output
