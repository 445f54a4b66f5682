#!/usr/bin/env python3
"""Where a GPU decode step's time goes: the engine alone on one decode workload, for nsys.

Runs `--npl` requests of `--npp` random prompt tokens and `--ntg` output tokens (EOS ignored) once as
a warm-up and once measured, and prints the decode step time (ms) and tokens/s of the measured run.
Run it under `nsys profile -t cuda` and read `nsys stats` (kernel and CUDA API summaries): the API
summary counts cudaGraphLaunch (replayed steps) against cudaStreamBeginCapture / cudaGraphInstantiate
(captures), and the kernel summary shows which kernels fill the step. `scripts/h200_gpu_tests.sh`
(stage `profile`) does both.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import time

from pycacheflow import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="GGUF path")
    ap.add_argument("--npp", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--ntg", type=int, default=128, help="output tokens per request")
    ap.add_argument("--npl", type=int, default=256, help="concurrent requests")
    ap.add_argument("--kv-mode", default="paged")
    ap.add_argument("-ngl", "--n-gpu-layers", dest="ngl", type=int, default=99)
    ap.add_argument("--sampling", choices=("greedy", "llama-default"), default="greedy",
                    help="llama-default: llama-server's defaults (temperature 0.8, top_k 40, top_p 0.95,"
                         " min_p 0.05, random seed)")
    ap.add_argument("--sampling-threads", type=int, default=0,
                    help="EngineConfig.sampling_threads (top-k candidate rows); 0 = the engine's default")
    args = ap.parse_args()

    # all prompts in the first step: every decode step then holds npl sequences
    llm = LLM(args.model, max_num_seqs=args.npl, max_num_batched_tokens=min(32768, max(512, args.npl * args.npp)),
              kv_mode=args.kv_mode,
              n_gpu_layers=args.ngl, n_ctx=args.npl * (args.npp + args.ntg + 16),
              sampling_threads=args.sampling_threads)
    rng = random.Random(0)
    n_vocab = llm.info.n_vocab
    params = SamplingParams(max_tokens=args.ntg, ignore_eos=True)
    if args.sampling == "llama-default":
        params = SamplingParams(max_tokens=args.ntg, ignore_eos=True, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    for label in ("warm-up", "measured"):
        prompts = [[rng.randrange(100, n_vocab) for _ in range(args.npp)] for _ in range(args.npl)]
        before = llm.stats()
        start = time.monotonic()
        outs = llm.generate(prompts, params)
        wall = time.monotonic() - start
        after = llm.stats()
        n_steps = max(1, after.num_steps - before.num_steps)
        per_step = {name: (getattr(after, name) - getattr(before, name)) / n_steps / 1e6
                    for name in ("prepare_ns", "launch_ns", "decode_ns", "sample_ns", "step_ns")}
        rest = per_step["step_ns"] - per_step["prepare_ns"] - per_step["decode_ns"] - per_step["sample_ns"]
        phases = (f"per step on average: prepare {per_step['prepare_ns']:.3f} + llama_decode "
                  f"{per_step['launch_ns']:.3f} + device wait {per_step['decode_ns'] - per_step['launch_ns']:.3f}"
                  f" + sample {per_step['sample_ns']:.3f} + the rest {rest:.3f} = step "
                  f"{per_step['step_ns']:.3f} ms; CUDA graph "
                  f"evaluations captured / replayed / direct "
                  f"{after.cuda_graphs_captured - before.cuda_graphs_captured} / "
                  f"{after.cuda_graphs_replayed - before.cuda_graphs_replayed} / "
                  f"{after.cuda_graphs_direct - before.cuda_graphs_direct}; llama graphs reused "
                  f"{after.num_llama_graphs_reused - before.num_llama_graphs_reused} of "
                  f"{after.num_llama_decodes - before.num_llama_decodes} decodes; padding tokens "
                  f"{after.num_padding_tokens - before.num_padding_tokens})")
        tg_start = max(o.metrics.first_token_time_s for o in outs)
        tg_end = max(o.metrics.finish_time_s for o in outs)
        steps = args.ntg - 1
        print(f"{label}: B={args.npl} {args.kv_mode} {args.sampling}: decode {(tg_end - tg_start) / steps * 1e3:.3f} ms/step, "
              f"{args.npl * steps / (tg_end - tg_start):.0f} tok/s (wall {wall:.2f} s; {phases})", flush=True)
    # under native/bench/cupti_kernel_trace.cpp (LD_PRELOAD): write its trace while the CUDA context still lives
    flush_trace = getattr(ctypes.CDLL(None), "cf_cupti_flush", None)
    if flush_trace is not None:
        flush_trace()
    llm.close()


if __name__ == "__main__":
    main()
