#!/usr/bin/env python3
"""`cacheflow serve` vs the in-process `LLM.generate` on the same requests (issue 12's CPU target).

Both run the default model with the same engine settings (-np/max_num_seqs = --streams, the
default n_ctx, default threads); the requests are --streams random token prompts of --prompt-len tokens,
each generating exactly --output-len tokens (ignore_eos, greedy). For each of --repeats rounds:

  generate:  LLM.generate(all requests) in this process; output tokens / wall seconds;
  serve:     `cacheflow serve` in a subprocess, loaded by `cacheflow bench serve`'s client with
             every request in flight at once (streamed /completion); output tokens / wall seconds
             from the first send to the last response.

Each side first runs one warm-up round of the same shape (as many requests, other random prompts,
so that the prefix cache finds nothing of the measured ones): both are measured warm, with the
batch shapes of the run already seen (CUDA graphs, cuBLAS and compute buffers), as a server is
after its first minutes.

Prints one JSON line per run and a summary with the medians and serve / generate; --out writes
them as JSON. Run it on a quiet machine (other processes take the same cores).

    python scripts/bench_serve_vs_generate.py --streams 32 --output-len 128 --out results/x.json

On a GPU (issue 12's H200 target, 1B shape, 128/128), --n-gpu-layers/--kv-mode/--batch-tokens go to
both sides (LLM(...) and serve's -ngl/--kv-mode/-b/-ub); the summary adds serve's TPOT p50 and the
engine's step time (generate's wall seconds / output tokens per request: one decode step per token).

    python scripts/bench_serve_vs_generate.py --model m.gguf --n-gpu-layers 99 --kv-mode paged \
        --streams 256 --prompt-len 128 --output-len 128 --batch-tokens 32768

--sampling llama-default samples both sides with llama-server's default parameters (temperature
0.8, top_k 40, top_p 0.95, min_p 0.05, random seed) instead of greedy (issue 15: the samplers
keep serving throughput within 5% of greedy).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cacheflow serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not become healthy in {timeout_s} s")


# llama-server's default sampling parameters (common/common.h of the pinned tree)
LLAMA_DEFAULT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def _engine_kwargs(args: argparse.Namespace) -> dict:
    kw: dict = {"n_gpu_layers": args.n_gpu_layers, "kv_mode": args.kv_mode}
    if args.batch_tokens:
        kw["max_num_batched_tokens"] = args.batch_tokens
    return kw


def _serve_flags(args: argparse.Namespace) -> list[str]:
    flags = ["-ngl", str(args.n_gpu_layers), "--kv-mode", args.kv_mode]
    if args.batch_tokens:
        flags += ["-b", str(args.batch_tokens), "-ub", str(args.batch_tokens)]
    return flags


def run_generate(
    model: str, requests: list, warmup: list, streams: int, args: argparse.Namespace
) -> dict:
    from pycacheflow import LLM, SamplingParams

    def generate(llm: LLM, reqs: list) -> list:
        prompts = [list(r.prompt_token_ids) for r in reqs]
        sampling = LLAMA_DEFAULT_SAMPLING if args.sampling == "llama-default" else {}
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, **sampling) for r in reqs]
        return llm.generate(prompts, params)

    with LLM(model, max_num_seqs=streams, **_engine_kwargs(args)) as llm:
        generate(llm, warmup)
        start = time.perf_counter()
        outs = generate(llm, requests)
        wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    step_ms = 1e3 * wall / max(r.max_tokens for r in requests)
    return {"mode": "generate", "output_tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "step_ms": step_ms}  # fmt: skip


def run_serve(
    model: str, requests: list, warmup: list, streams: int, args: argparse.Namespace
) -> dict:
    from pycacheflow.bench import online

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "cli", "serve", "-m", model, "-np", str(streams),
           "--host", "127.0.0.1", "--port", str(port)] + _serve_flags(args)  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_healthy(url, proc)
        sampling = LLAMA_DEFAULT_SAMPLING if args.sampling == "llama-default" else None
        online.run_load(url, warmup, max_concurrency=streams, sampling=sampling)
        run = online.run_load(url, requests, max_concurrency=streams, sampling=sampling)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    tokens = sum(m.num_output_tokens for m in run.metrics)
    tpots = [m.tpot_s for m in run.metrics if m.tpot_s is not None]
    ttfts = [m.ttft_s for m in run.metrics if m.ttft_s is not None]
    return {"mode": "serve", "output_tokens": tokens, "wall_s": run.wall_s,
            "tok_s": tokens / run.wall_s, "failed": len(run.errors),
            "tpot_p50_ms": 1e3 * statistics.median(tpots) if tpots else None,
            "ttft_p50_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
            "client_busy_s": run.client_busy_s}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=None, help="GGUF path (default: the default model)")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers on the GPU (CUDA builds)")
    ap.add_argument("--kv-mode", default="auto", choices=("auto", "paged", "stock", "stock-unified"))
    ap.add_argument("--batch-tokens", type=int, default=0, help="per-step token budget (0 = default)")
    ap.add_argument("--sampling", default="greedy", choices=("greedy", "llama-default"),
                    help="greedy, or llama-server's default sampling parameters on both sides")
    ap.add_argument("--out", default=None, help="write the runs and summary here (JSON)")
    args = ap.parse_args()
    from pycacheflow.bench.datasets import random_requests
    from pycacheflow.model_hub import ensure_default_model

    model = args.model or str(ensure_default_model())
    requests = random_requests(args.streams, args.prompt_len, args.output_len, n_vocab=49152)
    warmup = random_requests(args.streams, args.prompt_len, args.output_len, n_vocab=49152, seed=1)
    runs = []
    for _ in range(args.repeats):
        for fn in (run_generate, run_serve):
            runs.append(fn(model, requests, warmup, args.streams, args))
            print(json.dumps(runs[-1]), flush=True)
    med = {m: statistics.median(r["tok_s"] for r in runs if r["mode"] == m)
           for m in ("generate", "serve")}  # fmt: skip
    summary = {
        "streams": args.streams, "sampling": args.sampling, "prompt_len": args.prompt_len, "output_len": args.output_len,
        "generate_tok_s": med["generate"], "serve_tok_s": med["serve"],
        "serve_over_generate": med["serve"] / med["generate"],
        "engine_step_ms": statistics.median(r["step_ms"] for r in runs if r["mode"] == "generate"),
        "serve_tpot_p50_ms": statistics.median(
            r["tpot_p50_ms"] for r in runs if r["mode"] == "serve" and r["tpot_p50_ms"] is not None
        ) if any(r["mode"] == "serve" and r["tpot_p50_ms"] is not None for r in runs) else None,
        "load_avg_at_end": os.getloadavg()[0],
    }  # fmt: skip
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": runs, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
