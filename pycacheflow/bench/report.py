"""Markdown report of a results directory: tables and plots generated from the CSV/JSON files
that ``cacheflow bench`` wrote (never typed by hand)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from pycacheflow.bench import plots, report_extra
from pycacheflow.bench.results import read_csv

COMMANDS = ("throughput", "latency", "scaling", "kv_cache", "serve")


def make_plots(results_dir: Path) -> dict[str, Path]:
    """Every plot whose input CSV exists; returns {name: png path}."""
    d = Path(results_dir)
    made = {
        "throughput": plots.throughput_bars(
            read_csv(d / "throughput_results.csv"), d / "throughput.png"
        ),
        "scaling": plots.throughput_vs_concurrency(
            read_csv(d / "scaling_results.csv"), d / "scaling.png"
        ),
        "latency": plots.latency_cdfs(read_csv(d / "latency_requests.csv"), d / "latency_cdf.png"),
        "kv_throughput": plots.kv_utilization(
            read_csv(d / "throughput_kv_timeseries.csv"), d / "throughput_kv.png"
        ),
        "kv_cache": plots.kv_utilization(
            read_csv(d / "kv_cache_kv_timeseries.csv"), d / "kv_cache.png"
        ),
    }
    return {k: v for k, v in made.items() if v is not None}


def _summary(d: Path, command: str) -> dict:
    path = d / f"{command}_summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _num(value: object, digits: int = 1) -> str:
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return "-"


def _median(rows: Sequence[dict[str, str]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(values) if values else None


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines + [""]


def _command_line(s: dict) -> str:
    """The command that wrote summary s: as typed (its command_line, since stop 52), else rebuilt from its
    parameters (older results; options outside the ones below are not shown)."""
    if s.get("command_line"):
        return str(s["command_line"])
    p = s.get("parameters", {})
    cmd = s.get("command", "").replace("_", "-")
    parts = [
        f"cacheflow bench {cmd}",
        f"-n {p.get('num_requests')}",
        f"-p {p.get('prompt_len')}",
        f"-o {p.get('output_len')}",
    ]
    if cmd == "scaling":
        parts.append(
            f"--concurrency-list {','.join(str(c) for c in p.get('concurrency_levels', []))}"
        )
    else:
        parts.append(f"-c {p.get('concurrency')}")
    parts.append(f"-i {p.get('iterations')}")
    if p.get("dataset", "random") != "random":
        parts.append(f"--dataset {p['dataset']}")
    if p.get("threads"):
        parts.append(f"--threads {p['threads']}")
    parts += [f"--baseline {b}" for b in p.get("baselines", [])]
    if p.get("profile_overhead"):
        parts.append("--profile-overhead")
    return " ".join(parts)


def _variant_table(rows: Sequence[dict[str, str]], group_concurrency: bool) -> list[str]:
    header = [
        "variant",
        "KV mode",
        "c",
        "iters",
        "output tok/s",
        "total tok/s",
        "decode tok/s",
        "of BW ceiling",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "output x (CacheFlow / it)",
    ]
    keys: list[tuple[str, str]] = []
    for r in rows:
        k = (r["variant"], r["concurrency"] if group_concurrency else "")
        if k not in keys:
            keys.append(k)
    body = []
    for variant, c in keys:
        mine = [r for r in rows if r["variant"] == variant and (not c or r["concurrency"] == c)]
        subject = [
            r for r in rows if r["variant"] == plots.SUBJECT and (not c or r["concurrency"] == c)
        ]
        out, base = _median(mine, "output_throughput"), _median(subject, "output_throughput")
        ratio = f"{base / out:.2f}" if out and base and variant != plots.SUBJECT else ""
        frac = _median(mine, "ceiling_fraction")
        body.append(
            [
                variant,
                mine[0].get("kv_mode", ""),
                mine[0]["concurrency"],
                str(len(mine)),
                _num(out),
                _num(_median(mine, "total_token_throughput")),
                _num(_median(mine, "decode_tok_s")),
                f"{100 * frac:.1f}%" if frac is not None else "-",
                _num(_median(mine, "ttft_ms_median")),
                _num(_median(mine, "tpot_ms_median")),
                ratio,
            ]
        )
    return _table(header, body)


def _latency_table(rows: Sequence[dict[str, str]]) -> list[str]:
    header = ["variant", "metric", "p50 ms", "p90 ms", "p99 ms", "mean ms"]
    body = []
    for v in plots._variants(rows):
        mine = [r for r in rows if r["variant"] == v]
        for metric in ("ttft", "tpot", "itl", "e2e"):
            cells = [
                _num(_median(mine, f"{metric}_ms_{q}")) for q in ("median", "p90", "p99", "mean")
            ]
            body.append([v, metric.upper(), *cells])
    return _table(header, body)


def _kv_table(rows: Sequence[dict[str, str]]) -> list[str]:
    header = [
        "variant",
        "c",
        "KV used mean",
        "KV used peak",
        "reserved mean",
        "reserved peak",
        "reserved but unused (mean)",
        "reserved / used bytes",
        "output tok/s",
    ]
    body = []
    for v in plots._variants(rows):
        mine = [r for r in rows if r["variant"] == v]
        pct = [
            _median(mine, k)
            for k in (
                "kv_utilization_mean",
                "kv_utilization_peak",
                "kv_reserved_mean",
                "kv_reserved_peak",
                "kv_reserved_unused_mean",
            )
        ]
        body.append(
            [
                v,
                mine[0]["concurrency"],
                *[f"{100 * x:.1f}%" if x is not None else "-" for x in pct],
                _num(_median(mine, "kv_reserved_per_used"), 2),
                _num(_median(mine, "output_throughput")),
            ]
        )
    return _table(header, body)


def generate(results_dir: Path) -> Path:
    """Make the plots and write ``report.md`` into results_dir; returns its path."""
    d = Path(results_dir)
    pngs = make_plots(d)
    summaries = {c: _summary(d, c) for c in COMMANDS}
    first = next((s for s in summaries.values() if s), {})
    env, hw = first.get("environment", {}), first.get("hardware", {})
    lines = [
        "# CacheFlow benchmark report",
        "",
        "Generated by `scripts/generate_report.py` from the CSV and JSON files in this "
        "directory; every number below comes from those files.",
        "",
    ]
    lines += _table(
        ["", ""],
        [
            ["git commit", f"`{env.get('git_commit', '')}`"],
            ["date (UTC)", str(env.get("date", ""))],
            ["model", f"{env.get('model', '')} ({env.get('description', '')})"],
            ["quantization", str(env.get("quantization", ""))],
            ["build type", str(env.get("build_type", ""))],
            [
                "CPU",
                f"{env.get('cpu', '')}, {env.get('cpu_count', '')} cores, "
                f"{env.get('threads', '')} threads",
            ],
            ["GPU", str(env.get("gpu") or "none")],
            [
                "copy bandwidth",
                f"{_num(hw.get('copy_bandwidth_bytes_s', 0) / 1e9)} GB/s "
                "(numpy copy, read + written)",
            ],
            ["weights read per step", f"{_num(hw.get('weight_bytes', 0) / 2**20)} MiB"],
            ["KV bytes per token", str(hw.get("kv_bytes_per_token", ""))],
        ],
    )
    lines += [
        "Shared, noisy machines: compare the ratios measured in the same command, not the "
        "absolute numbers. The bandwidth ceiling is the time to read every weight once plus "
        "the KV rows in use, per decode-only step, at the measured copy bandwidth.",
        "",
    ]
    lines += _section(d, "throughput", "Throughput", summaries, pngs, group_concurrency=False)
    if "kv_throughput" in pngs:
        lines += [f"![KV utilization during the throughput run]({pngs['kv_throughput'].name})", ""]
    lines += _section(
        d, "scaling", "Scaling with concurrency", summaries, pngs, group_concurrency=True
    )
    if summaries["latency"]:
        lines += ["## Latency", "", f"    {_command_line(summaries['latency'])}", ""]
        lines += _latency_table(read_csv(d / "latency_results.csv"))
        lines += _variant_table(read_csv(d / "latency_results.csv"), group_concurrency=False)
        if "latency" in pngs:
            lines += [f"![latency CDFs]({pngs['latency'].name})", ""]
    if summaries["kv_cache"]:
        lines += ["## KV cache under churn", "", f"    {_command_line(summaries['kv_cache'])}", ""]
        lines += _kv_table(read_csv(d / "kv_cache_results.csv"))
        if "kv_cache" in pngs:
            lines += [f"![KV utilization over time]({pngs['kv_cache'].name})", ""]
    lines += report_extra.kv_capacity_section(d)
    lines += report_extra.serve_sections(d)
    path = d / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _section(
    d: Path, command: str, title: str, summaries: dict, pngs: dict, group_concurrency: bool
) -> list[str]:
    if not summaries[command]:
        return []
    rows = read_csv(d / f"{command}_results.csv")
    lines = [f"## {title}", "", f"    {_command_line(summaries[command])}", ""]
    lines += _variant_table(rows, group_concurrency)
    lines += _profiler_overhead(rows)
    lines += _baseline_sanity(rows)
    if command in pngs:
        lines += [f"![{title}]({pngs[command].name})", ""]
    return lines


def _profiler_overhead(rows: Sequence[dict[str, str]]) -> list[str]:
    """A sentence comparing CacheFlow with and without profiling (--profile-overhead)."""
    on = [r for r in rows if r["variant"] == plots.SUBJECT]
    off = [r for r in rows if r["variant"] == plots.SUBJECT + "-profile-off"]
    if not on or not off:
        return []
    parts = []
    for key, label in (("output_throughput", "output tok/s"), ("tpot_ms_median", "TPOT p50")):
        a, b = _median(on, key), _median(off, key)
        if a and b:
            parts.append(f"{label} with / without = {a / b:.3f}")
    values = [float(r["output_throughput"]) for r in on + off if r.get("output_throughput")]
    spread = (max(values) - min(values)) / statistics.median(values) if values else 0.0
    return [
        f"Profiler overhead (medians, same run): {'; '.join(parts)}. For scale: output tok/s "
        f"of these iterations spread over {100 * spread:.0f}% of their median.",
        "",
    ]


def _baseline_sanity(rows: Sequence[dict[str, str]], factor: float = 3.0) -> list[str]:
    """Flag llama-batched-bench when its decode rate is more than ``factor`` away from the
    engine's own stock KV mode in the same run (both run the same llama.cpp build)."""
    bench = _median([r for r in rows if r["variant"] == "llama-batched-bench"], "decode_tok_s")
    stock = _median([r for r in rows if r["variant"] == "stock"], "decode_tok_s")
    if not bench or not stock or 1 / factor <= bench / stock <= factor:
        return []
    return [
        f"Check before quoting: llama-batched-bench decoded at {bench:.1f} tok/s (median) and "
        f"the engine's stock KV mode at {stock:.1f} tok/s on the same llama.cpp build, a "
        f"{stock / bench:.1f}x gap that KV management alone does not explain.",
        "",
    ]
