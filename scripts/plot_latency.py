#!/usr/bin/env python3
"""Latency plots from `cacheflow bench` results: latency_cdf.png (CDFs of TTFT, TPOT, pooled
ITL and E2E per engine) from latency_requests.csv, and the KV utilization over time of the
throughput and kv-cache runs (throughput_kv.png, kv_cache.png) from *_kv_timeseries.csv.

Usage: python scripts/plot_latency.py [-d results/]   (needs matplotlib: the `bench` extra)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pycacheflow.bench import plots  # noqa: E402
from pycacheflow.bench.results import read_csv  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-d", "--dir", type=Path, default=Path("results"), help="results directory")
    args = parser.parse_args()
    d = args.dir
    made = [
        plots.latency_cdfs(read_csv(d / "latency_requests.csv"), d / "latency_cdf.png"),
        plots.kv_utilization(read_csv(d / "throughput_kv_timeseries.csv"), d / "throughput_kv.png"),
        plots.kv_utilization(read_csv(d / "kv_cache_kv_timeseries.csv"), d / "kv_cache.png"),
    ]
    for path in made:
        if path is not None:
            print(path)


if __name__ == "__main__":
    main()
