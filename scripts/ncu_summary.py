#!/usr/bin/env python3
"""Kernel time by kernel name from an `ncu --csv --metrics gpu__time_duration.sum` log.

Prints one line per kernel name (launches, total microseconds, share of the total, median microseconds per
launch), largest first,
then the total; with `--per-step-kernel NAME --per-step-count N` also the time per step, counting
N launches of kernels whose name contains NAME as one step (e.g. the paged attention kernel, once
per layer). Input: the CSV ncu writes to stdout (lines before the header are skipped).
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import statistics
import sys

UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv_path")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--per-step-kernel", default="paged_attention_split")
    ap.add_argument("--per-step-count", type=int, default=16, help="launches of that kernel per step")
    args = ap.parse_args()
    text = open(args.csv_path, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{args.csv_path}: no ncu CSV header found")
    total = collections.Counter()
    launches = collections.Counter()
    samples = collections.defaultdict(list)
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0][:90]
        value = float(row["Metric Value"].replace(",", "")) * UNITS_US.get(row["Metric Unit"], 1.0)
        total[name] += value
        launches[name] += 1
        samples[name].append(value)
    all_us = sum(total.values())
    print(f"{'kernel':<90} {'launches':>8} {'total us':>10} {'share':>6} {'median us':>10}")
    for name, us in total.most_common(args.top):
        median = statistics.median(samples[name])
        print(f"{name:<90} {launches[name]:>8} {us:>10.1f} {100 * us / all_us:>5.1f}% {median:>10.2f}")
    print(f"{'all kernels':<90} {sum(launches.values()):>8} {all_us:>10.1f}")
    steps = sum(n for k, n in launches.items() if args.per_step_kernel in k) / args.per_step_count
    if steps > 0:
        print(f"steps (launches of *{args.per_step_kernel}* / {args.per_step_count}): {steps:.2f}; "
              f"kernel time per step {all_us / steps:.1f} us")


if __name__ == "__main__":
    main()
