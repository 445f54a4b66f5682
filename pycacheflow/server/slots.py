"""SlotTable: llama-server's "slots" view (GET /slots, ``id_slot``) over CacheFlow requests.

llama-server runs one request per slot (``-np`` slots). CacheFlow has no slots: the scheduler
runs up to ``max_num_seqs`` sequences and queues the rest. For compatibility each in-flight
HTTP completion takes the lowest free slot id in [0, max_num_seqs) when it is submitted and
gives it back when it ends; one submitted while all are taken gets -1 (the engine queues it,
as llama-server defers it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Busy:
    request_id: int
    settings: dict[str, object]
    num_decoded: int = 0
    has_new_line: bool = False


class SlotTable:
    """Slot ids of in-flight requests (one thread: the event loop).

    Args:
        num_slots: max_num_seqs of the engine, >= 1.
        n_ctx: tokens per sequence, reported per slot.
    """

    NO_SLOT = -1

    def __init__(self, num_slots: int, n_ctx: int) -> None:
        self.num_slots = num_slots
        self.n_ctx = n_ctx
        self._busy: dict[int, _Busy] = {}

    @property
    def num_free(self) -> int:
        """Slots without a request."""
        return self.num_slots - len(self._busy)

    def acquire(self, request_id: int, settings: dict[str, object]) -> int:
        """Give the request the lowest free slot id; NO_SLOT (-1) when all are taken."""
        for slot_id in range(self.num_slots):
            if slot_id not in self._busy:
                self._busy[slot_id] = _Busy(request_id, settings)
                return slot_id
        return self.NO_SLOT

    def release(self, slot_id: int) -> None:
        """Free a slot (NO_SLOT and already free ids are ignored)."""
        self._busy.pop(slot_id, None)

    def progress(self, slot_id: int, num_new_tokens: int, text: str) -> None:
        """Account streamed output of the request in ``slot_id``."""
        busy = self._busy.get(slot_id)
        if busy is not None:
            busy.num_decoded += num_new_tokens
            busy.has_new_line = busy.has_new_line or "\n" in text

    def to_json(self, default_settings: dict[str, object]) -> list[dict[str, object]]:
        """GET /slots: one object per slot, as llama-server."""
        return [self.slot_json(i, default_settings) for i in range(self.num_slots)]

    def slot_json(self, slot_id: int, default_settings: dict[str, object]) -> dict[str, object]:
        """One slot's state (idle slots show the default settings)."""
        busy = self._busy.get(slot_id)
        return {
            "id": slot_id,
            "id_task": busy.request_id if busy else -1,
            "n_ctx": self.n_ctx,
            "speculative": False,
            "is_processing": busy is not None,
            "params": busy.settings if busy else default_settings,
            "next_token": {
                "has_next_token": busy is not None,
                "has_new_line": busy.has_new_line if busy else False,
                "n_remain": -1,
                "n_decoded": busy.num_decoded if busy else 0,
            },
        }
