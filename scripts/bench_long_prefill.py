#!/usr/bin/env python3
"""Head-of-line prefill, same command: short prompts arriving behind long ones, long-prefill rule on vs off.

Workload (the same requests at the same times in each run): --num-long long prompts (--long-prompt
tokens, --long-tokens output tokens) at t = 0, then --num-short short ones (--short-prompt tokens,
--short-tokens output tokens), one every --short-interval-ms from --short-start-ms. Runs:
long_prefill_token_threshold = 0 (off: every chunk as large as the step budget allows, in order),
-1 (the default: half the budget) and any given with --thresholds. Figures: the short requests'
TTFT (p50, p99, mean), the long requests' TTFT (mean), and the run's output throughput; and
whether each request's greedy tokens equal those of the first run (the rule changes no token).

TTFT = first token - request accepted (RequestMetrics.ttft_s). Greedy, EOS ignored, so every request
generates exactly its max_tokens. Prints a table and writes OUT/long_prefill_summary.json.

Usage: python scripts/bench_long_prefill.py [-m MODEL] [-t THREADS] [-ngl N] [--out results/scheduler]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "scripts"))

from bench_priority import random_prompt, run  # noqa: E402  (the same submit-at-times loop)
from pycacheflow import LLM  # noqa: E402
from pycacheflow.metrics import percentile  # noqa: E402


def workload(args: argparse.Namespace) -> list[tuple[float, list[int], int, bool]]:
    """(t_s, prompt, max_tokens, is_short) in arrival order."""
    rng = random.Random(args.seed)
    arrivals = [(0.0, random_prompt(rng, args.long_prompt), args.long_tokens, False)
                for _ in range(args.num_long)]  # fmt: skip
    for i in range(args.num_short):
        t_s = (args.short_start_ms + i * args.short_interval_ms) / 1e3
        arrivals.append((t_s, random_prompt(rng, args.short_prompt), args.short_tokens, True))
    return arrivals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=None, help="GGUF (default: the default model)")
    parser.add_argument("-t", "--threads", type=int, default=0)
    parser.add_argument("-ngl", "--gpu-layers", type=int, default=0)
    parser.add_argument("--batch-tokens", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--n-ctx", type=int, default=16384)
    parser.add_argument("--num-long", type=int, default=2)
    parser.add_argument("--long-prompt", type=int, default=3000)
    parser.add_argument("--long-tokens", type=int, default=8)
    parser.add_argument("--num-short", type=int, default=8)
    parser.add_argument("--short-prompt", type=int, default=32)
    parser.add_argument("--short-tokens", type=int, default=8)
    parser.add_argument("--short-start-ms", type=float, default=50.0)
    parser.add_argument("--short-interval-ms", type=float, default=100.0)
    parser.add_argument("--thresholds", type=int, nargs="*", default=[0, -1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "scheduler")
    args = parser.parse_args()

    model = args.model
    if model is None:
        from pycacheflow.model_hub import ensure_default_model

        model = str(ensure_default_model(progress=False))
    arrivals = workload(args)
    rows = []
    first_tokens = None
    for threshold in args.thresholds:
        llm = LLM(model, max_num_seqs=args.max_num_seqs, n_ctx=args.n_ctx, n_threads=args.threads,
                  n_gpu_layers=args.gpu_layers, max_num_batched_tokens=args.batch_tokens,
                  long_prefill_token_threshold=threshold)
        try:
            warm_rng = random.Random(args.seed + 1)  # other tokens: the prefix cache cannot help the run
            run(llm, [(0.0, random_prompt(warm_rng, args.long_prompt), 2, 0)])  # warm-up
            outputs, wall_s = run(llm, [(t_s, prompt, n, 0) for t_s, prompt, n, _ in arrivals])  # priority 0
        finally:
            llm.close()
        tokens = [o.token_ids for o in outputs]
        first_tokens = first_tokens or tokens
        short_ms = [o.metrics.ttft_s * 1e3 for o, a in zip(outputs, arrivals) if a[3]]
        long_ms = [o.metrics.ttft_s * 1e3 for o, a in zip(outputs, arrivals) if not a[3]]
        rows.append({
            "long_prefill_token_threshold": threshold,
            "short_ttft_p50_ms": percentile(short_ms, 50), "short_ttft_p99_ms": percentile(short_ms, 99),
            "short_ttft_mean_ms": sum(short_ms) / len(short_ms),
            "long_ttft_mean_ms": sum(long_ms) / len(long_ms),
            "output_tok_s": sum(len(t) for t in tokens) / wall_s, "wall_s": wall_s,
            "greedy_equal_to_first_run": sum(a == b for a, b in zip(tokens, first_tokens)) / len(tokens),
        })  # fmt: skip
    print("| threshold | short TTFT p50 / p99 / mean ms | long TTFT mean ms | output tok/s | greedy = first run |")
    print("|---|---|---|---|---|")
    for r in rows:
        t = r["long_prefill_token_threshold"]
        name = "off (0)" if t == 0 else f"auto ({args.batch_tokens // 2})" if t == -1 else str(t)
        print(f"| {name} | {r['short_ttft_p50_ms']:.0f} / {r['short_ttft_p99_ms']:.0f} / "
              f"{r['short_ttft_mean_ms']:.0f} | {r['long_ttft_mean_ms']:.0f} | {r['output_tok_s']:.1f} | "
              f"{r['greedy_equal_to_first_run']:.3f} |")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": model, "rows": rows,
        "env": {"cpus": os.cpu_count(), "load_avg": list(os.getloadavg()), "python": platform.python_version()},
    }  # fmt: skip
    (args.out / "long_prefill_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
