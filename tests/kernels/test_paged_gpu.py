"""Paged KV on the GPU, end to end: the CUDA paged attention op inside llama.cpp's graph.

A random-weight f16 llama (4 layers, head size 64, GQA 2) with a real tokenizer runs fully offloaded
(n_gpu_layers=99) with kv_mode="paged": the engine must resolve to paged on the GPU (the CUDA kernel
answers supports_op), finish 64 concurrent greedy requests with their exact lengths, and agree with
the same engine under other prompt chunking and with llama.cpp's stock KV cache on the GPU. The
agreement figures are printed and written to $CACHEFLOW_GPU_RESULTS (a JSON file) when set.

Needs an NVIDIA GPU, a CUDA build (CACHEFLOW_CUDA=ON pip install .) and a tokenizer GGUF
($CACHEFLOW_TOKENIZER_GGUF, else the cached default model); skipped visibly otherwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS = 64
N_OUT = 24


def _gpu_available() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0


def _tokenizer_source() -> Path | None:
    env = os.environ.get("CACHEFLOW_TOKENIZER_GGUF")
    if env:
        return Path(env)
    from pycacheflow.model_hub import default_model_path

    path = Path(default_model_path())
    return path if path.is_file() else None


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _gpu_available(), reason="needs an NVIDIA GPU"),
]


def _write_f16_model(out: Path, *shape: str) -> Path:
    """A random-weight F16 llama GGUF at out with the real tokenizer (scripts/make_tiny_gguf.py; shape:
    its --n-layer ... --seed arguments); skips without a tokenizer GGUF."""
    tok = _tokenizer_source()
    if tok is None:
        pytest.skip("no tokenizer GGUF (set CACHEFLOW_TOKENIZER_GGUF)")
    cmd = [sys.executable, str(ROOT / "scripts" / "make_tiny_gguf.py"), str(out), "--tokenizer-from", str(tok),
           "--dtype", "f16", *shape]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def gpu_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_f16_model(tmp_path_factory.mktemp("gpu_model") / "llama-4l-f16.gguf", "--n-layer", "4",
                            "--n-embd", "256", "--n-head", "4", "--n-head-kv", "2", "--n-ff", "512", "--seed", "1")


def _prompts(n_vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, n_vocab) for _ in range(rng.randrange(16, 300))] for _ in range(N_PROMPTS)]


def _run(model: Path, prompts: list[list[int]] | None = None, **config) -> tuple[dict, list[list[int]]]:
    from pycacheflow import LLM, SamplingParams

    with LLM(model=str(model), n_gpu_layers=99, max_num_seqs=N_PROMPTS, n_ctx=N_PROMPTS * 512, **config) as llm:
        info = llm.info
        prompts = prompts or _prompts(info.n_vocab)
        outs = llm.generate(prompts, SamplingParams(max_tokens=N_OUT, ignore_eos=True))
        return {"kv_mode": info.kv_mode_name, "prompts": prompts}, [list(o.token_ids) for o in outs]


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def test_paged_kv_runs_on_the_gpu(gpu_model: Path) -> None:
    meta, paged = _run(gpu_model, kv_mode="paged")
    assert meta["kv_mode"] == "paged"
    assert all(len(t) == N_OUT for t in paged)
    prompts = meta["prompts"]
    _, chunked = _run(gpu_model, prompts, kv_mode="paged", max_num_batched_tokens=64)
    assert all(len(t) == N_OUT for t in chunked)
    _, stock = _run(gpu_model, prompts, kv_mode="stock")
    figures = {
        "paged_vs_paged_chunks_of_64": _agreement(paged, chunked),
        "paged_vs_stock": _agreement(paged, stock),
    }
    print("greedy sequences equal (fraction of", N_PROMPTS, "):", figures)
    if os.environ.get("CACHEFLOW_GPU_RESULTS"):
        Path(os.environ["CACHEFLOW_GPU_RESULTS"]).write_text(json.dumps(figures, indent=1))


def _record(figures: dict) -> None:
    """Merge figures into $CACHEFLOW_GPU_RESULTS (a JSON file) when set."""
    path = os.environ.get("CACHEFLOW_GPU_RESULTS")
    if not path:
        return
    old = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    Path(path).write_text(json.dumps({**old, **figures}, indent=1))


def _shared_prefix_prompts(n_vocab: int) -> list[list[int]]:
    """16 prompts: one 200-token system prompt (12.5 blocks of 16) + a distinct 20-60 token question."""
    rng = random.Random(2)
    system = [rng.randrange(100, n_vocab) for _ in range(200)]
    return [system + [rng.randrange(100, n_vocab) for _ in range(rng.randrange(20, 60))] for _ in range(16)]


def test_prefix_cache_and_step_padding_on_the_gpu(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 on CUDA (cache on vs off, a warm repeat vs the cold run) and step padding on vs off
    (batch_builder.h): exact lengths and hits are asserted; greedy agreement is reported, since
    cuBLAS may pick another GEMM kernel for another token count (0.9 is a sanity floor)."""
    from pycacheflow import LLM, SamplingParams

    params = SamplingParams(max_tokens=N_OUT, ignore_eos=True)
    results = {}
    for padding in ("1", "0"):
        monkeypatch.setenv("CACHEFLOW_STEP_PADDING", padding)
        for cache in (True, False):
            with LLM(model=str(gpu_model), n_gpu_layers=99, kv_mode="paged", max_num_seqs=16, n_ctx=16 * 512,
                     enable_prefix_caching=cache) as llm:
                prompts = _shared_prefix_prompts(llm.info.n_vocab)
                first = [list(o.token_ids) for o in llm.generate(prompts[:1], params)]  # fills the cache
                rest = [list(o.token_ids) for o in llm.generate(prompts[1:], params)]
                warm = [list(o.token_ids) for o in llm.generate(prompts[:1], params)]
                stats = llm.stats()
            assert all(len(t) == N_OUT for t in first + rest + warm)
            assert (stats.prefix_cache_hit_tokens > 0) == cache
            assert (stats.num_padding_tokens > 0) == (padding == "1")
            results[(padding, cache)] = (first + rest, warm)
    figures = {
        "prefix_cache_on_vs_off": _agreement(results[("1", True)][0], results[("1", False)][0]),
        "prefix_cache_warm_repeat_vs_cold": _agreement(results[("1", True)][1], results[("1", True)][0][:1]),
        "step_padding_on_vs_off": _agreement(results[("1", False)][0], results[("0", False)][0]),
        "step_padding_on_vs_off_with_prefix_cache": _agreement(results[("1", True)][0], results[("0", True)][0]),
    }
    print("greedy sequences equal (fraction of 16):", figures)
    _record(figures)
    assert min(figures.values()) >= 0.9, figures


def _pressure_run(model: Path, route: str, monkeypatch: pytest.MonkeyPatch, n_ctx: int,
                  prompts: list[list[int]] | None = None, swap_space_bytes: int = 64 << 20,
                  preemption: str = "swap") -> tuple[list, object]:
    """32 requests of 20-51 prompt tokens (or `prompts`) + 48 output tokens, then 4 prompts with 3 greedy
    choices each (forks: copy-on-write copies of the shared last block), in a pool of n_ctx rows, preemption by
    `preemption`; route "1" = CacheFlow's CUDA copy stream, "0" = llama.cpp's per-block copies."""
    from pycacheflow import LLM, SamplingParams

    monkeypatch.setenv("CACHEFLOW_SWAP_ASYNC", route)
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    with LLM(model=str(model), n_gpu_layers=99, kv_mode="paged", max_num_seqs=32, n_ctx=n_ctx,
             preemption_mode=preemption, swap_space_bytes=swap_space_bytes) as llm:
        prompts = prompts or [list(range(500 + 97 * i, 520 + 97 * i + i)) for i in range(32)]
        tokens = [list(o.token_ids) for o in llm.generate(prompts, params)]
        for p in prompts[:4]:
            ids = llm.add_choices(p, [params] * 3)
            tokens += [[t for d in llm.iter_outputs(i, timeout=120) for t in d.token_ids] for i in ids]
        return tokens, llm.stats()


def test_swap_on_the_cuda_copy_stream(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13 on CUDA: swaps and copy-on-write copies as one kernel per batch on CacheFlow's side stream
    (engine/swapper.h, patches/0011), from and to pinned host memory, give the same greedy tokens as
    llama.cpp's per-block copies under the same (deterministic) schedule; nothing is lost or recomputed."""
    stream_tokens, s = _pressure_run(gpu_model, "1", monkeypatch, n_ctx=1024)
    llama_tokens, s_llama = _pressure_run(gpu_model, "0", monkeypatch, n_ctx=1024)
    roomy_tokens, s_roomy = _pressure_run(gpu_model, "1", monkeypatch, n_ctx=32 * 256)
    # recompute under the same pressure: its generated tokens run again as one prefill, and cuBLAS may round
    # another token count's GEMMs differently, so its agreement with the roomy run is reported, not asserted
    recompute_tokens, s_recompute = _pressure_run(gpu_model, "1", monkeypatch, n_ctx=1024, preemption="recompute")
    assert all(len(t) == 48 for t in recompute_tokens) and s_recompute.num_recomputed_tokens > 0
    assert s.swap_on_copy_stream == 1 and s_llama.swap_on_copy_stream == 0
    assert all(len(t) == 48 for t in stream_tokens + llama_tokens)
    assert s.num_preemptions_swap > 0 and s.num_preemptions_recompute == 0 and s.num_recomputed_tokens == 0
    assert s.swap_out_bytes > 0 and s.swap_in_bytes == s.swap_out_bytes and s.swap_out_ns > 0
    assert s.block_copy_bytes > 0 and s_llama.block_copy_bytes > 0
    assert (s.swap_out_bytes, s.num_preemptions_swap) == (s_llama.swap_out_bytes, s_llama.num_preemptions_swap)
    assert stream_tokens == llama_tokens
    assert s.kv_blocks_used == 0 and s.swap_blocks_used == 0
    # the copy stream ran the swaps beside compute (engine/swapper.h): each swap-in was issued a step before
    # its sequence joined the batch, and the issuing step's graph did not wait for its swaps
    assert s.num_swapped_in == s.num_resumed == s.num_preemptions_swap
    assert (s.num_swapped_in, s.num_deferred_seq_steps) == (s_llama.num_swapped_in, s_llama.num_deferred_seq_steps)
    assert s.num_swaps_overlapped > 0 and s.swap_overlapped_ns > 0
    assert s_llama.num_swaps_overlapped == 0 and s_llama.swap_overlapped_ns == 0
    assert s_llama.num_graphs_beside_copies == 0
    assert s_llama.num_graphs_overlapping_copies == 0 and s_llama.swap_compute_overlap_ns == 0
    gbs = lambda b, ns: round(b / ns, 2) if ns else None  # bytes per ns = GB/s
    figures = {
        "swap_copy_stream_vs_llama_copies": _agreement(stream_tokens, llama_tokens),
        "swap_pressure_vs_roomy": _agreement(stream_tokens, roomy_tokens),
        "recompute_pressure_vs_roomy": _agreement(recompute_tokens, roomy_tokens),
        "recompute_preemptions": s_recompute.num_preemptions_recompute,
        "swap_out_GBps_copy_stream_device": gbs(s.swap_out_bytes, s.swap_out_ns),
        "swap_in_GBps_copy_stream_device": gbs(s.swap_in_bytes, s.swap_in_ns),
        "swap_out_GBps_llama_copies_host": gbs(s_llama.swap_out_bytes, s_llama.swap_out_ns),
        "swap_in_GBps_llama_copies_host": gbs(s_llama.swap_in_bytes, s_llama.swap_in_ns),
        "swap_preemptions": s.num_preemptions_swap,
        "swap_batches_overlapped": s.num_swaps_overlapped,
        "swap_overlapped_device_ms": round(s.swap_overlapped_ns / 1e6, 3),
        "graphs_beside_copies_tiny_model": s.num_graphs_beside_copies,
    }
    print("swap on CUDA:", figures)
    _record(figures)
    assert s_roomy.num_preemptions == 0
    # an engine made after others in the process starts from zero: the copy stream's device counters are the
    # process's, and the earlier engines' swap time once made AUTO's swap rate ~25x too slow (stop 28)
    assert s_roomy.swap_out_ns == 0 and s_roomy.swap_in_ns == 0


@pytest.fixture(scope="module")
def wide_kv_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 layers, 16 KV heads of 64: 512 KiB per 16-token block, so that a victim's swap takes the copy
    stream a few hundred microseconds, long enough to be seen running beside the next graph."""
    return _write_f16_model(tmp_path_factory.mktemp("wide_kv_model") / "llama-8l-kv16-f16.gguf", "--n-layer", "8",
                            "--n-embd", "1024", "--n-head", "16", "--n-head-kv", "16", "--n-ff", "2048", "--seed", "2")


def test_swaps_overlap_compute_on_the_copy_stream(wide_kv_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13, swaps beside compute: with blocks of 512 KiB and victims of 13-20 blocks, the copy stream's
    swap-outs and swap-ins run while the step's graph computes (deferred batches, released at the next step),
    and the tokens still equal llama.cpp's synchronous per-block copies under the same schedule.
    num_graphs_beside_copies counts graph evaluations that ggml-cuda enqueued while such a swap batch was
    still running on the device (cudaEventQuery), the direct sign of overlap; it depends on timing, so it
    is recorded in the results, not asserted (stop 28 on the H200: 0 - the batches had finished by then)."""
    rng = random.Random(3)
    prompts = [[rng.randrange(100, 30000) for _ in range(rng.randrange(200, 300))] for _ in range(32)]
    stream_tokens, s = _pressure_run(wide_kv_model, "1", monkeypatch, n_ctx=4096, prompts=prompts,
                                     swap_space_bytes=1 << 30)
    llama_tokens, s_llama = _pressure_run(wide_kv_model, "0", monkeypatch, n_ctx=4096, prompts=prompts,
                                          swap_space_bytes=1 << 30)
    assert s.swap_on_copy_stream == 1 and s_llama.swap_on_copy_stream == 0
    assert s.num_preemptions_swap > 0 and s.num_recomputed_tokens == 0
    assert s.num_swapped_in == s.num_resumed == s.num_preemptions_swap
    assert stream_tokens == llama_tokens
    assert s.num_swaps_overlapped > 0 and s.swap_overlapped_ns > 0
    figures = {
        "wide_kv_swap_preemptions": s.num_preemptions_swap,
        "wide_kv_swap_batches_overlapped": s.num_swaps_overlapped,
        "wide_kv_graphs_beside_copies": s.num_graphs_beside_copies,
        # device timeline (CUDA events on the compute and copy streams): graphs that began before the swap batch
        # beside them ended, and the time both ran at once
        "wide_kv_graphs_overlapping_copies_device": s.num_graphs_overlapping_copies,
        "wide_kv_swap_compute_overlap_device_ms": round(s.swap_compute_overlap_ns / 1e6, 3),
        "wide_kv_swap_overlapped_device_ms": round(s.swap_overlapped_ns / 1e6, 3),
        "wide_kv_swap_device_ms": round((s.swap_out_ns + s.swap_in_ns) / 1e6, 3),
        "wide_kv_steps_deferred_for_swap_out": s.num_deferred_seq_steps,
        "wide_kv_step_ms_copy_stream_vs_llama_copies": [round(s.step_ns / 1e6, 1), round(s_llama.step_ns / 1e6, 1)],
    }
    print("swaps beside compute:", figures)
    _record(figures)  # num_graphs_beside_copies depends on timing: recorded, not asserted


@pytest.fixture(scope="module")
def large_kv_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 layers, 16 KV heads of 128: 128 KiB of K and V per token (the Llama-3.1-8B shape's figure), so that
    one victim of a few hundred tokens is tens of MB and its swap takes the copy stream milliseconds, far
    longer than the host needs to prepare and enqueue the next graph."""
    return _write_f16_model(tmp_path_factory.mktemp("large_kv_model") / "llama-16l-kv16x128-f16.gguf",
                            "--n-layer", "16", "--n-embd", "2048", "--n-head", "16", "--n-head-kv", "16",
                            "--n-ff", "2048", "--n-ctx-train", "4096", "--seed", "4")


def _large_swap_run(model: Path, route: str, monkeypatch: pytest.MonkeyPatch,
                    prompts: list[list[int]], n_out: int) -> tuple[list, object]:
    """Greedy tokens and stats of `prompts` with n_out output tokens each in a 2,048-row pool, preemption by
    swap; route "1" = the copy stream, "0" = llama.cpp's copies."""
    from pycacheflow import LLM, SamplingParams

    monkeypatch.setenv("CACHEFLOW_SWAP_ASYNC", route)
    with LLM(model=str(model), n_gpu_layers=99, kv_mode="paged", max_num_seqs=len(prompts), n_ctx=2048,
             enable_prefix_caching=False, preemption_mode="swap", swap_space_bytes=2 << 30) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=n_out, ignore_eos=True))
        return [list(o.token_ids) for o in outs], llm.stats()


def test_large_swaps_overlap_compute_on_the_device(large_kv_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13, the copies overlap compute on the device: 12 requests of 512 prompt + 384 output tokens in a
    2,048-row pool (3 at a time) preempt each other repeatedly, and each victim moves 64-112 MB (128 KiB per
    token), so a swap batch outlasts the host's preparation of the next graph (with 256-token prompts, 45 MB
    victims, 2-3 of the batches were still running when the next graph began, on an H100 and on an H200). The device timeline (CUDA events on the
    compute stream and the copy stream, kernels/cuda/copy_stream.cu) must then show graphs that began while a
    swap batch still ran, and the time both ran at once; tokens equal llama.cpp's synchronous copies under
    the same schedule, and the host no longer waits for the copies (step time is reported for both)."""
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 30000) for _ in range(512)] for _ in range(12)]
    stream_tokens, s = _large_swap_run(large_kv_model, "1", monkeypatch, prompts, 384)
    llama_tokens, s_llama = _large_swap_run(large_kv_model, "0", monkeypatch, prompts, 384)
    assert s.swap_on_copy_stream == 1 and s_llama.swap_on_copy_stream == 0
    assert all(len(t) == 384 for t in stream_tokens + llama_tokens)
    assert s.num_preemptions_swap > 0 and s.num_preemptions_recompute == 0 and s.num_recomputed_tokens == 0
    assert (s.num_preemptions_swap, s.swap_out_bytes) == (s_llama.num_preemptions_swap, s_llama.swap_out_bytes)
    assert stream_tokens == llama_tokens
    swap_device_ns = s.swap_out_ns + s.swap_in_ns
    figures = {
        "large_kv_swap_preemptions": s.num_preemptions_swap,
        "large_kv_mean_victim_MB": round(s.swap_out_bytes / s.num_preemptions_swap / 2**20, 1),
        "large_kv_swap_device_ms": round(swap_device_ns / 1e6, 3),
        "large_kv_swap_GBps_out_in_device": [round(s.swap_out_bytes / s.swap_out_ns, 2),
                                             round(s.swap_in_bytes / s.swap_in_ns, 2)],
        "large_kv_swap_batches_overlapped": s.num_swaps_overlapped,
        "large_kv_graphs_beside_copies": s.num_graphs_beside_copies,
        "large_kv_graphs_overlapping_copies_device": s.num_graphs_overlapping_copies,
        "large_kv_swap_compute_overlap_device_ms": round(s.swap_compute_overlap_ns / 1e6, 3),
        "large_kv_llama_copies_host_ms": round((s_llama.swap_out_ns + s_llama.swap_in_ns) / 1e6, 1),
        "large_kv_step_ms_copy_stream_vs_llama_copies": [round(s.step_ns / 1e6, 1), round(s_llama.step_ns / 1e6, 1)],
    }
    print("large swaps beside compute:", figures)
    _record(figures)
    # the direct sign of overlap: a graph began on the device before the swap batch beside it ended
    assert s.num_graphs_overlapping_copies > 0 and s.swap_compute_overlap_ns > 0, figures
    assert s_llama.num_graphs_overlapping_copies == 0 and s_llama.swap_compute_overlap_ns == 0


def _streamed_run(model: Path, prompts: list[list[int]], n_out: int, n_ctx: int, **config) -> tuple[list, object]:
    """Greedy tokens and stats of one CUDA engine (paged, fully offloaded, swap preemption)."""
    from pycacheflow import LLM, SamplingParams

    with LLM(model=str(model), n_gpu_layers=99, kv_mode="paged", n_ctx=n_ctx, preemption_mode="swap",
             swap_space_bytes=64 << 20, **config) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=n_out, ignore_eos=True))
        # a finished sequence's host slots are parked until the next step's end (a copy of its last step may
        # still write them); one more short request runs that step
        llm.generate([prompts[0][:8]], SamplingParams(max_tokens=1))
        return [list(o.token_ids) for o in outs], llm.stats()


def test_kv_streaming_engine_on_the_gpu(gpu_model: Path) -> None:
    """Issue 16, the engine's CUDA path: a 600-token prompt in a 16-block device pool (it cannot fit on the
    device; its middle blocks live in host slots and the layer-ahead hooks stage them per layer on the side
    stream) gives exactly the tokens of a roomy pool under the same schedule (one sequence, chunks of 64, so
    every decode is B=1 both ways), at staging depths 1, 2 and 4; then 8 sequences that overflow the pool
    together: same tokens at depths 1 and 2 (one schedule), agreement with a roomy pool reported."""
    rng = random.Random(16)
    one = [[rng.randrange(100, 30000) for _ in range(600)]]
    common = dict(max_num_seqs=1, max_num_batched_tokens=64)
    want, roomy = _streamed_run(gpu_model, one, 48, 4096, kv_streaming="off", **common)
    assert roomy.kv_streaming == 0 and roomy.num_preemptions == 0 and len(want[0]) == 48
    figures: dict = {}
    # streaming on in a pool that holds the sequence: nothing is staged, so no decode runs the layer-ahead hooks
    # (patches/0013): no gather ran on the side stream, no layer waited for one
    fit, s_fit = _streamed_run(gpu_model, one, 48, 4096, kv_streaming="on", kv_stream_blocks=64, **common)
    assert s_fit.kv_streaming == 1 and s_fit.kv_staged_blocks == 0 and fit == want
    assert s_fit.kv_stream_cuda_copy_ns <= 0 and s_fit.kv_stream_cuda_wait_layers <= 0
    for depth in (1, 2, 4):
        got, s = _streamed_run(gpu_model, one, 48, 256, kv_streaming="on", kv_stream_blocks=64,
                               kv_stream_depth=depth, **common)
        assert s.kv_streaming == 1 and s.kv_blocks_total * 16 < 600 + 48
        assert s.kv_stream_demotions > 0 and s.kv_staged_blocks > 0 and s.kv_staging_decodes > 0
        assert s.kv_stream_cuda_copy_ns > 0, "the staging copies ran on the device"
        assert got == want, f"depth {depth}: streamed tokens differ from the roomy pool's"
        assert s.kv_streamed_blocks == 0 and s.swap_blocks_used == 0
        figures[f"kv_stream_one_seq_depth{depth}"] = {
            "staged_blocks": s.kv_staged_blocks, "staging_decodes": s.kv_staging_decodes,
            "wait_layers": s.kv_stream_cuda_wait_layers,
            "staging_GBps_device": round(s.kv_staged_bytes / s.kv_stream_cuda_copy_ns, 2)}
    # the CPU path on the same small model (its own arithmetic: agreement reported, as paged vs stock above)
    from pycacheflow import LLM, SamplingParams

    with LLM(model=str(gpu_model), n_gpu_layers=0, kv_mode="paged", n_ctx=4096, **common) as cpu:
        on_cpu = [list(o.token_ids) for o in cpu.generate(one, SamplingParams(max_tokens=48, ignore_eos=True))]
    figures["kv_stream_one_seq_vs_cpu_common_prefix_tokens"] = next(
        (i for i, (a, b) in enumerate(zip(want[0], on_cpu[0])) if a != b), 48)
    many = [[rng.randrange(100, 30000) for _ in range(rng.randrange(120, 160))] for _ in range(8)]
    common = dict(max_num_seqs=8, max_num_batched_tokens=64)
    roomy_tokens, _ = _streamed_run(gpu_model, many, 100, 4096, kv_streaming="off", **common)
    by_depth = {}
    for depth in (1, 2):
        by_depth[depth], s = _streamed_run(gpu_model, many, 100, 256, kv_streaming="on", kv_stream_blocks=64,
                                           kv_stream_depth=depth, **common)
        assert all(len(t) == 100 for t in by_depth[depth])
        assert s.kv_stream_demotions > 0 and s.kv_staged_blocks > 0
        assert s.kv_streamed_blocks == 0 and s.swap_blocks_used == 0
    assert by_depth[1] == by_depth[2]
    figures["kv_stream_8_seqs_vs_roomy"] = _agreement(by_depth[2], roomy_tokens)
    figures["kv_stream_8_seqs_demotions"] = s.kv_stream_demotions
    figures["kv_stream_8_seqs_promotions"] = s.kv_stream_promotions
    figures["kv_stream_8_seqs_preemptions"] = s.num_preemptions
    print("KV streaming on CUDA:", figures)
    _record(figures)


_MMA_CHILD = """
import json, sys
from pycacheflow import LLM, SamplingParams
model, prompts_path, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts = json.loads(open(prompts_path).read())
config = dict(max_num_batched_tokens=chunk) if chunk else {}
with LLM(model=model, n_gpu_layers=99, kv_mode="paged", max_num_seqs=len(prompts), n_ctx=len(prompts) * 512,
         **config) as llm:
    outs = llm.generate(prompts, SamplingParams(max_tokens=%d, ignore_eos=True))
print(json.dumps([list(o.token_ids) for o in outs]))
""" % N_OUT


def _tokens_in_child(model: Path, prompts_path: Path, prefill: str, chunk: int = 0) -> list[list[int]]:
    """Greedy tokens of a fresh process with CACHEFLOW_PAGED_PREFILL=prefill (read once per process)."""
    env = {**os.environ, "CACHEFLOW_PAGED_PREFILL": prefill}
    result = subprocess.run([sys.executable, "-c", _MMA_CHILD, str(model), str(prompts_path), str(chunk)],
                            capture_output=True, text=True, env=env, check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tensor_core_prefill_end_to_end(gpu_model: Path, tmp_path: Path) -> None:
    """Issue 11, the opt-in tensor-core prefill (CACHEFLOW_PAGED_PREFILL=mma, paged_prefill_mma.cu) inside the
    engine: 64 greedy requests of 16-300 prompt tokens (runs of >= 64 tokens take the MMA kernel, shorter ones
    the rows kernel) finish with full length; agreement with the rows kernel (its own f16 P x V arithmetic, so
    reported, as paged vs stock) and with itself under prefill chunks of 64 is recorded."""
    from pycacheflow import LLM

    with LLM(model=str(gpu_model), n_gpu_layers=99, kv_mode="paged", max_num_seqs=1, n_ctx=512) as llm:
        prompts = _prompts(llm.info.n_vocab)
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))
    rows = _tokens_in_child(gpu_model, path, "rows")
    mma = _tokens_in_child(gpu_model, path, "mma")
    mma_chunks = _tokens_in_child(gpu_model, path, "mma", chunk=64)
    assert all(len(t) == N_OUT for t in rows + mma + mma_chunks)
    figures = {"mma_prefill_vs_rows": _agreement(mma, rows),
               "mma_prefill_vs_mma_chunks_of_64": _agreement(mma, mma_chunks)}
    print("tensor-core prefill, greedy sequences equal:", figures)
    _record(figures)
    assert figures["mma_prefill_vs_rows"] >= 0.75, "the MMA prefill parts from the rows kernel on most sequences"


def test_token_embedding_on_the_device(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token embedding matrix on the GPU (llama_session.cpp: the default for a model wholly on one CUDA device,
    CACHEFLOW_EMBD_ON_DEVICE=0 keeps it on the CPU, =1 insists): the 64 greedy requests give the same tokens as with
    it on the CPU (get_rows turns F16 rows into F32 exactly on both, and the rest of the graph is the same), and with
    =1 a model whose output head stays on the CPU is refused with a message naming the setting."""
    from pycacheflow import LLM
    from pycacheflow.errors import InvalidArgumentError

    monkeypatch.setenv("CACHEFLOW_EMBD_ON_DEVICE", "0")
    meta, on_cpu = _run(gpu_model, kv_mode="paged")
    monkeypatch.delenv("CACHEFLOW_EMBD_ON_DEVICE")
    _, by_default = _run(gpu_model, meta["prompts"], kv_mode="paged")
    monkeypatch.setenv("CACHEFLOW_EMBD_ON_DEVICE", "1")
    _, on_device = _run(gpu_model, meta["prompts"], kv_mode="paged")
    assert all(len(t) == N_OUT for t in on_device)
    figures = {"embd_on_device_vs_on_cpu": _agreement(on_device, on_cpu),
               "embd_default_vs_on_cpu": _agreement(by_default, on_cpu)}
    print("token embedding on the device, greedy sequences equal:", figures)
    _record(figures)
    assert figures["embd_on_device_vs_on_cpu"] == 1.0
    assert figures["embd_default_vs_on_cpu"] == 1.0
    # 4 layers: n_gpu_layers=4 offloads them all but keeps the output head on the CPU (llama.cpp's rule)
    with pytest.raises(InvalidArgumentError, match="CACHEFLOW_EMBD_ON_DEVICE=1 needs the whole model on the device"):
        LLM(model=str(gpu_model), n_gpu_layers=4, kv_mode="stock", n_ctx=512)


def test_async_decode_on_the_gpu(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Async decode (on by default here, a model wholly on one CUDA device; CACHEFLOW_ASYNC_DECODE=0 off: each
    step's next decode launched before its tokens are read, token ids from the device token feed, argmax rows in
    pinned slots; patches 0017, 0018, engine_step.cpp "Lookahead"): the 64 greedy requests give the same tokens as
    without; how many steps were launched ahead and adopted is reported (a sequence whose next row starts a block
    gets that block at the launch, so block boundaries do not stop it). The CPU suite checks the same bookkeeping
    synchronously (tests/e2e/test_async_decode.py); here the launches really overlap."""
    from pycacheflow import LLM, SamplingParams

    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", "0")
    meta, plain = _run(gpu_model, kv_mode="paged")
    monkeypatch.delenv("CACHEFLOW_ASYNC_DECODE")  # the default
    with LLM(model=str(gpu_model), n_gpu_layers=99, max_num_seqs=N_PROMPTS, n_ctx=N_PROMPTS * 512,
             kv_mode="paged") as llm:  # fmt: skip
        outs = llm.generate(meta["prompts"], SamplingParams(max_tokens=N_OUT, ignore_eos=True))
        stats = llm.stats()
    ahead = [list(o.token_ids) for o in outs]
    figures = {"async_decode_vs_plain": _agreement(ahead, plain),
               "async_decode_steps": stats.num_steps, "async_decode_launched_ahead": stats.num_lookahead_decodes,
               "async_decode_adopted": stats.num_lookahead_adopted}  # fmt: skip
    print("async decode:", figures)
    _record(figures)
    assert figures["async_decode_vs_plain"] == 1.0
    assert stats.num_lookahead_decodes > 0, "async decode is not on by default on one CUDA device"


def test_async_decode_adopted_by_the_requests_left_on_the_gpu(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Async decode where requests end on a stop token at different steps, which no launch foresees: every even
    request stops at the token of its plain run's output position 4 + i % 16 (or earlier, where that token comes
    before), the odd ones run to max_tokens. The decode launched ahead before each such end is adopted by the
    requests left (its rows of the ended ones never read), so none is dropped. Greedy agreement with the same loads
    without async decode is reported and must be at least 0.9: at an adopted step the device computed the ended
    requests' rows too, and cuBLAS may pick another GEMM for the larger batch."""
    from pycacheflow import LLM, SamplingParams

    monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", "0")
    meta, plain = _run(gpu_model, kv_mode="paged")
    params = [SamplingParams(max_tokens=N_OUT, ignore_eos=True,
                             stop_token_ids=[plain[i][4 + i % 16]] if i % 2 == 0 else [])
              for i in range(N_PROMPTS)]  # fmt: skip

    def run(async_decode: str):
        monkeypatch.setenv("CACHEFLOW_ASYNC_DECODE", async_decode)
        with LLM(model=str(gpu_model), n_gpu_layers=99, max_num_seqs=N_PROMPTS, n_ctx=N_PROMPTS * 512,
                 kv_mode="paged") as llm:  # fmt: skip
            outs = llm.generate(meta["prompts"], params)
            return [list(o.token_ids) for o in outs], llm.stats()

    want, _ = run("0")
    got, stats = run("1")
    figures = {"async_decode_stops_vs_plain": _agreement(got, want), "async_decode_stops_steps": stats.num_steps,
               "async_decode_stops_launched_ahead": stats.num_lookahead_decodes,
               "async_decode_stops_adopted": stats.num_lookahead_adopted}  # fmt: skip
    print("async decode with stops:", figures)
    _record(figures)
    assert any(len(t) < N_OUT for t in want[::2]), "no request stopped early"
    assert stats.num_lookahead_decodes == stats.num_lookahead_adopted > 0
    assert figures["async_decode_stops_vs_plain"] >= 0.9


def test_fused_projections_on_the_gpu(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fused projections (patches/0019): on the GPU every layer's Q/K/V and gate/up weights lie back to back (llama.cpp
    allocates them in creation order), so both fuse in every layer; the 64 greedy requests are compared with the
    unfused graph (CACHEFLOW_FUSE_PROJECTIONS=0). cuBLAS may pick another kernel for the taller matrices, so a near
    tie may break the other way: the agreement is reported, and a broken fusion (wrong rows, wrong halves) would
    leave almost no sequence equal."""
    from pycacheflow import LLM

    monkeypatch.setenv("CACHEFLOW_FUSE_PROJECTIONS", "0")
    meta, plain = _run(gpu_model, kv_mode="paged")
    monkeypatch.delenv("CACHEFLOW_FUSE_PROJECTIONS")
    _, fused = _run(gpu_model, meta["prompts"], kv_mode="paged")
    with LLM(model=str(gpu_model), n_gpu_layers=99, n_ctx=512) as llm:
        info = llm.info
    figures = {"fused_vs_unfused": _agreement(fused, plain), "fused_matrices": info.num_fused_projections}
    print("fused projections:", figures)
    _record(figures)
    assert info.num_fused_projections == 2 * info.n_layer
    assert figures["fused_vs_unfused"] >= 0.9


def test_add_rms_norm_on_the_gpu(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual add, RMS norm and norm weight in one kernel (patches/0020, bit 4 of CACHEFLOW_CUDA_GEMM, on by
    default): the 64 greedy requests with CACHEFLOW_CUDA_GEMM=7 against 3 (patch 0008's options alone). The
    sum of squares is reduced in another order than ggml's norm kernel, so a near tie may break the other way: the
    agreement is reported, and a wrong sum, weight or F16 copy would leave almost no sequence equal. This test does not
    show that the fusion engages (agreement 1.0 would also follow if it never did): the CUPTI timeline does, by kernel
    name (results/h200_gpu/stop45: 31 add_rms_norm calls per B=64 step in place of 31 of 32 adds and of 33 norms)."""
    monkeypatch.setenv("CACHEFLOW_CUDA_GEMM", "3")
    meta, plain = _run(gpu_model, kv_mode="paged")
    monkeypatch.setenv("CACHEFLOW_CUDA_GEMM", "7")
    _, fused = _run(gpu_model, meta["prompts"], kv_mode="paged")
    _, fused_stock_kv = _run(gpu_model, meta["prompts"], kv_mode="stock")
    figures = {"add_rms_norm_vs_unfused": _agreement(fused, plain),
               "add_rms_norm_paged_vs_stock_kv": _agreement(fused, fused_stock_kv)}
    print("add + rms norm:", figures)
    _record(figures)
    assert all(len(t) == N_OUT for t in fused)
    assert figures["add_rms_norm_vs_unfused"] >= 0.9


def test_f16_producers_on_the_gpu(gpu_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SWIGLU and paged attention also writing their result in F16 for the GEMM after them (patches/0021, bit 8 of
    CACHEFLOW_CUDA_GEMM): the 64 greedy requests with CACHEFLOW_CUDA_GEMM=15 against 7. Both kernels compute their F32
    result as before, bit for bit, and the F16 copy is that result rounded as ggml's conversion rounds it, so the
    down and output projections see the same inputs and every token must be equal. That the copies are read instead of
    converting shows in the CUPTI timeline (F32 -> F16 conversions per step, by kernel name), not here."""
    monkeypatch.setenv("CACHEFLOW_CUDA_GEMM", "7")
    meta, plain = _run(gpu_model, kv_mode="paged")
    monkeypatch.setenv("CACHEFLOW_CUDA_GEMM", "15")
    _, produced = _run(gpu_model, meta["prompts"], kv_mode="paged")
    figures = {"f16_producers_vs_7": _agreement(produced, plain)}
    print("f16 producers:", figures)
    _record(figures)
    assert all(len(t) == N_OUT for t in produced)
    assert produced == plain
