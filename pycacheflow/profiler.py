"""The engine's profiler from Python: collect native events, export traces, CSV and a summary.

With ``EngineConfig.profile_capacity > 0`` (``LLM(profile=True)``) the native engine records
step and request events into a ring buffer (cacheflow.h, "profiler"). A ``ProfileCollector``
drains it on a background thread; ``Profile`` turns the events into

- a Chrome trace (JSON loadable in Perfetto and chrome://tracing): one track per request with
  its queued / prefill / decode spans, one track of engine steps with the batch of each, and
  counter tracks for KV rows and batch composition;
- a per-request CSV (times relative to the first event, latencies in ms);
- a summary dict (requests, steps, latency percentiles, KV utilization).

Times in events are cf_clock_ns() nanoseconds; exports are relative to the first event.
"""

from __future__ import annotations

import csv
import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pycacheflow.metrics import Distribution
from pycacheflow.outputs import finish_reason_name

DEFAULT_PROFILE_CAPACITY = 1 << 16  # events (72 bytes each: 4.5 MiB)

# cf_profile_event_kind values (tests/unit/test_cdef.py checks them against the header).
STEP_BEGIN = 1
STEP_END = 2
REQUEST_ARRIVAL = 3
REQUEST_FIRST_SCHEDULED = 4
REQUEST_FIRST_TOKEN = 5
REQUEST_FINISH = 6
REQUEST_PREEMPT = 7
REQUEST_SWAP_OUT = 8
REQUEST_SWAP_IN = 9
REQUEST_PREFIX_HIT = 10
REQUEST_PRIORITY_PREEMPT = 11  # the PREEMPT / SWAP_OUT just before was for a more urgent request
REQUEST_KV_DEMOTE = 12  # KV streaming: num_tokens KV rows (num_bytes bytes) moved to host slots
REQUEST_KV_PROMOTE = 13  # KV streaming: host-resident rows moved back into device blocks
EVENT_KIND_NAMES = {
    STEP_BEGIN: "step_begin",
    STEP_END: "step_end",
    REQUEST_ARRIVAL: "request_arrival",
    REQUEST_FIRST_SCHEDULED: "request_first_scheduled",
    REQUEST_FIRST_TOKEN: "request_first_token",
    REQUEST_FINISH: "request_finish",
    REQUEST_PREEMPT: "request_preempt",
    REQUEST_SWAP_OUT: "request_swap_out",
    REQUEST_SWAP_IN: "request_swap_in",
    REQUEST_PREFIX_HIT: "request_prefix_hit",
    REQUEST_PRIORITY_PREEMPT: "request_priority_preempt",
    REQUEST_KV_DEMOTE: "request_kv_demote",
    REQUEST_KV_PROMOTE: "request_kv_promote",
}
# Request events that move a request's KV (or drop it), exported as instant events on its track.
_KV_MOVE_NAMES = {
    REQUEST_PREEMPT: "preempted (recompute)",
    REQUEST_SWAP_OUT: "swapped out",
    REQUEST_SWAP_IN: "swapped in",
    REQUEST_PRIORITY_PREEMPT: "preempted for priority",
    REQUEST_KV_DEMOTE: "KV demoted to host",
    REQUEST_KV_PROMOTE: "KV promoted to device",
}

_ENGINE_PID = 1
_REQUESTS_PID = 2
_STEP_TID = 1
_US_PER_NS = 1e-3


class ProfileEvent(NamedTuple):
    """One cf_profile_event (field for field; see cacheflow.h for what each kind sets)."""

    time_ns: int
    step_id: int
    request_id: int
    num_bytes: int
    kind: int
    num_seqs: int
    num_decode_tokens: int
    num_prefill_tokens: int
    num_waiting: int
    kv_tokens_used: int
    kv_tokens_free: int
    kv_blocks_used: int
    num_tokens: int
    finish_reason: int


# ---------------------------------------------------------------------------- collection


class ProfileCollector:
    """Drains a native profiler ring on a daemon thread so that it never fills up.

    Args:
        drain: ``Engine.profile_drain``: returns (events, num_dropped) without waiting.
        interval_s: seconds between drains (the ring must not fill within one interval).
    """

    def __init__(
        self, drain: Callable[[], tuple[list[ProfileEvent], int]], interval_s: float = 0.05
    ) -> None:
        self._drain = drain
        self._interval_s = interval_s
        self._lock = threading.Lock()  # guards _events, _num_dropped and calls of _drain
        self._events: list[ProfileEvent] = []
        self._num_dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cacheflow-profiler", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Drain everything recorded so far (call before reading ``events``). Thread-safe."""
        with self._lock:
            while True:
                batch, self._num_dropped = self._drain()
                self._events.extend(batch)
                if not batch:
                    return

    def events(self, clear: bool = False) -> list[ProfileEvent]:
        """Every event collected so far, in recording order (call ``poll`` first).

        Args:
            clear: also forget them (atomically), so the next call returns only newer ones.
        """
        with self._lock:
            result = list(self._events)
            if clear:
                self._events.clear()
            return result

    @property
    def num_dropped(self) -> int:
        """Events the native ring dropped because it was full."""
        return self._num_dropped

    def close(self) -> None:
        """Stop the thread after a last drain. Idempotent; call before the engine is freed."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:
            self.poll()
        except Exception:  # noqa: BLE001 - the engine may already be gone; keep what we have
            pass

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - engine closed or broken: stop collecting
                return


# ---------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class RequestSpan:
    """One request's timeline from profiler events (ns on the cf_clock_ns clock; None = the
    event was not recorded, e.g. the request is still running or the ring dropped it)."""

    request_id: int
    arrival_ns: int | None
    first_scheduled_ns: int | None
    first_token_ns: int | None
    finish_ns: int | None
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None


@dataclass(frozen=True)
class StepSpan:
    """One engine step: [begin_ns, end_ns), its batch and the KV state after it."""

    step_id: int
    begin_ns: int
    end_ns: int
    num_seqs: int
    num_decode_tokens: int
    num_prefill_tokens: int
    num_waiting: int
    kv_tokens_used: int
    kv_tokens_free: int
    kv_blocks_used: int = 0  # paged mode; 0 in the stock modes
    # KV rows the running sequences attend: their computed tokens, a shared row once per holder
    # (kv_tokens_used counts a shared row once)
    kv_tokens_attended: int = 0


@dataclass
class Profile:
    """Profiler events of one engine plus what is needed to interpret them.

    Args:
        events: ProfileEvents in any order (sorted by time here).
        num_dropped: events the ring dropped (the trace then has holes).
        kv_tokens_capacity: KV rows of the engine (cf_model_info.n_ctx), for utilization.
        metadata: extra facts stored in the trace and summary (model, kv_mode, ...).
    """

    events: list[ProfileEvent]
    num_dropped: int = 0
    kv_tokens_capacity: int = 0
    metadata: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.events = sorted(self.events, key=lambda e: (e.time_ns, e.kind))

    @property
    def start_ns(self) -> int:
        """Time of the first event (0 if none): the origin of exported times."""
        return self.events[0].time_ns if self.events else 0

    def requests(self) -> list[RequestSpan]:
        """Per-request timelines, by request id."""
        by_id: dict[int, dict[str, object]] = {}
        for e in self.events:
            if e.kind < REQUEST_ARRIVAL or e.kind > REQUEST_FINISH:
                continue
            r = by_id.setdefault(e.request_id, {})
            if e.kind == REQUEST_ARRIVAL:
                r["arrival_ns"], r["num_prompt_tokens"] = e.time_ns, e.num_tokens
            elif e.kind == REQUEST_FIRST_SCHEDULED:
                r["first_scheduled_ns"] = e.time_ns
            elif e.kind == REQUEST_FIRST_TOKEN:
                r["first_token_ns"] = e.time_ns
            else:
                r["finish_ns"], r["num_output_tokens"] = e.time_ns, e.num_tokens
                r["finish_reason"] = finish_reason_name(e.finish_reason)
        return [
            RequestSpan(
                request_id=rid,
                arrival_ns=r.get("arrival_ns"),
                first_scheduled_ns=r.get("first_scheduled_ns"),
                first_token_ns=r.get("first_token_ns"),
                finish_ns=r.get("finish_ns"),
                num_prompt_tokens=int(r.get("num_prompt_tokens", 0)),
                num_output_tokens=int(r.get("num_output_tokens", 0)),
                finish_reason=r.get("finish_reason"),
            )
            for rid, r in sorted(by_id.items())
        ]

    def steps(self) -> list[StepSpan]:
        """Engine steps with both a begin and an end event, in order."""
        begins = {e.step_id: e for e in self.events if e.kind == STEP_BEGIN}
        result = []
        for end in (e for e in self.events if e.kind == STEP_END):
            begin = begins.get(end.step_id)
            if begin is None:
                continue
            result.append(
                StepSpan(
                    step_id=end.step_id,
                    begin_ns=begin.time_ns,
                    end_ns=max(end.time_ns, begin.time_ns),
                    num_seqs=begin.num_seqs,
                    num_decode_tokens=begin.num_decode_tokens,
                    num_prefill_tokens=begin.num_prefill_tokens,
                    num_waiting=end.num_waiting,
                    kv_tokens_used=end.kv_tokens_used,
                    kv_tokens_free=end.kv_tokens_free,
                    kv_blocks_used=end.kv_blocks_used,
                    kv_tokens_attended=end.num_tokens,
                )
            )
        return sorted(result, key=lambda s: s.step_id)

    # ------------------------------------------------------------------ Chrome trace

    def chrome_trace(self) -> dict[str, object]:
        """The Chrome trace-event JSON object ({"traceEvents": [...], ...}).

        Process 1 "CacheFlow engine" has the "steps" thread (complete "X" events with the
        batch in args) and counters ("C" events): "KV cache (tokens)" with used and reserved
        rows, "batch" with sequences, decode and prefill tokens, "waiting requests". Process 2
        "requests" has one thread per request with "queued", "prefill" and "decode" spans, and
        instant ("i") events, category "kv", where its KV moved: "preempted (recompute)",
        "swapped out", "swapped in", "preempted for priority", and with KV streaming "KV demoted
        to host" / "KV promoted to device" (args: tokens, bytes). Timestamps are microseconds
        from the first event.
        """
        t0 = self.start_ns
        trace: list[dict[str, object]] = _trace_metadata()
        for s in self.steps():
            trace += self._step_events(s, t0)
        for r in self.requests():
            trace += _request_events(r, t0, self.events[-1].time_ns if self.events else t0)
        trace += [_kv_move_event(e, t0) for e in self.events if e.kind in _KV_MOVE_NAMES]
        other = {**self.metadata, "num_dropped_events": self.num_dropped}
        return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other}

    def _step_events(self, s: StepSpan, t0: int) -> list[dict[str, object]]:
        ts_begin, ts_end = _us(s.begin_ns - t0), _us(s.end_ns - t0)
        batch = {
            "seqs": s.num_seqs,
            "decode tokens": s.num_decode_tokens,
            "prefill tokens": s.num_prefill_tokens,
        }
        step = {
            "name": "step",
            "ph": "X",
            "pid": _ENGINE_PID,
            "tid": _STEP_TID,
            "ts": ts_begin,
            "dur": max(ts_end - ts_begin, 0.0),
            "args": {"step_id": s.step_id, **batch},
        }
        kv = {"used": s.kv_tokens_used}
        if self.kv_tokens_capacity:
            kv["reserved"] = self.kv_tokens_capacity - s.kv_tokens_free
        zero_batch = {k: 0 for k in batch}
        return [
            step,
            _counter("batch", ts_begin, batch),
            _counter("batch", ts_end, zero_batch),
            _counter("KV cache (tokens)", ts_end, kv),
            _counter("waiting requests", ts_end, {"waiting": s.num_waiting}),
        ]

    def write_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write ``chrome_trace()`` as JSON to path (open it in ui.perfetto.dev)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f, separators=(",", ":"))

    # ------------------------------------------------------------------ CSV and summary

    def request_rows(self) -> list[dict[str, object]]:
        """One dict per request: times (s, from the first event) and latencies (ms); empty
        strings where an event is missing."""
        t0 = self.start_ns
        rows = []
        for r in self.requests():
            rows.append(
                {
                    "request_id": r.request_id,
                    "num_prompt_tokens": r.num_prompt_tokens,
                    "num_output_tokens": r.num_output_tokens,
                    "finish_reason": r.finish_reason or "",
                    "arrival_s": _rel_s(r.arrival_ns, t0),
                    "first_scheduled_s": _rel_s(r.first_scheduled_ns, t0),
                    "first_token_s": _rel_s(r.first_token_ns, t0),
                    "finish_s": _rel_s(r.finish_ns, t0),
                    "queue_ms": _diff_ms(r.arrival_ns, r.first_scheduled_ns),
                    "prefill_ms": _diff_ms(r.first_scheduled_ns, r.first_token_ns),
                    "ttft_ms": _diff_ms(r.arrival_ns, r.first_token_ns),
                    "decode_ms": _diff_ms(r.first_token_ns, r.finish_ns),
                    "e2e_ms": _diff_ms(r.arrival_ns, r.finish_ns),
                    "tpot_ms": _tpot_ms(r),
                }
            )
        return rows

    def write_requests_csv(self, path: str | os.PathLike[str]) -> None:
        """Write ``request_rows()`` as CSV (header line even with no request)."""
        rows = self.request_rows()
        names = list(rows[0]) if rows else ["request_id"]
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=names)
            writer.writeheader()
            writer.writerows(rows)

    def summary(self) -> dict[str, object]:
        """Requests, steps, latency distributions (ms), batch sizes and KV utilization."""
        rows = self.request_rows()
        steps = self.steps()
        step_ms = [(s.end_ns - s.begin_ns) / 1e6 for s in steps]
        decode_only = [s for s in steps if s.num_prefill_tokens == 0 and s.num_decode_tokens > 0]
        decode_s = sum(s.end_ns - s.begin_ns for s in decode_only) / 1e9
        decode_tokens = sum(s.num_decode_tokens for s in decode_only)
        out: dict[str, object] = {
            **self.metadata,
            "num_events": len(self.events),
            "num_dropped_events": self.num_dropped,
            "duration_s": (self.events[-1].time_ns - self.start_ns) / 1e9 if self.events else 0.0,
            "num_requests": len(rows),
            "num_finished": sum(1 for r in rows if r["finish_reason"]),
            "num_steps": len(steps),
            "num_decode_only_steps": len(decode_only),
            "decode_only_tok_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
            "step_ms": Distribution.of(step_ms).to_dict(),
            "batch_seqs": Distribution.of(s.num_seqs for s in steps).to_dict(),
        }
        for name in ("queue_ms", "ttft_ms", "tpot_ms", "e2e_ms"):
            out[name] = Distribution.of(r[name] for r in rows if r[name] != "").to_dict()
        out["kv"] = self.kv_summary(steps)
        return out

    def kv_summary(self, steps: Sequence[StepSpan] | None = None) -> dict[str, float]:
        """KV rows over steps: utilization = used / capacity, reserved share, waste =
        1 - used / reserved (rows set aside but not holding tokens), each mean and peak, and
        reserved_per_used = KV bytes reserved per byte holding a token (summed over steps)."""
        steps = self.steps() if steps is None else steps
        cap = self.kv_tokens_capacity
        if not steps or cap <= 0:
            return {}
        used = [s.kv_tokens_used / cap for s in steps]
        reserved = [(cap - s.kv_tokens_free) / cap for s in steps]
        waste = [1 - u / r for u, r in zip(used, reserved) if r > 0]
        return {
            "capacity_tokens": cap,
            "utilization_mean": sum(used) / len(used),
            "utilization_peak": max(used),
            "reserved_mean": sum(reserved) / len(reserved),
            "reserved_peak": max(reserved),
            "reserved_unused_mean": sum(waste) / len(waste) if waste else 0.0,
            "reserved_per_used": sum(reserved) / sum(used) if sum(used) > 0 else 0.0,
        }

    def write_summary(self, path: str | os.PathLike[str]) -> None:
        """Write ``summary()`` as indented JSON (NaN written as null)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_json_ready(self.summary()), f, indent=2)
            f.write("\n")


# ---------------------------------------------------------------------------- helpers


def _us(ns: int) -> float:
    return round(ns * _US_PER_NS, 3)


def _rel_s(ns: int | None, t0: int) -> float | str:
    return "" if ns is None else round((ns - t0) / 1e9, 6)


def _diff_ms(a: int | None, b: int | None) -> float | str:
    return "" if a is None or b is None else round((b - a) / 1e6, 3)


def _tpot_ms(r: RequestSpan) -> float | str:
    if r.first_token_ns is None or r.finish_ns is None or r.num_output_tokens < 2:
        return ""
    return round((r.finish_ns - r.first_token_ns) / 1e6 / (r.num_output_tokens - 1), 3)


def _counter(name: str, ts: float, values: dict[str, float]) -> dict[str, object]:
    return {"name": name, "ph": "C", "pid": _ENGINE_PID, "ts": ts, "args": values}


def _trace_metadata() -> list[dict[str, object]]:
    def meta(name: str, pid: int, value: object, tid: int | None = None) -> dict[str, object]:
        event: dict[str, object] = {"name": name, "ph": "M", "pid": pid, "args": {}}
        if tid is not None:
            event["tid"] = tid
        event["args"] = {"name": value} if name.endswith("_name") else {"sort_index": value}
        return event

    return [
        meta("process_name", _ENGINE_PID, "CacheFlow engine"),
        meta("process_sort_index", _ENGINE_PID, 0),
        meta("thread_name", _ENGINE_PID, "steps", _STEP_TID),
        meta("process_name", _REQUESTS_PID, "requests"),
        meta("process_sort_index", _REQUESTS_PID, 1),
    ]


def _request_events(r: RequestSpan, t0: int, last_ns: int) -> list[dict[str, object]]:
    """Thread-name metadata plus the queued / prefill / decode spans of one request; a phase
    whose end was not recorded runs to the last event and is marked "unfinished"."""
    tid = r.request_id
    events: list[dict[str, object]] = [
        {
            "name": "thread_name",
            "ph": "M",
            "pid": _REQUESTS_PID,
            "tid": tid,
            "args": {"name": f"request {r.request_id}"},
        },
        {
            "name": "thread_sort_index",
            "ph": "M",
            "pid": _REQUESTS_PID,
            "tid": tid,
            "args": {"sort_index": r.request_id},
        },
    ]
    phases = (
        ("queued", r.arrival_ns, r.first_scheduled_ns, {"prompt tokens": r.num_prompt_tokens}),
        ("prefill", r.first_scheduled_ns, r.first_token_ns, {}),
        (
            "decode",
            r.first_token_ns,
            r.finish_ns,
            {"output tokens": r.num_output_tokens, "finish reason": r.finish_reason},
        ),
    )
    for name, begin, end, args in phases:
        if begin is None:
            continue
        if end is None:
            args = {**args, "unfinished": True}
            end = r.finish_ns if r.finish_ns is not None else last_ns
        ts = _us(begin - t0)
        events.append(
            {
                "name": name,
                "cat": "request",
                "ph": "X",
                "pid": _REQUESTS_PID,
                "tid": tid,
                "ts": ts,
                "dur": max(_us(end - t0) - ts, 0.0),
                "args": args,
            }
        )
    return events


def _kv_move_event(e: ProfileEvent, t0: int) -> dict[str, object]:
    """An instant event on the request's track for a PREEMPT, SWAP_*, PRIORITY_PREEMPT or KV_*."""
    args: dict[str, object] = {"step_id": e.step_id, "tokens": e.num_tokens}
    if e.kind in (REQUEST_KV_DEMOTE, REQUEST_KV_PROMOTE):
        args["bytes"] = e.num_bytes
    return {
        "name": _KV_MOVE_NAMES[e.kind],
        "cat": "kv",
        "ph": "i",
        "s": "t",
        "pid": _REQUESTS_PID,
        "tid": e.request_id,
        "ts": _us(e.time_ns - t0),
        "args": args,
    }


def _json_ready(value: object) -> object:
    """Replace NaN floats by None, recursively (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


# ---------------------------------------------------------------------------- format check

_PHASE_KEYS = {
    "X": ("name", "pid", "tid", "ts", "dur"),
    "B": ("name", "pid", "tid", "ts"),
    "E": ("pid", "tid", "ts"),
    "C": ("name", "pid", "ts", "args"),
    "M": ("name", "pid", "args"),
    "i": ("name", "pid", "ts"),
    "I": ("name", "pid", "ts"),
}


def check_chrome_trace(trace: object) -> None:
    """Check a Chrome trace-event document the way the viewers read it.

    Accepts a JSON array of events or an object with a "traceEvents" array. Checks: every
    event is an object with a known phase ("X", "B", "E", "C", "M", "i", "I") and that phase's
    required keys; timestamps and durations are finite numbers >= 0; counter args are numbers;
    per (pid, tid) track, "B"/"E" pairs balance with E not before B, and complete "X" spans
    either nest or follow each other (never partly overlap).

    Raises:
        ValueError: the first violation, naming the event index.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ValueError('a trace is a JSON array or an object with a "traceEvents" array')
    spans: dict[tuple[object, object], list[tuple[float, float, int]]] = {}
    open_b: dict[tuple[object, object], list[tuple[float, int]]] = {}
    for index, e in enumerate(events):
        _check_event(index, e)
        track = (e["pid"], e.get("tid"))
        if e["ph"] == "X":
            spans.setdefault(track, []).append((e["ts"], e["ts"] + e["dur"], index))
        elif e["ph"] == "B":
            open_b.setdefault(track, []).append((e["ts"], index))
        elif e["ph"] == "E":
            stack = open_b.get(track)
            if not stack:
                raise ValueError(f"event {index}: 'E' without an open 'B' on track {track}")
            begin_ts, begin_index = stack.pop()
            if e["ts"] < begin_ts:
                raise ValueError(f"event {index}: 'E' before its 'B' (event {begin_index})")
    for track, stack in open_b.items():
        if stack:
            raise ValueError(f"event {stack[-1][1]}: 'B' never closed on track {track}")
    for track, items in spans.items():
        _check_nesting(track, items)


def _check_event(index: int, e: object) -> None:
    if not isinstance(e, dict) or e.get("ph") not in _PHASE_KEYS:
        raise ValueError(f"event {index}: not an object with a known 'ph': {e!r:.120}")
    missing = [k for k in _PHASE_KEYS[e["ph"]] if k not in e]
    if missing:
        raise ValueError(f"event {index} ('{e['ph']}'): missing {', '.join(missing)}")
    for key in ("ts", "dur"):
        if key in e and not _is_time(e[key]):
            raise ValueError(f"event {index}: {key} must be a finite number >= 0, got {e[key]!r}")
    if e["ph"] == "C":
        args = e["args"]
        if not isinstance(args, dict) or not all(_is_number(v) for v in args.values()):
            raise ValueError(f"event {index}: counter args must map names to numbers")


def _check_nesting(track: tuple[object, object], items: list[tuple[float, float, int]]) -> None:
    # Sorted by start (longer first on ties), each span must end inside every span still open.
    stack: list[tuple[float, float, int]] = []
    for start, end, index in sorted(items, key=lambda s: (s[0], -s[1])):
        # ts + dur is float arithmetic on microseconds: allow a rounding slack far below 1 ns.
        while stack and stack[-1][1] <= start + 1e-6:
            stack.pop()
        if stack and end > stack[-1][1] + 1e-6:
            raise ValueError(
                f"event {index}: span [{start}, {end}) partly overlaps event {stack[-1][2]} "
                f"on track {track}"
            )
        stack.append((start, end, index))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_time(value: object) -> bool:
    return _is_number(value) and value >= 0
