"""RequestState: turns one request's output events into stream deltas and a RequestOutput.

Pure Python over ``OutputEvent``s and a detokenize callable, so it is tested without the native
library. Consumers own one state per request; the dispatcher never touches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pycacheflow.detokenizer import (
    DetokenizeFn,
    IncrementalDetokenizer,
    StopStringMatcher,
    truncate_at_stop,
)
from pycacheflow.outputs import (
    FINISH_REASON_NONE,
    TOKEN_NONE,
    RequestMetrics,
    RequestOutput,
    StreamDelta,
    finish_reason_name,
)

if TYPE_CHECKING:
    from pycacheflow.outputs import OutputEvent
    from pycacheflow.sampling_params import SamplingParams


class RequestState:
    """Accumulates the events of one request.

    Args:
        request_id: the engine's id.
        prompt: the prompt as the user gave it (None for token prompts).
        prompt_token_ids: the tokens submitted.
        params: the request's sampling parameters (stop strings are applied here).
        detokenize: token ids -> UTF-8 bytes, as for the final text.
        streaming: keep incremental text state so ``add`` returns text deltas; without it
            ``add`` only accumulates and the text is decoded once at the end.
    """

    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        detokenize: DetokenizeFn,
        streaming: bool = False,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = tuple(prompt_token_ids)
        self.params = params
        self._detokenize = detokenize
        self.token_ids: list[int] = []
        self._token_times_ns: list[int] = []
        self._final: OutputEvent | None = None
        self._incremental = IncrementalDetokenizer(detokenize) if streaming else None
        self._matcher = StopStringMatcher(params.stop) if streaming else None
        self.output: RequestOutput | None = None

    @property
    def finished(self) -> bool:
        """True once the final event was added."""
        return self._final is not None

    @property
    def hit_stop_string(self) -> bool:
        """True once streamed text contained a stop string (the caller should abort the request
        if the engine has not finished it by itself)."""
        return self._matcher is not None and self._matcher.stopped

    def add(self, events: Sequence[OutputEvent]) -> StreamDelta:
        """Add this request's next events (in order).

        Returns:
            The delta they produce; on the final event ``delta.output`` is the RequestOutput.
        """
        new_ids = []
        for event in events:
            if self._final is not None:
                break  # nothing follows a final event
            if event.token_id != TOKEN_NONE:
                new_ids.append(event.token_id)
                self._token_times_ns.append(event.time_ns)
            if event.finish_reason != FINISH_REASON_NONE:
                self._final = event
        self.token_ids.extend(new_ids)
        text = self._stream_text(new_ids)
        if self._final is not None:
            self.output = self._build_output()
        return StreamDelta(self.request_id, text, tuple(new_ids), self.output)

    def _stream_text(self, new_ids: list[int]) -> str:
        if self._incremental is None or self._matcher is None:
            return ""
        text = self._matcher.push(self._incremental.push(new_ids))
        if self._final is not None:
            text += self._matcher.push(self._incremental.flush()) + self._matcher.flush()
        return text

    def _build_output(self) -> RequestOutput:
        final = self._final
        assert final is not None
        text, stopped = truncate_at_stop(
            self._detokenize(self.token_ids).decode("utf-8", errors="replace"), self.params.stop
        )
        reason = finish_reason_name(final.finish_reason)
        if stopped or self.hit_stop_string:
            reason = "stop"  # also when Python saw the stop string first and aborted
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
            text=text,
            token_ids=tuple(self.token_ids),
            finish_reason=reason or "error",
            metrics=metrics,
        )
