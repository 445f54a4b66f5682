"""The CUDA paged attention kernel on the GPU: accuracy vs float64 and batch invariance.

Builds native/tests/cuda/test_paged_attention_cuda.cu with the kernel
(native/src/kernels/cuda/paged_attention.cu) using nvcc and runs it: every row within 2e-3 of a
float64 reference, and each row's output bit-identical alone, with a wider block table (more splits
in the grid) and with its blocks elsewhere in the pool; then the opt-in tensor-core prefill path
(paged_prefill_mma.cu, CACHEFLOW_PAGED_PREFILL=mma) on ragged prefill batches: within 2e-3 of the
output scale of float64, rows-kernel tokens unchanged, staged rows and batch composition without effect. Needs an NVIDIA GPU and nvcc (the `gpu`
marker; skipped, with the reason shown, on machines without them).
"""

from __future__ import annotations

from pathlib import Path

from cuda_helpers import CUDA_TESTS, KERNELS, build_and_run, needs_cuda

pytestmark = needs_cuda


def test_paged_attention_cuda_matches_reference_and_is_batch_invariant(tmp_path: Path) -> None:
    build_and_run(KERNELS / "paged_attention.cu", CUDA_TESTS / "test_paged_attention_cuda.cu",
                  tmp_path / "test_paged_attention_cuda", flags=("--use_fast_math",),
                  extra_sources=(KERNELS / "paged_prefill_mma.cu",))  # fmt: skip


def test_ring_kernel_matches_reference_and_is_batch_invariant(tmp_path: Path) -> None:
    """The opt-in ring kernel (paged_attention_ring.cuh, CACHEFLOW_PA_KERNEL=ring) beside the two-pass kernel on 11
    shapes (D 64 / 128 / 256, GQA 1-8, long rows): within 2e-3 of float64, bit-identical at 1, 2, 16 and by-the-grid
    splits per CTA, each row alone / relocated / with a wider table bit-identical to its batch."""
    out = build_and_run(KERNELS / "paged_attention.cu", CUDA_TESTS / "test_paged_attention_cuda.cu",
                        tmp_path / "test_paged_attention_cuda", flags=("--use_fast_math",),
                        extra_sources=(KERNELS / "paged_prefill_mma.cu",), args=("--ring",))  # fmt: skip
    assert "ring spc=16" in out
