"""Layer split over two devices on one GPU: the local CUDA0 and an rpc-server of this build on the same GPU (issue
17; README "Several devices").

With one GPU this is the only multi-device exercise of the paged path: half the layers (and their K/V pools) go to
the rpc-server's CUDA device, half stay on the local one, and each device runs the CUDA paged attention op for its
own layers, while one block table serves both. The same arithmetic runs on the same GPU for both halves, so greedy
tokens are expected to equal the single-device run's; the measured agreement is printed and written to
$CACHEFLOW_GPU_RESULTS (a JSON file, key "rpc_gpu") when set, and the test asserts at least 0.95 (cuBLAS may choose
other GEMM algorithms in another CUDA context). Both runs keep ggml-cuda's stock GEMM path (CACHEFLOW_CUDA_GEMM=0):
the engine sets patches 0008, 0020 and 0021 in its own process only, so the rpc-server's layers run the stock graph,
and with the engine's options on the local half the two halves would not do the same arithmetic (stop 46, H100: 30
of 32 equal with options 15 on the local half, 31 of 32 in stops 28-32 with options 3). Swaps under
pressure: the CUDA copy stream is off when a pool is on an RPC device (llama.cpp's per-block copies instead), tokens
again compared with the single-device run under the same schedule.

Needs an NVIDIA GPU, a CUDA build (CACHEFLOW_CUDA=ON pip install .) and a tokenizer GGUF; never run on the CPU-only
CI (skipped). Run on the GPU machine since stop 28 (figures in results/h200_gpu/stopNN/gpu_agreement.json).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_paged_gpu
from test_paged_gpu import _agreement, _gpu_available, _prompts

from cli.devices import rpc_server_path

gpu_model = test_paged_gpu.gpu_model  # the 4-layer f16 model fixture of the single-GPU tests

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _gpu_available(), reason="needs an NVIDIA GPU"),
]


@pytest.fixture(scope="module")
def rpc_cuda_server() -> Iterator[str]:
    """An rpc-server of this build on the local GPU (-d CUDA0), as "127.0.0.1:PORT"."""
    path = rpc_server_path()
    if not path.is_file():
        pytest.skip(f"no rpc-server at {path}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(path), "-H", "127.0.0.1", "-p", str(port), "-d", "CUDA0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"rpc-server exited with {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "rpc-server did not listen within 60 s"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _generate(model: Path, prompts: list[list[int]] | None, **config) -> tuple[object, object, list]:
    from pycacheflow import LLM, SamplingParams

    with LLM(model=str(model), n_gpu_layers=99, kv_mode="paged", **config) as llm:
        prompts = prompts or _prompts(llm.info.n_vocab)[:32]
        outs = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
        return llm.info, llm.stats(), prompts, [list(o.token_ids) for o in outs]


def test_layer_split_over_cuda0_and_an_rpc_server_on_the_same_gpu(gpu_model: Path, rpc_cuda_server: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEFLOW_CUDA_GEMM", "0")  # the rpc-server's arithmetic on both halves (module docstring)
    base = {"max_num_seqs": 32, "n_ctx": 32 * 512}
    info1, s1, prompts, single = _generate(gpu_model, None, **base)
    # device order: RPC0 (the server's CUDA0) first, then the local CUDA0; 4 layers + output over 2
    info2, s2, _, split = _generate(gpu_model, prompts, rpc_servers=(rpc_cuda_server,), tensor_split=(1, 1), **base)
    assert info1.kv_mode_name == info2.kv_mode_name == "paged"
    assert set(info1.kv_devices) == {"CUDA0"}
    assert {d[:3] for d in info2.kv_devices} == {"RPC", "CUD"}, info2.kv_devices
    assert s2.kv_blocks_total == s1.kv_blocks_total  # one pool per engine, not per device

    # swaps and copy-on-write with half the pools behind RPC: llama.cpp's copies, not the copy stream
    tight = {"max_num_seqs": 32, "n_ctx": 1024, "preemption_mode": "swap", "swap_space_bytes": 64 << 20}
    _, _, _, tight_single = _generate(gpu_model, prompts, **tight)
    _, t2, _, tight_split = _generate(gpu_model, prompts, rpc_servers=(rpc_cuda_server,), tensor_split=(1, 1), **tight)
    assert t2.num_preemptions_swap > 0 and t2.swap_on_copy_stream == 0
    assert t2.swap_in_bytes == t2.swap_out_bytes > 0

    figures = {"split_vs_single": _agreement(split, single),
               "split_vs_single_under_swap": _agreement(tight_split, tight_single),
               "kv_devices": list(info2.kv_devices)}  # fmt: skip
    print("rpc_gpu:", figures)
    if os.environ.get("CACHEFLOW_GPU_RESULTS"):
        path = Path(os.environ["CACHEFLOW_GPU_RESULTS"])
        data = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**data, "rpc_gpu": figures}, indent=2))
    assert figures["split_vs_single"] >= 0.95 and figures["split_vs_single_under_swap"] >= 0.95
