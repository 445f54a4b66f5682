"""Result files of ``cacheflow bench`` (BENCHMARKS.md "Reporting").

Per command: ``<command>_results.csv`` (one row per configuration and iteration, baselines
included), ``<command>_requests.csv`` (one row per request: the latency CDFs), optionally
``<command>_kv_timeseries.csv`` (KV rows per engine step), and ``<command>_summary.json``
(environment, parameters, hardware ceiling inputs, medians per variant and ratios to the
baselines). Plots and the report are generated from these files only.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from pycacheflow.bench.offline import HardwareModel, OfflineResult

# Metrics summarized per variant in the JSON and the console table: (column, higher is better).
KEY_METRICS = (
    ("output_throughput", True),
    ("total_token_throughput", True),
    ("request_throughput", True),
    ("decode_tok_s", True),
    ("ttft_ms_median", False),
    ("ttft_ms_p99", False),
    ("prefix_cache_hit_rate", True),
    ("tpot_ms_median", False),
    ("itl_ms_median", False),
    ("e2e_ms_median", False),
)


def result_row(
    command: str, r: OfflineResult, hw: HardwareModel | None, params: dict[str, object]
) -> dict[str, object]:
    """The CSV row of one offline run: identity, workload, RunMetrics, decode phase, ceiling."""
    row: dict[str, object] = {
        "command": command,
        "variant": r.variant,
        "kv_mode": r.kv_mode,
        "iteration": r.iteration,
        "concurrency": r.concurrency,
        "dataset": params.get("dataset", ""),
        "prompt_len": params.get("prompt_len", ""),
        "output_len": params.get("output_len", ""),
    }
    row.update(r.run.to_row())
    row.update(r.decode_phase(hw))
    row["num_preemptions"] = r.num_preemptions  # this run's, not the engine's total
    prompt_tokens = sum(m.num_prompt_tokens for m in r.metrics)
    cached = sum(m.num_cached_tokens for m in r.metrics)
    row["prefix_cache_hit_rate"] = cached / prompt_tokens if prompt_tokens else 0.0  # in tokens
    if r.profile is not None:
        row.update({f"kv_{k}": v for k, v in r.profile.kv_summary().items()})
    return row


def request_rows(command: str, results: Iterable[OfflineResult]) -> list[dict[str, object]]:
    """One row per request: latencies in ms, ITL gaps space-separated."""
    rows = []
    for r in results:
        for index, m in enumerate(r.metrics):
            rows.append(
                {
                    "command": command,
                    "variant": r.variant,
                    "iteration": r.iteration,
                    "concurrency": r.concurrency,
                    "request": index,
                    "num_prompt_tokens": m.num_prompt_tokens,
                    "num_output_tokens": m.num_output_tokens,
                    "ttft_ms": _ms(m.ttft_s),
                    "tpot_ms": _ms(m.tpot_s),
                    "e2e_ms": _ms(m.e2e_s),
                    "queue_ms": _ms(m.queue_s),
                    "itl_ms": " ".join(f"{1000 * g:.3f}" for g in m.itl_s),
                }
            )
    return rows


def kv_timeseries_rows(command: str, results: Iterable[OfflineResult]) -> list[dict[str, object]]:
    """KV rows used / reserved (fractions of capacity) and batch size at the end of each step,
    time in s from the run's first event."""
    rows = []
    for r in results:
        p = r.profile
        if p is None or p.kv_tokens_capacity <= 0:
            continue
        cap, t0 = p.kv_tokens_capacity, p.start_ns
        for s in p.steps():
            rows.append(
                {
                    "command": command,
                    "variant": r.variant,
                    "iteration": r.iteration,
                    "concurrency": r.concurrency,
                    "step_id": s.step_id,
                    "time_s": round((s.end_ns - t0) / 1e9, 6),
                    "kv_used_frac": round(s.kv_tokens_used / cap, 6),
                    "kv_reserved_frac": round((cap - s.kv_tokens_free) / cap, 6),
                    "num_seqs": s.num_seqs,
                    "num_waiting": s.num_waiting,
                }
            )
    return rows


def summarize(
    rows: Sequence[dict[str, object]], group_keys: Sequence[str], extra: Sequence[str] = ()
) -> list[dict[str, object]]:
    """Median of each KEY_METRICS column, and of each ``extra`` column (e.g. the KV utilization
    ones), per group (e.g. per variant and concurrency)."""
    groups: dict[tuple, list[dict[str, object]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in group_keys), []).append(row)
    out = []
    for key, members in groups.items():
        entry: dict[str, object] = dict(zip(group_keys, key))
        entry["iterations"] = len(members)
        for name in [m for m, _ in KEY_METRICS] + ["ceiling_fraction", *extra]:
            values = [float(m[name]) for m in members if _is_value(m.get(name))]
            if values:
                entry[name] = statistics.median(values)
        out.append(entry)
    return out


def ratios(
    medians: Sequence[dict[str, object]], subject: str = "cacheflow", keys: Sequence[str] = ()
) -> list[dict[str, object]]:
    """subject / baseline for every KEY_METRICS column, per baseline variant and per ``keys``
    group (e.g. concurrency). > 1 means the subject has the larger value (better for
    throughputs, worse for latencies)."""
    out = []
    for base in medians:
        if base.get("variant") == subject:
            continue
        match = [
            m
            for m in medians
            if m.get("variant") == subject and all(m.get(k) == base.get(k) for k in keys)
        ]
        if not match:
            continue
        entry: dict[str, object] = {"baseline": base["variant"], **{k: base.get(k) for k in keys}}
        for name, _ in KEY_METRICS:
            a, b = match[0].get(name), base.get(name)
            if _is_value(a) and _is_value(b) and float(b) != 0:
                entry[name] = float(a) / float(b)
        out.append(entry)
    return out


def write_csv(path: Path, rows: Sequence[dict[str, object]]) -> None:
    """Write rows (union of keys, in first-seen order) as CSV; NaN written empty."""
    names: list[str] = []
    for row in rows:
        names += [k for k in row if k not in names]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=names or ["empty"])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if _is_nan(v) else v) for k, v in row.items()})


def write_json(path: Path, data: dict[str, object]) -> None:
    """Indented JSON, NaN written as null."""
    path.write_text(json.dumps(_clean(data), indent=2) + "\n", encoding="utf-8")


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Rows of a results CSV ([] if the file does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _ms(seconds: float | None) -> float | str:
    return "" if seconds is None else round(1000 * seconds, 3)


def _is_nan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _is_value(v: object) -> bool:
    if v is None or v == "":
        return False
    try:
        return not math.isnan(float(v))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _clean(value: object) -> object:
    if _is_nan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
