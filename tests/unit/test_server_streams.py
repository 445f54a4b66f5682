"""RequestGroup (pycacheflow/server/streams.py) over a stub LLM: wake-ups from another thread,
heartbeats, abort and close; WorkerPool. No engine, no HTTP."""

from __future__ import annotations

import asyncio
import threading
import time

from pycacheflow import SamplingParams
from pycacheflow.outputs import StreamDelta
from pycacheflow.server.streams import RequestGroup, WorkerPool

FINAL = object()  # stands for a RequestOutput: only ``output is not None`` matters here


class StubLLM:
    """add_request / take_outputs / abort with outputs pushed by the test (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queued: dict[int, list[StreamDelta]] = {}
        self.notify: dict[int, object] = {}
        self.aborted: list[int] = []
        self.forgotten: set[int] = set()

    def add_request(self, prompt, params, *, priority=0, notify=None) -> int:
        request_id = len(self.queued) + 1
        self.queued[request_id], self.notify[request_id] = [], notify
        return request_id

    def push(self, request_id: int, text: str, final: bool = False) -> None:
        delta = StreamDelta(request_id, text, (), FINAL if final else None)
        with self._lock:
            self.queued[request_id].append(delta)
        self.notify[request_id]()

    def take_outputs(self, request_id: int) -> list[StreamDelta]:
        with self._lock:
            deltas, self.queued[request_id] = self.queued[request_id], []
        if any(d.finished for d in deltas):
            self.forgotten.add(request_id)
        return deltas

    def abort(self, request_id: int) -> bool:
        self.aborted.append(request_id)
        threading.Timer(0.01, self.push, (request_id, "", True)).start()  # engine's final event
        return True


async def collect(group: RequestGroup, heartbeat_s: float | None = None) -> list[tuple]:
    return [(i, d.text if d else None) async for i, d in group.deltas(heartbeat_s)]


def test_deltas_from_another_thread_interleave_and_end():
    async def run() -> list[tuple]:
        llm = StubLLM()
        group = RequestGroup(llm)
        a = group.submit("a", SamplingParams())
        b = group.submit("b", SamplingParams())
        ids = group.request_ids

        def produce() -> None:
            llm.push(ids[a], "x")
            llm.push(ids[b], "y", final=True)
            llm.push(ids[a], "z", final=True)

        threading.Timer(0.02, produce).start()
        result = await asyncio.wait_for(collect(group), 5)
        assert group.close() == 0 and llm.aborted == []
        return result

    result = asyncio.run(run())
    assert sorted(result) == [(0, "x"), (0, "z"), (1, "y")]
    assert [t for i, t in result if i == 0] == ["x", "z"]


def test_heartbeat_when_silent():
    async def run() -> list[tuple]:
        llm = StubLLM()
        group = RequestGroup(llm)
        group.submit("a", SamplingParams())
        threading.Timer(0.25, llm.push, (1, "late", True)).start()
        return await asyncio.wait_for(collect(group, heartbeat_s=0.1), 5)

    result = asyncio.run(run())
    assert result[-1] == (0, "late")
    assert (-1, None) in result


def test_close_aborts_unfinished_and_takes_their_final_delta():
    async def run() -> StubLLM:
        llm = StubLLM()
        group = RequestGroup(llm)
        group.submit("a", SamplingParams())
        group.submit("b", SamplingParams())
        llm.push(1, "done", final=True)
        async for _ in group.deltas():
            break  # the handler stops early (client gone)
        assert group.close() == 1 and group.close() == 0  # idempotent
        await asyncio.sleep(0.1)  # the abort's final event arrives and is discarded
        return llm

    llm = asyncio.run(run())
    assert llm.aborted == [2]
    assert llm.forgotten == {1, 2}


def test_abort_keeps_consuming():
    async def run() -> list[tuple]:
        llm = StubLLM()
        group = RequestGroup(llm)
        group.submit("a", SamplingParams())
        llm.push(1, "x")
        asyncio.get_running_loop().call_later(0.05, group.abort)
        return await asyncio.wait_for(collect(group), 5)

    assert asyncio.run(run()) == [(0, "x"), (0, "")]


def test_worker_pool_runs_calls_off_the_loop_and_returns_results_and_errors():
    async def run() -> tuple:
        pool = WorkerPool(max_threads=2, name="test-worker")
        loop_thread = threading.current_thread()

        def work(i: int) -> tuple:
            if i == 3:
                raise ValueError("three")
            time.sleep(0.01)
            return i, threading.current_thread() is not loop_thread

        results = await asyncio.gather(*(pool.run(work, i) for i in range(8)),
                                       return_exceptions=True)  # fmt: skip
        return results, pool._num_threads

    results, num_threads = asyncio.run(run())
    assert [r for r in results if not isinstance(r, Exception)] == [
        (i, True) for i in range(8) if i != 3]  # fmt: skip
    assert isinstance(results[3], ValueError) and str(results[3]) == "three"
    assert num_threads == 2  # never more than max_threads
