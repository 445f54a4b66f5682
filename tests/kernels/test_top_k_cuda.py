"""The batched top-k kernel (native/src/kernels/cuda/top_k_rows.cu) on the GPU: exact ids against a
host reference on random rows, rows full of ties and of -inf, ragged shapes up to a 128,256-token
vocabulary and 256 rows, and the launcher's argument checks (native/tests/cuda/test_top_k_rows.cu,
built with nvcc). Needs an NVIDIA GPU and nvcc (the `gpu` marker; skipped, with the reason shown,
elsewhere). The kernel's times for the candidates' shapes are printed with -s.
"""

from __future__ import annotations

from pathlib import Path

from cuda_helpers import CUDA_TESTS, KERNELS, build_and_run, needs_cuda

pytestmark = needs_cuda


def test_top_k_rows_cuda_matches_the_reference(tmp_path: Path) -> None:
    print(build_and_run(KERNELS / "top_k_rows.cu", CUDA_TESTS / "test_top_k_rows.cu", tmp_path / "ttk"))
