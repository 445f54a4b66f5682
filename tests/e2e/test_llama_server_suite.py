"""llama.cpp's own server tests (8 files of tools/server/tests in the pinned tree) against
`cacheflow serve` with the default model: every test that stock llama-server passes
(scripts/llama_server_suite/stock_passed.txt) must pass, except those listed with a reason in
scripts/llama_server_suite/known_failures.txt. Runs scripts/llama_server_suite.sh cacheflow
(a few minutes: it starts one server per test).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SUITE_TESTS = REPO / "vendor" / "llama.cpp" / "tools" / "server" / "tests"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cacheflow_passes_what_stock_llama_server_passes(real_model_path, tmp_path):
    if not SUITE_TESTS.is_dir():
        pytest.skip("no vendored llama.cpp tree (vendor/llama.cpp): build CacheFlow first")
    env = {**os.environ, "MODEL": str(real_model_path), "OUT": str(tmp_path),
           "PORT": str(_free_port())}  # fmt: skip
    script = REPO / "scripts" / "llama_server_suite.sh"
    proc = subprocess.run([str(script), "cacheflow"], capture_output=True, text=True, env=env,
                          cwd=REPO, check=False)  # fmt: skip
    log = (tmp_path / "cacheflow.log").read_text() if (tmp_path / "cacheflow.log").exists() else ""
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n--- pytest log tail ---\n{log[-6000:]}"
