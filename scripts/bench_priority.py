#!/usr/bin/env python3
"""Scheduling policies under saturation, same command: priority vs FCFS, and SJF vs FCFS.

1. priority: a burst of --num-low low-priority long requests (priority 10; --low-prompt prompt
   tokens, --low-tokens output tokens) at t = 0 saturates the engine (--max-num-seqs running,
   a KV pool of --n-ctx rows smaller than they want), then --num-urgent urgent short requests
   (priority 0; --urgent-prompt, --urgent-tokens) arrive one every --urgent-interval-ms.
   Figure: the urgent requests' TTFT (p50, p99, mean) under policy "priority" vs "fcfs"; both
   runs preempt by swap and see the same requests at the same times. The issue's target is
   urgent p99 TTFT at least 5x lower under "priority".
2. sjf: --num-mixed requests of mixed lengths (half short: --urgent-tokens output tokens, half
   long: --low-tokens; prompts of 16 to 64 tokens) submitted at once to an engine of
   --mixed-seqs sequences. Figure: mean TTFT over all requests under "sjf" vs "fcfs" (SJF:
   shortest predicted remaining work first, native/src/core/scheduler.h).
The defaults are small so that a run takes about a minute on a shared 2-core CPU.

TTFT = first token - request accepted (RequestMetrics.ttft_s). Outputs are greedy with EOS
ignored, so every request generates exactly its max_tokens. Prints a table and writes
OUT/priority_summary.json.

Usage: python scripts/bench_priority.py [-m MODEL] [-t THREADS] [-ngl N] [--out results/scheduler]
(-ngl 99: every layer on the GPU; scripts/h200_gpu_tests.sh's stage "priority" runs it so, with a
heavier workload so that the GPU saturates.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pycacheflow import LLM, SamplingParams  # noqa: E402
from pycacheflow.metrics import percentile  # noqa: E402

LOW_PRIORITY, URGENT_PRIORITY = 10, 0  # smaller = more urgent


def random_prompt(rng: random.Random, n: int) -> list[int]:
    """n random token ids from the lower vocabulary (ordinary text tokens of SmolLM2)."""
    return [rng.randrange(100, 20000) for _ in range(n)]


def run(llm: LLM, arrivals: list[tuple[float, list[int], int, int]]) -> tuple[list, float]:
    """Submit (t_s, prompt, max_tokens, priority) at t_s after the start; wait for all.

    Returns:
        (RequestOutputs in arrival order, wall seconds of the whole run).
    """
    outputs: list = [None] * len(arrivals)
    threads = []

    def collect(index: int, request_id: int) -> None:
        for delta in llm.iter_outputs(request_id):
            if delta.finished:
                outputs[index] = delta.output

    start = time.monotonic()
    for index, (t_s, prompt, max_tokens, priority) in enumerate(arrivals):
        delay = start + t_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        request_id = llm.add_request(prompt, params, priority=priority)
        thread = threading.Thread(target=collect, args=(index, request_id))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return outputs, time.monotonic() - start


def ttft_stats(outputs: list) -> dict[str, float]:
    """p50, p99, mean and max TTFT in ms of outputs."""
    ttft_ms = [o.metrics.ttft_s * 1e3 for o in outputs]
    return {
        "p50_ms": percentile(ttft_ms, 50), "p99_ms": percentile(ttft_ms, 99),
        "mean_ms": sum(ttft_ms) / len(ttft_ms), "max_ms": max(ttft_ms), "n": len(ttft_ms),
    }  # fmt: skip


def priority_workload(args: argparse.Namespace) -> list[tuple[float, list[int], int, int]]:
    rng = random.Random(args.seed)
    arrivals = [(0.0, random_prompt(rng, args.low_prompt), args.low_tokens, LOW_PRIORITY)
                for _ in range(args.num_low)]  # fmt: skip
    for i in range(args.num_urgent):
        t_s = args.urgent_start_ms / 1e3 + i * args.urgent_interval_ms / 1e3
        prompt = random_prompt(rng, args.urgent_prompt)
        arrivals.append((t_s, prompt, args.urgent_tokens, URGENT_PRIORITY))
    return arrivals


def mixed_workload(args: argparse.Namespace) -> list[tuple[float, list[int], int, int]]:
    rng = random.Random(args.seed + 1)
    arrivals = []
    for i in range(args.num_mixed):
        max_tokens = args.low_tokens if i % 2 == 0 else args.urgent_tokens
        arrivals.append((0.0, random_prompt(rng, rng.randrange(16, 65)), max_tokens, 0))
    return arrivals


def engine(args: argparse.Namespace, policy: str, max_num_seqs: int, n_ctx: int) -> LLM:
    return LLM(
        args.model, kv_mode="paged", policy=policy, preemption_mode="swap",
        max_num_seqs=max_num_seqs, n_ctx=n_ctx, n_threads=args.threads, max_num_batched_tokens=128,
        n_gpu_layers=args.n_gpu_layers,
    )  # fmt: skip


def bench_priority(args: argparse.Namespace) -> dict[str, object]:
    arrivals = priority_workload(args)
    rows = {}
    for policy in ("priority", "fcfs"):
        with engine(args, policy, max_num_seqs=args.max_num_seqs, n_ctx=args.n_ctx) as llm:
            outputs, wall_s = run(llm, arrivals)
            stats = llm.stats()
        assert all(len(o.token_ids) == a[2] for o, a in zip(outputs, arrivals))
        urgent = [o for o, a in zip(outputs, arrivals) if a[3] == URGENT_PRIORITY]
        low = [o for o, a in zip(outputs, arrivals) if a[3] == LOW_PRIORITY]
        rows[policy] = {
            "urgent_ttft": ttft_stats(urgent), "low_ttft": ttft_stats(low), "wall_s": wall_s,
            "preemptions": stats.num_preemptions,
            "preemptions_priority": stats.num_preemptions_priority,
            "engine_ttft_by_priority": [e._asdict() for e in stats.ttft_by_priority],
            "swap": {k: getattr(stats, k) for k in (
                "num_preemptions_swap", "swap_out_bytes", "swap_out_ns", "swap_in_ns", "swap_on_copy_stream",
                "num_swapped_in", "num_resumed", "num_deferred_seq_steps", "num_swaps_overlapped",
                "swap_overlapped_ns", "num_graphs_beside_copies")},
        }  # fmt: skip
    p99 = rows["fcfs"]["urgent_ttft"]["p99_ms"] / rows["priority"]["urgent_ttft"]["p99_ms"]
    return {"runs": rows, "urgent_p99_ttft_fcfs_over_priority": p99}


def bench_sjf(args: argparse.Namespace) -> dict[str, object]:
    arrivals = mixed_workload(args)
    rows = {}
    for policy in ("sjf", "fcfs"):
        with engine(args, policy, max_num_seqs=args.mixed_seqs, n_ctx=args.mixed_seqs * 256) as llm:
            outputs, wall_s = run(llm, arrivals)
        assert all(len(o.token_ids) == a[2] for o, a in zip(outputs, arrivals))
        rows[policy] = {"ttft": ttft_stats(outputs), "wall_s": wall_s}
    ratio = rows["fcfs"]["ttft"]["mean_ms"] / rows["sjf"]["ttft"]["mean_ms"]
    return {"runs": rows, "mean_ttft_fcfs_over_sjf": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-m", "--model", help="GGUF model (default: the default model)")
    parser.add_argument("-t", "--threads", type=int, default=1,
                        help="CPU threads; 0 = one per physical core (1: the least contention on a shared CPU)")
    parser.add_argument("--num-low", type=int, default=8)
    parser.add_argument("--low-prompt", type=int, default=32)
    parser.add_argument("--low-tokens", type=int, default=48)
    parser.add_argument("--num-urgent", type=int, default=8)
    parser.add_argument("--urgent-prompt", type=int, default=16)
    parser.add_argument("--urgent-tokens", type=int, default=4)
    parser.add_argument("--urgent-start-ms", type=float, default=300.0)
    parser.add_argument("--urgent-interval-ms", type=float, default=300.0)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--n-ctx", type=int, default=256, help="KV rows (16-token blocks)")
    parser.add_argument("--num-mixed", type=int, default=12)
    parser.add_argument("--mixed-seqs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=0,
                        help="layers on the GPU (CUDA build; 99 = all)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "scheduler")
    args = parser.parse_args()
    if args.model is None:
        from pycacheflow.model_hub import ensure_default_model

        args.model = str(ensure_default_model(progress=False))

    load_before = os.getloadavg()
    summary = {
        "command": " ".join(["python", *sys.argv]), "model": os.path.basename(args.model),
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "loadavg_before": load_before, "args": {k: str(v) for k, v in vars(args).items()},
        "priority": bench_priority(args), "sjf": bench_sjf(args), "loadavg_after": os.getloadavg(),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "priority_summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    pr, sj = summary["priority"]["runs"], summary["sjf"]["runs"]
    print("urgent TTFT (ms)       p50       p99      mean   | low mean  wall s  preempt (prio)")
    for policy, r in pr.items():
        u, lo = r["urgent_ttft"], r["low_ttft"]
        print(f"  {policy:9s}  {u['p50_ms']:9.1f} {u['p99_ms']:9.1f} {u['mean_ms']:9.1f}   |"
              f" {lo['mean_ms']:8.1f} {r['wall_s']:7.1f}  {r['preemptions']}"
              f" ({r['preemptions_priority']})")
    ratio = summary["priority"]["urgent_p99_ttft_fcfs_over_priority"]
    print(f"urgent p99 TTFT fcfs / priority: {ratio:.1f}x")
    print("mixed lengths TTFT (ms)   mean      p50      p99   wall s")
    for policy, r in sj.items():
        t = r["ttft"]
        print(f"  {policy:9s}  {t['mean_ms']:9.1f} {t['p50_ms']:8.1f} {t['p99_ms']:8.1f}"
              f" {r['wall_s']:7.1f}")
    print(f"mean TTFT fcfs / sjf: {summary['sjf']['mean_ttft_fcfs_over_sjf']:.2f}x")
    print(f"wrote {args.out / 'priority_summary.json'}")


if __name__ == "__main__":
    main()
