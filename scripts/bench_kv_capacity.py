#!/usr/bin/env python3
"""Sequences run at once under one KV memory budget: paged mode vs stock split, same command.

Every engine gets the same KV memory (--kv-cache-memory, EngineConfig.kv_cache_bytes) and the
same mixed-length workload (ShareGPT prompts with their reply lengths as output budgets, EOS
ignored; or random mixed lengths), submitted all at once. Rows (pycacheflow/bench/capacity.py):

  stock xK   stock split with the most slots that never fail: each slice holds the longest
             request (budget rows / longest, in 256-row steps);
  stock x2K  stock split with twice the slots: slices too short for the long requests, which are
             rejected or cut (the failures a user would see);
  paged      paged mode with --paged-seqs slots: one shared pool, admission by free blocks,
             preemption by recompute when blocks run out.

Printed and written to OUT/kv_capacity_results.csv and OUT/kv_capacity_summary.json: requests
completed/failed, mean and peak sequences per step, KV utilization (tokens stored / rows
allocated), pool usage, preemptions, output tokens/s, and the ratio of paged's mean concurrency
to stock's.

Usage: python scripts/bench_kv_capacity.py [-m MODEL] [--kv-cache-memory 216MiB] [-n 48]
       [--dataset sharegpt|random] [--paged-seqs 64] [-t THREADS] [--out results/kv_capacity]
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_size(text: str) -> int:
    """Bytes of '216MiB', '1GiB', '512M' or a plain integer (the CLI's --kv-cache-memory)."""
    from cli.common import ByteSize

    return ByteSize().convert(text, None, None)


def workload(args: argparse.Namespace, tokenizer) -> list:
    from pycacheflow.bench import datasets

    if args.dataset == "sharegpt":
        return datasets.sharegpt_requests(args.num_requests, tokenizer.tokenize, args.seed)
    rng = random.Random(args.seed)
    n_vocab = tokenizer.info.n_vocab
    return [
        datasets.BenchRequest(
            tuple(rng.randrange(100, n_vocab) for _ in range(rng.randint(16, 1024))),
            rng.randint(16, 512),
        )
        for _ in range(args.num_requests)
    ]


def run_row(args: argparse.Namespace, label: str, kv_mode: str, max_num_seqs: int, reqs: list):
    from tqdm import tqdm

    from pycacheflow.bench.capacity import run_capacity
    from pycacheflow.llm import LLM
    from pycacheflow.profiler import DEFAULT_PROFILE_CAPACITY

    with (
        LLM(
            args.model,
            kv_mode=kv_mode,
            max_num_seqs=max_num_seqs,
            kv_cache_bytes=args.kv_cache_bytes,
            n_threads=args.threads,
            max_num_batched_tokens=args.batch_tokens,
            profile_capacity=DEFAULT_PROFILE_CAPACITY,
        ) as llm,
        tqdm(total=len(reqs), desc=label, unit="req", file=sys.stderr) as bar,
    ):
        return run_capacity(label, llm, reqs, on_finish=lambda: bar.update(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF model (default: the default model)")
    ap.add_argument("--kv-cache-memory", default="216MiB", help="KV budget of every engine")
    ap.add_argument("-n", "--num-requests", type=int, default=48)
    ap.add_argument("--dataset", choices=("sharegpt", "random"), default="sharegpt")
    ap.add_argument("--paged-seqs", type=int, default=64, help="max_num_seqs of the paged engine")
    ap.add_argument("-t", "--threads", type=int, default=0, help="0 = one per physical core")
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "kv_capacity")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))

    from pycacheflow.bench.capacity import stock_split_safe_seqs
    from pycacheflow.llm import LLM

    if args.model is None:
        from pycacheflow.model_hub import ensure_default_model

        args.model = str(ensure_default_model(progress=True))
    args.kv_cache_bytes = parse_size(args.kv_cache_memory)
    with LLM(args.model, max_num_seqs=1, n_ctx=256, n_threads=1) as tok:
        info = tok.info
        try:
            reqs = workload(args, tok)
        except RuntimeError as exc:  # the ShareGPT package is missing: say how to get it
            sys.exit(f"bench_kv_capacity: {exc} (or use --dataset random)")
    token_bytes = info.kv_bytes_per_token
    longest = max(r.num_prompt_tokens + r.max_tokens for r in reqs)
    safe = stock_split_safe_seqs(args.kv_cache_bytes, token_bytes, longest)
    if safe < 1:
        sys.exit(f"--kv-cache-memory {args.kv_cache_memory} holds no slice of {longest + 1} tokens")
    print(
        f"budget {args.kv_cache_bytes / 2**20:.0f} MiB = {args.kv_cache_bytes // token_bytes} KV rows "
        f"of {token_bytes} B; {len(reqs)} {args.dataset} requests, prompt+output "
        f"{min(r.num_prompt_tokens + r.max_tokens for r in reqs)}..{longest} tokens "
        f"(mean {sum(r.num_prompt_tokens + r.max_tokens for r in reqs) / len(reqs):.0f}); "
        f"stock split holds at most {safe} slices of the longest",
        file=sys.stderr,
    )
    rows = [
        run_row(args, f"stock x{safe}", "stock", safe, reqs),
        run_row(args, f"stock x{2 * safe}", "stock", 2 * safe, reqs),
        run_row(args, "paged", "paged", args.paged_seqs, reqs),
    ]
    write(args, rows, info, token_bytes, longest, safe)


def write(args, rows, info, token_bytes: int, longest: int, safe: int) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    table = [r.row() for r in rows]
    with open(args.out / "kv_capacity_results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    stock, paged = rows[0], rows[-1]
    ratio = paged.mean_running / stock.mean_running if stock.mean_running else 0.0
    summary = {
        "command": "python " + " ".join(sys.argv),
        "commit": subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "model": Path(args.model).name,
        "kv_cache_bytes": args.kv_cache_bytes,
        "kv_bytes_per_token": token_bytes,
        "dataset": args.dataset,
        "num_requests": rows[0].num_requests,
        "longest_request_tokens": longest,
        "stock_split_safe_seqs": safe,
        "mean_running_ratio_paged_vs_stock": ratio,
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "rows": table,
    }
    (args.out / "kv_capacity_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    head = (
        f"{'engine':<11} {'slots':>5} {'KV rows':>7} {'MiB':>5} {'done':>4} {'fail':>4} "
        f"{'mean run':>8} {'peak':>4} {'KV util':>7} {'pool':>5} {'preempt':>7} {'out tok/s':>9}"
    )
    print(head)
    for r in rows:
        print(
            f"{r.label:<11} {r.max_num_seqs:>5} {r.n_ctx:>7} {r.kv_bytes / 2**20:>5.0f} "
            f"{r.num_completed:>4} {r.num_failed:>4} {r.mean_running:>8.2f} {r.peak_running:>4} "
            f"{r.kv_utilization:>7.1%} {r.pool_usage:>5.1%} {r.num_preemptions:>7} "
            f"{r.output_tok_s:>9.1f}"
        )
    print(
        f"paged runs {ratio:.2f}x the sequences at once of stock split without failures "
        f"({paged.num_failed} paged failures, KV utilization {paged.kv_utilization:.1%})"
    )


if __name__ == "__main__":
    main()
