"""SlotTable (pycacheflow/server/slots.py): llama-server's slots over the engine's slot ids.

The engine names each running request's slot (cf_output_event.slot_id); the table only records
what was reported: a queued request holds none, a finished one gives its slot back, a preempted
one that resumed elsewhere moves, and a slot reported by a newer request shows that one.
"""

from __future__ import annotations

from pycacheflow.server.slots import SlotTable

SETTINGS = {"n_predict": 8}


def make_table(num_slots: int, *request_ids: int) -> SlotTable:
    table = SlotTable(num_slots, n_ctx=256)
    for request_id in request_ids:
        table.add(request_id, SETTINGS)
    return table


def busy(table: SlotTable) -> list[int]:
    """id_task of each slot (-1 = idle), as GET /slots shows them."""
    return [slot["id_task"] for slot in table.to_json({})]


def test_slots_are_the_ones_the_engine_reports():
    table = make_table(2, 10, 11, 12)
    assert busy(table) == [-1, -1] and table.num_free == 2  # queued: no slot yet
    table.update(10, 1)
    table.update(11, 0)
    assert busy(table) == [11, 10] and table.num_free == 0
    assert [table.slot_of(10), table.slot_of(11), table.slot_of(12)] == [1, 0, -1]
    table.remove(10)
    table.update(12, 1)
    assert busy(table) == [11, 12]
    table.remove(11)
    table.remove(12)
    table.remove(12)  # idempotent
    assert busy(table) == [-1, -1] and table.num_free == 2


def test_a_request_that_resumed_in_another_slot_moves():
    table = make_table(2, 10, 11)
    table.update(10, 0)
    table.update(11, 0)  # 10 was preempted, 11 took its slot before 10's move was seen
    assert busy(table) == [11, -1]
    table.update(10, 1)
    assert busy(table) == [11, 10]
    table.remove(10)
    assert busy(table) == [11, -1]


def test_a_finished_request_reported_late_does_not_free_the_new_holder():
    table = make_table(1, 10, 11)
    table.update(10, 0)
    table.update(11, 0)  # the engine gave slot 0 to 11 in the step that finished 10
    table.remove(10)
    assert busy(table) == [11] and table.slot_of(11) == 0


def test_progress_is_shown_on_the_slot():
    table = make_table(1, 10)
    table.update(10, 0)
    table.progress(10, 2, "x\n")
    slot = table.to_json({})[0]
    assert slot["id_task"] == 10 and slot["next_token"][0]["n_decoded"] == 2
    assert slot["next_token"][0]["has_new_line"] is True
