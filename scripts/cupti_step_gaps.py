#!/usr/bin/env python3
"""Where a replayed CUDA graph's device time goes, from native/bench/cupti_kernel_trace.cpp's CSV.

Each cudaGraphLaunch is one group of records (one correlation id): in a decode-only run of the engine or of
llama-batched-bench, one decode step. For the last --last groups of at least --min-nodes records it prints, per
graph launch (medians): the span from the first record's start to the last one's end, the time some record ran
(busy), the idle time inside the graph (span - busy: latency between dependent kernels), the time from one graph's
end to the next one's start, and how much of that the device spent idle (the gap less any record that ran in it:
input copies, kernels launched outside graphs). Then one line per kernel name: launches per graph, median duration,
time per graph, and the idle time before it per graph (its start minus the latest end of the records before it in
the same graph; negative where programmatic dependent launch overlapped them).

The tracer's own host overhead lengthens the time between graphs (on the H100, a B=1 decode step took 1.74 ms
traced against 1.55 untraced, results/h200_gpu/stop37): compare that figure with an untraced step time, not alone.
The times inside a graph are the device's. Records CUPTI could not time (start 0, or end before start) are skipped.

Usage: python scripts/cupti_step_gaps.py TRACE.csv [--last 100] [--min-nodes 20] [--top 20]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import csv
import statistics
import sys


Span = tuple[str, int, int]  # (name, start_ns, end_ns) of one record


def load_trace(path: str, min_nodes: int) -> tuple[list[list[Span]], list[Span]]:
    """The graph launches of at least min_nodes records, each a list of records sorted by start, the launches sorted
    by their start; and every timed record of the trace (graphs or not), sorted by start."""
    groups: dict[str, list[Span]] = collections.defaultdict(list)
    every: list[Span] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            start, end = int(row["start_ns"]), int(row["end_ns"])
            if start == 0 or end < start:
                continue  # CUPTI could not time it
            name = row["name"] if row["kind"] == "kernel" else f"[{row['name']}]"
            every.append((name, start, end))
            if row["graph_id"] != "0":
                groups[row["correlation_id"]].append((name, start, end))
    out = [sorted(g, key=lambda r: r[1]) for g in groups.values() if len(g) >= min_nodes]
    out.sort(key=lambda g: g[0][1])
    every.sort(key=lambda r: r[1])
    return out, every


def running_max_ends(every: list[Span]) -> list[int]:
    """For each index k of `every` (sorted by start), the latest end of every[0..k]: nondecreasing, so the first record
    that may still run at time t is at bisect_right(running_max_ends, t)."""
    out, latest = [], 0
    for _, _, e in every:
        latest = max(latest, e)
        out.append(latest)
    return out


def busy_between(every: list[Span], starts: list[int], max_ends: list[int], lo: int, hi: int) -> int:
    """Time in [lo, hi) during which some record of `every` ran (sorted by start; starts = their starts, max_ends =
    running_max_ends(every)). A record that started long before lo, behind shorter ones, still counts."""
    i = bisect.bisect_right(max_ends, lo)  # every record before i ended by lo
    clipped = [(n, max(s, lo), min(e, hi)) for n, s, e in every[i:bisect.bisect_left(starts, hi)] if e > lo]
    clipped = [r for r in clipped if r[2] > r[1]]
    return busy_ns(clipped) if clipped else 0


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
    """A kernel's name without its argument list, cut to width characters."""
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width - 3] + "..."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv_path")
    ap.add_argument("--last", type=int, default=100, help="graph launches analysed, the last ones of the trace")
    ap.add_argument("--min-nodes", type=int, default=20, help="smaller graphs are not decode steps")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()

    all_groups, every = load_trace(args.csv_path, args.min_nodes)
    if not all_groups:
        sys.exit(f"{args.csv_path}: no graph launch of at least {args.min_nodes} records")
    starts = [r[1] for r in every]
    max_ends = running_max_ends(every)
    first = max(0, len(all_groups) - args.last)
    groups = all_groups[first:]

    spans, busies, between, idle_between = [], [], [], []
    per_name_dur: dict[str, list[float]] = collections.defaultdict(list)
    per_name_gap: dict[str, float] = collections.defaultdict(float)
    per_name_count: collections.Counter[str] = collections.Counter()
    for i, g in enumerate(groups):
        start, end = g[0][1], max(r[2] for r in g)
        spans.append(end - start)
        busies.append(busy_ns(g))
        prev = all_groups[first + i - 1] if first + i > 0 else None
        if prev is not None:
            prev_end = max(r[2] for r in prev)
            between.append(start - prev_end)
            idle_between.append(start - prev_end - busy_between(every, starts, max_ends, prev_end, start))
        latest_end = g[0][1]
        for name, s, e in g:
            per_name_dur[name].append(e - s)
            per_name_gap[name] += s - latest_end
            per_name_count[name] += 1
            latest_end = max(latest_end, e)

    n = len(groups)
    med = statistics.median
    nan = float("nan")
    print(f"{args.csv_path}: {n} graph launches analysed (of {len(all_groups)}), "
          f"{sum(len(g) for g in groups) / n:.0f} records each")
    print(f"per graph, median us: span {med(spans) / 1e3:.1f} = busy {med(busies) / 1e3:.1f} "
          f"+ idle inside the graph {med(s - b for s, b in zip(spans, busies)) / 1e3:.1f}; "
          f"to the next graph {med(between) / 1e3 if between else nan:.1f}, "
          f"of it device idle {med(idle_between) / 1e3 if idle_between else nan:.1f}")
    print(f"{'kernel':<70} {'per graph':>9} {'median us':>9} {'us/graph':>8} {'idle before us/graph':>20}")
    by_time = sorted(per_name_dur, key=lambda k: -sum(per_name_dur[k]))
    for name in by_time[: args.top]:
        print(f"{short_name(name):<70} {per_name_count[name] / n:>9.1f} {med(per_name_dur[name]) / 1e3:>9.2f} "
              f"{sum(per_name_dur[name]) / n / 1e3:>8.1f} {per_name_gap[name] / n / 1e3:>20.1f}")
    total_gap = sum(per_name_gap.values()) / n / 1e3
    print(f"{'all':<70} {sum(per_name_count.values()) / n:>9.1f} {'':>9} "
          f"{sum(sum(v) for v in per_name_dur.values()) / n / 1e3:>8.1f} {total_gap:>20.1f}")


if __name__ == "__main__":
    main()
