"""Report sections for results kept in subfolders of a results directory.

- Serving: every ``serve_results.csv`` below the directory (``cacheflow bench serve``, e.g.
  ``cpu_serve/rate_0.5/``), one table per folder: the server under test (the command's URL)
  against its baselines (``--baseline`` URLs, e.g. llama-server), with throughput and TTFT/TPOT
  percentiles and the ratio to each baseline.
- KV capacity: ``kv_capacity/kv_capacity_results.csv`` (scripts/bench_kv_capacity.py).

Every number comes from those files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pycacheflow.bench.results import read_csv


def _f(value: object, digits: int = 1) -> str:
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return "-"


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in body] + [""]


def serve_sections(d: Path) -> list[str]:
    """'## Serving' with one table per folder holding serve_results.csv; [] if none."""
    paths = sorted(p for p in d.rglob("serve_results.csv"))
    if not paths:
        return []
    lines = [
        "## Serving",
        "",
        (
            "`cacheflow bench serve URL --baseline URL2`: the same requests against each server, "
            "one after the other; latencies measured by the client. Rows: the server under test "
            "(URL) and its baselines; x = under test / baseline (output tok/s), TTFT p99 ratio "
            "likewise."
        ),
        "",
    ]
    for path in paths:
        summary_path = path.with_name("serve_summary.json")
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        params = summary.get("parameters", {})
        subject = params.get("url", "")
        baselines = set(params.get("baselines", []))
        rows = [r for r in read_csv(path) if r["variant"] != "no-op server"]
        mine = next((r for r in rows if r["variant"] == subject), None)
        body = []
        for r in rows:
            role = (
                "under test"
                if r["variant"] == subject
                else "baseline"
                if r["variant"] in baselines
                else ""
            )
            ratio = ttft_ratio = ""
            if mine is not None and r is not mine and float(r["output_throughput"] or 0) > 0:
                ratio = f"{float(mine['output_throughput']) / float(r['output_throughput']):.2f}x"
                if float(r["ttft_ms_p99"] or 0) > 0:
                    ttft_ratio = f"{float(mine['ttft_ms_p99']) / float(r['ttft_ms_p99']):.2f}"
            body.append(
                [
                    f"{role} `{r['variant']}`",
                    str(r["dataset"]),
                    str(r["request_rate"]),
                    f"{r['num_requests']} ({r['num_errors']} failed)",
                    _f(r["output_throughput"]),
                    _f(r["ttft_ms_median"]),
                    _f(r["ttft_ms_p99"]),
                    _f(r["tpot_ms_median"]),
                    _f(r["tpot_ms_p99"]),
                    ratio,
                    ttft_ratio,
                ]
            )
        lines += [f"`{path.parent.relative_to(d) if path.parent != d else '.'}`", ""]
        if summary.get("command_line"):
            lines += [f"    {summary['command_line']}", ""]
        lines += _table(
            [
                "server",
                "dataset",
                "rate req/s",
                "requests",
                "output tok/s",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "TPOT p50 ms",
                "TPOT p99 ms",
                "x",
                "TTFT p99 ratio",
            ],
            body,
        )
    return lines


def kv_capacity_section(d: Path) -> list[str]:
    """'## Sequences at one KV memory budget' from kv_capacity/; [] if absent."""
    csv_path = d / "kv_capacity" / "kv_capacity_results.csv"
    if not csv_path.exists():
        return []
    summary_path = csv_path.with_name("kv_capacity_summary.json")
    s = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    lines = ["## Sequences at one KV memory budget", ""]
    if s:
        lines += [
            f"    {s.get('command', '')}",
            "",
            (
                f"{s.get('num_requests')} {s.get('dataset')} requests (longest "
                f"{s.get('longest_request_tokens')} tokens), every engine with "
                f"{int(s.get('kv_cache_bytes', 0)) / 2**20:.1f} MiB of KV cache; stock split "
                f"holds {s.get('stock_split_safe_seqs')} slices of the longest request. Paged "
                f"runs {float(s.get('mean_running_ratio_paged_vs_stock', 0)):.2f}x the "
                "sequences at once."
            ),
            "",
        ]
    body = [
        [
            r["label"],
            r["max_num_seqs"],
            r["n_ctx"],
            f"{r['num_completed']}/{r['num_requests']}",
            r["num_failed"],
            _f(r["mean_running"], 2),
            r["peak_running"],
            f"{float(r['kv_utilization']):.1%}",
            f"{float(r['pool_usage']):.1%}",
            r["num_preemptions"],
            _f(r["output_tok_s"]),
        ]
        for r in read_csv(csv_path)
    ]
    return lines + _table(
        [
            "engine",
            "slots",
            "KV rows",
            "completed",
            "failed",
            "mean running",
            "peak",
            "KV utilization",
            "pool usage",
            "preemptions",
            "output tok/s",
        ],
        body,
    )
