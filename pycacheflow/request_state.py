"""RequestState: turns one request's output chunks into stream deltas and a RequestOutput.

The text is the engine's: it detokenizes incrementally and applies the stop strings natively,
and each ``RequestChunk`` carries the text released with its tokens. This class only
accumulates (tokens, their times, text pieces), so the final text is the streamed pieces
concatenated by construction. Pure Python over RequestChunks: tested without the native
library. Consumers own one state per request; the dispatcher never touches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pycacheflow.outputs import (
    SLOT_ID_NONE,
    RequestChunk,
    RequestMetrics,
    RequestOutput,
    StreamDelta,
    finish_reason_name,
)

if TYPE_CHECKING:
    from pycacheflow.outputs import FinalInfo, PromptProgress, TokenLogprobs


class RequestState:
    """Accumulates the chunks of one request.

    Args:
        request_id: the engine's id.
        prompt: the prompt as the user gave it (None for token prompts).
        prompt_token_ids: the tokens submitted.
        stop: the request's stop strings (to name the one that ended it).
        logprobs: the request asked for token probabilities (``SamplingParams.logprobs``).
    """

    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: Sequence[int],
        stop: Sequence[str] = (),
        logprobs: bool = False,
    ) -> None:
        self.request_id = request_id
        self.stop = tuple(stop)
        self.prompt = prompt
        self.prompt_token_ids = tuple(prompt_token_ids)
        self.token_ids: list[int] = []
        self._token_times_ns: list[int] = []
        self._pieces: list[str] = []
        self._logprobs: list[TokenLogprobs] | None = [] if logprobs else None
        self._final: FinalInfo | None = None
        self.slot_id = SLOT_ID_NONE
        self.output: RequestOutput | None = None

    @property
    def finished(self) -> bool:
        """True once the final chunk was added."""
        return self._final is not None

    def add(self, chunks: RequestChunk | Sequence[RequestChunk]) -> StreamDelta:
        """Add this request's next chunk(s), in order; they become one delta.

        Returns:
            The delta they produce; on the final chunk ``delta.output`` is the RequestOutput.
        """
        if isinstance(chunks, RequestChunk):  # one chunk (itself a tuple)
            chunks = (chunks,)
        if len(chunks) == 1 and self._final is None and self._logprobs is None:
            return self._add_one(chunks[0])
        new_ids: list[int] = []
        text = []
        new_logprobs: list[TokenLogprobs] = []
        progress: list[PromptProgress] = []
        for chunk in chunks:
            if self._final is not None:
                break  # nothing follows a final chunk
            new_ids += chunk.token_ids
            new_logprobs += chunk.logprobs or ()
            progress += chunk.progress
            self._token_times_ns += chunk.token_times_ns
            text.append(chunk.text)
            self.slot_id = chunk.slot_id
            self._final = chunk.final
        self.token_ids += new_ids
        piece = "".join(text)
        self._pieces.append(piece)
        delta_logprobs = None
        if self._logprobs is not None:
            self._logprobs += new_logprobs
            delta_logprobs = tuple(new_logprobs)
        if self._final is not None:
            self.output = self._build_output(self._final)
        return StreamDelta(self.request_id, piece, tuple(new_ids), self.output, self.slot_id,
                           delta_logprobs, tuple(progress))  # fmt: skip

    def _add_one(self, chunk: RequestChunk) -> StreamDelta:
        """``add`` of one chunk of a request without token probabilities (the common case: a
        stream's output of one drain), without the merging of several."""
        token_ids = tuple(chunk.token_ids)
        self.token_ids += token_ids
        self._token_times_ns += chunk.token_times_ns
        self._pieces.append(chunk.text)
        self.slot_id = chunk.slot_id
        if chunk.final is not None:
            self._final = chunk.final
            self.output = self._build_output(chunk.final)
        return StreamDelta(self.request_id, chunk.text, token_ids, self.output, self.slot_id,
                           None, tuple(chunk.progress))  # fmt: skip

    def _build_output(self, final: FinalInfo) -> RequestOutput:
        metrics = RequestMetrics.from_times_ns(
            arrival_ns=final.arrival_ns,
            first_scheduled_ns=final.first_scheduled_ns,
            token_times_ns=self._token_times_ns,
            finish_ns=final.time_ns,
            num_prompt_tokens=final.num_prompt_tokens or len(self.prompt_token_ids),
            num_cached_tokens=final.num_cached_tokens,
            num_preemptions=final.num_preemptions,
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            text="".join(self._pieces),
            token_ids=tuple(self.token_ids),
            finish_reason=finish_reason_name(final.finish_reason) or "error",
            metrics=metrics,
            stop_string=_nth(self.stop, final.stop_string_index),
            logprobs=None if self._logprobs is None else tuple(self._logprobs),
            error=final.error,
        )


def _nth(items: tuple[str, ...], index: int) -> str | None:
    return items[index] if 0 <= index < len(items) else None
