"""Concurrency at a fixed KV memory budget: paged mode against stock split mode.

Every engine gets the same KV memory (``EngineConfig.kv_cache_bytes``). Stock split mode cuts it
into ``max_num_seqs`` equal slices (llama.cpp's per-sequence streams), so a request longer than a
slice fails: it is rejected (prompt too long) or its output is cut at the slice's end. The most
sequences stock split can run without failing is therefore the budget's rows divided by the
longest request, in llama.cpp's 256-row steps (``stock_split_safe_seqs``). Paged mode shares one
pool of blocks: requests are admitted while free blocks last and, when blocks run out, the newest
running sequence is preempted and later recomputed (vLLM's policy), so nothing fails at any
``max_num_seqs``; how many run at once then depends on the real lengths, not the longest one.

``run_capacity`` submits a whole workload at once to one engine and measures, from the profiler's
step events: the sequences running per step (mean and peak), KV utilization (tokens stored /
rows of allocated blocks in paged mode, / rows of the whole cache in stock mode, where every slice
is allocated up front) and pool usage (rows holding tokens / rows of the cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from pycacheflow.bench.datasets import BenchRequest
from pycacheflow.errors import PromptTooLongError
from pycacheflow.sampling_params import SamplingParams

CTX_ALIGN_TOKENS = 256  # llama.cpp allocates context rows (per stream in split mode) in these steps


def stock_split_safe_seqs(kv_cache_bytes: int, kv_bytes_per_token: int, longest_tokens: int) -> int:
    """Most sequences stock split mode can hold in the budget with every slice >= longest_tokens.

    Args:
        kv_cache_bytes: the KV memory budget, bytes.
        kv_bytes_per_token: K and V bytes of one token over all layers (``ModelInfo.kv_bytes_per_token``).
        longest_tokens: prompt + output tokens of the longest request.

    Returns:
        floor(rows / slice) with rows = budget // bytes per token and slice = longest_tokens + 1
        rounded up to 256 (0 if not even one slice fits).
    """
    rows = kv_cache_bytes // kv_bytes_per_token
    slice_rows = -(-(longest_tokens + 1) // CTX_ALIGN_TOKENS) * CTX_ALIGN_TOKENS
    return rows // slice_rows


@dataclass
class CapacityResult:
    """One engine's run of the whole workload at the budget.

    Attributes:
        label: row name ("paged", "stock", ...); kv_mode: the engine's resolved KV mode.
        max_num_seqs: sequence slots of the engine; n_ctx: KV rows the budget bought;
        n_ctx_per_seq: longest sequence it can hold; kv_bytes: n_ctx * bytes per token.
        num_completed: requests that produced every output token asked for.
        num_rejected: requests refused at submission (prompt longer than a sequence can hold).
        num_cut: requests that finished with fewer output tokens than asked (out of KV room).
        num_preemptions: sequences preempted (paged mode).
        mean_running, peak_running: sequences in the batch per step (steps that computed).
        kv_utilization: mean over steps of tokens stored / KV rows allocated to sequences.
        pool_usage: mean over steps of tokens stored / n_ctx.
        output_tok_s: output tokens of the run / its wall time; duration_s: that wall time.
    """

    label: str
    kv_mode: str
    max_num_seqs: int
    n_ctx: int
    n_ctx_per_seq: int
    kv_bytes: int
    num_requests: int
    num_completed: int
    num_rejected: int
    num_cut: int
    num_preemptions: int
    mean_running: float
    peak_running: int
    kv_utilization: float
    pool_usage: float
    output_tok_s: float
    duration_s: float

    @property
    def num_failed(self) -> int:
        """Requests rejected or cut short."""
        return self.num_rejected + self.num_cut

    def row(self) -> dict[str, object]:
        """Flat dict for CSV/JSON, num_failed included."""
        return {**asdict(self), "num_failed": self.num_failed}


def run_capacity(
    label: str,
    llm,  # pycacheflow.LLM, opened with profile_capacity > 0 and the budget
    requests: Sequence[BenchRequest],
    on_finish: Callable[[], None] | None = None,
) -> CapacityResult:
    """Submit every request at once (EOS ignored), wait for all, and measure the run.

    Args:
        label: name of the row.
        llm: an open LLM with profiling on.
        requests: the workload.
        on_finish: called once per finished or rejected request (progress bars).

    Returns:
        The CapacityResult; the LLM's profile is cleared.

    Raises:
        ValueError: the engine records no profile (profile_capacity == 0).
    """
    if not llm.config.profile_capacity:
        raise ValueError("run_capacity needs an engine with profile_capacity > 0")
    info = llm.info
    token_bytes = info.kv_bytes_per_token
    preemptions_before = llm.stats().num_preemptions
    llm.profile(clear=True)
    start = time.perf_counter()
    ids: list[tuple[int, int]] = []  # (request id, output tokens asked)
    num_rejected = 0
    for req in requests:
        params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True)
        try:
            ids.append((llm.add_request(list(req.prompt_token_ids), params), req.max_tokens))
        except PromptTooLongError:
            num_rejected += 1
            if on_finish is not None:
                on_finish()
    num_completed = num_cut = num_output = 0
    for request_id, asked in ids:
        for delta in llm.iter_outputs(request_id):
            if delta.output is None:
                continue
            got = len(delta.output.token_ids)
            num_output += got
            num_completed += got == asked
            num_cut += got < asked
            if on_finish is not None:
                on_finish()
    duration_s = time.perf_counter() - start
    steps = llm.profile(clear=True).steps()
    block_rows = info.block_size if info.kv_mode_name == "paged" else 0

    def allocated_rows(step) -> int:
        return step.kv_blocks_used * block_rows if block_rows else info.n_ctx

    kv_steps = [s for s in steps if allocated_rows(s) > 0]
    return CapacityResult(
        label=label,
        kv_mode=info.kv_mode_name,
        max_num_seqs=llm.config.max_num_seqs,
        n_ctx=info.n_ctx,
        n_ctx_per_seq=info.n_ctx_per_seq,
        kv_bytes=info.n_ctx * token_bytes,
        num_requests=len(requests),
        num_completed=num_completed,
        num_rejected=num_rejected,
        num_cut=num_cut,
        num_preemptions=llm.stats().num_preemptions - preemptions_before,
        mean_running=_mean([s.num_seqs for s in steps]),
        peak_running=max((s.num_seqs for s in steps), default=0),
        kv_utilization=_mean([s.kv_tokens_used / allocated_rows(s) for s in kv_steps]),
        pool_usage=_mean([s.kv_tokens_used / info.n_ctx for s in steps]),
        output_tok_s=num_output / duration_s if duration_s > 0 else 0.0,
        duration_s=duration_s,
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
