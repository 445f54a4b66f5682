"""SlotTable: llama-server's "slots" view (GET /slots, ``id_slot``) over CacheFlow requests.

The slot ids are the engine's (cf_output_event.slot_id): a request takes the lowest free slot
id in [0, max_num_seqs) when the scheduler first runs it and gives it back when it finishes or
is preempted (a preempted request may resume in another slot). This table only records the slot
each in-flight HTTP completion last reported, with its settings and progress, for /slots and
``fail_on_no_slot``: a request still queued in the engine holds no slot, as in llama-server.
"""

from __future__ import annotations

from dataclasses import dataclass

from pycacheflow.outputs import SLOT_ID_NONE


@dataclass
class _Request:
    settings: dict[str, object]
    slot_id: int = SLOT_ID_NONE
    num_decoded: int = 0
    has_new_line: bool = False


class SlotTable:
    """Slots of in-flight requests as the engine reports them (one thread: the event loop).

    Args:
        num_slots: max_num_seqs of the engine, >= 1.
        n_ctx: tokens per sequence, reported per slot.
    """

    def __init__(self, num_slots: int, n_ctx: int) -> None:
        self.num_slots = num_slots
        self.n_ctx = n_ctx
        self._requests: dict[int, _Request] = {}
        self._holders: dict[int, int] = {}  # slot id -> request id that reported it last

    @property
    def num_free(self) -> int:
        """Slots no in-flight request reported."""
        return self.num_slots - len(self._holders)

    def add(self, request_id: int, settings: dict[str, object]) -> None:
        """Register a submitted request (it holds no slot until the engine reports one)."""
        self._requests[request_id] = _Request(settings)

    def remove(self, request_id: int) -> None:
        """Forget a request that ended. Unknown ids are ignored (idempotent)."""
        request = self._requests.pop(request_id, None)
        if request is not None and self._holders.get(request.slot_id) == request_id:
            del self._holders[request.slot_id]

    def update(self, request_id: int, slot_id: int) -> None:
        """Record the slot the engine reported for a request (SLOT_ID_NONE: none yet)."""
        request = self._requests.get(request_id)
        if request is None or slot_id == SLOT_ID_NONE or slot_id == request.slot_id:
            return
        if self._holders.get(request.slot_id) == request_id:
            del self._holders[request.slot_id]
        request.slot_id = slot_id
        self._holders[slot_id] = request_id

    def slot_of(self, request_id: int) -> int:
        """The slot the engine last reported for the request (SLOT_ID_NONE if none)."""
        request = self._requests.get(request_id)
        return SLOT_ID_NONE if request is None else request.slot_id

    def progress(self, request_id: int, num_new_tokens: int, text: str) -> None:
        """Account streamed output of a request."""
        request = self._requests.get(request_id)
        if request is not None:
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
        holder = self._holders.get(slot_id)
        busy = self._requests[holder] if holder is not None else None
        slot: dict[str, object] = {
            "id": slot_id,
            "id_task": holder if holder is not None else -1,
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
