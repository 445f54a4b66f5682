"""EngineRunner: runs a native Engine in the background and routes its output events.

The native step thread (``cf_engine_start``) does all per-step work. One Python dispatcher
thread blocks in ``cf_engine_drain`` (GIL released), takes events in batches and hands each
request's share of a batch to that request's ``RequestStream`` with one queue put. Any number
of consumer threads (``LLM.generate`` calls, HTTP handlers) wait on their own streams.

    add_request ──► native queue ──► step thread ──► event queue
                                                        │ cf_engine_drain (batches)
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

from pycacheflow import errors

if TYPE_CHECKING:
    from pycacheflow._native import Engine
    from pycacheflow.outputs import OutputEvent
    from pycacheflow.sampling_params import SamplingParams

_DRAIN_TIMEOUT_MS = 100  # bounds how long close() waits for the dispatcher to notice


class RequestStream:
    """The output events of one request, in order, filled by the dispatcher thread.

    Args:
        request_id: the engine's request id.
        notify: called on the dispatcher thread after new events were queued (e.g.
            ``lambda: loop.call_soon_threadsafe(ev.set)`` for an asyncio server). Must be cheap
            and must not block or raise.
    """

    def __init__(self, request_id: int, notify: Callable[[], None] | None = None) -> None:
        self.request_id = request_id
        self._queue: queue.SimpleQueue[list[OutputEvent] | BaseException] = queue.SimpleQueue()
        self._notify = notify
        self.finished = False  # set by the consumer once the final event was read

    def _put(self, item: list[OutputEvent] | BaseException) -> None:
        self._queue.put(item)
        if self._notify is not None:
            self._notify()

    def get(self, timeout: float | None = None) -> list[OutputEvent]:
        """Next batch of events (blocks).

        Args:
            timeout: seconds to wait at most; None = forever.

        Returns:
            One or more events in order; the request's last event has finish_reason != 0.

        Raises:
            queue.Empty: timeout passed.
            ShutdownError: the runner was closed before the request finished.
        """
        item = self._queue.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def get_nowait(self) -> list[OutputEvent] | None:
        """Next batch if one is queued, else None (for event-loop consumers woken by notify)."""
        try:
            return self.get(timeout=0)
        except queue.Empty:
            return None

    def events(self) -> Iterator[OutputEvent]:
        """Iterate over the request's events until its final one (blocks between batches)."""
        while not self.finished:
            for event in self.get():
                yield event
                if event.finish_reason != 0:
                    self.finished = True


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
                events = self.engine.drain(timeout_ms=_DRAIN_TIMEOUT_MS)
            except errors.CacheFlowError as exc:  # engine broken: fail every waiter
                self._fail_all(exc)
                return
            if events:
                self._route(events)

    def _route(self, events: list[OutputEvent]) -> None:
        by_request: dict[int, list[OutputEvent]] = {}
        for event in events:
            by_request.setdefault(event.request_id, []).append(event)
        with self._lock:
            targets = []
            for request_id, batch in by_request.items():
                stream = self._streams.get(request_id)
                if stream is None:
                    continue  # not submitted through this runner
                if batch[-1].finish_reason != 0:
                    del self._streams[request_id]
                targets.append((stream, batch))
        for stream, batch in targets:
            stream._put(batch)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream._put(exc)
