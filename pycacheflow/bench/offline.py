"""Closed-loop benchmark runs on in-process engines, variants side by side.

A run keeps ``concurrency`` requests in flight: the first ``concurrency`` are submitted at once
and each finished request is replaced by the next, until all are done (arrival = submission, so
TTFT includes time queued inside the engine, never time the client held the request back).
Every variant (CacheFlow with its own KV mode, and the stock KV modes as baselines) is loaded
once per concurrency level, warmed up, and the iterations alternate between variants so that
slow drift of a shared machine hits them alike.
"""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pycacheflow.bench.datasets import BenchRequest
from pycacheflow.config import EngineConfig
from pycacheflow.errors import InvalidArgumentError
from pycacheflow.metrics import RunMetrics, decode_ceiling_tok_s, run_metrics
from pycacheflow.outputs import EngineStats, RequestMetrics, RequestOutput, budget_note
from pycacheflow.profiler import Profile
from pycacheflow.sampling_params import SamplingParams

_CTX_ALIGN_TOKENS = 256  # llama.cpp pads the context to this
_WARMUP_TOKENS = 4


@dataclass(frozen=True)
class Variant:
    """One engine configuration under test.

    Attributes:
        name: label in results ("cacheflow", "stock", "stock-unified", "paged-ggml").
        kv_mode: EngineConfig.kv_mode.
        profile: record profiler events (step-level metrics; under 2% overhead).
        paged_attention: EngineConfig.paged_attention (the paged mode attention kernel).
        prefix_caching: EngineConfig.enable_prefix_caching.
    """

    name: str
    kv_mode: str
    profile: bool = True
    paged_attention: str = "invariant"
    prefix_caching: bool = True


def variants(
    kv_mode: str,
    stock_baseline: bool,
    profile: bool = True,
    paged_ggml_baseline: bool = False,
    prefix_caching: bool = True,
    no_prefix_cache_baseline: bool = False,
) -> list[Variant]:
    """CacheFlow as configured, plus both stock KV modes when ``stock_baseline``, plus paged
    mode with the ggml-numerics attention kernel when ``paged_ggml_baseline``, plus CacheFlow
    with its prefix cache off when ``no_prefix_cache_baseline``."""
    result = [Variant("cacheflow", kv_mode, profile, prefix_caching=prefix_caching)]
    if no_prefix_cache_baseline:
        result.append(Variant("no-prefix-cache", kv_mode, profile, prefix_caching=False))
    if stock_baseline:
        result += [
            Variant("stock", "stock", profile),
            Variant("stock-unified", "stock-unified", profile),
        ]
    if paged_ggml_baseline:
        result.append(Variant("paged-ggml", "paged", profile, "ggml"))
    return result


@dataclass(frozen=True)
class HardwareModel:
    """What the bandwidth ceiling needs: weight bytes, KV bytes per token, bandwidth."""

    weight_bytes: int
    kv_token_bytes: int
    bandwidth_bytes_s: float


@dataclass
class OfflineResult:
    """One (variant, concurrency, iteration) run.

    Attributes:
        kv_mode: the engine's resolved KV mode ("stock", "stock-unified", "paged").
        run: aggregate metrics; outputs: per-request outputs in workload order.
        profile: profiler events of the run (None without profiling).
        stats: engine counters right after the run (cumulative over the engine's life: the
            engine serves every iteration).
        num_preemptions: preemptions during this run alone.
    """

    variant: str
    kv_mode: str
    concurrency: int
    iteration: int
    outputs: list[RequestOutput]
    run: RunMetrics
    profile: Profile | None
    stats: EngineStats
    num_preemptions: int = 0

    @property
    def metrics(self) -> list[RequestMetrics]:
        """Per-request metrics in workload order."""
        return [o.metrics for o in self.outputs]

    def decode_phase(self, hw: HardwareModel | None) -> dict[str, float]:
        """Decode-only steps (no prefill in the batch) from the profile: tokens/s over their
        summed durations, and the same steps' bandwidth-bound ideal time: each step reads the
        weights once plus the KV rows its sequences attend (kv_tokens_attended after the step: a
        prefix shared by several sequences counts once per sequence, in every KV mode alike).

        Returns:
            {} without a profile; else decode_tok_s, and with ``hw`` ceiling_decode_tok_s and
            ceiling_fraction (= ideal time / actual time of those steps).
        """
        if self.profile is None:
            return {}
        steps = [
            s for s in self.profile.steps() if s.num_prefill_tokens == 0 and s.num_decode_tokens
        ]
        actual_s = sum(s.end_ns - s.begin_ns for s in steps) / 1e9
        tokens = sum(s.num_decode_tokens for s in steps)
        if actual_s <= 0:
            return {}
        out = {"decode_tok_s": tokens / actual_s, "decode_steps": len(steps)}
        if hw is not None and hw.bandwidth_bytes_s > 0:
            ideal_s = sum(
                (hw.weight_bytes + s.kv_tokens_attended * hw.kv_token_bytes) / hw.bandwidth_bytes_s
                for s in steps
            )
            out["ceiling_decode_tok_s"] = tokens / ideal_s
            out["ceiling_fraction"] = ideal_s / actual_s
        return out


def engine_config(
    model: str,
    kv_mode: str,
    concurrency: int,
    max_seq_tokens: int,
    threads: int,
    batch_tokens: int,
    profile: bool,
    paged_attention: str = "invariant",
    prefix_caching: bool = True,
    preemption: dict[str, object] | None = None,
    kv_cache_bytes: int = 0,
) -> EngineConfig:
    """EngineConfig sized for the workload: ``concurrency`` sequences of up to max_seq_tokens
    (prompt + output), rounded up to llama.cpp's 256-token context alignment. ``preemption``:
    EngineConfig's preemption_mode / swap_space_bytes (default: the engine's). ``kv_cache_bytes``
    > 0 sizes the KV cache of the "auto" and "paged" modes instead (a pool that may fill, so that
    preemption happens; "auto" takes it also where it resolves to stock, for a model the paged
    path does not cover); "stock" and "stock-unified" keep room for every sequence, as they
    cannot preempt."""
    from pycacheflow.profiler import DEFAULT_PROFILE_CAPACITY

    per_seq = -(-(max_seq_tokens + 1) // _CTX_ALIGN_TOKENS) * _CTX_ALIGN_TOKENS
    budget = kv_cache_bytes if kv_mode in ("auto", "paged") else 0
    return EngineConfig(
        model=model,
        n_ctx=0 if budget else concurrency * per_seq,
        kv_cache_bytes=budget,
        max_num_seqs=concurrency,
        max_num_batched_tokens=batch_tokens,
        n_threads=threads,
        kv_mode=kv_mode,
        profile_capacity=DEFAULT_PROFILE_CAPACITY if profile else 0,
        paged_attention=paged_attention,
        enable_prefix_caching=prefix_caching,
        **(preemption or {}),
    )


def run_closed_loop(
    llm,  # pycacheflow.LLM
    requests: Sequence[BenchRequest],
    concurrency: int,
    on_finish: Callable[[], None] | None = None,
) -> list[RequestOutput]:
    """Run requests keeping ``concurrency`` in flight (EOS ignored: exact output lengths).

    Args:
        llm: an open LLM.
        requests: the workload, submitted in order.
        concurrency: requests in flight at most (>= 1).
        on_finish: called on this thread after each finished request (progress bars).

    Returns:
        One RequestOutput per request, in workload order.
    """
    wakeups: queue.SimpleQueue[int] = queue.SimpleQueue()
    outputs: list[RequestOutput | None] = [None] * len(requests)
    request_ids: dict[int, int] = {}
    next_index = 0

    def submit() -> None:
        nonlocal next_index
        i, next_index = next_index, next_index + 1
        req = requests[i]
        params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True)
        notify = functools.partial(wakeups.put, i)
        request_ids[i] = llm.add_request(list(req.prompt_token_ids), params, notify=notify)

    while next_index < min(concurrency, len(requests)):
        submit()
    num_open = next_index
    while num_open:
        i = wakeups.get()
        if outputs[i] is not None:
            continue  # a wake-up queued after the request's last delta was taken
        for delta in llm.take_outputs(request_ids[i]):
            if delta.output is None:
                continue
            outputs[i] = delta.output
            num_open -= 1
            if on_finish is not None:
                on_finish()
            if next_index < len(requests):
                submit()
                num_open += 1
    return outputs  # type: ignore[return-value]


def warm_up(llm, concurrency: int, n_vocab: int) -> None:
    """A few short requests: page the weights in and build the compute graphs."""
    reqs = [BenchRequest(tuple(range(100, 116)), _WARMUP_TOKENS) for _ in range(concurrency)]
    run_closed_loop(llm, reqs, concurrency)
    if llm.config.profile_capacity:
        llm.profile(clear=True)


def run_variants(
    model: str,
    variant_list: Sequence[Variant],
    concurrency: int,
    workload: Callable[[int], Sequence[BenchRequest]],
    iterations: int,
    threads: int,
    batch_tokens: int,
    on_finish: Callable[[], None] | None = None,
    preemption: dict[str, object] | None = None,
    kv_cache_bytes: int = 0,
    on_budget_rounded: Callable[[str], None] | None = None,
) -> list[OfflineResult]:
    """Run ``iterations`` iterations of the workload on every variant, interleaved.

    Args:
        model: GGUF path.
        variant_list: engines to compare; all are loaded at once for the duration.
        concurrency: requests in flight (and the engines' max_num_seqs).
        workload: iteration -> requests (the same list for every variant of an iteration).
        iterations: >= 1.
        threads: CPU threads per engine (0 = one per physical core).
        batch_tokens: max_num_batched_tokens.
        on_finish: progress callback, once per finished request.
        preemption: preemption_mode / swap_space_bytes of every engine (see engine_config).
        kv_cache_bytes: KV budget of the paged engines; 0 = room for every sequence.
        on_budget_rounded: called with ``outputs.budget_note``'s text when an engine holds fewer tokens than
            the budget fits (llama.cpp's 256-row multiples); None = the engine's own warning (it names
            kv_cache_bytes), e.g. a CLI passes one that names its option.

    Raises:
        InvalidArgumentError: an engine refused its settings, or a budget that cannot hold the
            workload's longest request (its message starts with kv_cache_bytes=).

    Returns:
        One OfflineResult per (iteration, variant), in run order.
    """
    from pycacheflow.llm import LLM

    max_seq = max(r.num_prompt_tokens + r.max_tokens for r in workload(0))
    llms = {}
    try:
        for v in variant_list:
            config = engine_config(
                model,
                v.kv_mode,
                concurrency,
                max_seq,
                threads,
                batch_tokens,
                v.profile,
                v.paged_attention,
                v.prefix_caching,
                preemption,
                kv_cache_bytes,
            )
            # n_ctx was sized here, not by the user; a budget the user gave is noted when rounded
            llms[v.name] = LLM(config=config,
                               warn_rounded_ctx=config.kv_cache_bytes > 0 and on_budget_rounded is None)
            note = budget_note(config.kv_cache_bytes, llms[v.name].info)
            if note and on_budget_rounded is not None:
                on_budget_rounded(note)
            if config.kv_cache_bytes and llms[v.name].info.n_ctx_per_seq <= max_seq:
                raise InvalidArgumentError(
                    f"kv_cache_bytes={config.kv_cache_bytes} holds "
                    f"{llms[v.name].info.n_ctx_per_seq} tokens per sequence, but the workload's "
                    f"longest request needs {max_seq + 1} (prompt + output + 1); raise it"
                )
            warm_up(llms[v.name], concurrency, llms[v.name].info.n_vocab)
        results = []
        for it in range(iterations):
            requests = workload(it)
            order = list(variant_list)
            order = order[it % len(order) :] + order[: it % len(order)]  # rotate who goes first
            for v in order:
                results.append(_run_one(llms[v.name], v, requests, concurrency, it, on_finish))
        return results
    finally:
        for llm in llms.values():
            llm.close()


def _run_one(
    llm,
    variant: Variant,
    requests: Sequence[BenchRequest],
    concurrency: int,
    iteration: int,
    on_finish: Callable[[], None] | None,
) -> OfflineResult:
    preemptions_before = llm.stats().num_preemptions
    outputs = run_closed_loop(llm, requests, concurrency, on_finish)
    profile = llm.profile(clear=True) if variant.profile else None
    stats = llm.stats()
    return OfflineResult(
        variant=variant.name,
        kv_mode=llm.info.kv_mode_name,
        concurrency=concurrency,
        iteration=iteration,
        outputs=outputs,
        run=run_metrics([o.metrics for o in outputs]),
        profile=profile,
        stats=stats,
        num_preemptions=stats.num_preemptions - preemptions_before,
    )


def workload_ceiling_tok_s(
    hw: HardwareModel, concurrency: int, prompt_len: float, output_len: float
) -> float:
    """Decode ceiling for the fixed workload without a profile: batch = concurrency, each
    sequence at its mean decode context prompt + output / 2."""
    return decode_ceiling_tok_s(
        hw.bandwidth_bytes_s,
        hw.weight_bytes,
        concurrency,
        prompt_len + output_len / 2,
        hw.kv_token_bytes,
    )
