#!/usr/bin/env python3
"""Throughput plots from `cacheflow bench` results: throughput.png (median output tokens/s per
engine, iterations as dots, ratios to CacheFlow) from throughput_results.csv, and scaling.png
(output and decode tokens/s vs concurrency with the baselines dashed and the memory-bandwidth
ceiling dotted) from scaling_results.csv.

Usage: python scripts/plot_throughput.py [-d results/]   (needs matplotlib: the `bench` extra)
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
    made = [
        plots.throughput_bars(
            read_csv(args.dir / "throughput_results.csv"), args.dir / "throughput.png"
        ),
        plots.throughput_vs_concurrency(
            read_csv(args.dir / "scaling_results.csv"), args.dir / "scaling.png"
        ),
    ]
    for path in made:
        if path is not None:
            print(path)


if __name__ == "__main__":
    main()
