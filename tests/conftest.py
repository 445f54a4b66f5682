"""Shared fixtures: the real and the tiny model, and LLM builders.

Model fixtures work offline once the default model is in the user cache (STYLE.md section 7):
  - ``real_model_path``: pycacheflow's default model (SmolLM2-135M-Instruct Q4_1), fetched into
    the user cache on first use by ``pycacheflow.model_hub.ensure_default_model``;
  - ``tiny_model_path``: a 2-layer random-weight llama GGUF with the real model's tokenizer,
    written once per session by ``scripts/make_tiny_gguf.py`` into a temporary directory;
  - ``tiny_gemma3_model_path``: the same for a 2-layer Gemma 3 with sliding-window attention,
    a model the paged KV path does not cover (served with llama.cpp's stock KV cache).

Builders instead of setup code: ``make_llm(model, **config)`` opens an LLM that is closed at the
end of the test. ``tiny_llm`` and ``real_llm`` are shared per session for tests that only read
(generate, tokenize) and leave no request behind.

Everything here imports pycacheflow lazily, so ``tests/unit`` runs without libcacheflow.so.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pycacheflow.llm import LLM

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_GGUF_SCRIPT = REPO_ROOT / "scripts" / "make_tiny_gguf.py"
TINY_SEED = 0

# Markers, also declared in pyproject.toml [tool.pytest.ini_options]; registered here too so a
# run from another rootdir (or an older pyproject) does not warn about unknown markers.
MARKERS = {
    "gpu": "needs an NVIDIA GPU and a CUDA build",
    "e2e": "drives the engine, the CLI or the HTTP server end to end",
    "slow": "takes more than a few seconds",
}

# Small engines: KV for 8 sequences of 512 tokens (tiny) or 256 tokens (real; 23 KiB/token).
TINY_CONFIG = {"max_num_seqs": 8, "n_ctx": 8 * 512}
REAL_CONFIG = {"max_num_seqs": 8, "n_ctx": 8 * 256}


def pytest_configure(config: pytest.Config) -> None:
    declared = {line.split(":")[0].strip() for line in config.getini("markers")}
    for name, doc in MARKERS.items():
        if name not in declared:
            config.addinivalue_line("markers", f"{name}: {doc}")


# ---------------------------------------------------------------------------- model files


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """The default model's GGUF path (downloaded into the user cache on first use)."""
    from pycacheflow.model_hub import ensure_default_model

    return Path(ensure_default_model(progress=False))


def _write_tiny_model(out: Path, real_model_path: Path, arch: str) -> Path:
    """Run scripts/make_tiny_gguf.py for arch with the real tokenizer and TINY_SEED; returns out."""
    cmd = [sys.executable, str(TINY_GGUF_SCRIPT), str(out), "--arch", arch,
           "--tokenizer-from", str(real_model_path), "--seed", str(TINY_SEED)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stderr}"
    return out


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory, real_model_path: Path) -> Path:
    """A tiny random-weight llama GGUF (2 layers, n_embd 64, GQA 4/2) with the real tokenizer."""
    out = tmp_path_factory.mktemp("tiny_model") / f"tiny-llama-seed{TINY_SEED}.gguf"
    return _write_tiny_model(out, real_model_path, "llama")


@pytest.fixture(scope="session")
def tiny_gemma3_model_path(tmp_path_factory: pytest.TempPathFactory, real_model_path: Path) -> Path:
    """A tiny random-weight Gemma 3 GGUF (2 layers, n_embd 64, 4 query heads of 32 on 1 KV head;
    layer 0 sliding-window attention over 64 tokens, layer 1 full attention) with the real
    tokenizer. The paged KV path does not cover it: kv_mode "auto" resolves to "stock"."""
    out = tmp_path_factory.mktemp("tiny_gemma3") / f"tiny-gemma3-seed{TINY_SEED}.gguf"
    return _write_tiny_model(out, real_model_path, "gemma3")


# ---------------------------------------------------------------------------- LLM builders


@pytest.fixture
def make_llm() -> Iterator[Callable[..., LLM]]:
    """Builder: ``make_llm(model, **config)`` -> an open LLM, closed after the test."""
    from pycacheflow.llm import LLM

    opened: list[LLM] = []

    def build(model: str | Path, **config: object) -> LLM:
        llm = LLM(model, **config)
        opened.append(llm)
        return llm

    yield build
    for llm in reversed(opened):
        llm.close()


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_path: Path) -> Iterator[LLM]:
    """A session-wide LLM on the tiny model (TINY_CONFIG). Leave no request running."""
    from pycacheflow.llm import LLM

    with LLM(tiny_model_path, **TINY_CONFIG) as llm:
        yield llm


@pytest.fixture(scope="session")
def real_llm(real_model_path: Path) -> Iterator[LLM]:
    """A session-wide LLM on the real model (REAL_CONFIG). Leave no request running."""
    from pycacheflow.llm import LLM

    with LLM(real_model_path, **REAL_CONFIG) as llm:
        yield llm
