#!/usr/bin/env python3
"""Decode throughput of CacheFlow vs llama-batched-bench, side by side in one run.

Workload (BENCHMARKS.md "Fixed"): npl concurrent requests of npp random prompt tokens and ntg
output tokens each (EOS ignored). llama-batched-bench is built from the same pinned tree in the
persistent build folder (`cmake --build build/<tag> --target llama-batched-bench`) and run with
`-npp NPP -ntg NTG -npl NPL -c CTX -b 2048 -ub 512` (default split KV); its S_TG (decode tokens/s)
is the baseline (build and run helpers: pycacheflow/bench/baselines.py).

CacheFlow's decode throughput is measured the same way batched-bench measures S_TG: from the
moment every request has its first token (prefill done) until the last token, counting the
tokens produced in that window. Iterations alternate between the two tools; medians and the
ratio are printed and written to OUT/decode_results.csv and OUT/decode_summary.json. Per CacheFlow
iteration the summary also has its engine steps, its decodes launched ahead and adopted (async
decode, CACHEFLOW_ASYNC_DECODE) and a digest of its greedy tokens: iteration i's prompts depend on
i only, so two runs with different settings must show the same digests.

Usage: python scripts/bench_decode.py [-m MODEL] [--npp 128 --ntg 64 --npl 16] [-i 3] [-t N]
"""

from __future__ import annotations

import argparse
import array
import csv
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tokens_after(metrics, t0: float) -> int:
    """Output tokens of one request sampled after time t0 (engine clock, seconds)."""
    t = metrics.first_token_time_s
    count = 0
    for itl in metrics.itl_s:
        t += itl
        count += t > t0
    return count


def run_cacheflow(llm, args: argparse.Namespace, seed: int) -> dict:
    """Run one iteration of the workload on CacheFlow; return decode/total throughput."""
    from pycacheflow import SamplingParams

    rng = random.Random(seed)
    n_vocab = llm.info.n_vocab
    prompts = [[rng.randrange(100, n_vocab) for _ in range(args.npp)] for _ in range(args.npl)]
    params = SamplingParams(max_tokens=args.ntg, ignore_eos=True)
    before = llm.stats()
    start = time.monotonic()
    outs = llm.generate(prompts, params)
    wall = time.monotonic() - start
    after = llm.stats()
    # The greedy tokens, for comparing runs of one seed across settings (async decode must not change them).
    digest = hashlib.sha256()
    for o in outs:
        digest.update(array.array("i", o.token_ids).tobytes())
    tg_start = max(o.metrics.first_token_time_s for o in outs)
    tg_end = max(o.metrics.finish_time_s for o in outs)
    arrival = min(o.metrics.arrival_time_s for o in outs)
    # Decode window: from the last request's first token (every prompt prefilled) to the last token.
    # Count only the tokens sampled inside it (token times from first_token_time_s + the ITLs): with
    # chunked prefill, early requests decode while later prompts are still being prefilled, and
    # counting those tokens would overstate the decode rate (batched-bench prefills all first).
    tokens_after = sum(_tokens_after(o.metrics, tg_start) for o in outs)
    assert all(o.metrics.num_output_tokens == args.ntg for o in outs), "wrong output lengths"
    return {
        "speed_tg": tokens_after / (tg_end - tg_start),
        "t_tg": tg_end - tg_start,
        "t_pp": tg_start - arrival,
        "speed": args.npl * (args.npp + args.ntg) / (tg_end - arrival),
        "wall_s": wall,
        "steps": after.num_steps - before.num_steps,
        "lookahead_decodes": after.num_lookahead_decodes - before.num_lookahead_decodes,
        "lookahead_adopted": after.num_lookahead_adopted - before.num_lookahead_adopted,
        "tokens_sha256": digest.hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=None, help="GGUF path (default model if unset)")
    parser.add_argument("--npp", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--ntg", type=int, default=64, help="output tokens per request")
    parser.add_argument("--npl", type=int, default=16, help="concurrent requests")
    parser.add_argument("-i", "--iterations", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--kv-mode", default="stock", help="CacheFlow kv_mode")
    parser.add_argument("-ngl", "--n-gpu-layers", dest="ngl", type=int, default=0,
                        help="layers offloaded to the GPU (both tools)")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args()

    from pycacheflow import LLM
    from pycacheflow.bench import baselines
    from pycacheflow.model_hub import ensure_default_model

    args.model = str(args.model or ensure_default_model())
    args.ctx = args.npl * (args.npp + args.ntg)
    try:
        exe = baselines.build_tool(baselines.find_build_dir(ROOT), "llama-batched-bench")
    except baselines.BaselineError as exc:
        sys.exit(str(exc))
    # Every prompt is prefilled in the first step, as batched-bench prefills all prompts before its
    # first decode; the decode steps then all hold npl sequences.
    llm = LLM(args.model, n_ctx=args.ctx, max_num_seqs=args.npl,
              max_num_batched_tokens=min(32768, max(512, args.npl * args.npp)),
              n_threads=args.threads, kv_mode=args.kv_mode, n_gpu_layers=args.ngl)
    run_cacheflow(llm, args, seed=1234)  # warm-up (page in weights, build graphs)

    # llama.cpp contexts hold at most 256 sequences (LLAMA_MAX_SEQ): past that, CacheFlow runs alone.
    with_baseline = args.npl <= 256
    rows = []
    checks = []  # per iteration: steps, decodes launched ahead and adopted, digest of the greedy tokens
    for it in range(args.iterations):
        if with_baseline:
            b = baselines.run_batched_bench(exe, args.model, args.npp, args.ntg, args.npl,
                                            args.threads, args.ctx)
            base = {"speed_tg": b.speed_tg, "t_tg": b.t_tg_s, "t_pp": b.t_pp_s, "speed": b.speed}
            rows.append({"iteration": it, "engine": "llama-batched-bench", **{
                k: base[k] for k in ("speed_tg", "t_tg", "t_pp", "speed")}})
        else:
            base = {"speed_tg": float("nan")}
        ours = run_cacheflow(llm, args, seed=it)
        rows.append({"iteration": it, "engine": f"cacheflow-{args.kv_mode}", **{
            k: ours[k] for k in ("speed_tg", "t_tg", "t_pp", "speed")}})
        checks.append({k: ours[k] for k in ("steps", "lookahead_decodes", "lookahead_adopted", "tokens_sha256")})
        print(f"iter {it}: batched-bench S_TG {base['speed_tg']:.1f} t/s, "
              f"cacheflow {ours['speed_tg']:.1f} t/s; {ours['steps']} steps, "
              f"{ours['lookahead_adopted']}/{ours['lookahead_decodes']} launched ahead adopted, "
              f"tokens {ours['tokens_sha256']}", file=sys.stderr)
    llm.close()

    def med(engine: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["engine"] == engine)

    ours_name = f"cacheflow-{args.kv_mode}"
    summary = {
        "workload": {"npp": args.npp, "ntg": args.ntg, "npl": args.npl, "ctx": args.ctx,
                     "n_gpu_layers": args.ngl, "kv_mode": args.kv_mode,
                     "iterations": args.iterations, "threads": args.threads},
        "model": args.model,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "baseline_speed_tg_median": med("llama-batched-bench", "speed_tg") if with_baseline else None,
        "cacheflow_speed_tg_median": med(ours_name, "speed_tg"),
        "cacheflow_iterations": checks,
    }
    summary["ratio_tg"] = (summary["cacheflow_speed_tg_median"] / summary["baseline_speed_tg_median"]
                           if with_baseline else None)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "decode_results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (args.out / "decode_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
