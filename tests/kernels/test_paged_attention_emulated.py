"""The CUDA paged attention kernels' logic on the CPU, where CI has no GPU.

native/tests/cuda/emulate_paged_attention.cpp compiles the two-pass kernel (every load shape), the warp-split
kernel (both load shapes, and one-warp CTAs), the pipelined kernel (both register budgets) and the ring kernel (1 and 2
splits per CTA) from their headers with g++, one host thread per CUDA thread of a CTA (shuffles and barriers
emulated; cp.async copies synchronously), and checks them on the quick cases: within 1e-5 of a float64 reference,
each kernel's load shapes bit-identical to each other, each row bit-identical alone, with a wider block table and with
its blocks elsewhere (batch invariance), and the grids' split counts. About 4 minutes on 2 cores. It needs g++ and
CUDA's cuda_fp16.h (the test is skipped, with the reason shown, without them); the GPU itself runs
test_paged_attention_cuda.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cuda_helpers import CUDA_TESTS, KERNELS


def _cuda_include() -> Path | None:
    candidates = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    for base in candidates:
        if base and (Path(base) / "include" / "cuda_fp16.h").is_file():
            return Path(base) / "include"
    return None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None or _cuda_include() is None,
                    reason="needs g++ and CUDA's headers (cuda_fp16.h)")  # fmt: skip
def test_cuda_paged_attention_kernels_emulated_on_the_cpu(tmp_path: Path) -> None:
    exe = tmp_path / "emulate_paged_attention"
    build = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-w", f"-I{_cuda_include()}", f"-I{KERNELS}",
                            str(CUDA_TESTS / "emulate_paged_attention.cpp"), "-o", str(exe)],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    result = subprocess.run([str(exe), "--quick"], capture_output=True, text=True, check=False, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    # 2 cases x 10 kernels, load shapes, head placements, CTA widths; 1 case x 2 ring kernel variants
    assert result.stdout.count("invariant yes ok") == 22, result.stdout
    assert result.stdout.count("bits of the serial merge ok") == 2, result.stdout  # the combine alone, D 64 and 256
