"""Plain data coming out of the engine: raw events, model info, stats, request outputs.

The NamedTuples of C structs mirror those of cacheflow.h field for field (tests/unit/test_cdef.py
fails on drift). ``RequestChunk`` is one request's share of one drain (what the dispatcher hands
to a request's stream: one object per request per drain, not per token). ``RequestMetrics`` and
``RequestOutput`` are what users see.

Times: the native engine stamps events with ``cf_clock_ns()`` (a monotonic clock, nanoseconds).
``RequestMetrics`` converts them to seconds on the same clock; only differences are meaningful.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# Mirrors of cacheflow.h constants (tests/unit/test_cdef.py checks them against the header).
TOKEN_NONE = -1  # CF_TOKEN_NONE: an event without a token
SLOT_ID_NONE = -1  # CF_SLOT_ID_NONE: the request never ran
FINISH_REASON_NONE = 0  # CF_FINISH_REASON_NONE: the request is still running
# cf_finish_reason value i + 1 <-> FINISH_REASONS[i]
FINISH_REASONS = ("stop", "length", "abort", "error")

_NS_PER_S = 1e9


class OutputEvent(NamedTuple):
    """One cf_output_event: a generated token and/or the end of a request.

    ``token_id`` is CF_TOKEN_NONE (-1) when the event carries no token; ``finish_reason`` is
    the cf_finish_reason int (0 = still running). The fields after ``time_ns`` are "final":
    set on a request's last event only, 0 elsewhere. Times are cf_clock_ns() nanoseconds.
    ``text_len`` bytes of released text belong to it (``Engine.drain`` does not return them).
    ``prompt_progress`` is 1 on a prompt progress event (``SamplingParams.return_progress``):
    no token, ``num_prompt_processed`` prompt tokens in the KV so far, the "final" counts and
    ``first_scheduled_ns`` set.
    """

    request_id: int
    token_id: int
    finish_reason: int
    time_ns: int
    arrival_ns: int
    first_scheduled_ns: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    num_preemptions: int
    slot_id: int
    text_len: int
    text_offset: int
    stop_string_index: int
    num_logprobs: int
    logprobs_offset: int
    prompt_progress: int
    num_prompt_processed: int
    error_len: int = 0


@dataclass(frozen=True)
class PromptProgress:
    """One prompt progress report of a request (``SamplingParams.return_progress``): what
    llama-server streams as ``prompt_progress``. The engine queues one when the request is
    first scheduled, before any prompt token is computed (``processed == cached``), then one
    after each step that computed a chunk of the prompt (the last: ``processed == total``).

    Attributes:
        total: prompt tokens.
        cached: of those, found in the prefix cache (not computed).
        processed: prompt tokens in the request's KV so far (cached + computed), strictly
            increasing over a request's reports.
        time_ns: when the step began (the first report) or finished its decode (cf_clock_ns).
        first_scheduled_ns: when the request was first scheduled (the first report's time_ns).
    """

    total: int
    cached: int
    processed: int
    time_ns: int
    first_scheduled_ns: int

    @property
    def elapsed_ms(self) -> float:
        """Milliseconds from the first scheduling to this report (0.0 for the first)."""
        return (self.time_ns - self.first_scheduled_ns) / 1e6


@dataclass(frozen=True)
class FinalInfo:
    """The "final" fields of a request's last event (see cacheflow.h), times in cf_clock_ns ns."""

    finish_reason: int
    time_ns: int
    arrival_ns: int
    first_scheduled_ns: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    num_preemptions: int
    stop_string_index: int  # -1: no stop string ended it
    error: str | None = None  # why a request that caused its own "error" ended (error_len bytes)


@dataclass(frozen=True)
class TokenLogprobs:
    """Token probabilities at one output position (``SamplingParams.logprobs``).

    Attributes:
        token_id: the sampled token.
        logprob: natural log of its probability (<= 0; -3.4e38 stands for probability 0).
        top: (token_id, logprob) of the most likely tokens at this position, in decreasing
            probability (at most ``SamplingParams.logprobs`` of them).
        text: the output text released with this token (whole characters; "" while the engine
            holds text back, e.g. a possible stop string). The texts of a request's tokens
            concatenated are its output text, but for what its final event flushes.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    text: str = ""


class RequestChunk(NamedTuple):
    """One request's events of one drain, merged (built by the dispatcher from the drain's
    arrays; a NamedTuple, as the dispatcher builds one per request per drain: a tuple is made
    several times faster than a frozen dataclass).

    Attributes:
        request_id: the request.
        token_ids: tokens sampled, in order.
        token_times_ns: [len(token_ids)] sample time of each (cf_clock_ns ns).
        text: the text the engine released with them (whole characters, never a stop string).
        slot_id: the slot of its latest event (SLOT_ID_NONE if it never ran).
        final: set when the chunk holds the request's last event.
        logprobs: one entry per token of ``token_ids`` when the request asked for token
            probabilities, else None.
        progress: its prompt progress reports, in order (() unless it asked for them); they
            come before the tokens of the same drain.
    """

    request_id: int
    token_ids: list
    token_times_ns: list
    text: str
    slot_id: int
    final: FinalInfo | None = None
    logprobs: list[TokenLogprobs] | None = None
    progress: tuple[PromptProgress, ...] = ()


class ModelInfo(NamedTuple):
    """cf_model_info: the loaded model and the engine's resolved capacity.

    ``kv_mode`` is the resolved cf_kv_mode int (see ``kv_mode_name``); ``token_bos``/``token_eos``
    are CF_TOKEN_NONE (-1) when the model has none; ``add_bos`` is 0/1; ``vocab_type`` is
    llama.cpp's ``enum llama_vocab_type`` (2 = BPE, e.g. SmolLM2).
    """

    n_vocab: int
    n_ctx_train: int
    n_ctx: int
    n_ctx_per_seq: int
    max_num_seqs: int
    max_num_batched_tokens: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    kv_mode: int
    block_size: int
    token_bos: int
    token_eos: int
    add_bos: int
    n_threads: int
    model_size_bytes: int
    n_params: int
    description: str
    arch: str
    kv_bytes_per_token: int
    vocab_type: int
    kv_devices: tuple[str, ...]  # paged mode: device of each layer's K/V pools; () in stock modes
    num_fused_projections: int  # Q/K/V and gate/up matrices fused at load (patches/0019)
    kv_mode_name: str = ""


def rounding_note(n_ctx: int, info: ModelInfo) -> str | None:
    """Why the KV cache holds info.n_ctx tokens where n_ctx were asked for, or None when it holds
    n_ctx (or n_ctx is 0, the default size).

    llama.cpp allocates its KV cache in multiples of 256 rows (per sequence in the stock split
    mode). Paged mode with step padding (on a GPU) keeps the pool's last block as the padding's
    scratch, asking for one block more when the rounding leaves none spare (llama_session.cpp), so
    its capacity is a multiple of 256 less one block.
    """
    if n_ctx <= 0 or info.n_ctx == n_ctx:
        return None
    note = "llama.cpp allocates multiples of 256"
    if info.kv_mode_name == "stock":
        note += " per sequence"
    scratch = info.n_ctx % 256 != 0 and (info.n_ctx + info.block_size) % 256 == 0
    if info.kv_mode_name == "paged" and scratch:
        note += ", less the step padding's scratch block"
    return note


def budget_note(kv_cache_bytes: int, info: ModelInfo) -> str | None:
    """What a KV budget in bytes became, when the cache holds fewer tokens than the budget fits
    (``kv_cache_bytes // kv_bytes_per_token``); None when it holds them all or no budget was set.

    The engine rounds the budget's tokens down to llama.cpp's multiples of 256 rows (per
    sequence in the stock split mode), so that the cache stays within it (see ``rounding_note``
    for the step padding's scratch block).
    """
    if kv_cache_bytes <= 0 or info.kv_bytes_per_token <= 0:
        return None
    fits = kv_cache_bytes // info.kv_bytes_per_token
    if fits <= info.n_ctx:
        return None
    note = rounding_note(fits, info) or "llama.cpp allocates multiples of 256"
    return (f"fits {fits} tokens; the KV cache holds {info.n_ctx} ({note}, rounded down to stay "
            "within it)")  # fmt: skip


class DeviceInfo(NamedTuple):
    """cf_device_info: one ggml device (``pycacheflow._native.list_devices``).

    ``name`` is what ``EngineConfig.devices`` takes ("CPU", "CUDA0", "RPC0"); ``type`` is ggml's
    enum ggml_backend_dev_type (0 CPU, 1 GPU, RPC devices included, 2 integrated GPU, 3
    accelerator); memory in bytes as the device (or its rpc-server) reports it.
    """

    name: str
    description: str
    type: int
    memory_total_bytes: int
    memory_free_bytes: int


class PriorityTTFT(NamedTuple):
    """cf_priority_ttft: time to first token of the requests of one priority value, since init.

    TTFT = first output token sampled - request accepted. Seconds on the engine clock.
    """

    priority: int
    num_requests: int
    ttft_sum_s: float
    ttft_max_s: float

    @property
    def ttft_mean_s(self) -> float:
        """Mean TTFT in seconds (0 when no request counted)."""
        return self.ttft_sum_s / self.num_requests if self.num_requests else 0.0


class EngineStats(NamedTuple):
    """cf_engine_stats: engine-wide counters since init (see cacheflow.h for each field), plus
    ``ttft_by_priority`` (cf_engine_get_ttft_by_priority: ascending priority, at most
    CF_TTFT_PRIORITIES_MAX values)."""

    num_steps: int
    num_running: int
    num_waiting: int
    num_finished: int
    num_prompt_tokens: int
    num_generated_tokens: int
    kv_tokens_used: int
    kv_tokens_capacity: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_bytes_reserved: int
    kv_bytes_used: int
    num_preemptions: int
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    prefix_cache_evictions: int
    prefix_cache_blocks: int
    num_preemptions_swap: int
    num_preemptions_recompute: int
    num_recomputed_tokens: int
    num_swapped: int
    swap_blocks_total: int
    swap_blocks_used: int
    swap_out_bytes: int
    swap_in_bytes: int
    swap_out_ns: int
    swap_in_ns: int
    num_preemptions_priority: int
    num_rows_sampled_in_graph: int
    num_rows_sampled_top_k: int
    num_rows_sampled_host: int
    decode_ns: int
    sample_ns: int
    cuda_graphs_captured: int
    cuda_graphs_replayed: int
    cuda_graphs_direct: int
    num_padding_tokens: int
    swap_on_copy_stream: int
    block_copy_bytes: int
    prepare_ns: int
    launch_ns: int
    step_ns: int
    num_llama_decodes: int
    num_llama_graphs_reused: int
    num_swapped_in: int
    num_resumed: int
    num_deferred_seq_steps: int
    num_swaps_overlapped: int
    swap_overlapped_ns: int
    num_graphs_beside_copies: int
    num_graphs_overlapping_copies: int
    swap_compute_overlap_ns: int
    kv_streaming: int
    kv_streamed_blocks: int
    kv_stream_demotions: int
    kv_stream_promotions: int
    kv_staged_blocks: int
    kv_staged_bytes: int
    kv_staging_decodes: int
    kv_stream_cuda_wait_layers: int
    kv_stream_cuda_copy_ns: int
    num_lookahead_decodes: int
    num_lookahead_adopted: int
    ttft_by_priority: tuple[PriorityTTFT, ...] = ()

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache / tokens looked up, since init (0 if none)."""
        queried = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / queried if queried else 0.0


def finish_reason_name(value: int) -> str | None:
    """ "stop", "length", "abort" or "error" for a cf_finish_reason value; None while running."""
    if value == FINISH_REASON_NONE:
        return None
    if 1 <= value <= len(FINISH_REASONS):
        return FINISH_REASONS[value - 1]
    return "error"


def _s(time_ns: int) -> float:
    return time_ns / _NS_PER_S


@dataclass(frozen=True)
class RequestMetrics:
    """Timing and token counts of one finished request.

    Times (``*_time_s``) are seconds on the engine's monotonic clock (cf_clock_ns() / 1e9);
    latencies (``*_s``) are differences of them.

    Attributes:
        num_prompt_tokens: prompt length in tokens.
        num_output_tokens: tokens generated.
        num_cached_tokens: prompt tokens reused from the prefix cache.
        num_preemptions: times the request was preempted.
        arrival_time_s: when the engine accepted the request.
        first_scheduled_time_s: first step that computed any of its tokens; None if never.
        first_token_time_s: when the first output token was sampled; None if none was.
        finish_time_s: when the request finished.
        ttft_s: time to first token = first_token - arrival; None if no token was produced.
        e2e_s: end-to-end latency = finish - arrival.
        tpot_s: time per output token after the first = (e2e - ttft) / (num_output_tokens - 1);
            None when num_output_tokens <= 1 (undefined: there is no second token).
        queue_s: first_scheduled - arrival; None if never scheduled.
        itl_s: inter-token latencies, one per output token after the first, in order.
    """

    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    arrival_time_s: float
    first_scheduled_time_s: float | None
    first_token_time_s: float | None
    finish_time_s: float
    ttft_s: float | None
    e2e_s: float
    tpot_s: float | None
    queue_s: float | None
    itl_s: tuple[float, ...]

    @classmethod
    def from_times_ns(
        cls,
        *,
        arrival_ns: int,
        first_scheduled_ns: int,
        token_times_ns: Sequence[int],
        finish_ns: int,
        num_prompt_tokens: int,
        num_cached_tokens: int = 0,
        num_preemptions: int = 0,
    ) -> RequestMetrics:
        """Build metrics from the native nanosecond timestamps of one request.

        Args:
            arrival_ns: when the request was accepted (cf_clock_ns ns).
            first_scheduled_ns: first step that computed it; 0 = never scheduled.
            token_times_ns: sample time of each output token, in order; its length is the
                number of output tokens.
            finish_ns: time of the request's last event; 0 = use the last token's time.
            num_prompt_tokens, num_cached_tokens, num_preemptions: counts from the final event.

        Returns:
            The metrics (pure function).
        """
        num_out = len(token_times_ns)
        if finish_ns <= 0:
            finish_ns = token_times_ns[-1] if num_out else arrival_ns
        e2e_s = _s(finish_ns - arrival_ns)
        ttft_s = _s(token_times_ns[0] - arrival_ns) if num_out else None
        tpot_s = (e2e_s - ttft_s) / (num_out - 1) if num_out > 1 else None
        itl_s = tuple(_s(b - a) for a, b in zip(token_times_ns, token_times_ns[1:]))
        scheduled = first_scheduled_ns > 0
        return cls(
            num_prompt_tokens=num_prompt_tokens,
            num_output_tokens=num_out,
            num_cached_tokens=num_cached_tokens,
            num_preemptions=num_preemptions,
            arrival_time_s=_s(arrival_ns),
            first_scheduled_time_s=_s(first_scheduled_ns) if scheduled else None,
            first_token_time_s=_s(token_times_ns[0]) if num_out else None,
            finish_time_s=_s(finish_ns),
            ttft_s=ttft_s,
            e2e_s=e2e_s,
            tpot_s=tpot_s,
            queue_s=_s(first_scheduled_ns - arrival_ns) if scheduled else None,
            itl_s=itl_s,
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict of all fields (itl_s as a list)."""
        result = dict(self.__dict__)
        result["itl_s"] = list(self.itl_s)
        return result


@dataclass(frozen=True)
class RequestOutput:
    """The result of one finished request.

    Attributes:
        request_id: the engine's id of the request (> 0).
        prompt: the prompt as given (the user message when a chat template was applied);
            None when the prompt was given as token ids.
        prompt_token_ids: the tokens actually sent to the engine.
        text: the generated text, cut right before the earliest stop string if one occurred
            (the engine's text: the streamed pieces concatenated).
        token_ids: the generated token ids (as sampled; may run past a stop string's start).
        finish_reason: "stop" (end-of-generation token, stop token or stop string), "length"
            (max_tokens or context full), "abort" or "error".
        metrics: timings and counts.
        error: finish_reason "error" caused by the request itself (its grammar left no token
            to sample): the engine's reason; else None.
        stop_string: the stop string that ended it (finish_reason "stop"), else None.
        logprobs: with ``SamplingParams.logprobs``: the probabilities of each token of
            ``token_ids``, in order; else None.
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    metrics: RequestMetrics
    stop_string: str | None = None
    logprobs: tuple[TokenLogprobs, ...] | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict: prompt, text, token_ids, finish_reason, metrics, request_id."""
        return {
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "metrics": self.metrics.to_dict(),
            "request_id": self.request_id,
            "stop_string": self.stop_string,
            **({} if self.logprobs is None else {"logprobs": [
                {"token_id": lp.token_id, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                for lp in self.logprobs
            ]}),
        }


@dataclass(frozen=True)
class StreamDelta:
    """One piece of a streamed request (from ``LLM.iter_outputs``).

    Attributes:
        request_id: the request.
        text: new text since the previous delta; never contains (a prefix of) a stop string
            that later completes. May be "" when new tokens did not complete a character yet.
        token_ids: tokens sampled since the previous delta.
        output: set on the last delta only: the full ``RequestOutput`` (finish reason, metrics).
        slot_id: the engine slot the request runs in (llama-server's id_slot), in
            [0, max_num_seqs); SLOT_ID_NONE (-1) if it never ran.
        logprobs: with ``SamplingParams.logprobs``: the probabilities of each token of
            ``token_ids`` (and the text each released); else None.
        progress: with ``SamplingParams.return_progress``: the prompt progress reports since
            the previous delta, in order; they precede this delta's tokens. () otherwise.
    """

    request_id: int
    text: str
    token_ids: tuple[int, ...]
    output: RequestOutput | None = None
    slot_id: int = SLOT_ID_NONE
    logprobs: tuple[TokenLogprobs, ...] | None = None
    progress: tuple[PromptProgress, ...] = ()

    @property
    def finished(self) -> bool:
        """True on the request's last delta."""
        return self.output is not None
