"""PNG plots from the result CSVs of ``cacheflow bench`` (matplotlib, Agg backend).

Every function reads rows as ``results.read_csv`` returns them (strings), so plots are made
from the files only, never from in-memory runs. Baselines are drawn dashed; CacheFlow solid.
Needs the optional extra ``bench`` (matplotlib).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

SUBJECT = "cacheflow"
_DPI = 110


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plots need matplotlib: pip install 'cacheflow[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _f(row: dict[str, str], key: str) -> float | None:
    value = row.get(key, "")
    try:
        return float(value) if value not in ("", None) else None
    except ValueError:
        return None


def _variants(rows: Sequence[dict[str, str]]) -> list[str]:
    names: list[str] = []
    for r in rows:
        if r["variant"] not in names:
            names.append(r["variant"])
    return sorted(names, key=lambda v: (v != SUBJECT, v))


def _style(variant: str) -> dict[str, object]:
    return {
        "linestyle": "-" if variant == SUBJECT else "--",
        "linewidth": 2.2 if variant == SUBJECT else 1.6,
    }


def throughput_vs_concurrency(rows: Sequence[dict[str, str]], path: Path) -> Path | None:
    """Output tokens/s and decode tokens/s vs concurrency per variant (median, min-max bars),
    with the memory-bandwidth ceiling of the decode phase dotted. Returns None without rows."""
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panels = (
        ("output_throughput", "output tokens/s (whole run)"),
        ("decode_tok_s", "decode tokens/s (decode-only steps)"),
    )
    for ax, (metric, title) in zip(axes, panels):
        for v in _variants(rows):
            xs, med, lo, hi = _by_concurrency([r for r in rows if r["variant"] == v], metric)
            if xs:
                ax.errorbar(
                    xs,
                    med,
                    yerr=[[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]],
                    marker="o",
                    capsize=3,
                    label=v,
                    **_style(v),
                )
        if metric == "decode_tok_s":
            xs, med, _, _ = _by_concurrency(
                [r for r in rows if r["variant"] == SUBJECT], "ceiling_decode_tok_s"
            )
            if xs:
                ax.plot(xs, med, ":", color="black", label="bandwidth ceiling")
                ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        levels = sorted({int(float(r["concurrency"])) for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("tokens/s")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def _by_concurrency(rows: Sequence[dict[str, str]], metric: str):
    groups: dict[int, list[float]] = {}
    for r in rows:
        value = _f(r, metric)
        if value is not None:
            groups.setdefault(int(float(r["concurrency"])), []).append(value)
    xs = sorted(groups)
    return (
        xs,
        [statistics.median(groups[x]) for x in xs],
        [min(groups[x]) for x in xs],
        [max(groups[x]) for x in xs],
    )


def throughput_bars(rows: Sequence[dict[str, str]], path: Path) -> Path | None:
    """Median output tokens/s per variant (bars) with every iteration as a dot, and the
    ratio CacheFlow / variant written on each baseline bar."""
    if not rows:
        return None
    plt = _plt()
    names = _variants(rows)
    values = {
        v: [x for r in rows if r["variant"] == v if (x := _f(r, "output_throughput"))]
        for v in names
    }
    names = [v for v in names if values[v]]
    medians = [statistics.median(values[v]) for v in names]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 4.4))
    colors = ["tab:blue" if v == SUBJECT else "tab:gray" for v in names]
    ax.bar(range(len(names)), medians, color=colors, alpha=0.8)
    for i, v in enumerate(names):
        ax.plot([i] * len(values[v]), values[v], "k.", markersize=6)
    subject = medians[names.index(SUBJECT)] if SUBJECT in names else None
    for i, (v, m) in enumerate(zip(names, medians)):
        label = f"{m:.1f}" + (f"\n(x{subject / m:.2f})" if subject and v != SUBJECT else "")
        ax.annotate(
            label,
            (i, max(values[v])),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 4),
            textcoords="offset points",
        )
    modes = {r["variant"]: r.get("kv_mode", "") for r in rows}
    ticks = [f"{v}\n(KV {modes[v]})" if modes.get(v) else v for v in names]
    ax.set_xticks(range(len(names)), ticks, fontsize=8)
    ax.set_ylabel("output tokens/s (median of iterations)")
    ax.set_title("Offline throughput (x = CacheFlow / baseline)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_ylim(0, max(max(v) for v in values.values()) * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def latency_cdfs(rows: Sequence[dict[str, str]], path: Path) -> Path | None:
    """Empirical CDFs of TTFT, TPOT, ITL (pooled gaps) and E2E per variant, in ms."""
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, metric in zip(axes.flat, ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")):
        for v in _variants(rows):
            samples = _samples([r for r in rows if r["variant"] == v], metric)
            if samples:
                samples.sort()
                ys = [(i + 1) / len(samples) for i in range(len(samples))]
                ax.step(samples, ys, where="post", label=f"{v} (n={len(samples)})", **_style(v))
        ax.set_xlabel(f"{metric.split('_')[0].upper()} (ms)")
        ax.set_ylabel("fraction of samples")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Latency CDFs (closer to the left is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def _samples(rows: Sequence[dict[str, str]], metric: str) -> list[float]:
    if metric == "itl_ms":
        return [float(x) for r in rows for x in r.get("itl_ms", "").split()]
    return [x for r in rows if (x := _f(r, metric)) is not None]


def kv_utilization(rows: Sequence[dict[str, str]], path: Path) -> Path | None:
    """KV rows in use and reserved (fractions of capacity) per engine step over time, one
    panel per variant, with the batch size on a second axis."""
    if not rows:
        return None
    plt = _plt()
    names = _variants(rows)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.6 * len(names)), squeeze=False)
    for ax, v in zip(axes[:, 0], names):
        mine = [r for r in rows if r["variant"] == v]
        t = [float(r["time_s"]) for r in mine]
        ax.plot(
            t,
            [100 * float(r["kv_reserved_frac"]) for r in mine],
            color="tab:orange",
            label="reserved for running sequences",
        )
        ax.plot(
            t,
            [100 * float(r["kv_used_frac"]) for r in mine],
            color="tab:blue",
            label="holding tokens",
        )
        ax.set_ylim(0, 105)
        ax.set_ylabel("% of KV rows")
        ax.set_title(f"{v} (concurrency {mine[0]['concurrency']})", fontsize=10)
        ax.grid(True, alpha=0.3)
        twin = ax.twinx()
        twin.plot(
            t,
            [int(r["num_seqs"]) for r in mine],
            color="gray",
            alpha=0.4,
            linewidth=0.8,
            label="sequences in the batch",
        )
        twin.set_ylabel("batch (seqs)", color="gray")
        lines = ax.get_legend_handles_labels()
        extra = twin.get_legend_handles_labels()
        ax.legend(lines[0] + extra[0], lines[1] + extra[1], fontsize=8, loc="lower right")
    axes[-1, 0].set_xlabel("time since the run's first event (s)")
    fig.suptitle("KV cache utilization over time (per engine step)")
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path
