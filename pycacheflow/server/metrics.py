"""GET /metrics: Prometheus text with llama-server's metric names plus CacheFlow's own.

``ServerMetrics`` accumulates per-request facts when a request finishes (on the event loop
thread) and reads the engine's counters at scrape time; ``prometheus_client`` writes the text.

llama-server's metrics (``llamacpp:`` prefix) are written as llama-server writes them: each name
as is in its HELP, TYPE and sample lines (counters keep their ``_total``; ``n_tokens_max`` is a
counter), the speculative-decoding counters at 0, and the throughput gauges
(prompt_tokens_seconds, predicted_tokens_seconds) over the window since the previous scrape,
which a scrape resets, as llama-server's do. CacheFlow adds (``cacheflow:`` prefix) TTFT,
TPOT and end-to-end latency histograms, KV block and token use, the prefix-cache hit rate,
preemptions (by mode, and those made for a more urgent request), recomputed tokens, swap bytes
and time, finished requests by reason, and TTFT by request priority (a summary: count and sum
in seconds, labelled ``priority``, plus the largest TTFT of each priority as a gauge), from the
engine's own table (``EngineStats.ttft_by_priority``, cf_engine_get_ttft_by_priority).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

if TYPE_CHECKING:
    from pycacheflow.outputs import EngineStats, RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Histogram:
    """Cumulative-bucket histogram of seconds (not thread-safe: one writer thread).

    Args:
        bounds_s: sorted upper bounds in seconds; +Inf is implicit.
    """

    def __init__(self, bounds_s: Sequence[float]) -> None:
        self.bounds_s = tuple(bounds_s)
        self._counts = [0] * (len(self.bounds_s) + 1)  # last = over every bound
        self.sum_s = 0.0
        self.count = 0

    def observe(self, value_s: float) -> None:
        """Add one observation (seconds)."""
        self._counts[bisect.bisect_left(self.bounds_s, value_s)] += 1
        self.sum_s += value_s
        self.count += 1

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        """The histogram as a Prometheus metric family."""
        buckets, total = [], 0
        for bound, count in zip((*map(str, self.bounds_s), "+Inf"), self._counts):
            total += count
            buckets.append((bound, total))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.sum_s)


class ServerMetrics:
    """What /metrics reports. Call ``observe`` once per finished request (loop thread)."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.tpot = Histogram(TPOT_BUCKETS_S)
        self.e2e = Histogram(E2E_BUCKETS_S)
        self.num_prompt_tokens = 0  # computed, excluding prefix-cache hits
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self.prompt_s = 0.0
        self.predicted_s = 0.0
        self.n_tokens_max = 0
        self.finished_by_reason: Counter[str] = Counter()
        # the scrape window of the throughput gauges: [prompt tokens, prompt s, output, output s]
        self._window = [0, 0.0, 0, 0.0]

    def observe(self, output: RequestOutput) -> None:
        """Account one finished request."""
        m = output.metrics
        self.finished_by_reason[output.finish_reason] += 1
        self.num_prompt_tokens += m.num_prompt_tokens - m.num_cached_tokens
        self.num_cached_tokens += m.num_cached_tokens
        self.num_output_tokens += m.num_output_tokens
        self.n_tokens_max = max(self.n_tokens_max, m.num_prompt_tokens + m.num_output_tokens)
        self.e2e.observe(m.e2e_s)
        self._window[0] += m.num_prompt_tokens - m.num_cached_tokens
        self._window[2] += m.num_output_tokens
        if m.ttft_s is not None:
            self.ttft.observe(m.ttft_s)
            start = m.first_scheduled_time_s or m.arrival_time_s
            prompt_s = max(0.0, m.first_token_time_s - start)
            predicted_s = max(0.0, m.finish_time_s - m.first_token_time_s)
            self.prompt_s += prompt_s
            self.predicted_s += predicted_s
            self._window[1] += prompt_s
            self._window[3] += predicted_s
        if m.tpot_s is not None:
            self.tpot.observe(m.tpot_s)

    def render(self, stats: EngineStats) -> bytes:
        """Prometheus text exposition (format 0.0.4) of everything, engine ``stats`` included;
        starts a new window for the throughput gauges."""
        window, self._window = self._window, [0, 0.0, 0, 0.0]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self, stats))
        return _llamacpp_text(self, stats, window).encode() + generate_latest(registry)


class _Collector:
    """Adapter for prometheus_client: yields the families of one scrape."""

    def __init__(self, metrics: ServerMetrics, stats: EngineStats) -> None:
        self._m = metrics
        self._s = stats

    def collect(self) -> Iterator[Metric]:
        yield from self._cacheflow()

    def _cacheflow(self) -> Iterator[Metric]:
        m, s = self._m, self._s
        yield m.ttft.family("cacheflow:time_to_first_token_seconds", "Time to first token")
        yield m.tpot.family(
            "cacheflow:time_per_output_token_seconds", "Time per output token after the first"
        )
        yield m.e2e.family("cacheflow:e2e_request_latency_seconds", "End-to-end request latency")
        for name, doc, value in (
            ("kv_blocks_total", "KV blocks in the pool (paged mode; 0 otherwise)",
             s.kv_blocks_total),
            ("kv_blocks_used", "KV blocks in use", s.kv_blocks_used),
            ("kv_blocks_free", "KV blocks free", max(0, s.kv_blocks_total - s.kv_blocks_used)),
            ("kv_tokens_used", "KV cache rows holding a token (a row shared by the prefix cache "
             "or a fork counted once)", s.kv_tokens_used),
            ("kv_tokens_capacity", "KV cache capacity in tokens", s.kv_tokens_capacity),
            ("kv_bytes_used", "KV cache bytes in use", s.kv_bytes_used),
            ("prefix_cache_hit_rate",
             "Share of the tokens looked up at admission that the prefix cache held",
             s.prefix_cache_hit_rate),
            ("prefix_cache_blocks", "KV blocks holding cached tokens (in use or free)",
             s.prefix_cache_blocks),
        ):  # fmt: skip
            yield GaugeMetricFamily(f"cacheflow:{name}", doc, value=value)
        for name, doc, value in (
            ("preemptions_total", "Sequences preempted", s.num_preemptions),
            ("prefix_cache_queried_tokens_total", "Tokens looked up in the prefix cache",
             s.prefix_cache_queried_tokens),
            ("prefix_cache_hit_tokens_total", "Tokens found in the prefix cache",
             s.prefix_cache_hit_tokens),
            ("prefix_cache_evictions_total", "Cached KV blocks reused for other tokens",
             s.prefix_cache_evictions),
        ):  # fmt: skip
            yield CounterMetricFamily(f"cacheflow:{name}", doc, value=value)
        for name, doc, value in (
            ("preemptions_swap_total", "Sequences preempted by swapping their KV blocks out",
             s.num_preemptions_swap),
            ("preemptions_recompute_total", "Sequences preempted by dropping their KV",
             s.num_preemptions_recompute),
            ("recomputed_tokens_total", "Computed tokens whose KV a recompute preemption dropped",
             s.num_recomputed_tokens),
            ("swap_bytes_total", "KV bytes swapped to host memory", s.swap_out_bytes),
            ("swap_in_bytes_total", "KV bytes swapped back from host memory", s.swap_in_bytes),
            ("swap_seconds_total", "Time spent copying swapped KV blocks, both directions",
             (s.swap_out_ns + s.swap_in_ns) / 1e9),
            ("preemptions_priority_total",
             "Sequences preempted to make room for a more urgent request (priority policy)",
             s.num_preemptions_priority),
            ("swaps_overlapped_total",
             "Swap batches that ran beside the graph of the step issuing them (CUDA copy stream)",
             s.num_swaps_overlapped),
            ("swap_overlapped_seconds_total",
             "Device time of the swap batches issued without a wait by their step's graph",
             s.swap_overlapped_ns / 1e9),
        ):  # fmt: skip
            yield CounterMetricFamily(f"cacheflow:{name}", doc, value=value)
        for name, doc, value in (
            ("kv_stream_demotions_total", "KV blocks moved to host slots by KV streaming",
             s.kv_stream_demotions),
            ("kv_stream_promotions_total", "KV blocks moved back to the device by KV streaming",
             s.kv_stream_promotions),
            ("kv_staged_blocks_total", "Host-resident KV blocks staged into paged attention, per decode",
             s.kv_staged_blocks),
            ("kv_staged_bytes_total", "Bytes of those staged blocks (every layer's K and V rows)",
             s.kv_staged_bytes),
            ("kv_staging_decodes_total", "Decodes that staged at least one host-resident block",
             s.kv_staging_decodes),
        ):  # fmt: skip
            yield CounterMetricFamily(f"cacheflow:{name}", doc, value=value)
        yield GaugeMetricFamily(
            "cacheflow:kv_streamed_blocks",
            "KV blocks of running sequences that live in host slots now (KV streaming)",
            value=s.kv_streamed_blocks,
        )
        yield from _ttft_by_priority(s)
        yield GaugeMetricFamily(
            "cacheflow:swapped_sequences",
            "Sequences swapped out to host memory now",
            value=s.num_swapped,
        )
        yield _labelled_counter(
            "cacheflow:sampled_rows_total",
            "Sampled rows by route: in_graph (batched argmax or a backend chain), top_k (on the CPU"
            " among the row's in-graph top-k candidates), host (on the CPU from the whole row)",
            "route",
            {"in_graph": s.num_rows_sampled_in_graph, "top_k": s.num_rows_sampled_top_k,
             "host": s.num_rows_sampled_host},
        )  # fmt: skip
        yield _labelled_counter(
            "cacheflow:cuda_graph_evaluations_total",
            "ggml-cuda graph evaluations of the process by how they ran (captured, replayed, direct)",
            "mode",
            {"captured": s.cuda_graphs_captured, "replayed": s.cuda_graphs_replayed,
             "direct": s.cuda_graphs_direct},
        )  # fmt: skip
        for name, doc, value in (
            ("lookahead_decodes_total", "Decodes launched one step ahead of their step (async decode,"
             " CACHEFLOW_ASYNC_DECODE)", s.num_lookahead_decodes),
            ("lookahead_adopted_total", "Of those, the decodes whose step planned the same batch and used them",
             s.num_lookahead_adopted),
        ):  # fmt: skip
            yield CounterMetricFamily(f"cacheflow:{name}", doc, value=value)
        yield CounterMetricFamily(
            "cacheflow:padding_tokens",
            "Padding tokens decoded so that steps keep the few shapes whose CUDA graphs replay",
            value=s.num_padding_tokens,
        )
        yield _labelled_counter(
            "cacheflow:requests_finished_total", "Finished requests by reason", "reason",
            {r: m.finished_by_reason[r] for r in ("stop", "length", "abort", "error")},
        )  # fmt: skip


def _labelled_counter(name: str, doc: str, label: str, values: dict[str, float]) -> Metric:
    """One counter family with a sample per label value (values: label value -> count)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def _ttft_by_priority(s: EngineStats) -> Iterator[Metric]:
    """TTFT per request priority (the engine's table; a smaller priority is more urgent)."""
    summary = SummaryMetricFamily(
        "cacheflow:time_to_first_token_by_priority_seconds",
        "Time to first token by request priority (smaller = more urgent)",
        labels=["priority"],
    )
    largest = GaugeMetricFamily(
        "cacheflow:time_to_first_token_by_priority_max_seconds",
        "Largest time to first token by request priority",
        labels=["priority"],
    )
    for e in s.ttft_by_priority:
        summary.add_metric([str(e.priority)], count_value=e.num_requests, sum_value=e.ttft_sum_s)
        largest.add_metric([str(e.priority)], e.ttft_max_s)
    yield summary
    yield largest


def _llamacpp_text(m: ServerMetrics, s: EngineStats, window: list) -> str:
    """llama-server's metrics, named, typed and documented as llama-server writes them."""
    rows = (
        ("counter", "prompt_tokens_total", "Number of prompt tokens processed.",
         m.num_prompt_tokens),
        ("counter", "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.",
         m.num_cached_tokens),
        ("counter", "prompt_seconds_total", "Prompt process time", float(m.prompt_s)),
        ("counter", "tokens_predicted_total", "Number of generation tokens processed.",
         m.num_output_tokens),
        ("counter", "tokens_predicted_seconds_total", "Predict process time",
         float(m.predicted_s)),
        ("counter", "n_decode_total", "Total number of llama_decode() calls (engine steps).",
         s.num_steps),
        ("counter", "n_tokens_max", "Largest observed n_tokens.", m.n_tokens_max),
        ("counter", "spec_decode_num_draft_tokens_total",
         "Total number of drafted tokens (no speculative decoding in CacheFlow).", 0),
        ("counter", "spec_decode_num_accepted_tokens_total",
         "Total number of accepted draft tokens (no speculative decoding in CacheFlow).", 0),
        ("counter", "spec_decode_num_drafts_total",
         "Total number of drafts (no speculative decoding in CacheFlow).", 0),
        ("gauge", "prompt_tokens_seconds",
         "Average prompt throughput in tokens/s since the previous scrape.",
         _rate(window[0], window[1])),
        ("gauge", "predicted_tokens_seconds",
         "Average generation throughput in tokens/s since the previous scrape.",
         _rate(window[2], window[3])),
        ("gauge", "requests_processing", "Number of requests processing.", s.num_running),
        ("gauge", "requests_deferred",
         "Number of requests deferred (waiting to start, or preempted and swapped out).",
         s.num_waiting + s.num_swapped),
        ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         _rate(s.num_generated_tokens, s.num_steps)),
    )  # fmt: skip
    lines = []
    for kind, name, doc, value in rows:
        lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {value!r}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _rate(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0
