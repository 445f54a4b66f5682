"""scripts/cupti_step_gaps.py: the per-step split of a replayed graph's device time (span = busy + idle inside)
and the idle time charged to each kernel, on a CSV written the way native/bench/cupti_kernel_trace.cpp writes it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "cupti_step_gaps.py"


def write_trace(path: Path) -> None:
    """Three graph launches of 21 records each: 20 kernels with 0.5 us gaps (every 5th one, 'attn', runs 3 us
    after a 2 us gap), then a 1 us DtoH copy; 10 us of idle device between launches; a direct kernel between."""
    rows = ["kind,name,start_ns,end_ns,correlation_id,graph_id,stream_id"]
    t = 0
    for step in range(3):
        t += 10_000
        for i in range(20):
            attn = i % 5 == 4
            t += 1_500 if attn else 0
            dur = 3_000 if attn else 1_000
            name = "attn_kernel(args)" if attn else f"matvec<{i % 2}>(float const* x)"
            rows.append(f"kernel,{name},{t},{t + dur},{100 + step},7,13")
            t += dur + 500
        rows.append(f"memcpy,memcpy DtoH,{t},{t + 1_000},{100 + step},7,13")
        t += 1_000
        rows.append(f"kernel,argmax,{t + 100},{t + 200},{900 + step},0,13")
    rows.append("kernel,untimed,0,0,100,7,13")  # CUPTI could not time it: skipped, else the span would be huge
    path.write_text("\n".join(rows) + "\n")


def test_span_busy_idle_and_idle_per_kernel(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    write_trace(trace)
    out = subprocess.run([sys.executable, str(SCRIPT), str(trace), "--last", "2"], capture_output=True, text=True,
                         check=True).stdout
    assert "2 graph launches analysed (of 3), 21 records each" in out
    # busy: 16 x 1 us + 4 x 3 us + 1 us copy = 29 us; idle: 20 gaps of 0.5 us + 4 x 1.5 us = 16 us
    # between graphs: 10 us, of which the direct 0.1 us argmax kernel ran (so 9.9 us device idle)
    assert "span 45.0 = busy 29.0 + idle inside the graph 16.0; to the next graph 10.0, of it device idle 9.9" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[3:]}
    assert lines["attn_kernel"][1:] == ["4.0", "3.00", "12.0", "8.0"]  # 4 x (1.5 + 0.5) us idle before
    assert lines["[memcpy"][-1] == "0.5"
    assert lines["all"][1:] == ["21.0", "29.0", "16.0"]


def test_a_trace_without_graph_launches_is_an_error(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("kind,name,start_ns,end_ns,correlation_id,graph_id,stream_id\nkernel,k,0,10,1,0,13\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(trace)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "no graph launch of at least 20 records" in proc.stderr


def test_a_long_record_behind_shorter_ones_counts_as_busy_in_a_gap() -> None:
    """A side-stream copy that starts before two short kernels and runs 5 us into the gap [100, 110) us."""
    spec = importlib.util.spec_from_file_location("cupti_step_gaps", SCRIPT)
    gaps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gaps)
    every = [("[memcpy HtoD]", 10_000, 105_000), ("k1", 20_000, 30_000), ("k2", 40_000, 50_000),
             ("k3", 107_000, 108_000)]  # fmt: skip
    starts = [r[1] for r in every]
    max_ends = gaps.running_max_ends(every)
    assert max_ends == [105_000, 105_000, 105_000, 108_000]
    assert gaps.busy_between(every, starts, max_ends, 100_000, 110_000) == 6_000  # 5 us of the copy, 1 us of k3
    assert gaps.busy_between(every, starts, max_ends, 60_000, 70_000) == 10_000  # inside the copy
    assert gaps.busy_between(every, starts, max_ends, 108_000, 110_000) == 0
