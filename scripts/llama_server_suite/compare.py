#!/usr/bin/env python3
"""Compare the outcomes of llama.cpp's server tests against stock llama-server and CacheFlow.

Reads the result files the suite plugin writes ("<outcome> <nodeid>" lines), prints counts per
test file and the tests stock passes that CacheFlow fails. Exit status 1 when a test that stock
passes fails against CacheFlow and is not listed in known_failures.txt (with its reason), or
when a listed test passes now (the list must be shortened), unless its reason starts with
"machine-dependent:" (an outcome that depends on the CPU's rounding, listed either way); 0
otherwise.

    compare.py --stock stock.txt --cacheflow cacheflow.txt [--known known_failures.txt]
    compare.py --stock-passed stock_passed.txt --cacheflow cacheflow.txt   # CI: no stock run
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path


def read_outcomes(path: Path) -> dict[str, str]:
    """nodeid -> outcome from a plugin result file."""
    outcomes = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            outcome, nodeid = line.split(" ", 1)
            outcomes[nodeid] = outcome
    return outcomes


def read_list(path: Path) -> dict[str, str]:
    """nodeid -> reason from a list file ("nodeid  # reason" lines; blank and # lines skipped)."""
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            nodeid, _, reason = line.partition("#")
            entries[nodeid.strip()] = reason.strip()
    return entries


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stock_group = parser.add_mutually_exclusive_group(required=True)
    stock_group.add_argument("--stock", type=Path, help="stock llama-server's result file")
    stock_group.add_argument("--stock-passed", type=Path, help="committed list of stock passes")
    parser.add_argument("--cacheflow", type=Path, required=True, help="CacheFlow's result file")
    parser.add_argument("--known", type=Path, help="known CacheFlow failures, with reasons")
    parser.add_argument("--write-stock-passed", type=Path, help="write stock's passes here")
    args = parser.parse_args()

    if args.stock is not None:
        stock = read_outcomes(args.stock)
        stock_passed = sorted(n for n, o in stock.items() if o == "passed")
        if args.write_stock_passed:
            args.write_stock_passed.write_text("".join(f"{n}\n" for n in stock_passed))
    else:
        stock = None
        stock_passed = sorted(read_list(args.stock_passed))
    cacheflow = read_outcomes(args.cacheflow)
    known = read_list(args.known) if args.known and args.known.exists() else {}

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for nodeid in stock_passed:
        counts[_file_of(nodeid)]["stock"] += 1
        if cacheflow.get(nodeid) == "passed":
            counts[_file_of(nodeid)]["both"] += 1
    for nodeid, outcome in cacheflow.items():
        if outcome == "passed":
            counts[_file_of(nodeid)]["cacheflow"] += 1
    print(f"{'file':<34} {'stock':>6} {'cacheflow':>10} {'both':>6}")
    for name in sorted(counts):
        c = counts[name]
        print(f"{name:<34} {c['stock']:>6} {c['cacheflow']:>10} {c['both']:>6}")
    total_cf = sum(o == "passed" for o in cacheflow.values())
    both = sum(cacheflow.get(n) == "passed" for n in stock_passed)
    ran = f" of {len(stock)} run" if stock is not None else ""
    print(f"stock llama-server passes {len(stock_passed)}{ran}; cacheflow serve passes "
          f"{total_cf} of {len(cacheflow)} run, {both} of stock's {len(stock_passed)}")

    missing = [n for n in stock_passed if cacheflow.get(n) != "passed"]
    unexpected = [n for n in missing if n not in known]
    fixed = [n for n in known if cacheflow.get(n) == "passed"
             and not known[n].startswith("machine-dependent:")]  # fmt: skip
    if [n for n in missing if n in known]:
        print(f"\nknown CacheFlow failures ({sum(n in known for n in missing)}):")
        for nodeid in missing:
            if nodeid in known:
                print(f"  {nodeid}  # {known[nodeid]}")
    if unexpected:
        print(f"\nstock passes, CacheFlow fails ({len(unexpected)}):")
        for nodeid in unexpected:
            print(f"  {cacheflow.get(nodeid, 'not run')}: {nodeid}")
    if fixed:
        print(f"\nlisted as known failures but passing now ({len(fixed)}); remove them:")
        for nodeid in fixed:
            print(f"  {nodeid}")
    return 1 if unexpected or fixed else 0


if __name__ == "__main__":
    sys.exit(main())
