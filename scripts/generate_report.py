#!/usr/bin/env python3
"""Generate results/report.md (Markdown with embedded PNGs) from the CSV and JSON files that
`cacheflow bench` wrote: environment, the commands, tables of medians and ratios to the
baselines, fractions of the memory-bandwidth ceiling, and the plots of plot_throughput.py and
plot_latency.py. Nothing in the report is typed by hand.

Usage: python scripts/generate_report.py -d results/   (needs matplotlib: the `bench` extra)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pycacheflow.bench import report  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-d", "--dir", type=Path, default=Path("results"), help="results directory")
    args = parser.parse_args()
    if not args.dir.is_dir():
        sys.exit(f"{args.dir} is not a directory: run `cacheflow bench ... --out {args.dir}` first")
    print(report.generate(args.dir))


if __name__ == "__main__":
    main()
