#!/usr/bin/env python3
"""Where a replayed CUDA graph's device time goes, from native/bench/cupti_kernel_trace.cpp's CSV.

Each cudaGraphLaunch is one group of records (one correlation id): a decode step of the engine or of
llama-batched-bench. For the last --last groups of at least --min-nodes records it prints, per step (medians):
the span from the first kernel's start to the last one's end, the time some kernel ran (busy), the idle time
inside the graph (span - busy: launch latency between dependent kernels), and the device idle time between one
graph's end and the next one's start (host work on the critical path). Then one line per kernel name: launches
per step, median duration, time per step, and the idle time before it per step (its start minus the latest end
of the kernels before it in the same graph; negative where programmatic dependent launch overlapped them).

Usage: python scripts/cupti_step_gaps.py TRACE.csv [--last 100] [--min-nodes 20] [--top 20]
"""

from __future__ import annotations

import argparse
import collections
import csv
import statistics
import sys


def load_groups(path: str, min_nodes: int) -> list[list[tuple[str, int, int]]]:
    """Graph launches as lists of (name, start_ns, end_ns) sorted by start, the groups sorted by their start."""
    groups: dict[str, list[tuple[str, int, int]]] = collections.defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["graph_id"] == "0":
                continue
            name = row["name"] if row["kind"] == "kernel" else f"[{row['name']}]"
            groups[row["correlation_id"]].append((name, int(row["start_ns"]), int(row["end_ns"])))
    out = [sorted(g, key=lambda r: r[1]) for g in groups.values() if len(g) >= min_nodes]
    out.sort(key=lambda g: g[0][1])
    return out


def busy_ns(records: list[tuple[str, int, int]]) -> int:
    """Length of the union of the records' [start, end) intervals (records sorted by start)."""
    total = 0
    cur_start, cur_end = records[0][1], records[0][2]
    for _, s, e in records[1:]:
        if s > cur_end:
            total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    return total + cur_end - cur_start


def short_name(name: str, width: int = 70) -> str:
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width - 3] + "..."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv_path")
    ap.add_argument("--last", type=int, default=100, help="graph launches analysed, the last ones of the trace")
    ap.add_argument("--min-nodes", type=int, default=20, help="smaller graphs are not decode steps")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()

    all_groups = load_groups(args.csv_path, args.min_nodes)
    if not all_groups:
        sys.exit(f"{args.csv_path}: no graph launch of at least {args.min_nodes} records")
    first = max(0, len(all_groups) - args.last)
    groups = all_groups[first:]

    spans, busies, between = [], [], []
    per_name_dur: dict[str, list[float]] = collections.defaultdict(list)
    per_name_gap: dict[str, float] = collections.defaultdict(float)
    per_name_count: collections.Counter[str] = collections.Counter()
    for i, g in enumerate(groups):
        start, end = g[0][1], max(r[2] for r in g)
        spans.append(end - start)
        busies.append(busy_ns(g))
        prev = all_groups[first + i - 1] if first + i > 0 else None
        if prev is not None:
            between.append(start - max(r[2] for r in prev))
        latest_end = g[0][1]
        for name, s, e in g:
            per_name_dur[name].append(e - s)
            per_name_gap[name] += s - latest_end
            per_name_count[name] += 1
            latest_end = max(latest_end, e)

    n = len(groups)
    med = statistics.median
    print(f"{args.csv_path}: {n} graph launches analysed (of {len(all_groups)}), "
          f"{sum(len(g) for g in groups) / n:.0f} records each")
    print(f"per step, median us: span {med(spans) / 1e3:.1f} = busy {med(busies) / 1e3:.1f} "
          f"+ idle inside the graph {med(s - b for s, b in zip(spans, busies)) / 1e3:.1f}; "
          f"device idle between graphs {med(between) / 1e3 if between else float('nan'):.1f}")
    print(f"{'kernel':<70} {'per step':>8} {'median us':>9} {'us/step':>8} {'idle before us/step':>19}")
    by_time = sorted(per_name_dur, key=lambda k: -sum(per_name_dur[k]))
    for name in by_time[: args.top]:
        print(f"{short_name(name):<70} {per_name_count[name] / n:>8.1f} {med(per_name_dur[name]) / 1e3:>9.2f} "
              f"{sum(per_name_dur[name]) / n / 1e3:>8.1f} {per_name_gap[name] / n / 1e3:>19.1f}")
    total_gap = sum(per_name_gap.values()) / n / 1e3
    print(f"{'all':<70} {sum(per_name_count.values()) / n:>8.1f} {'':>9} "
          f"{sum(sum(v) for v in per_name_dur.values()) / n / 1e3:>8.1f} {total_gap:>19.1f}")


if __name__ == "__main__":
    main()
