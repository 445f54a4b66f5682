"""Shared by the standalone CUDA kernel tests: the skip rule and the nvcc build-and-run step."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "native" / "src" / "kernels" / "cuda"
CUDA_TESTS = ROOT / "native" / "tests" / "cuda"


def _gpu_available() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0


# The marker pair of every standalone kernel test: `gpu`, skipped (reason shown) without nvcc or a GPU.
needs_cuda = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("nvcc") is None or not _gpu_available(),
                                 reason="needs an NVIDIA GPU and nvcc")]  # fmt: skip


def build_and_run(kernel: Path, test: Path, exe: Path, flags: tuple[str, ...] = (),
                  extra_sources: tuple[Path, ...] = (), args: tuple[str, ...] = ()) -> str:
    """nvcc kernel (+ extra_sources) + test into exe, run it with args; asserts both steps succeed and PASS is
    printed. Returns the test's stdout."""
    build = subprocess.run(["nvcc", "-std=c++17", "-O3", *flags, "-arch=native", f"-I{KERNELS}",
                            f"-I{KERNELS.parent}", str(kernel), *map(str, extra_sources), str(test), "-o", str(exe)],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    result = subprocess.run([str(exe), *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    return result.stdout
