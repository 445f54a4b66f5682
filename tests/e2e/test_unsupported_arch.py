"""Models the paged KV path does not cover: kv_mode "auto" falls back to llama.cpp's stock KV
cache with a one-line notice on stderr, and a forced kv_mode "paged" is a clear error.

The model is the tiny Gemma 3 of scripts/make_tiny_gguf.py (--arch gemma3): one sliding-window
layer and one full-attention layer, like the real Gemma 3 (which is too large to download here).
The notice is printed by the native engine straight to file descriptor 2, hence capfd.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pycacheflow import SamplingParams
from pycacheflow.errors import UnsupportedError

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]

NOTICE = (
    "cacheflow: using the stock KV cache: the paged KV path does not cover this model "
    "(it has sliding-window attention layers)"
)
PAGED_ERROR = (
    "kv_mode=paged does not cover this model: it has sliding-window attention layers; "
    "use kv_mode=stock"
)
SMALL_CTX = {"max_num_seqs": 2, "n_ctx": 2 * 256}
# Longer than the model's 64-token window, so the sliding-window layer masks part of the prompt.
PROMPTS = ["The capital of France is", "one two three four " * 25 + "The capital of France is"]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `cacheflow ARGS...` as `python -m cli` in a subprocess, from the repository root."""
    cmd = [sys.executable, "-m", "cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO_ROOT)


# ---------------------------------------------------------------------------- Python API


def test_auto_resolves_to_stock_with_one_notice(tiny_gemma3_model_path, make_llm, capfd):
    capfd.readouterr()
    llm = make_llm(tiny_gemma3_model_path, **SMALL_CTX)
    err = capfd.readouterr().err
    assert llm.info.arch == "gemma3"
    assert llm.info.kv_mode_name == "stock"
    assert err.splitlines().count(NOTICE) == 1, err
    assert "cacheflow:" not in err.replace(NOTICE, ""), err


def test_auto_notice_silenced_by_log_level_none(tiny_gemma3_model_path, make_llm, capfd):
    capfd.readouterr()
    llm = make_llm(tiny_gemma3_model_path, log_level="none", **SMALL_CTX)
    assert llm.info.kv_mode_name == "stock"
    assert "paged KV path" not in capfd.readouterr().err


def test_forced_paged_raises_unsupported(tiny_gemma3_model_path, make_llm):
    with pytest.raises(UnsupportedError, match="sliding-window attention") as info:
        make_llm(tiny_gemma3_model_path, kv_mode="paged", **SMALL_CTX)
    assert str(info.value) == PAGED_ERROR
    assert info.value.status is not None and info.value.status < 0


def test_auto_greedy_generates_same_as_stock(tiny_gemma3_model_path, make_llm):
    auto = make_llm(tiny_gemma3_model_path, **SMALL_CTX).generate(PROMPTS, greedy(12))
    stock = make_llm(tiny_gemma3_model_path, kv_mode="stock", **SMALL_CTX)
    assert [len(o.token_ids) for o in auto] == [12, 12]
    assert {o.finish_reason for o in auto} == {"length"}
    assert len(set(auto[0].token_ids)) > 1  # random weights, yet not one token repeated
    assert [o.token_ids for o in auto] == [o.token_ids for o in stock.generate(PROMPTS, greedy(12))]
    alone = [stock.generate([p], greedy(12))[0].token_ids for p in PROMPTS]
    assert alone == [o.token_ids for o in auto]


def test_llama_auto_is_paged_without_notice(tiny_model_path, make_llm, capfd):
    capfd.readouterr()
    llm = make_llm(tiny_model_path, n_gpu_layers=0, **SMALL_CTX)
    assert llm.info.kv_mode_name == "paged"
    assert "paged KV path" not in capfd.readouterr().err


# ---------------------------------------------------------------------------- CLI


def test_cli_auto_prints_one_notice_line(tiny_gemma3_model_path):
    result = run_cli(
        "generate", "-m", str(tiny_gemma3_model_path), "-q", "-n", "4", "--ignore-eos", "Hello"
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [NOTICE]
    assert result.stdout.strip()


def test_cli_forced_paged_fails_with_one_line(tiny_gemma3_model_path):
    result = run_cli("generate", "-m", str(tiny_gemma3_model_path), "--kv-mode", "paged", "Hello")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"Error: UnsupportedError: {PAGED_ERROR}"]
    assert result.stdout == ""
