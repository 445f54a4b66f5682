"""RequestGroup: the engine requests of one HTTP call, consumed on the asyncio event loop.

The engine's dispatcher thread calls each request's ``notify`` after queueing its output; the
callback only marks the group in the loop's ``LoopWaker``, which schedules one wake-up on the
loop per drain however many streams got output (one ``call_soon_threadsafe``, not one per
stream). The loop then takes everything queued for each request with ``LLM.take_outputs``
(never blocking; output of several drains comes as one delta) and turns it into response bytes:
one write per stream per wake-up. No thread per stream, no polling:

    dispatcher thread ── notify() ──► LoopWaker.mark(group) ─(first mark of a drain)─►
        loop.call_soon_threadsafe(flush) ──► Event.set() of every marked group
                                                                              │
    handler:  async for index, delta in group.deltas():  ◄── take_outputs ◄──┘

Whatever ends the handler early (client disconnect, cancellation at shutdown, an exception)
runs ``close()``, which aborts the unfinished requests; their final "abort" deltas are taken
by the wake callback so that the LLM forgets them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from pycacheflow import errors

if TYPE_CHECKING:
    from pycacheflow.llm import LLM, PromptInput
    from pycacheflow.outputs import StreamDelta
    from pycacheflow.sampling_params import SamplingParams


class LoopWaker:
    """Wakes the groups of one event loop that got output, with one loop callback per batch.

    ``mark`` runs on the dispatcher thread (cheap, never blocks on the loop); ``_flush`` on the
    loop wakes every group marked since the previous flush.

    Args:
        loop: the running loop (defaults to the current one).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._marked: set[RequestGroup] = set()

    def mark(self, group: RequestGroup) -> None:
        """Wake ``group`` soon (any thread; must not raise)."""
        with self._lock:
            first = not self._marked
            self._marked.add(group)
        if first:
            try:
                self._loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # loop closed (server shut down): nothing is waiting any more
                pass

    def _flush(self) -> None:
        with self._lock:
            marked, self._marked = self._marked, set()
        for group in marked:
            group._wake()


class RequestGroup:
    """Submits requests and yields their deltas on one event loop.

    Must be created and used on the loop's thread; call ``close()`` in a ``finally``.

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
        self._event = asyncio.Event()
        self._request_ids: list[int] = []  # index -> request id
        self._unfinished: dict[int, int] = {}  # request id -> index
        self._closed = False
        self._timed_out = False  # the last _wait ended by its timeout

    @property
    def request_ids(self) -> list[int]:
        """Engine request ids, in submission order."""
        return list(self._request_ids)

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
            self._event.clear()  # before taking: a notify from now on wakes the next wait
            for request_id, index in list(self._unfinished.items()):
                for delta in self._llm.take_outputs(request_id):
                    if delta.finished:
                        del self._unfinished[request_id]
                    yield index, delta
            if self._unfinished and not await self._wait(heartbeat_s):
                yield -1, None

    async def _wait(self, timeout_s: float | None) -> bool:
        """Wait for a notify; False if ``timeout_s`` passed first.

        One timer handle per wait (no task, unlike ``asyncio.wait_for``): this runs once per
        stream per engine step.
        """
        if timeout_s is None or self._event.is_set():
            await self._event.wait()
            return True
        self._timed_out = False
        timer = self._loop.call_later(timeout_s, self._on_timeout)
        try:
            await self._event.wait()
        finally:
            timer.cancel()
        return not self._timed_out

    def _on_timeout(self) -> None:
        self._timed_out = True
        self._event.set()

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
        num_aborted = sum(self._llm.abort(request_id) for request_id in list(self._unfinished))
        self._discard_finished()
        return num_aborted

    # ------------------------------------------------------------------ callbacks

    def _notify(self) -> None:
        # Dispatcher thread: must be cheap and must not raise.
        self._waker.mark(self)

    def _wake(self) -> None:
        self._event.set()
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
