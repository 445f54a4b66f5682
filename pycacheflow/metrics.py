"""Benchmark metric formulas (BENCHMARKS.md "Metrics"): pure functions, no engine, no I/O.

Per-request latencies come from ``outputs.RequestMetrics`` (TTFT, TPOT, ITL, E2E as defined
there); this module aggregates them over a run:

- percentiles use linear interpolation between closest ranks (numpy's default): for sorted
  values ``v[0..n)`` the q-th percentile is at rank ``(n - 1) * q / 100``;
- TPOT is summarized over requests with at least two output tokens; ITL pools every gap of every
  request;
- throughput divides by the run's duration, from the first arrival to the last finish;
- goodput counts requests per second that met every given SLO (TTFT, TPOT, E2E);
- the memory-bandwidth ceiling of a decode step is the time to read the weights once plus the KV
  rows of every sequence in the batch.

All latencies are seconds, all rates per second, all sizes bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from pycacheflow.outputs import RequestMetrics

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile of values, interpolated linearly between closest ranks.

    Args:
        values: the samples (any order); must not be empty.
        q: percentile in [0, 100].

    Returns:
        The value at rank (n - 1) * q / 100 of the sorted samples.

    Raises:
        ValueError: values is empty or q is outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    """Summary of one latency (or other) sample set.

    Attributes:
        count: number of samples (0 = every other field is NaN).
        mean, median, p90, p99, min, max: in the samples' unit.
    """

    count: int
    mean: float
    median: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        """Summarize samples (None entries are skipped); NaN fields when there are none."""
        data = [float(v) for v in values if v is not None]
        if not data:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan, nan)
        return cls(
            count=len(data),
            mean=sum(data) / len(data),
            median=percentile(data, 50.0),
            p90=percentile(data, 90.0),
            p99=percentile(data, 99.0),
            min=min(data),
            max=max(data),
        )

    def scaled(self, factor: float) -> Distribution:
        """The same summary with every value multiplied (e.g. 1000 for seconds -> ms)."""
        return Distribution(
            self.count,
            *(getattr(self, f) * factor for f in ("mean", "median", "p90", "p99", "min", "max")),
        )

    def to_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat dict ``{prefix + field: value}`` for CSV rows."""
        return {prefix + k: v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Slo:
    """Service-level objectives for goodput; None = no limit on that metric (seconds)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met_by(self, m: RequestMetrics) -> bool:
        """True if the request met every set objective (a missing TTFT/TPOT fails a set one,
        except TPOT of a single-token request, which has none to miss)."""
        if self.ttft_s is not None and (m.ttft_s is None or m.ttft_s > self.ttft_s):
            return False
        if self.tpot_s is not None and m.tpot_s is not None and m.tpot_s > self.tpot_s:
            return False
        return self.e2e_s is None or m.e2e_s <= self.e2e_s


@dataclass(frozen=True)
class RunMetrics:
    """Aggregate metrics of one benchmark run (one configuration, one iteration).

    Attributes:
        num_requests: finished requests.
        duration_s: first arrival to last finish (or as given).
        num_prompt_tokens, num_output_tokens: totals over requests.
        request_throughput: requests/s. output_throughput: output tokens/s.
        total_token_throughput: (prompt + output) tokens/s.
        goodput: requests/s that met the SLO (equals request_throughput without one).
        ttft, tpot, itl, e2e: distributions in seconds.
    """

    num_requests: int
    duration_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution

    def to_row(self) -> dict[str, float]:
        """Flat dict for CSV: counts, rates, and each latency in ms as ``ttft_ms_p99`` etc."""
        row: dict[str, float] = {
            "num_requests": self.num_requests,
            "duration_s": self.duration_s,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "goodput": self.goodput,
        }
        for name in ("ttft", "tpot", "itl", "e2e"):
            dist: Distribution = getattr(self, name).scaled(1000.0)
            row.update({f"{name}_ms_{k}": v for k, v in asdict(dist).items() if k != "count"})
        return row


def prompt_cache_hit_rate(metrics: Sequence[RequestMetrics]) -> float:
    """Prompt tokens reused from the cache over all prompt tokens (0 for no prompt tokens)."""
    num_prompt = sum(m.num_prompt_tokens for m in metrics)
    return sum(m.num_cached_tokens for m in metrics) / num_prompt if num_prompt else 0.0


def run_duration_s(metrics: Sequence[RequestMetrics]) -> float:
    """Seconds from the earliest arrival to the latest finish; 0 for no requests."""
    if not metrics:
        return 0.0
    return max(m.finish_time_s for m in metrics) - min(m.arrival_time_s for m in metrics)


def throughput(count: float, duration_s: float) -> float:
    """count / duration_s; 0 when the duration is not positive."""
    return count / duration_s if duration_s > 0 else 0.0


def goodput(metrics: Sequence[RequestMetrics], duration_s: float, slo: Slo | None) -> float:
    """Requests per second that met every objective of ``slo`` (all requests without one)."""
    met = len(metrics) if slo is None else sum(1 for m in metrics if slo.met_by(m))
    return throughput(met, duration_s)


def run_metrics(
    metrics: Sequence[RequestMetrics], duration_s: float | None = None, slo: Slo | None = None
) -> RunMetrics:
    """Aggregate per-request metrics of one run.

    Args:
        metrics: one RequestMetrics per finished request.
        duration_s: the run's duration; None = first arrival to last finish.
        slo: objectives for goodput; None = every request counts.

    Returns:
        The RunMetrics (pure function).
    """
    duration = run_duration_s(metrics) if duration_s is None else duration_s
    num_prompt = sum(m.num_prompt_tokens for m in metrics)
    num_output = sum(m.num_output_tokens for m in metrics)
    return RunMetrics(
        num_requests=len(metrics),
        duration_s=duration,
        num_prompt_tokens=num_prompt,
        num_output_tokens=num_output,
        request_throughput=throughput(len(metrics), duration),
        output_throughput=throughput(num_output, duration),
        total_token_throughput=throughput(num_prompt + num_output, duration),
        goodput=goodput(metrics, duration, slo),
        ttft=Distribution.of(m.ttft_s for m in metrics),
        tpot=Distribution.of(m.tpot_s for m in metrics),
        itl=Distribution.of(gap for m in metrics for gap in m.itl_s),
        e2e=Distribution.of(m.e2e_s for m in metrics),
    )


# ---------------------------------------------------------------------------- hardware ceiling


def kv_bytes_per_token(
    n_layer: int, n_embd: int, n_head: int, n_head_kv: int, elem_bytes: int = 2
) -> int:
    """KV-cache bytes one token occupies: K and V rows of every layer (f16 by default).

    Args:
        n_layer, n_embd, n_head, n_head_kv: the model's shape (cf_model_info).
        elem_bytes: bytes per element of the cache type (2 for f16).

    Returns:
        2 * n_layer * n_head_kv * (n_embd / n_head) * elem_bytes.
    """
    head_dim = n_embd // n_head
    return 2 * n_layer * n_head_kv * head_dim * elem_bytes


def decode_step_bytes(weight_bytes: int, context_tokens: int, kv_token_bytes: int) -> int:
    """Bytes one decode step must read at least: every weight once plus the KV rows of every
    sequence's context (context_tokens summed over the batch)."""
    return weight_bytes + context_tokens * kv_token_bytes


def decode_ceiling_tok_s(
    bandwidth_bytes_s: float,
    weight_bytes: int,
    batch_size: int,
    context_tokens_per_seq: float,
    kv_token_bytes: int,
) -> float:
    """Decode tokens/s that memory bandwidth allows: batch_size tokens per step, each step
    reading the weights plus batch_size * context_tokens_per_seq KV rows.

    Returns:
        batch_size * bandwidth / (weights + batch_size * context * kv_token_bytes).
    """
    step_bytes = weight_bytes + batch_size * context_tokens_per_seq * kv_token_bytes
    return batch_size * bandwidth_bytes_s / step_bytes if step_bytes > 0 else 0.0
