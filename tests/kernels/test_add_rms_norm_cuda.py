"""CacheFlow's residual add + RMS norm + weight kernel (native/src/kernels/cuda/add_rms_norm.cuh, patches/0020)
against a CPU reference: the sum bit for bit, the output within 4e-6 relative, the F16 copy bit for bit, in place
and padded, a row alone equal to the same row in a batch (native/tests/cuda/test_add_rms_norm.cu, built with nvcc
and ggml-cuda's -use_fast_math). Needs an NVIDIA GPU and nvcc (the `gpu` marker; skipped, with the reason shown,
elsewhere); with -s it prints the kernel's time per call."""

from __future__ import annotations

from pathlib import Path

from cuda_helpers import CUDA_TESTS, KERNELS, build_and_run, needs_cuda

pytestmark = needs_cuda


def test_add_rms_norm_matches_the_reference(tmp_path: Path) -> None:
    out = build_and_run(KERNELS / "add_rms_norm.cu", CUDA_TESTS / "test_add_rms_norm.cu", tmp_path / "t",
                        flags=("-use_fast_math",))  # fmt: skip
    print(out)
