"""Prefix cache lookup cost vs engine step time at 256 concurrent sequences (issue 14), CPU.

Two measurements in one command, same machine, same shape (256 prompts of about 1,000 tokens,
block size 16):
1. the native micro-benchmark ``bench_prefix_cache`` (native/bench): match_prefix of 256 prompts
   against a populated index, and whole admissions (the scheduler's two matches plus
   allocate_prefix), median of 15 rounds;
2. the engine's step time with 256 sequences running: the default model, 256 shared-prefix
   prompts (a ~980-token system prompt + a short question, the index warmed by one of them),
   max_num_seqs 256, profiler on; the median duration of the decode-only steps with all 256
   sequences in the batch (and, for reference, of the steps that also prefilled).
The ratio is the worst case of one step: all 256 sequences admitted in it.

    CACHEFLOW_LIB=$(ls $PWD/build/cp3*/libcacheflow.so) PYTHONPATH=$PWD \\
        python scripts/bench_prefix_lookup.py [--threads 2] [--out results/prefix_cache/stop23]
Writes <out>/lookup_native.txt and <out>/lookup_summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
from pathlib import Path

NUM_SEQS = 256
PROMPT_TOKENS = 1000
BLOCK_SIZE = 16
_LINE = re.compile(r"^(\w+)\s+(\w+)\s+batch\s+([\d.]+) us\s+per prompt\s+([\d.]+) us")


def native_lookup(build: Path) -> tuple[str, dict[str, dict[str, float]]]:
    """Build and run bench_prefix_cache; its output and {workload: {op: batch us}}."""
    subprocess.run(["cmake", "--build", str(build), "--target", "bench_prefix_cache", "-j", "2"],
                   check=True, capture_output=True)  # fmt: skip
    exe = build / "bench_prefix_cache"
    text = subprocess.run([str(exe), str(NUM_SEQS), str(PROMPT_TOKENS), str(BLOCK_SIZE)],
                          check=True, capture_output=True, text=True).stdout  # fmt: skip
    table: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            table.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    return text, table


def engine_step_ms(threads: int, output_len: int) -> dict[str, float]:
    """Median decode step (ms) with all NUM_SEQS sequences in the batch, and their count."""
    from pycacheflow.bench import datasets
    from pycacheflow.llm import LLM
    from pycacheflow.model_hub import ensure_default_model
    from pycacheflow.sampling_params import SamplingParams

    model = str(ensure_default_model(progress=False))
    with LLM(model, max_num_seqs=NUM_SEQS, n_ctx=65536, n_threads=threads, block_size=BLOCK_SIZE,
             profile=True) as llm:  # fmt: skip
        reqs = datasets.shared_prefix_requests(NUM_SEQS, PROMPT_TOKENS - 20, output_len,
                                               llm.tokenize, seed=0)  # fmt: skip
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        llm.generate([list(reqs[0].prompt_token_ids)], params)  # warms the index
        llm.profile(clear=True)
        outs = llm.generate([list(r.prompt_token_ids) for r in reqs], params)
        full = [s for s in llm.profile().steps() if s.num_seqs == NUM_SEQS]
    durations_ms = [(s.end_ns - s.begin_ns) / 1e6 for s in full if s.num_prefill_tokens == 0]
    mixed_ms = [(s.end_ns - s.begin_ns) / 1e6 for s in full if s.num_prefill_tokens > 0]
    prompt_lens = [o.metrics.num_prompt_tokens for o in outs]
    cached = sum(o.metrics.num_cached_tokens for o in outs) / sum(prompt_lens)
    return {
        "decode_step_ms_median": statistics.median(durations_ms),
        "decode_step_ms_min": min(durations_ms),
        "num_decode_steps": len(durations_ms),
        "mixed_step_ms_median": statistics.median(mixed_ms) if mixed_ms else float("nan"),
        "num_mixed_steps": len(mixed_ms),
        "prompt_tokens_mean": statistics.mean(prompt_lens),
        "prefix_hit_rate": cached,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output-len", type=int, default=48)
    pip_builds = sorted(Path("build").glob("cp3*"))  # the folder `pip install .` made
    default_build = pip_builds[0] if pip_builds else Path("build/dev")
    parser.add_argument("--build", type=Path, default=default_build)
    parser.add_argument("--out", type=Path, default=Path("results/prefix_cache/stop23"))
    args = parser.parse_args()
    text, table = native_lookup(args.build)
    print(text, end="")
    step = engine_step_ms(args.threads, args.output_len)
    step_us = step["decode_step_ms_median"] * 1e3
    ratios = {
        f"{w}_{op}_over_step": us / step_us for w, ops in table.items() for op, us in ops.items()
    }
    summary = {"native_batch_us": table, "engine": step, "ratios": ratios,
               "shape": {"num_seqs": NUM_SEQS, "prompt_tokens": PROMPT_TOKENS,
                         "block_size": BLOCK_SIZE, "threads": args.threads}}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lookup_native.txt").write_text(text)
    (args.out / "lookup_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"engine: decode step with {NUM_SEQS} seqs, median "
          f"{step['decode_step_ms_median']:.1f} ms over {step['num_decode_steps']} steps "
          f"(prompts {step['prompt_tokens_mean']:.0f} tokens, "
          f"hit rate {step['prefix_hit_rate']:.3f}); steps with prefill too: median "
          f"{step['mixed_step_ms_median']:.1f} ms over {step['num_mixed_steps']}")  # fmt: skip
    for name, r in ratios.items():
        print(f"{name}: {r:.4%}")


if __name__ == "__main__":
    main()
