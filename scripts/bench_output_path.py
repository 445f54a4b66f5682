#!/usr/bin/env python3
"""Python's cost per engine step on the serving output path, without a model (issue 12).

For N streams with one new token each per step (a decode step), it times the Python work that
follows one drain, on this process's one core:

  split:   pycacheflow.engine.split_by_request (the drain's arrays -> one RequestChunk per stream)
  state:   RequestState.add per stream (-> StreamDelta)
  format:  the /completion SSE chunk per stream (responses.completion_partial + sse.event, orjson)

and prints the median microseconds per step over the steps (the median: other processes on a
shared machine preempt a few steps) and per stream. Set against the engine's step time at that
batch (H200, 1B shape: about 4.2 ms at 64 streams and 14 ms at 256, issue 12) this is the share
of a step the output path holds the GIL in the serving process: what decides whether the API
needs a process of its own. results/serving/README.md has the numbers.

    python scripts/bench_output_path.py --streams 64 256 1024
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's pycacheflow, not an installed one
from pycacheflow._native import EVENT_DTYPE  # noqa: E402
from pycacheflow.engine import split_by_request  # noqa: E402
from pycacheflow.request_state import RequestState  # noqa: E402
from pycacheflow.server import responses, sse  # noqa: E402


def step_arrays(num_streams: int, step: int) -> tuple[np.ndarray, bytes]:
    """The events and text of one decode step: one token and a 4-byte piece per stream."""
    events = np.zeros(num_streams, EVENT_DTYPE)
    events["request_id"] = np.arange(1, num_streams + 1)
    events["token_id"] = 1000 + step
    events["time_ns"] = time.perf_counter_ns()
    events["slot_id"] = np.arange(num_streams)
    events["text_len"] = 4
    events["text_offset"] = np.arange(num_streams) * 4
    return events, b" abc" * num_streams


def measure(num_streams: int, num_steps: int) -> dict[str, float]:
    states = {i: RequestState(i, None, [1, 2, 3]) for i in range(1, num_streams + 1)}
    samples: dict[str, list[float]] = {"split": [], "state": [], "format": []}
    for step in range(num_steps):
        events, text = step_arrays(num_streams, step)
        t0 = time.perf_counter()
        chunks = split_by_request(events, text)
        t1 = time.perf_counter()
        deltas = [states[c.request_id].add(c) for c in chunks]
        t2 = time.perf_counter()
        for d in deltas:
            sse.event(responses.completion_partial(0, d.text, d.token_ids, step, d.slot_id))
        t3 = time.perf_counter()
        samples["split"].append(t1 - t0)
        samples["state"].append(t2 - t1)
        samples["format"].append(t3 - t2)
    per_step = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    per_step["total"] = sum(per_step.values())
    per_step["per_stream"] = per_step["total"] / num_streams
    return per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    for n in args.streams:
        us = measure(n, args.steps)
        print(f"streams {n:5d}: per step {us['total']:8.1f} us (split {us['split']:.1f}, "
              f"state {us['state']:.1f}, format {us['format']:.1f}); "
              f"{us['per_stream']:.2f} us per stream")  # fmt: skip


if __name__ == "__main__":
    main()
