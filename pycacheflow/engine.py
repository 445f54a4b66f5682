"""EngineRunner: runs a native Engine in the background and routes its output events.

The native step thread (``cf_engine_start``) does all per-step work, text and stop strings
included. One Python dispatcher thread blocks in ``cf_engine_drain_outputs`` (GIL released),
takes every queued event as one numpy array plus one text buffer, splits them by request with
array operations (``split_by_request``) and hands each request its ``RequestChunk`` (its tokens,
times and text of the drain, merged) with one queue put: Python work per drain grows with the
requests in it, not with their tokens. Any number of consumer threads (``LLM.generate`` calls,
HTTP handlers) wait on their own streams.

    add_request ──► native queue ──► step thread ──► event queue (+ text)
                                                        │ cf_engine_drain_outputs (arrays)
                                               dispatcher thread
                                        ┌───────────────┼───────────────┐
                                  RequestStream   RequestStream   RequestStream ──► consumers

A request is registered under the routing lock in the same critical section that submits it,
so its first events can never arrive before its stream exists.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from pycacheflow import errors
from pycacheflow.outputs import (
    FINISH_REASON_NONE,
    TOKEN_NONE,
    FinalInfo,
    PromptProgress,
    RequestChunk,
    TokenLogprobs,
)

if TYPE_CHECKING:
    from pycacheflow._native import Engine
    from pycacheflow.sampling_params import SamplingParams

_DRAIN_TIMEOUT_MS = 100  # bounds how long close() waits for the dispatcher to notice


class RequestStream:
    """The output chunks of one request, in order, filled by the dispatcher thread.

    Args:
        request_id: the engine's request id.
        notify: called on the dispatcher thread after new events were queued (e.g.
            ``lambda: loop.call_soon_threadsafe(ev.set)`` for an asyncio server). Must be cheap
            and must not block or raise.
    """

    def __init__(self, request_id: int, notify: Callable[[], None] | None = None) -> None:
        self.request_id = request_id
        self._queue: queue.SimpleQueue[RequestChunk | BaseException] = queue.SimpleQueue()
        self._notify = notify
        self.finished = False  # set by the consumer once the final event was read

    def _put(self, item: RequestChunk | BaseException) -> None:
        self._queue.put(item)
        if self._notify is not None:
            self._notify()

    def get(self, timeout: float | None = None) -> RequestChunk:
        """Next chunk (blocks).

        Args:
            timeout: seconds to wait at most; None = forever.

        Returns:
            The request's output of one drain; the last chunk has ``final`` set.

        Raises:
            queue.Empty: timeout passed.
            ShutdownError: the runner was closed before the request finished.
        """
        item = self._queue.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def get_nowait(self) -> RequestChunk | None:
        """Next chunk if one is queued, else None (for event-loop consumers woken by notify)."""
        try:
            return self.get(timeout=0)
        except queue.Empty:
            return None

    def take_queued(self) -> list[RequestChunk | BaseException]:
        """Everything queued now, in order, without blocking ([] if nothing): chunks, and the
        exception that failed the stream where one was queued (the caller raises it). One
        consumer per stream (``empty`` then ``get`` cannot race with another taker); no
        exception is raised for an empty queue, which an event-loop consumer would pay for on
        every wake-up."""
        q = self._queue
        items = []
        while not q.empty():
            items.append(q.get_nowait())
        return items

    def chunks(self) -> Iterator[RequestChunk]:
        """Iterate over the request's chunks until its final one (blocks between them)."""
        while not self.finished:
            chunk = self.get()
            self.finished = chunk.final is not None
            yield chunk


class EngineRunner:
    """Owns an Engine while its step thread and the dispatcher thread run.

    Args:
        engine: an open engine; the runner takes ownership and closes it in ``close()``.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()  # guards _streams and _closed
        self._streams: dict[int, RequestStream] = {}
        self._closed = False
        self._stop = threading.Event()
        engine.start()
        self._thread = threading.Thread(
            target=self._dispatch, name="cacheflow-dispatch", daemon=True
        )
        self._thread.start()

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        notify: Callable[[], None] | None = None,
    ) -> RequestStream:
        """Submit a request and return its stream (thread-safe).

        Args:
            prompt_token_ids: [num_prompt_tokens] int32 token ids.
            params: sampling parameters.
            priority: smaller first under the "priority" policy.
            notify: see ``RequestStream``.

        Raises:
            ShutdownError: the runner is closed. Native errors as ``Engine.add_request``.
        """
        with self._lock:
            if self._closed:
                raise errors.ShutdownError("engine is closed")
            request_id = self.engine.add_request(prompt_token_ids, params, priority)
            stream = RequestStream(request_id, notify)
            self._streams[request_id] = stream
        return stream

    def add_requests(
        self, requests: Sequence[tuple[Sequence[int], SamplingParams]]
    ) -> list[RequestStream]:
        """Submit (prompt_token_ids, params) requests together (one engine step admits them
        all; see ``Engine.add_requests``) and return their streams in order (thread-safe).

        Raises:
            ShutdownError: the runner is closed. Native errors as ``Engine.add_requests``
            (nothing is submitted then).
        """
        with self._lock:
            if self._closed:
                raise errors.ShutdownError("engine is closed")
            ids = self.engine.add_requests([(tokens, params, 0) for tokens, params in requests])
            streams = [RequestStream(request_id) for request_id in ids]
            for stream in streams:
                self._streams[stream.request_id] = stream
        return streams

    def add_choices(
        self,
        prompt_token_ids: Sequence[int],
        params: Sequence[SamplingParams],
        priority: int = 0,
        notify: Callable[[], None] | None = None,
    ) -> list[RequestStream]:
        """Submit len(params) completions of one prompt together (thread-safe): in paged mode
        they share the prompt's KV (the engine forks it, copy-on-write), each sampled with its
        own params. Arguments as ``add_request``; returns the streams in order.

        Raises:
            As ``add_request``; nothing is submitted on failure.
        """
        requests = [(prompt_token_ids, p, priority, len(params) - 1 if i == 0 else 0)
                    for i, p in enumerate(params)]  # fmt: skip
        with self._lock:
            if self._closed:
                raise errors.ShutdownError("engine is closed")
            ids = self.engine.add_requests(requests)
            streams = [RequestStream(request_id, notify) for request_id in ids]
            for stream in streams:
                self._streams[stream.request_id] = stream
        return streams

    def abort(self, request_id: int) -> bool:
        """Abort a request; its stream still receives a final "abort" event.

        Returns:
            False if the request was unknown or had already finished, or the runner is closed.
        """
        try:
            self.engine.abort(request_id)
        except (errors.NotFoundError, errors.ShutdownError):
            return False
        return True

    def close(self) -> None:
        """Stop both threads and free the engine (which drops unfinished requests).

        Streams of unfinished requests receive ShutdownError.

        Idempotent; must not be called from the dispatcher thread or a ``notify`` callback.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self.engine.stop()
        self._thread.join()
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream._put(errors.ShutdownError("engine closed before the request finished"))
        self.engine.close()

    @property
    def num_active(self) -> int:
        """Requests submitted and not yet finished."""
        with self._lock:
            return len(self._streams)

    def _dispatch(self) -> None:
        while not self._stop.is_set():
            try:
                events, text, logprobs = self.engine.drain_outputs(timeout_ms=_DRAIN_TIMEOUT_MS)
            except errors.CacheFlowError as exc:  # engine broken: fail every waiter
                self._fail_all(exc)
                return
            if len(events):
                self._route(split_by_request(events, text, logprobs))

    def _route(self, chunks: list[RequestChunk]) -> None:
        with self._lock:
            targets = []
            for chunk in chunks:
                stream = self._streams.get(chunk.request_id)
                if stream is None:
                    continue  # not submitted through this runner
                if chunk.final is not None:
                    del self._streams[chunk.request_id]
                targets.append((stream, chunk))
        for stream, chunk in targets:
            stream._put(chunk)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream._put(exc)


def split_by_request(
    events: np.ndarray, text: bytes, logprobs: np.ndarray | None = None
) -> list[RequestChunk]:
    """One RequestChunk per request of a drain, in order of each request's first event.

    Args:
        events: [num_events] EVENT_DTYPE array as ``Engine.drain_outputs`` returns it (a
            request's events in order; nothing follows a request's final event).
        text: the drain's text buffer (event i's bytes at text_offset[i], text_len[i] long).
        logprobs: the drain's [num_logprobs] LOGPROB_DTYPE buffer (event i's entries at
            logprobs_offset[i], num_logprobs[i] long); None or empty when no request asked.

    Returns:
        The chunks: each request's tokens (events without a token left out), their times, its
        text pieces concatenated and decoded (the engine releases whole characters only), its
        latest slot id, the final fields when its last event is among them, for requests
        with token probabilities one ``TokenLogprobs`` per token (no Python object per token
        for the others), and for requests that asked for prompt progress its
        ``PromptProgress`` reports (progress events carry no token; a drain without any costs
        one array test).
    """
    request_ids = events["request_id"]
    order = np.argsort(request_ids, kind="stable")  # each request's events together, in order
    ids_sorted = request_ids[order]
    starts = np.flatnonzero(np.r_[True, ids_sorted[1:] != ids_sorted[:-1]])
    bounds = sorted(zip(order[starts].tolist(), starts.tolist(), np.r_[starts[1:], len(order)].tolist()))
    byte_ends = np.cumsum(events["text_len"][order])
    reasons = _error_reasons(events, text)
    text = _gather_text(events, order, text, byte_ends, bool(reasons))
    # Whole columns to Python lists once; per request only list slices remain.
    token_ids = events["token_id"][order].tolist()
    times = events["time_ns"][order].tolist()
    slot_ids = events["slot_id"][order].tolist()
    finish = events["finish_reason"][order].tolist()
    byte_end = [0] + byte_ends.tolist()
    all_tokens = TOKEN_NONE not in token_ids
    probs = _Logprobs(events, order, logprobs, text, byte_end)
    is_progress = events["prompt_progress"][order]
    any_progress = bool(is_progress.any())
    if any_progress:
        is_progress = is_progress.tolist()
    request_ids_sorted = ids_sorted.tolist()
    # the "final" fields of the drain's last events, column by column (reading them from a
    # numpy record field by field cost ~1 us a field)
    final_positions = np.flatnonzero(events["finish_reason"][order] != FINISH_REASON_NONE)
    finals = {}
    if len(final_positions):
        rows = order[final_positions]
        columns = [events[f][rows].tolist() for f in _FINAL_FIELDS]
        finals = dict(zip(final_positions.tolist(), zip(*columns)))
    chunks = []
    append = chunks.append
    # Per request only list slices and one tuple: this loop runs for every request of every
    # step (a decode step of 256 streams: 256 times), on the dispatcher thread, holding the GIL.
    for _, start, end in bounds:
        ids, stamps = token_ids[start:end], times[start:end]
        if not all_tokens:
            kept = [i for i, t in enumerate(ids) if t != TOKEN_NONE]
            ids, stamps = [ids[i] for i in kept], [stamps[i] for i in kept]
        final = None
        if finish[end - 1] != FINISH_REASON_NONE:
            final = FinalInfo(*finals[end - 1], error=reasons.get(request_ids_sorted[start]))
        piece = text[byte_end[start]:byte_end[end]].decode("utf-8", errors="replace")
        progress = ()
        if any_progress and any(is_progress[start:end]):
            progress = _progress(events, order[start:end])
        append(RequestChunk(request_ids_sorted[start], ids, stamps, piece, slot_ids[end - 1],
                            final, probs.of(start, end) if probs.any else None, progress))  # fmt: skip
    return chunks


def _progress(events: np.ndarray, rows: np.ndarray) -> tuple[PromptProgress, ...]:
    """The PromptProgress of the progress events among ``rows`` (one request's, in order)."""
    return tuple(
        PromptProgress(int(ev["num_prompt_tokens"]), int(ev["num_cached_tokens"]),
                       int(ev["num_prompt_processed"]), int(ev["time_ns"]),
                       int(ev["first_scheduled_ns"]))  # fmt: skip
        for ev in events[rows]
        if ev["prompt_progress"]
    )


class _Logprobs:
    """The token probabilities of one drain, read per request (``split_by_request``).

    Positions are in the drain's request order (``order``); only events with entries become
    ``TokenLogprobs``, so a drain in which no request asked for them costs one array test.
    """

    def __init__(self, events: np.ndarray, order: np.ndarray, logprobs: np.ndarray | None,
                 text: bytes, byte_end: list[int]) -> None:  # fmt: skip
        self.any = logprobs is not None and len(logprobs) > 0  # False: ``of`` is always None
        if not self.any:
            return
        self._counts = events["num_logprobs"][order].tolist()
        self._offsets = events["logprobs_offset"][order].tolist()
        self._token_ids = logprobs["token_id"].tolist()
        self._values = logprobs["logprob"].tolist()
        self._text, self._byte_end = text, byte_end

    def of(self, start: int, end: int) -> list[TokenLogprobs] | None:
        """TokenLogprobs of the events [start, end) in request order, or None if none has any."""
        if not self.any or not any(self._counts[start:end]):
            return None
        out = []
        for k in range(start, end):
            count = self._counts[k]
            if count == 0:
                continue
            first = self._offsets[k]
            ids, values = self._token_ids[first:first + count], self._values[first:first + count]
            piece = self._text[self._byte_end[k]:self._byte_end[k + 1]]
            out.append(TokenLogprobs(ids[0], values[0], tuple(zip(ids[1:], values[1:])),
                                     piece.decode("utf-8", errors="replace")))  # fmt: skip
        return out


_FINAL_FIELDS = tuple(f for f in FinalInfo.__dataclass_fields__ if f != "error")


def _error_reasons(events: np.ndarray, text: bytes) -> dict[int, str]:
    """request id -> the reason of its "error" end, for the final events that carry one (their
    error_len bytes follow their text in the buffer; rare: one array test otherwise)."""
    if not events["error_len"].any():
        return {}
    reasons = {}
    for ev in events[events["error_len"] > 0]:
        start = int(ev["text_offset"]) + int(ev["text_len"])
        piece = text[start : start + int(ev["error_len"])]
        reasons[int(ev["request_id"])] = piece.decode("utf-8", errors="replace")
    return reasons


def _gather_text(
    events: np.ndarray, order: np.ndarray, text: bytes, byte_ends: np.ndarray, gaps: bool = False
) -> bytes:
    """The events' text bytes in ``order`` (so each request's bytes are contiguous); ``gaps``:
    the buffer also holds bytes of no event's text (error reasons), which are left out."""
    if not text or (not gaps and np.array_equal(order, np.arange(len(order)))):
        return text  # already in that order (one request, or requests not interleaved)
    lens = events["text_len"][order].astype(np.int64)
    offsets = events["text_offset"][order]
    # byte k of the result comes from offsets[i] + (k - start of event i in the result)
    index = np.repeat(offsets - (byte_ends - lens), lens) + np.arange(int(byte_ends[-1]))
    return np.frombuffer(text, dtype=np.uint8)[index].tobytes()
