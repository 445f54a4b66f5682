#!/usr/bin/env python3
"""Long contexts: KV streaming vs all KV on the device vs preemption (recompute, swap), same command.

Issue 16's long-context workload. Each case is PROMPTxBATCH: BATCH requests of PROMPT distinct random
tokens and --output-len output tokens (EOS ignored), submitted at once to one engine. Modes:

  device      streaming off, a pool that holds every request whole (the baseline where it fits)
  stream-fit  streaming on with the same roomy pool: nothing needs to move, so this is the cost of having
              it on (the layer-ahead hooks in every decode)
  stream      streaming on with a pool of --budget of the requests' total KV (default a quarter): middle
              blocks live in host slots and are staged back per layer each decode
  recompute   the same small pool, streaming off, preemption by recompute
  swap        the same small pool, streaming off, preemption by swap to host memory

A mode that cannot serve a case says why instead of a figure (a prompt longer than the small pool can
hold is refused with PromptTooLongError unless streaming is on; a pool that does not fit the device
fails its allocation). Per row: output tokens/s over the whole run, TTFT p50/max, TPOT p50 (decode
time per output token of one request), decode tokens/s of the batch (BATCH / TPOT p50), and the
streaming counters: blocks demoted/promoted, bytes staged and the staging copies' device time, i.e. the
host-to-device rate achieved (compare it with a pinned cudaMemcpy in the same run:
native/tests/cuda/test_kv_stream_cuda.cu --bench prints one). Rows are printed and appended to --out
(JSON) as they finish, so a run cut short keeps what it measured.

    python scripts/bench_kv_streaming.py -m llama-8b-shape-f16.gguf -ngl 99 --cases 32768x1 32768x4 \
        --modes device stream-fit stream recompute swap --output-len 32
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

MODES = ("device", "stream-fit", "stream", "recompute", "swap")
BLOCK = 16  # tokens per KV block (the engine's block size)


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def engine_config(mode: str, prompt_len: int, batch: int, output_len: int, budget: float,
                  kv_bytes_per_token: int, depth: int) -> dict:
    """LLM keyword arguments of one mode for one case (see the module docstring)."""
    per_request = round_up(prompt_len + output_len + 1, BLOCK)
    roomy = round_up(batch * per_request + BLOCK, 256)
    small = round_up(max(1, int(budget * batch * per_request)), 256)  # up: a quarter of 4 holds one whole
    host_bytes = batch * per_request * kv_bytes_per_token
    config = {"kv_mode": "paged", "max_num_seqs": batch, "enable_prefix_caching": False}
    if mode in ("device", "stream-fit"):
        config |= {"n_ctx": roomy, "kv_streaming": "off" if mode == "device" else "on"}
        if mode == "stream-fit":
            config |= {"kv_stream_blocks": 64, "kv_stream_depth": depth, "swap_space_bytes": 64 * BLOCK *
                       kv_bytes_per_token + (1 << 20)}
        return config
    config["n_ctx"] = small
    if mode == "stream":
        # R: every block the small pool cannot hold, with a little room (the pool's watermark)
        staged = (batch * per_request - small) // BLOCK + 64
        return config | {"kv_streaming": "on", "kv_stream_blocks": min(staged, 65536), "kv_stream_depth": depth,
                         "preemption_mode": "swap", "swap_space_bytes": (staged + 64) * BLOCK * kv_bytes_per_token}
    return config | {"kv_streaming": "off", "preemption_mode": mode, "swap_space_bytes": host_bytes + (1 << 20)}


def run_case(model: str, mode: str, prompts: list[list[int]], output_len: int, config: dict, ngl: int,
             batch_tokens: int) -> dict:
    row = {"mode": mode, "prompt_len": len(prompts[0]), "batch": len(prompts), "output_len": output_len,
           "pool_tokens": config["n_ctx"]}
    start = time.monotonic()
    try:
        llm = LLM(model, n_gpu_layers=ngl, max_num_batched_tokens=batch_tokens, **config)
    except Exception as exc:  # a pool that does not fit the device, a bad combination: reported, not a figure
        return row | {"error": f"{type(exc).__name__}: {exc}"}
    row["load_s"] = time.monotonic() - start
    try:
        start = time.monotonic()
        outs = llm.generate(prompts, SamplingParams(max_tokens=output_len, ignore_eos=True))
        wall = time.monotonic() - start
        s = llm.stats()
    except Exception as exc:
        llm.close()
        return row | {"error": f"{type(exc).__name__}: {exc}"}
    llm.close()
    lengths = [len(o.token_ids) for o in outs]
    ttft = [o.metrics.ttft_s for o in outs]
    tpot = [o.metrics.tpot_s for o in outs if o.metrics.tpot_s is not None]
    tpot_p50 = statistics.median(tpot) if tpot else None
    return row | {
        "token_ids": [list(o.token_ids) for o in outs],
        "output_tokens": lengths,
        "wall_s": wall,
        "output_tok_s": sum(lengths) / wall,
        "ttft_p50_s": statistics.median(ttft),
        "ttft_max_s": max(ttft),
        "tpot_p50_ms": tpot_p50 * 1e3 if tpot_p50 else None,
        "decode_tok_s": len(prompts) / tpot_p50 if tpot_p50 else None,
        "preemptions_swap": s.num_preemptions_swap,
        "preemptions_recompute": s.num_preemptions_recompute,
        "recomputed_tokens": s.num_recomputed_tokens,
        "kv_streaming": s.kv_streaming,
        "demotions": s.kv_stream_demotions,
        "promotions": s.kv_stream_promotions,
        "staged_blocks": s.kv_staged_blocks,
        "staged_GB": s.kv_staged_bytes / 1e9,
        "staging_decodes": s.kv_staging_decodes,
        "staging_copy_s": s.kv_stream_cuda_copy_ns / 1e9 if s.kv_stream_cuda_copy_ns > 0 else None,
        "staging_GBps_device": s.kv_staged_bytes / s.kv_stream_cuda_copy_ns if s.kv_stream_cuda_copy_ns > 0 else None,
        "staging_wait_layers": s.kv_stream_cuda_wait_layers,
        # how ggml-cuda ran the decodes (patches/0009): a streaming run that launches eagerly pays the launches
        "cuda_graphs": [s.cuda_graphs_captured, s.cuda_graphs_replayed, s.cuda_graphs_direct],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="GGUF path")
    ap.add_argument("--cases", nargs="+", default=["32768x1", "32768x4"], help="PROMPTxBATCH, e.g. 65536x2")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("-o", "--output-len", type=int, default=32)
    ap.add_argument("--budget", type=float, default=0.25,
                    help="small pool (stream, recompute, swap) as a share of the case's total KV")
    ap.add_argument("--depth", type=int, default=2, help="kv_stream_depth")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    ap.add_argument("--batch-tokens", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/kv_streaming/long_context.json"))
    args = ap.parse_args()

    probe = LLM(args.model, n_gpu_layers=0, max_num_seqs=1, n_ctx=256)
    info = probe.info
    probe.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"params": vars(args) | {"out": str(args.out)}, "model": {"n_layer": info.n_layer, "n_embd": info.n_embd,
           "n_head": info.n_head, "n_head_kv": info.n_head_kv, "kv_bytes_per_token": info.kv_bytes_per_token},
           "rows": []}  # fmt: skip
    for case in args.cases:
        prompt_len, batch = (int(x) for x in case.split("x"))
        if info.n_ctx_train and prompt_len + args.output_len > info.n_ctx_train:
            # a sequence holds at most n_ctx_train tokens: "131072x1" means the longest prompt that leaves room
            # for the outputs (the row records the length that ran)
            prompt_len = info.n_ctx_train - args.output_len
            print(f"{case}: prompt cut to {prompt_len} tokens (n_ctx_train {info.n_ctx_train} - {args.output_len} "
                  "output tokens)", flush=True)
        rng = random.Random(args.seed + prompt_len + batch)
        prompts = [[rng.randrange(100, info.n_vocab) for _ in range(prompt_len)] for _ in range(batch)]
        tokens: dict[str, list] = {}
        for mode in args.modes:
            config = engine_config(mode, prompt_len, batch, args.output_len, args.budget, info.kv_bytes_per_token,
                                   args.depth)
            row = run_case(args.model, mode, prompts, args.output_len, config, args.n_gpu_layers, args.batch_tokens)
            row["config"] = config
            if "error" not in row:
                tokens[mode] = row.pop("token_ids")
                ref = next(iter(tokens))  # the first mode that ran, "device" by default
                row["greedy_equal_to"] = {ref: sum(a == b for a, b in zip(tokens[mode], tokens[ref])) / batch}
            doc["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "config"}, default=str), flush=True)
            args.out.write_text(json.dumps(doc, indent=1, default=str))
    print("\n| case | mode | pool tokens | output tok/s | TTFT p50 / max (s) | TPOT p50 (ms) | decode tok/s"
          " | demoted / staged GB | staging GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in doc["rows"]:
        case = f"{r['prompt_len']}x{r['batch']}"
        if "error" in r:
            print(f"| {case} | {r['mode']} | {r['pool_tokens']} | {r['error'][:90]} | | | | | |")
            continue
        gbps = f"{r['staging_GBps_device']:.1f}" if r["staging_GBps_device"] else "-"
        tpot = f"{r['tpot_p50_ms']:.1f}" if r["tpot_p50_ms"] else "-"
        dec = f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "-"
        print(f"| {case} | {r['mode']} | {r['pool_tokens']} | {r['output_tok_s']:.1f} | {r['ttft_p50_s']:.2f} / "
              f"{r['ttft_max_s']:.2f} | {tpot} | {dec} | {r['demotions']} / {r['staged_GB']:.1f} | {gbps} |")
    doc["env"] = {"load_avg": os.getloadavg(), "cpus": os.cpu_count()}
    args.out.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
