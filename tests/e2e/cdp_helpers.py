"""A headless Chromium driven through its DevTools protocol (CDP) over ``--remote-debugging-pipe``:
no chromedriver, no websocket client, nothing from PyPI. Imported by tests/e2e/test_webui_browser.py
(not a test module).

The pipe protocol: the browser reads commands from its fd 3 and writes replies and events to its
fd 4, each message one JSON object followed by a NUL byte. One page target is attached in flat
mode, so page commands carry its ``sessionId``. Everything is synchronous: ``send`` writes a
command and reads messages until its reply, keeping the events it reads on the way in
``events``.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

# Debian's package installs /usr/bin/chromium; other distributions name it chromium-browser.
BINARY_NAMES = ("chromium", "chromium-browser")
_BROWSER_FDS = (3, 4)  # the fds --remote-debugging-pipe reads commands from / writes replies to


def find_chromium() -> str | None:
    """The path of a Chromium binary on PATH, or None."""
    return next((p for p in map(shutil.which, BINARY_NAMES) if p), None)


class CdpError(RuntimeError):
    """A CDP command answered with an error, or the browser went away."""


class Chromium:
    """``chromium --headless=new --remote-debugging-pipe`` with one blank page attached.

    Args:
        binary: the Chromium executable.
        timeout_s: how long one command may wait for its reply, in seconds.
    """

    def __init__(self, binary: str, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._buffer = b""
        self._profile = tempfile.mkdtemp(prefix="cacheflow-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # --no-sandbox: tests run as root on CI; the rest keeps the browser from calling home.
        args = [binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
                "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking",
                "--disable-component-update", "--disable-extensions", "--disable-sync",
                f"--user-data-dir={self._profile}", "about:blank"]  # fmt: skip

        def remap_fds() -> None:  # in the child, before exec; dup2's copies are inheritable
            # Through fds above 4 first: a pipe end may already be fd 3 or 4, and dup2 onto
            # itself would leave it close-on-exec (or the first dup2 would clobber the second).
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, out_w)]
            for fd, target in zip(high, _BROWSER_FDS):
                os.dup2(fd, target)

        # close_fds=False: subprocess would close fds 3 and 4 after preexec_fn otherwise; the
        # other fds Python opened are not inheritable, so nothing else leaks into the browser.
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, close_fds=False,
                                     preexec_fn=remap_fds)  # fmt: skip
        os.close(cmd_r)
        os.close(out_w)
        self.session_id: str | None = None
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"}, page=False)
            attach = {"targetId": target["targetId"], "flatten": True}
            self.session_id = self.send("Target.attachToTarget", attach, page=False)["sessionId"]
        except BaseException:
            self.close()
            raise

    def send(
        self, method: str, params: dict[str, Any] | None = None, page: bool = True
    ) -> dict[str, Any]:
        """Run one CDP command (on the page's session unless ``page`` is False).

        Returns:
            The command's ``result`` object.

        Raises:
            CdpError: the command failed, or no reply came within ``timeout_s``.
        """
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self.session_id
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read(deadline)
            if reply.get("id") != self._next_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise CdpError(f"{method}: {reply['error']}")
            return reply["result"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serializable values only).

        Raises:
            CdpError: the expression threw.
        """
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def events_of(self, method: str) -> list[dict[str, Any]]:
        """The params of every event named ``method`` read so far."""
        return [e["params"] for e in self.events if e.get("method") == method]

    def close(self) -> None:
        """Close the browser (kills it if it does not exit within 10 s) and drop its profile."""
        try:
            os.write(self._cmd_w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read(self, deadline: float) -> dict[str, Any]:
        """The next message from the browser (waits until ``deadline``, a monotonic time)."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise CdpError("no reply from the browser in time")
            chunk = os.read(self._out_r, 1 << 16)
            if not chunk:
                raise CdpError(f"the browser exited ({self.proc.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)
