"""KV streaming on the GPU (issue 16): staged blocks from a pinned host tier, layer-ahead prefetch.

Builds native/tests/cuda/test_kv_stream_cuda.cu with the paged attention kernel and kv_stream.cu using nvcc and
runs it with --bench: attention over 6 layers with blocks staged through the hooks is bit-identical to the same rows
all in the pools (eager, and a CUDA graph of the layer loop replayed after the staged list changed), for depth 1, 2,
4 and 6, and the stats count the bytes exactly; then it prints the gather's GB/s against a pinned memcpy and whether
the copy hides behind a fake per-layer compute. Needs an NVIDIA GPU and nvcc (the `gpu` marker).
"""

from __future__ import annotations

from pathlib import Path

from cuda_helpers import CUDA_TESTS, KERNELS, build_and_run, needs_cuda

pytestmark = needs_cuda


def test_kv_stream_cuda_matches_resident_pools(tmp_path: Path) -> None:
    out = build_and_run(KERNELS / "kv_stream.cu", CUDA_TESTS / "test_kv_stream_cuda.cu",
                        tmp_path / "test_kv_stream_cuda", flags=("--use_fast_math",),
                        extra_sources=(KERNELS / "paged_attention.cu", KERNELS / "paged_prefill_mma.cu"), args=("--bench",))  # fmt: skip
    print(out)
