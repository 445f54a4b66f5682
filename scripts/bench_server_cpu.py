#!/usr/bin/env python3
"""CPU that ``cacheflow serve`` spends per request, against the fake engine (issue 14).

What it measures: the server process's own CPU time (utime + stime of every thread, from
/proc/<pid>/stat, and of its main thread, the asyncio event loop, from /proc/<pid>/task/<pid>/stat)
over a closed-loop load of R streamed requests with C in flight, divided by R; beside it the
output tokens per second, the client's time to first token (p50, p99) and the load generator's
own CPU per request (getrusage of this process and its client processes), so that a run where
the client, not the server, is the ceiling shows itself.

How: it compiles the toy engine (tests/fakes/fake_cacheflow.c) into a temporary shared library
with ``--slots`` sequences (its max-seqs constant), a step every ``--step-ms`` and a context long
enough for the prompts, starts ``python -m cli serve`` of this checkout on it (CACHEFLOW_LIB,
PYTHONPATH), warms it up with a few requests, and drives it with ``cacheflow bench serve``'s load
client (pycacheflow/bench/load_client.py: raw asyncio HTTP/1.1, one connection per request). Each
request is a text prompt of about ``--prompt-tokens`` tokens (the fake's tokens are bytes): a
system prompt shared by all plus a short question of its own, streamed with ``--output-tokens``
tokens (EOS ignored). Every (endpoint, repeat) runs on a fresh server; the endpoints alternate
within a repeat, so both see the same machine load. The table gives the median over repeats and
the spread (min-max). The machine's load average (``uptime``) is printed before and after.

    python scripts/bench_server_cpu.py                         # 256 slots, 7 ms steps, 1024 x 256
    python scripts/bench_server_cpu.py --repeats 3 --out /tmp/after.json
    python scripts/bench_server_cpu.py --endpoints /completion --requests 256 --repeats 1
    python scripts/bench_server_cpu.py --tree /tmp/main-copy --tree .   # before/after, alternating
    python scripts/bench_server_cpu.py --profile /tmp/prof     # py-spy of the server, if installed
    python scripts/bench_server_cpu.py --cprofile /tmp/prof    # cProfile of its event loop thread
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pycacheflow.bench import load_client

FAKE_SOURCE = REPO / "tests" / "fakes" / "fake_cacheflow.c"
ENDPOINTS = ("/completion", "/v1/chat/completions")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_WARMUP_REQUESTS = 8


def build_fake(out_dir: Path, slots: int, step_ms: float, ctx: int, max_requests: int) -> Path:
    """The fake libcacheflow with ``slots`` sequences, ``step_ms`` per step, ``ctx`` tokens per
    sequence and room for ``max_requests`` requests (it never reuses a request's entry)."""
    source = FAKE_SOURCE.read_text()
    edits = [
        (r"FAKE_MAX_REQUESTS = \d+", f"FAKE_MAX_REQUESTS = {max_requests}"),
        (r"FAKE_CTX_PER_SEQ = \d+", f"FAKE_CTX_PER_SEQ = {ctx}"),
        (r"max_num_seqs = 16;", f"max_num_seqs = {slots};"),
        (r"n_ctx = 16 \* FAKE_CTX_PER_SEQ", f"n_ctx = {slots} * FAKE_CTX_PER_SEQ"),
        (r"% 16\)", f"% {slots})"),
        (r"\{0, 1000000\}", f"{{0, {int(step_ms * 1e6)}}}"),
    ]
    for pattern, replacement in edits:
        source, count = re.subn(pattern, replacement, source)
        if count == 0:
            raise RuntimeError(f"fake_cacheflow.c changed: {pattern!r} not found")
    src = out_dir / "fake_cacheflow.c"
    src.write_text(source)
    lib = out_dir / "libcacheflow_fake.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler")
    subprocess.run([cc, "-std=c11", "-O1", "-shared", "-fPIC", f"-I{REPO / 'native' / 'include'}",
                    str(src), "-o", str(lib), "-lpthread"], check=True)  # fmt: skip
    return lib


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proc_cpu_s(pid: int) -> tuple[float, float, float]:
    """(whole process, main thread, main thread's system part) CPU seconds so far."""

    def read(path: str) -> tuple[float, float]:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK  # utime, stime (14, 15)

    main = read(f"/proc/{pid}/task/{pid}/stat")
    return sum(read(f"/proc/{pid}/stat")), sum(main), main[1]


def own_cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (the client processes)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


class Server:
    """``python -m cli serve`` of this checkout on the fake library."""

    def __init__(self, tree: Path, lib: Path, model: Path, slots: int, log: Path,
                 cprofile: Path | None = None) -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "CACHEFLOW_LIB": str(lib),
               "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH"))
                                             if p)}  # fmt: skip
        cmd = [sys.executable, "-m", "cli", "serve", "-m", str(model), "-np", str(slots),
               "--host", "127.0.0.1", "--port", str(self.port)]  # fmt: skip
        if cprofile is not None:  # the main thread (the event loop) under cProfile, start-up too
            cmd[1:3] = ["-m", "cProfile", "-o", str(cprofile), "-m", "cli"]
        self._log = open(log, "w")  # noqa: SIM115 - the server's log until stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=tree)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not ready: {log.read_text()}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def make_bodies(endpoint: str, num: int, prompt_tokens: int, output_tokens: int) -> list[dict]:
    """Streamed request bodies: a shared system prompt plus a question of each request's own,
    about ``prompt_tokens`` bytes (= fake tokens) in all, ASCII."""
    question_len = 24
    words = "the cache keeps every block of a shared prompt prefix for the next request "
    system = (words * (prompt_tokens // len(words) + 1))[: max(1, prompt_tokens - question_len)]
    bodies = []
    for i in range(num):
        question = f"question {i:06d}: why?".ljust(question_len)[:question_len]
        common = {"stream": True, "ignore_eos": True, "temperature": 0, "cache_prompt": True}
        if endpoint == "/completion":
            bodies.append({"prompt": system + question, "n_predict": output_tokens,
                           "return_tokens": True, **common})  # fmt: skip
        else:
            bodies.append({"model": "fake", "max_tokens": output_tokens,
                           "messages": [{"role": "system", "content": system},
                                        {"role": "user", "content": question}],
                           "stream_options": {"include_usage": True}, **common})  # fmt: skip
    return bodies


def run_once(args: argparse.Namespace, tree: Path, lib: Path, model: Path, endpoint: str,
             log: Path) -> dict:  # fmt: skip
    name = endpoint.strip("/").replace("/", "_")
    if tree != REPO:
        name = f"{tree.name}_{name}"
    cprofile = args.cprofile / f"{name}.prof" if args.cprofile else None
    server = Server(tree, lib, model, args.slots, log, cprofile)
    try:
        warm = make_bodies(endpoint, _WARMUP_REQUESTS, args.prompt_tokens, args.output_tokens)
        load_client.run_requests(server.url, endpoint, warm, [0.0] * len(warm),
                                 [args.prompt_tokens] * len(warm), len(warm))  # fmt: skip
        bodies = make_bodies(endpoint, args.requests, args.prompt_tokens, args.output_tokens)
        spy = None
        if args.profile is not None:
            out = args.profile / f"{name}.txt"
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(server.proc.pid), "--format",
                                    "raw", "--rate", "1000", "--nonblocking", "--gil", "--threads",
                                    "-o", str(out)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            time.sleep(1.0)
        cpu0, loop0, sys0 = proc_cpu_s(server.proc.pid)
        client0 = own_cpu_s()
        run = load_client.run_requests(
            server.url, endpoint, bodies, [0.0] * len(bodies), [args.prompt_tokens] * len(bodies),
            args.concurrency, num_procs=args.client_procs,
        )
        cpu1, loop1, sys1 = proc_cpu_s(server.proc.pid)
        client1 = own_cpu_s()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    finally:
        server.stop()
    if run.errors:
        raise RuntimeError(f"{len(run.errors)} failed requests, e.g. {run.errors[0]}")
    ttfts = sorted(m.ttft_s for m in run.metrics if m.ttft_s is not None)
    num_tokens = sum(m.num_output_tokens for m in run.metrics)
    elapsed = run.end_s - run.start_s
    n = len(run.metrics)
    return {
        "tree": str(tree),
        "endpoint": endpoint,
        "requests": n,
        "elapsed_s": elapsed,
        "server_cpu_ms_per_req": 1e3 * (cpu1 - cpu0) / n,
        "loop_cpu_ms_per_req": 1e3 * (loop1 - loop0) / n,
        "loop_sys_ms_per_req": 1e3 * (sys1 - sys0) / n,
        "client_cpu_ms_per_req": 1e3 * (client1 - client0) / n,
        "server_cpu_util": (cpu1 - cpu0) / elapsed,
        "output_tok_s": num_tokens / elapsed,
        "output_tokens_per_req": num_tokens / n,
        "sse_chunks_per_req": run.num_chunks / n,
        "ttft_p50_ms": 1e3 * ttfts[len(ttfts) // 2],
        "ttft_p99_ms": 1e3 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
    }


_COLUMNS = (
    ("server_cpu_ms_per_req", "server CPU ms/req", "{:.2f}"),
    ("loop_cpu_ms_per_req", "loop thread ms/req", "{:.2f}"),
    ("loop_sys_ms_per_req", "of it kernel", "{:.2f}"),
    ("sse_chunks_per_req", "SSE chunks/req", "{:.1f}"),
    ("output_tok_s", "tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("client_cpu_ms_per_req", "client CPU ms/req", "{:.2f}"),
)


def summary(runs: list[dict], endpoints: list[str], trees: list[Path]) -> str:
    """A markdown table: per endpoint and tree, median (min-max) over repeats of each column."""
    lines = ["| endpoint | tree | " + " | ".join(name for _, name, _ in _COLUMNS) + " |",
             "|---" * (len(_COLUMNS) + 2) + "|"]  # fmt: skip
    for endpoint, tree in ((e, t) for e in endpoints for t in trees):
        mine = [r for r in runs if r["endpoint"] == endpoint and r["tree"] == str(tree)]
        cells = []
        for key, _, fmt in _COLUMNS:
            values = [r[key] for r in mine]
            med = fmt.format(statistics.median(values))
            cells.append(med if len(values) == 1 else
                         f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})")  # fmt: skip
        lines.append(f"| {endpoint} | {tree} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=256, help="the fake's sequences (-np)")
    parser.add_argument("--step-ms", type=float, default=7.0, help="the fake's step time")
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=256, help="streams in flight")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--endpoints", default=",".join(ENDPOINTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--client-procs", type=int, default=1, help="load client processes")
    parser.add_argument("--tree", type=Path, action="append", dest="trees",
                        help="a checkout whose pycacheflow and cli to serve (repeat to compare "
                             "trees, alternating within each repeat); default: this one")
    parser.add_argument("--out", type=Path, help="write every run as JSON here")
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles of the server here")
    parser.add_argument("--cprofile", type=Path,
                        help="run the server under cProfile, its stats files here")
    args = parser.parse_args()
    endpoints = [e for e in args.endpoints.split(",") if e]
    for e in endpoints:
        if e not in ENDPOINTS:
            parser.error(f"endpoint {e!r} is not one of {', '.join(ENDPOINTS)}")
    trees = [t.resolve() for t in args.trees or [REPO]]
    ctx = 1 << (args.prompt_tokens + args.output_tokens + 64).bit_length()
    head = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    print(f"commit {head}\nbefore: {uptime()}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-server-cpu-") as tmp:
        tmp_path = Path(tmp)
        lib = build_fake(tmp_path, args.slots, args.step_ms, ctx, args.requests + 256)
        model = tmp_path / "fake.gguf"
        model.write_bytes(b"GGUF")
        for folder in (args.profile, args.cprofile):
            if folder:
                folder.mkdir(parents=True, exist_ok=True)
        for repeat in range(args.repeats):
            for endpoint, tree in ((e, t) for e in endpoints for t in trees):
                log = tmp_path / "serve.log"
                run = run_once(args, tree, lib, model, endpoint, log)
                run["repeat"] = repeat
                runs.append(run)
                print(json.dumps(run), flush=True)
    after = uptime()
    print(f"after: {after}\n")
    print(f"{args.requests} requests, {args.concurrency} in flight, {args.slots} slots, "
          f"{args.step_ms} ms steps, ~{args.prompt_tokens}-token prompts, {args.output_tokens} "
          f"output tokens; median (min-max) of {args.repeats}\n")  # fmt: skip
    print(summary(runs, endpoints, trees))
    if args.out:
        args.out.write_text(json.dumps({"commit": head, "args": {k: str(v) for k, v in
                                        vars(args).items()}, "after": after, "runs": runs},
                                       indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
