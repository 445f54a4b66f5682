"""Helpers for the `cacheflow serve` tests: run the server in a subprocess on 127.0.0.1 and
read server-sent events. Imported by tests/e2e/test_server*.py (not a test module)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

import pycacheflow

# The directory holding the pycacheflow (and cli) package this test process imports, so the
# server subprocess runs the same code and finds the same native library.
PACKAGE_ROOT = Path(pycacheflow.__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m cli serve ARGS --host 127.0.0.1 --port P` as a child process.

    Args:
        args: serve arguments (model, engine options).
        env: extra environment variables (e.g. CACHEFLOW_LIB).
        host: the --host value (llama-server's: one address or several, comma-separated);
            ``base_url`` is on the first.
    """

    def __init__(
        self, args: Sequence[str], env: dict[str, str] | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://{host.split(',')[0]}:{self.port}"
        log_fd, self._log_path = tempfile.mkstemp(prefix="cacheflow-serve-", suffix=".log")
        child_env = {**os.environ, **(env or {})}
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_ROOT), child_env.get("PYTHONPATH", "")) if p
        )
        cmd = [sys.executable, "-m", "cli", "serve", *args,
               "--host", host, "--port", str(self.port)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=log_fd, stderr=subprocess.STDOUT, env=child_env, cwd=PACKAGE_ROOT
        )
        os.close(log_fd)  # the child has its own copy

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Poll GET /health until it answers 200.

        Raises:
            AssertionError: the process exited or the timeout passed (with its log).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {timeout_s} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send ``sig`` and wait for the exit status (kills after ``timeout_s``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        """Everything the server printed so far."""
        return Path(self._log_path).read_text(errors="replace")

    def close(self) -> None:
        """Stop (if running) and drop the log file."""
        self.stop()
        Path(self._log_path).unlink(missing_ok=True)


def sse_data(lines: Iterator[str]) -> Iterator[object]:
    """Payloads of ``data:`` events (JSON decoded; "[DONE]" kept as the string)."""
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


def stream_events(client: httpx.Client, path: str, body: dict[str, object]) -> list[object]:
    """POST ``body`` and collect every SSE payload of the answer (asserts status 200)."""
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse_data(response.iter_lines()))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name with labels: value} (via prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def signal_name(sig: int) -> str:
    """'SIGTERM' for signal.SIGTERM (for test ids)."""
    return signal.Signals(sig).name
