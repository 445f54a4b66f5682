"""Run the native unit tests (native/tests/test_*, built by `pip install .` into the
persistent build folder build/<wheel tag>/) as part of pytest, with the real model for the
model-backed ones."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
NATIVE_TESTS = sorted(p.stem for p in (REPO_ROOT / "native" / "tests").glob("test_*.c*"))


def build_dir() -> Path:
    """The newest build/<tag>/ folder holding the native test executables."""
    dirs = [p.parent for p in (REPO_ROOT / "build").glob("*/CTestTestfile.cmake")]
    if not dirs:
        pytest.fail("no native build under build/: run `pip install .` from the checkout first")
    return max(dirs, key=lambda d: d.stat().st_mtime)


@pytest.mark.parametrize("name", NATIVE_TESTS)
def test_native(name, real_model_path, tiny_model_path):
    exe = build_dir() / name
    assert exe.is_file(), f"{exe} was not built (is CACHEFLOW_BUILD_TESTS on?)"
    # test_engine exercises engine mechanics: the tiny fixture keeps it fast. test_paged_llama
    # compares paged with stock attention on both the real model and the tiny f32 one.
    model = real_model_path if name == "test_paged_llama" else tiny_model_path
    env = dict(os.environ, CACHEFLOW_TEST_MODEL=str(model),
               CACHEFLOW_TEST_TINY_MODEL=str(tiny_model_path))
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
