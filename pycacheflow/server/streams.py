"""RequestGroup: the engine requests of one HTTP call, consumed on the asyncio event loop;
WorkerPool: calls off the loop (tokenization) whose results come back in batches.

The engine's dispatcher thread calls each request's ``notify`` after queueing its output; the
callback only marks the group in the loop's ``LoopWaker``, which schedules one wake-up on the
loop per drain however many streams got output (one ``call_soon_threadsafe``, not one per
stream). The loop then takes everything queued for each request with ``LLM.take_outputs``
(never blocking; output of several drains comes as one delta) and turns it into response bytes:
one write per stream per wake-up. No thread per stream, no polling:

    dispatcher thread ── notify() ──► LoopWaker.mark(group) ─(first mark of a drain)─►
        loop.call_soon_threadsafe(flush) ──► _wake() of every marked group
                                                                              │
    handler:  group.wait(), then group.take()  ◄────────────── take_outputs ◄─┘
              (or: async for index, delta in group.deltas())

A wake resolves the future of the ``wait`` in progress (no asyncio.Event, whose wait creates a
future and a waiter list entry anyway); the SSE keep-alive timeout is one timer per group that
re-arms itself, not a timer per wait.

Whatever ends the handler early (client disconnect, cancellation at shutdown, an exception)
runs ``close()``, which aborts the unfinished requests; their final "abort" deltas are taken
by the wake callback so that the LLM forgets them.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, TypeVar

from pycacheflow import errors

if TYPE_CHECKING:
    from pycacheflow.llm import LLM, PromptInput
    from pycacheflow.outputs import StreamDelta
    from pycacheflow.sampling_params import SamplingParams

T = TypeVar("T")


class LoopWaker:
    """Wakes the groups of one event loop that got output, with one loop callback per batch.

    ``mark`` runs on the dispatcher thread (cheap, never blocks on the loop: a deque append,
    atomic under the GIL, and one ``call_soon_threadsafe`` for the first mark since the last
    flush); ``_flush`` on the loop wakes every group marked since the previous flush.

    Args:
        loop: the running loop (defaults to the current one).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._marked: collections.deque[RequestGroup] = collections.deque()
        self._scheduled = False  # a _flush is pending on the loop

    def mark(self, group: RequestGroup) -> None:
        """Wake ``group`` soon (any thread; must not raise)."""
        self._marked.append(group)
        if not self._scheduled:
            # A flush that runs between the append and this test sees the group; one that ran
            # before the append left _scheduled False, so this schedules the next: none is lost
            # (at worst two flushes run, the second finding nothing).
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # loop closed (server shut down): nothing is waiting any more
                pass

    def _flush(self) -> None:
        self._scheduled = False
        marked, popleft = self._marked, self._marked.popleft
        while marked:
            popleft()._wake()


class RequestGroup:
    """Submits requests and yields their deltas on one event loop.

    Must be created and used on the loop's thread; call ``close()`` in a ``finally``. Either
    iterate ``deltas()``, or call ``take()`` and ``wait()`` in turn (a streaming response: one
    call of each per wake-up, whatever the number of requests).

    Args:
        llm: the engine.
        loop: the running loop (defaults to the current one).
        waker: the loop's shared waker (one per loop batches wake-ups); None = a private one.
    """

    def __init__(
        self,
        llm: LLM,
        loop: asyncio.AbstractEventLoop | None = None,
        waker: LoopWaker | None = None,
    ) -> None:
        self._llm = llm
        self._loop = loop or asyncio.get_running_loop()
        self._waker = waker or LoopWaker(self._loop)
        self._request_ids: list[int] = []  # index -> request id
        self._unfinished: dict[int, int] = {}  # request id -> index
        self._closed = False
        self._ready = False  # woken since the last take(): output may be queued
        self._waiter: asyncio.Future[bool] | None = None  # of the wait() in progress
        # One timer for the heartbeat, not one per wait (a wait runs per stream per step): it
        # fires at the deadline of the wait that armed it and re-arms for a later one.
        self._deadline = 0.0  # loop time at which the current wait() times out
        self._timer: asyncio.TimerHandle | None = None
        self._error: BaseException | None = None  # raised by the next take()
        self.disconnected = False  # set by ``disconnect`` (the HTTP client went away)

    @property
    def request_ids(self) -> list[int]:
        """Engine request ids, in submission order."""
        return list(self._request_ids)

    @property
    def finished(self) -> bool:
        """Every request's last delta was taken."""
        return not self._unfinished

    def submit(self, prompt: PromptInput, params: SamplingParams, priority: int = 0) -> int:
        """Submit one request (thread: the loop's); returns its index in the group.

        Raises:
            As ``LLM.add_request`` (PromptTooLongError, InvalidArgumentError, ShutdownError).
        """
        request_id = self._llm.add_request(prompt, params, priority=priority, notify=self._notify)
        index = len(self._request_ids)
        self._request_ids.append(request_id)
        self._unfinished[request_id] = index
        return index

    def submit_choices(
        self, prompt: PromptInput, params: list[SamplingParams], priority: int = 0
    ) -> list[int]:
        """Submit len(params) completions of one prompt that share its KV (``LLM.add_choices``);
        returns their indices in the group.

        Raises:
            As ``submit``.
        """
        request_ids = self._llm.add_choices(prompt, params, priority=priority, notify=self._notify)
        first = len(self._request_ids)
        for i, request_id in enumerate(request_ids):
            self._request_ids.append(request_id)
            self._unfinished[request_id] = first + i
        return list(range(first, first + len(request_ids)))

    def take(self) -> list[tuple[int, StreamDelta]]:
        """(index, delta) of everything queued now, requests in submission order, without
        blocking; a request's last delta has ``output`` set and ends it.

        Raises:
            ShutdownError: the engine was closed first (after a take that returned the deltas
                taken before it).
        """
        self._ready = False
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        out = []
        unfinished = self._unfinished
        for request_id, index in list(unfinished.items()):
            try:
                deltas = self._llm.take_outputs(request_id)
            except Exception as exc:  # raised after what was taken goes out
                if not out:
                    raise
                self._error, self._ready = exc, True
                return out
            for delta in deltas:
                if delta.finished:
                    del unfinished[request_id]
                out.append((index, delta))
        return out

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until output may be queued (or ``disconnect``); False if ``timeout_s`` passed
        first. Returns at once when woken since the last ``take``."""
        if self._ready:
            return True
        waiter = self._loop.create_future()
        self._waiter = waiter
        if timeout_s is None:
            self._deadline = math.inf  # a timer armed by an earlier wait ends nothing
        else:
            self._deadline = self._loop.time() + timeout_s
            if self._timer is None:
                self._timer = self._loop.call_at(self._deadline, self._on_timer)
        try:
            return await waiter
        finally:
            self._waiter = None

    async def deltas(
        self, heartbeat_s: float | None = None
    ) -> AsyncIterator[tuple[int, StreamDelta | None]]:
        """Yield (index, delta) for every request until all have finished.

        Each request's last delta has ``output`` set. Deltas of one request are in order;
        requests interleave.

        Args:
            heartbeat_s: if set, yield (-1, None) whenever nothing arrived for this many
                seconds (for SSE keep-alive pings).

        Raises:
            ShutdownError: the engine was closed first.
        """
        while self._unfinished:
            for item in self.take():
                yield item
            if self._unfinished and not await self.wait(heartbeat_s):
                yield -1, None

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no wait in progress: the next one arms its own timer
        if self._loop.time() >= self._deadline:
            waiter.set_result(False)
        elif self._deadline != math.inf:  # a later wait moved the deadline
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def disconnect(self) -> None:
        """The HTTP client went away: set ``disconnected`` and end the current ``wait``."""
        self.disconnected = True
        self._wake()

    def abort(self) -> None:
        """Abort every unfinished request but keep consuming: ``deltas()`` still yields their
        final "abort" deltas (used to end streams cleanly at shutdown)."""
        for request_id in list(self._unfinished):
            self._llm.abort(request_id)

    def close(self) -> int:
        """Abort every unfinished request; their final deltas are discarded. Idempotent.

        Returns:
            How many requests this call aborted.
        """
        if self._closed:
            return 0
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        num_aborted = sum(self._llm.abort(request_id) for request_id in list(self._unfinished))
        self._discard_finished()
        return num_aborted

    # ------------------------------------------------------------------ callbacks

    def _notify(self) -> None:
        # Dispatcher thread: must be cheap and must not raise.
        self._waker.mark(self)

    def _wake(self) -> None:
        self._ready = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)
        if self._closed:
            self._discard_finished()

    def _discard_finished(self) -> None:
        for request_id in list(self._unfinished):
            try:
                deltas = self._llm.take_outputs(request_id)
            except (errors.NotFoundError, errors.ShutdownError):
                deltas = None
            if deltas is None or any(d.finished for d in deltas):
                del self._unfinished[request_id]


class WorkerPool:
    """Runs calls on worker threads for one event loop (``run``), for work that releases the
    GIL (a prompt's tokenization); results come back in batches: one ``call_soon_threadsafe``
    (one wake-up of the loop, a write to its self-pipe) for all calls that finished since the
    loop last took results, where ``loop.run_in_executor`` pays one per call, plus a
    concurrent Future chained to an asyncio one. Threads start on demand (at most
    ``max_threads``), are daemons and wait on a queue when idle.

    Args:
        loop: the loop whose coroutines call ``run`` (defaults to the current one).
        max_threads: worker threads at most; None = ThreadPoolExecutor's default,
            min(32, cores + 4).
        name: the threads' name prefix.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        max_threads: int | None = None,
        name: str = "cacheflow-worker",
    ) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._max_threads = max_threads or min(32, (os.cpu_count() or 1) + 4)
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: collections.deque = collections.deque()  # (future, result, exception)
        self._scheduled = False  # a _flush is pending on the loop
        self._lock = threading.Lock()  # guards _num_threads, _num_idle
        self._num_threads = 0
        self._num_idle = 0

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on a worker thread; its result, or what it raised. Cancelling the
        caller does not stop a call already running (its result is dropped)."""
        future = self._loop.create_future()
        self._jobs.put((future, fn, args))
        with self._lock:
            # _num_idle: idle threads minus queued calls no thread took yet
            start = self._num_idle <= 0 and self._num_threads < self._max_threads
            if start:
                self._num_threads += 1
                name = f"{self._name}_{self._num_threads - 1}"
            else:
                self._num_idle -= 1  # a waiting thread takes it (none: it waits its turn)
        if start:
            threading.Thread(target=self._work, name=name, daemon=True).start()
        return await future

    def _work(self) -> None:
        while True:
            future, fn, args = self._jobs.get()
            try:
                item = (future, fn(*args), None)
            except BaseException as exc:  # handed to the caller
                item = (future, None, exc)
            self._done.append(item)
            if not self._scheduled:  # (as LoopWaker.mark: no result is left behind)
                self._scheduled = True
                try:
                    self._loop.call_soon_threadsafe(self._flush)
                except RuntimeError:  # loop closed: nobody waits for the result
                    pass
            del future, fn, args, item
            with self._lock:
                self._num_idle += 1

    def _flush(self) -> None:
        self._scheduled = False
        done, popleft = self._done, self._done.popleft
        while done:
            future, result, exc = popleft()
            if future.cancelled():
                continue
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)
