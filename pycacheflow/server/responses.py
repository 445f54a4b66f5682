"""Response bodies of the llama-server compatible API (plain dicts, JSON-ready).

Field names and shapes follow llama-server of the pinned tree (tools/server/server-task.cpp):
the native /completion result, OpenAI text_completion / chat.completion objects and their
stream chunks, ``timings``, ``usage`` and the OpenAI error object.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pycacheflow

if TYPE_CHECKING:
    from pycacheflow.outputs import PromptProgress, RequestMetrics, RequestOutput
    from pycacheflow.reasoning import ReasoningSplit
    from pycacheflow.sampling_params import SamplingParams
    from pycacheflow.server.protocol import GenerationRequest

def _system_fingerprint() -> str:
    """llama-server's build_info format, "b<build>-<commit>", with CacheFlow's version and the
    git commit its library was built from, e.g. "b0.1.0-1a2b3c4" ("b0.1.0" outside git)."""
    from pycacheflow.errors import CacheFlowError

    try:
        from pycacheflow._native import version

        release = version().split(" ", 1)[0]  # "0.1.0+1a2b3c4"
    except (ImportError, OSError, CacheFlowError):  # no loadable library: the package version
        release = pycacheflow.__version__
    return "b" + release.replace("+", "-")


SYSTEM_FINGERPRINT = _system_fingerprint()
# llama-server's default sampler order (common_params_sampling.samplers, by
# common_sampler_type_to_str's names): the order of CacheFlow's chain (engine/sampling.cpp)
SAMPLER_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                 "temperature")
_MS_PER_S = 1000.0


def error_body(
    message: str, code: int, error_type: str, extra: dict[str, object] | None = None
) -> dict[str, object]:
    """``{"error": {"code", "message", "type", ...}}`` (OpenAI's format, as llama-server)."""
    error: dict[str, object] = {"code": code, "message": message, "type": error_type}
    error.update(extra or {})
    return {"error": error}


@dataclass(frozen=True)
class Completion:
    """One finished completion with what the response builders need besides the output.

    Attributes:
        output: the engine's result.
        stop_type: llama-server's "eos", "word" or "limit".
        stopping_word: the stop string that ended it, or "".
        slot_id: the slot it ran in, in [0, max_num_seqs).
        truncated: it stopped because its slot's context was full (llama-server's
            ``truncated``), not at its own n_predict.
        probs: the token probabilities of a non-streamed answer that asked for them, in
            llama-server's JSON shape (``logprobs.probs_json``); None otherwise.
    """

    output: RequestOutput
    stop_type: str
    stopping_word: str
    slot_id: int
    truncated: bool = False
    probs: list | None = None

    @property
    def oai_finish_reason(self) -> str:
        """OpenAI finish_reason: "stop" (EOS or stop word) or "length"."""
        return "length" if self.stop_type == "limit" else "stop"


def stop_type_of(output: RequestOutput, stopping_word: str) -> str:
    """llama-server's stop_type for a finished output."""
    if output.finish_reason == "stop":
        return "word" if stopping_word else "eos"
    return "limit"


class ResponseIds:
    """The ``id``, ``created`` and ``model`` shared by all chunks of one OpenAI response."""

    def __init__(self, prefix: str, model: str) -> None:
        self.id = f"{prefix}-{secrets.token_urlsafe(24)}"
        self.created = int(time.time())
        self.model = model

    def envelope(self, obj: str) -> dict[str, object]:
        """The common fields of one response object."""
        return {
            "created": self.created,
            "id": self.id,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "object": obj,
        }


# ---------------------------------------------------------------------------- shared parts


def timings(metrics: RequestMetrics) -> dict[str, float]:
    """llama-server's ``timings``: prompt (prefill) and predicted (decode) counts and speeds.

    Prompt time runs from the first step that computed the request to its first token;
    predicted time from the first token to the last. The generation rate counts the tokens
    after the first (the first comes from the prompt's last batch, costing no decode step), as
    llama-server's does: 0 for a single token.
    """
    start = metrics.first_scheduled_time_s or metrics.arrival_time_s
    first = metrics.first_token_time_s
    prompt_ms = max(0.0, (first - start) * _MS_PER_S) if first is not None else 0.0
    predicted_ms = (metrics.finish_time_s - first) * _MS_PER_S if first is not None else 0.0
    prompt_n = metrics.num_prompt_tokens - metrics.num_cached_tokens
    predicted_n = metrics.num_output_tokens
    decoded = predicted_n - 1  # tokens that took a decode step
    return {
        "cache_n": metrics.num_cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": _MS_PER_S * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / decoded if decoded > 0 else 0.0,
        "predicted_per_second": (
            _MS_PER_S * decoded / predicted_ms if decoded > 0 and predicted_ms > 0 else 0.0
        ),
    }


def prompt_progress(progress: PromptProgress) -> dict[str, int]:
    """llama-server's ``prompt_progress``: prompt tokens in all, found in the cache, in the KV
    so far (cache included), and milliseconds since the request was first scheduled."""
    return {
        "total": progress.total,
        "cache": progress.cached,
        "processed": progress.processed,
        "time_ms": int(progress.elapsed_ms),
    }


def progress_timings(progress: PromptProgress) -> dict[str, float]:
    """``timings`` at a prompt progress report (llama-server's slot stats then): the prompt
    tokens computed so far (cache excluded) and the time from the first scheduling to the
    report (0 on the first report, sent before any prompt token is computed); nothing
    predicted yet."""
    prompt_n = progress.processed - progress.cached
    prompt_ms = max(0.0, progress.elapsed_ms)
    return {
        "cache_n": progress.cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": _MS_PER_S * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": 0,
        "predicted_ms": 0.0,
        "predicted_per_token_ms": 0.0,
        "predicted_per_second": 0.0,
    }


def with_progress(
    body: dict[str, object], progress: PromptProgress, timings_per_token: bool
) -> dict[str, object]:
    """``body`` (a stream chunk) as a prompt progress chunk: ``prompt_progress``, and
    ``timings`` with ``timings_per_token``."""
    if timings_per_token:
        body["timings"] = progress_timings(progress)
    body["prompt_progress"] = prompt_progress(progress)
    return body


def usage(outputs: list[RequestOutput], num_choices: int = 1) -> dict[str, object]:
    """OpenAI ``usage`` of the outputs: completion tokens summed over them, the prompt (and its
    cached tokens) counted once per prompt, not once per choice: outputs holds ``num_choices``
    choices of each prompt (OpenAI's ``n``; its choices share the prompt)."""
    prompt = sum(o.metrics.num_prompt_tokens for o in outputs) // max(num_choices, 1)
    completion = sum(o.metrics.num_output_tokens for o in outputs)
    cached = sum(o.metrics.num_cached_tokens for o in outputs) // max(num_choices, 1)
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def generation_settings(
    request: GenerationRequest, n_ctx: int, model: str, params: SamplingParams | None = None
) -> dict[str, object]:
    """The request's effective settings, as /completion's ``generation_settings``; ``params``:
    the sampling parameters submitted (a choice's), instead of the request's."""
    p = request.params if params is None else params
    return {
        "n_ctx": n_ctx,
        "model": model,
        "n_predict": request.n_predict,
        "max_tokens": request.n_predict,
        "seed": -1 if p.seed is None else p.seed,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "stop": list(p.stop),
        "ignore_eos": p.ignore_eos,
        "repeat_penalty": p.repeat_penalty,
        "repeat_last_n": p.repeat_last_n,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        # llama-server's shape; a ban (-inf) is null
        "logit_bias": [{"bias": b if b != float("-inf") else None, "token": t}
                       for t, b in p.logit_bias],  # fmt: skip
        "stream": request.stream,
        "cache_prompt": request.cache_prompt,
        "priority": request.priority,
        "dynatemp_range": p.dynatemp_range,
        "dynatemp_exponent": p.dynatemp_exponent,
        "top_n_sigma": p.top_n_sigma,
        "xtc_probability": p.xtc_probability,
        "xtc_threshold": p.xtc_threshold,
        "typical_p": p.typical_p,
        "dry_multiplier": p.dry_multiplier,
        "dry_base": p.dry_base,
        "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": p.dry_penalty_last_n,
        "dry_sequence_breakers": list(p.dry_sequence_breakers),
        "mirostat": p.mirostat,
        "mirostat_tau": p.mirostat_tau,
        "mirostat_eta": p.mirostat_eta,
        "min_keep": p.min_keep,
        # llama-server's sampler order (common_params_sampling.samplers), the one CacheFlow's chain
        # follows; mirostat replaces it with temperature -> mirostat
        "samplers": list(SAMPLER_ORDER),
        "n_probs": p.logprobs or 0,
        "post_sampling_probs": p.post_sampling_probs,
        "reasoning_format": request.reasoning_format,
        # llama-server's flag for deepseek-legacy streams (it changes nothing in the pinned tree)
        "reasoning_in_content": request.stream and request.reasoning_format == "deepseek-legacy",
    }


# ---------------------------------------------------------------------------- /completion


def completion_partial(
    index: int,
    text: str,
    token_ids: tuple[int, ...],
    num_decoded: int,
    slot_id: int,
    probs: list | None = None,
) -> dict[str, object]:
    """One streamed /completion chunk (``stop`` false); ``probs``: its token's probabilities
    (one entry: a request with n_probs streams one chunk per token)."""
    body = {
        "index": index,
        "content": text,
        "tokens": list(token_ids),
        "stop": False,
        "id_slot": slot_id,
        "tokens_predicted": num_decoded,
    }
    if probs:
        body["completion_probabilities"] = probs
    return body


def completion_final(
    done: Completion,
    index: int,
    request: GenerationRequest,
    settings: dict[str, object],
    prompt_text: str,
) -> dict[str, object]:
    """The /completion result; when streaming, the last chunk (content already sent)."""
    out, m = done.output, done.output.metrics
    streamed = request.stream
    return {
        "index": index,
        "content": "" if streamed else out.text,
        "tokens": list(out.token_ids) if request.return_tokens and not streamed else [],
        "id_slot": done.slot_id,
        "stop": True,
        "model": settings["model"],
        "tokens_predicted": m.num_output_tokens,
        "tokens_evaluated": m.num_prompt_tokens,
        "generation_settings": settings,
        "prompt": prompt_text,
        "has_new_line": "\n" in out.text,
        "truncated": done.truncated,
        "stop_type": done.stop_type,
        "stopping_word": done.stopping_word,
        "tokens_cached": m.num_prompt_tokens + m.num_output_tokens,
        "timings": timings(m),
        **({"completion_probabilities": done.probs} if done.probs else {}),
    }


def select_fields(body: dict[str, object], fields: tuple[str, ...]) -> dict[str, object]:
    """llama-server's ``response_fields``: only the named fields, a path "a/b" reaching into
    nested objects (the key stays "a/b"); missing ones are left out. () = the whole body."""
    if not fields:
        return body
    selected: dict[str, object] = {}
    for path in fields:
        value: object = body
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            selected[path] = value
    return selected


# ---------------------------------------------------------------------------- OpenAI


def oai_completion(ids: ResponseIds, done: list[Completion], num_choices: int = 1) -> dict[str, object]:
    """A non-streamed ``text_completion``: ``num_choices`` choices per prompt."""
    choices = [
        {"text": d.output.text, "index": i, "logprobs": _oai_logprobs(d.probs),
         "finish_reason": d.oai_finish_reason}
        for i, d in enumerate(done)
    ]  # fmt: skip
    body = {"choices": choices, **ids.envelope("text_completion")}
    body["usage"] = usage([d.output for d in done], num_choices)
    if len(done) == 1:
        body["timings"] = timings(done[0].output.metrics)
    return body


def _oai_logprobs(probs: list | None) -> dict[str, object] | None:
    """A choice's ``logprobs`` as llama-server writes it: {"content": probs}, or null."""
    return {"content": probs} if probs else None


def oai_completion_chunk(
    ids: ResponseIds, index: int, text: str, finish_reason: str | None, probs: list | None = None
) -> dict[str, object]:
    """A streamed ``text_completion`` chunk (``probs``: its token's probabilities)."""
    choice = {"text": text, "index": index, "logprobs": _oai_logprobs(probs),
              "finish_reason": finish_reason}  # fmt: skip
    return {"choices": [choice], **ids.envelope("text_completion")}


def oai_completion_last_chunk(ids: ResponseIds, index: int, done: Completion) -> dict[str, object]:
    """The final streamed ``text_completion`` chunk of a choice: finish_reason, usage and
    timings. The usage here is llama-server's (it always sends it on this chunk); with
    ``stream_options.include_usage`` OpenAI's usage chunk follows too
    (``oai_completion_usage_chunk``), so clients of either find it where they expect it."""
    body = oai_completion_chunk(ids, index, "", done.oai_finish_reason)
    body["usage"] = usage([done.output])
    body["timings"] = timings(done.output.metrics)
    return body


def oai_completion_usage_chunk(ids: ResponseIds, outputs: list, num_choices: int = 1) -> dict[str, object]:
    """OpenAI's last streamed chunk with ``include_usage``: empty choices, the total usage."""
    return {"choices": [], **ids.envelope("text_completion"), "usage": usage(outputs, num_choices)}


def chat_completion(
    ids: ResponseIds, done: list[Completion], splits: list[ReasoningSplit] | None = None
) -> dict[str, object]:
    """A non-streamed ``chat.completion``: one choice per completion (``n``); ``splits``:
    each completion's text parsed into content and reasoning (``reasoning_content`` when not
    empty), None = all content."""
    choices = [
        {
            "finish_reason": d.oai_finish_reason,
            "index": i,
            "message": _chat_message(d.output.text if splits is None else splits[i]),
            **({"logprobs": _oai_logprobs(d.probs)} if d.probs else {}),
        }
        for i, d in enumerate(done)
    ]
    body = {"choices": choices, **ids.envelope("chat.completion")}
    body["usage"] = usage([d.output for d in done], len(done))  # the choices of one prompt
    body["timings"] = timings(done[0].output.metrics)
    return body


def _chat_message(text: str | ReasoningSplit) -> dict[str, object]:
    if isinstance(text, str):
        return {"role": "assistant", "content": text}
    message: dict[str, object] = {"role": "assistant", "content": text.content}
    if text.reasoning:
        message["reasoning_content"] = text.reasoning
    return message


def chat_chunk(
    ids: ResponseIds,
    delta: dict[str, object],
    finish_reason: str | None = None,
    index: int = 0,
    probs: list | None = None,
) -> dict[str, object]:
    """A streamed ``chat.completion.chunk`` of choice ``index``; the first of each choice
    carries ``{"role": "assistant"}``; ``probs``: its token's probabilities."""
    choice = {"finish_reason": finish_reason, "index": index, "delta": delta}
    if probs:
        choice["logprobs"] = _oai_logprobs(probs)
    return {"choices": [choice], **ids.envelope("chat.completion.chunk")}


def chat_last_chunks(
    ids: ResponseIds, done: Completion, include_usage: bool, index: int = 0
) -> list[dict[str, object]]:
    """The closing chat chunks: finish_reason, then (if asked) usage with empty choices.

    The last one carries ``timings``, as in llama-server.
    """
    chunks = [chat_chunk(ids, {}, done.oai_finish_reason, index)]
    if include_usage:
        chunks.append(
            {"choices": [], **ids.envelope("chat.completion.chunk"), "usage": usage([done.output])}
        )
    chunks[-1]["timings"] = timings(done.output.metrics)
    return chunks
