"""SlotTable (pycacheflow/server/slots.py): llama-server's slot ids over CacheFlow requests.

Every in-flight request reports an id_slot in [0, num_slots), whatever order the engine runs
requests in: FIFO hand-over to waiting requests, a move for requests the scheduler ran early, a
shared slot only when more requests than slots have produced output (paged preemption).
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


def test_requests_beyond_the_slots_wait_and_take_freed_slots_in_order():
    table = make_table(2, 10, 11, 12, 13)
    assert busy(table) == [10, 11] and table.num_free == 0
    assert [table.slot_of(10), table.slot_of(11)] == [0, 1]
    table.remove(11)
    assert busy(table) == [10, 12]  # the oldest waiting request takes slot 1
    table.remove(10)
    assert busy(table) == [13, 12]
    assert [table.slot_of(12), table.slot_of(13)] == [1, 0]
    table.remove(12)
    table.remove(13)
    table.remove(13)  # idempotent
    assert busy(table) == [-1, -1] and table.num_free == 2


def test_a_request_run_ahead_of_older_ones_moves_into_a_slot():
    """The priority policy ran 13 before 12: 13 takes the slot that 12 got while waiting."""
    table = make_table(2, 10, 11, 12, 13)
    table.progress(10, 1, "a")
    table.progress(11, 1, "b")
    table.remove(10)
    assert busy(table) == [12, 11]  # not running yet, nothing reported
    table.progress(13, 1, "c")
    assert table.slot_of(13) == 0 and busy(table) == [13, 11]
    table.remove(11)
    assert table.slot_of(12) == 1 and busy(table) == [13, 12]


def test_more_running_requests_than_slots_share_one():
    """After preemption the engine may have output for more requests than slots."""
    table = make_table(1, 10, 11)
    table.progress(10, 2, "x\n")
    table.progress(11, 1, "y")  # ran while 10 was preempted
    assert table.slot_of(11) == 0 and table.slot_of(10) == 0
    slot = table.to_json({})[0]
    assert slot["id_task"] == 10 and slot["next_token"][0]["n_decoded"] == 2
    assert slot["next_token"][0]["has_new_line"] is True
    table.remove(10)
    assert busy(table) == [11] and table.slot_of(11) == 0


def test_ids_stay_in_range_in_any_order():
    table = make_table(3, *range(12))
    for request_id in (11, 4, 7, 0, 9, 2, 5):
        table.progress(request_id, 1, "t")
    assert all(0 <= table.slot_of(r) < 3 for r in range(12))
    for request_id in range(12):
        table.remove(request_id)
    assert busy(table) == [-1, -1, -1]
