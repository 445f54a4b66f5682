"""`cacheflow serve` flag handling (cli/serve.py): llama-server flags map onto EngineConfig and
ServerConfig; nothing is loaded (the model loader is replaced)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import cli.serve
from cli.main import cacheflow


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
        "policy": "priority", "log_level": "error",
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
        (["--mlock"], "unsupported llama-server flag: --mlock"),
        (["--hf-repo", "x/y"], "unsupported llama-server flag: --hf-repo"),
        (["--bogus"], "no such option: --bogus"),
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
