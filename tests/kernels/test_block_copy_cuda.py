"""The KV block copy kernel (native/src/kernels/cuda/block_copy.cu) on the GPU: scattered blocks of
every layer's K and V pools swapped out to pinned host memory and back into other blocks bit-exact,
device-to-device copies, uneven sizes, the argument checks (native/tests/cuda/test_block_copy.cu,
built with nvcc); with -s it prints the host link's GB/s for the swap shape: the kernel against one
cudaMemcpyAsync per block range and against one contiguous pinned memcpy. Needs an NVIDIA GPU and
nvcc (the `gpu` marker; skipped, with the reason shown, elsewhere).
"""

from __future__ import annotations

from pathlib import Path

from cuda_helpers import CUDA_TESTS, KERNELS, build_and_run, needs_cuda

pytestmark = needs_cuda


def test_block_copy_cuda_is_exact(tmp_path: Path) -> None:
    print(build_and_run(KERNELS / "block_copy.cu", CUDA_TESTS / "test_block_copy.cu", tmp_path / "tbc"))
