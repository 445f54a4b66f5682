"""CacheFlow's SwiGLU kernel with its F16 copy (native/src/kernels/cuda/swiglu_f16.cuh, patches/0021): the output bit
for bit against a kernel written as ggml-cuda's SWIGLU and within 1e-5 of float64, the F16 copy bit for bit, gate and
up as halves of one row (both orders) or as two padded tensors, a row alone equal to the same row in a batch
(native/tests/cuda/test_swiglu_f16.cu, built with nvcc and ggml-cuda's -use_fast_math). Needs an NVIDIA GPU and nvcc
(the `gpu` marker; skipped, with the reason shown, elsewhere); with -s it prints the time per call against ggml's
SWIGLU and F16 conversion."""

from __future__ import annotations

from pathlib import Path

from cuda_helpers import CUDA_TESTS, KERNELS, build_and_run, needs_cuda

pytestmark = needs_cuda


def test_swiglu_f16_matches_ggml_and_the_reference(tmp_path: Path) -> None:
    out = build_and_run(KERNELS / "swiglu_f16.cu", CUDA_TESTS / "test_swiglu_f16.cu", tmp_path / "t",
                        flags=("-use_fast_math",))  # fmt: skip
    print(out)
