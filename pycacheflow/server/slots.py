"""SlotTable: llama-server's "slots" view (GET /slots, ``id_slot``) over CacheFlow requests.

llama-server runs one request per slot (``-np`` slots, ids 0..np-1) and defers the rest until a
slot frees. CacheFlow has no slots: the scheduler runs up to ``max_num_seqs`` sequences and
queues the rest. For compatibility every in-flight HTTP completion is given a slot id in
[0, max_num_seqs), never -1:

  - when submitted, it takes the lowest free slot, else it waits (FIFO, like llama-server's
    deferred tasks) and takes the next slot given back;
  - the engine, not this table, decides what runs. A waiting request that produces output
    before it got a slot (the "priority" or "sjf" policy ran it ahead of older ones) takes a free
    slot, else the slot of a request whose slot id no response has shown yet (that one waits
    again), else -- only when more requests than slots have produced output, i.e. after paged
    preemption -- it shares a slot with the request holding it, which /slots shows until it
    ends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

_NO_SLOT = -1  # internal: a request still waiting for a slot


@dataclass
class _Request:
    settings: dict[str, object]
    slot_id: int = _NO_SLOT
    reported: bool = False  # its slot id went out in a response (it may not change any more)
    num_decoded: int = 0
    has_new_line: bool = False


class SlotTable:
    """Slot ids of in-flight requests (one thread: the event loop).

    Args:
        num_slots: max_num_seqs of the engine, >= 1.
        n_ctx: tokens per sequence, reported per slot.
    """

    def __init__(self, num_slots: int, n_ctx: int) -> None:
        self.num_slots = num_slots
        self.n_ctx = n_ctx
        self._requests: dict[int, _Request] = {}
        self._holders: list[list[int]] = [[] for _ in range(num_slots)]  # slot -> request ids
        self._waiting: deque[int] = deque()  # request ids without a slot, oldest first

    @property
    def num_free(self) -> int:
        """Slots without a request."""
        return sum(not holders for holders in self._holders)

    def add(self, request_id: int, settings: dict[str, object]) -> None:
        """Register a submitted request: it takes the lowest free slot, or waits for one."""
        self._requests[request_id] = _Request(settings)
        free = self._free_slot()
        if free is None:
            self._waiting.append(request_id)
        else:
            self._take(request_id, free)

    def remove(self, request_id: int) -> None:
        """Forget a request that ended; its slot goes to the oldest waiting one. Unknown ids
        are ignored (idempotent)."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        if request.slot_id == _NO_SLOT:
            self._waiting.remove(request_id)
            return
        holders = self._holders[request.slot_id]
        holders.remove(request_id)
        if not holders and self._waiting:
            self._take(self._waiting.popleft(), request.slot_id)

    def slot_of(self, request_id: int) -> int:
        """The request's slot id, in [0, num_slots); a waiting request is moved into a slot
        (see the module docstring). Call once the request has output to report."""
        request = self._requests[request_id]
        if request.slot_id == _NO_SLOT:
            self._waiting.remove(request_id)
            self._take(request_id, self._slot_for_running())
        request.reported = True
        return request.slot_id

    def progress(self, request_id: int, num_new_tokens: int, text: str) -> None:
        """Account streamed output of a request (which then holds a slot)."""
        request = self._requests.get(request_id)
        if request is not None:
            self.slot_of(request_id)
            request.num_decoded += num_new_tokens
            request.has_new_line = request.has_new_line or "\n" in text

    def to_json(self, default_settings: dict[str, object]) -> list[dict[str, object]]:
        """GET /slots: one object per slot, as llama-server."""
        return [self.slot_json(i, default_settings) for i in range(self.num_slots)]

    def slot_json(
        self, slot_id: int, default_settings: dict[str, object], idle_params: bool = False
    ) -> dict[str, object]:
        """One slot's state, as llama-server's: a busy slot shows its request's settings
        (``params``) and progress (``next_token``, a one-element list); an idle slot only its
        id, context and state, unless ``idle_params`` (for /props: the default settings)."""
        holders = self._holders[slot_id]
        busy = self._requests[holders[0]] if holders else None
        slot: dict[str, object] = {
            "id": slot_id,
            "id_task": holders[0] if holders else -1,
            "n_ctx": self.n_ctx,
            "speculative": False,
            "is_processing": busy is not None,
        }
        if busy is not None or idle_params:
            slot["params"] = busy.settings if busy else default_settings
            slot["next_token"] = [{
                "has_next_token": busy is not None,
                "has_new_line": busy.has_new_line if busy else False,
                "n_remain": -1,
                "n_decoded": busy.num_decoded if busy else 0,
            }]  # fmt: skip
        return slot

    # ------------------------------------------------------------------ internals

    def _free_slot(self) -> int | None:
        return next((i for i, holders in enumerate(self._holders) if not holders), None)

    def _take(self, request_id: int, slot_id: int) -> None:
        self._requests[request_id].slot_id = slot_id
        self._holders[slot_id].append(request_id)

    def _slot_for_running(self) -> int:
        """A slot for a waiting request that the engine runs already."""
        free = self._free_slot()
        if free is not None:
            return free
        for slot_id, holders in enumerate(self._holders):
            holder = self._requests[holders[0]]
            if len(holders) == 1 and not holder.reported:  # not running yet: it waits again
                holder.slot_id = _NO_SLOT
                self._waiting.appendleft(holders.pop())
                return slot_id
        return min(range(self.num_slots), key=lambda i: len(self._holders[i]))
