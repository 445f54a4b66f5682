"""`cacheflow serve` flag handling (cli/serve.py): llama-server flags map onto EngineConfig and
ServerConfig; nothing is loaded (the model loader is replaced)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli.serve
from cli.llama_server_flags import LLAMA_SERVER_FLAGS
from cli.main import cacheflow

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "vendor" / "llama.cpp" / "tools" / "server" / "README.md"


class Loaded(Exception):
    """Raised by the stub loader to stop `serve` before it loads anything."""


@pytest.fixture
def engine_kwargs(monkeypatch) -> list[dict[str, object]]:
    seen: list[dict[str, object]] = []

    def stub(model, config_kwargs, memory_options=""):
        seen.append(config_kwargs)
        raise Loaded

    monkeypatch.setattr(cli.serve, "load_llm", stub)
    return seen


def invoke(*args: str):
    return CliRunner().invoke(cacheflow, ["serve", *args])


def test_llama_server_flags_map_to_engine_config(engine_kwargs):
    result = invoke("-np", "4", "-n", "5", "-c", "2048", "-b", "256", "-ub", "1024", "-t", "-1",
                    "-fa", "-ngl", "all", "--kv-mode", "paged", "--block-size", "32",
                    "--policy", "priority", "-cb")  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs == [{
        "n_ctx": 2048, "kv_cache_bytes": 0, "max_num_seqs": 4, "max_num_batched_tokens": 256, "n_threads": 0,
        "n_gpu_layers": -1, "flash_attn": True, "kv_mode": "paged", "block_size": 32,
        "paged_attention": "invariant", "policy": "priority", "log_level": "error",
    }]  # fmt: skip


def test_kv_cache_memory(engine_kwargs):
    result = invoke("--kv-cache-memory", "1.5GiB")
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs[0]["kv_cache_bytes"] == 3 * 2**29 and engine_kwargs[0]["n_ctx"] == 0


def test_defaults_and_env_vars(engine_kwargs, monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "4096")
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "8")
    result = invoke("-fa", "off")
    assert isinstance(result.exception, Loaded), result.output
    kwargs = engine_kwargs[0]
    assert (kwargs["n_ctx"], kwargs["max_num_seqs"]) == (4096, 8)
    assert kwargs["max_num_batched_tokens"] == 512  # min(-b 2048, -ub 512)
    assert kwargs["flash_attn"] is False and kwargs["n_gpu_layers"] == -1  # -ngl auto


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mlock"], "unsupported llama-server flag --mlock: "),
        (["--hf-repo", "x/y"], "unsupported llama-server flag -hf (-hfr, --hf-repo): "),
        (["--bogus"], "no such option: --bogus"),
        (["-ctk", "q8_0"], "CacheFlow's KV cache is f16"),
        (["-ngl", "many"], "-ngl"),
        (["-fa", "maybe"], "maybe"),
        (["-np", "-3"], "-np"),
        (["--preemption", "swap"], "'swap' is not available yet"),
        (["--kv-cache-memory", "much"], "is not a size"),
    ],
)
def test_bad_flags_are_usage_errors(engine_kwargs, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert engine_kwargs == []


# Multi-letter short flags of llama-server that click used to split into one-letter clusters
# (-ctk q8_0 was "-c tk", -mg 0 was "-m g", -hf printed the help).
@pytest.mark.parametrize(
    "args,message",
    [
        (["-tb", "4"], "unsupported llama-server flag -tb (--threads-batch): CacheFlow runs"),
        (["-mg", "0"], "unsupported llama-server flag -mg (--main-gpu): device selection"),
        (["-dev", "CUDA0"], "unsupported llama-server flag -dev (--device): "),
        (["-ts", "3,1"], "unsupported llama-server flag -ts (--tensor-split): "),
        (["-sm", "row"], "unsupported llama-server flag -sm (--split-mode): "),
        (["-nocb"], "unsupported llama-server flag -nocb (--no-cont-batching): continuous"),
        (["-no-kvu"], "unsupported llama-server flag -no-kvu (--no-kv-unified): "),
        (["-hf", "user/model"], "unsupported llama-server flag -hf (-hfr, --hf-repo): "),
        (["-hf"], "unsupported llama-server flag -hf (-hfr, --hf-repo): "),  # value missing
        (["-np", "2", "--temp", "0.7"], "unsupported llama-server flag --temp (--temperature)"),
        (["-ctv", "q4_0"], "CacheFlow's KV cache is f16 (llama.cpp's other cache types"),
    ],
)
def test_multi_letter_llama_server_flags_fail_by_name(engine_kwargs, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert engine_kwargs == []


def test_every_llama_server_flag_is_accepted_or_named(engine_kwargs):
    """Each spelling of each flag in llama-server's README either is a serve option or fails
    with a message naming it (never click's one-letter clusters or "no such option")."""
    defined = {opt for p in cli.serve.serve.params if not p.name.startswith("llama_server_flag_")
               for opt in (*p.opts, *p.secondary_opts)} | {"-h", "--help", "--usage"}  # fmt: skip
    for names, num_values in LLAMA_SERVER_FLAGS:
        for name in names:
            if name in defined:
                continue
            result = invoke(name, *["1"] * num_values)
            assert result.exit_code == 2, (name, result.output)
            assert "unsupported llama-server flag " in result.output and name in result.output
    assert engine_kwargs == []


@pytest.mark.parametrize(
    "args,kv_mode",
    [(["-kvu", "--kv-mode", "stock"], "stock-unified"), (["-kvu"], "auto"),
     (["-kvu", "--kv-mode", "paged"], "paged"), (["--kv-mode", "stock"], "stock")],
)  # fmt: skip
def test_kv_unified_makes_stock_unified(engine_kwargs, args, kv_mode):
    result = invoke(*args)
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs[0]["kv_mode"] == kv_mode


def test_llama_server_spellings_with_the_same_meaning(engine_kwargs, monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_V", "f16")
    result = invoke("-ctk", "f16", "-cb", "--log-verbose")
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs[0]["log_level"] == "info"
    assert invoke("--version").output.startswith("cacheflow serve, version ")
    assert "Usage: cacheflow serve" in invoke("--usage").output
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_K", "q8_0")
    result = invoke()
    assert result.exit_code == 2 and "CacheFlow's KV cache is f16" in result.output


@pytest.mark.skipif(not README.is_file(), reason="no vendored llama.cpp tree (vendor/llama.cpp)")
def test_flag_table_matches_the_vendored_readme():
    script = REPO_ROOT / "scripts" / "gen_llama_server_flags.py"
    cmd = [sys.executable, str(script), "--check"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_port_in_use_is_one_line_before_loading(engine_kwargs):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("--port", str(port))
        assert result.exit_code == 1, result.output
        assert result.output.strip() == f"Error: port {port} on 127.0.0.1 is already in use"
        assert engine_kwargs == []  # failed before loading the model
        cmd = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    assert proc.returncode == 1
    assert proc.stderr == f"Error: port {port} on 127.0.0.1 is already in use\n"
