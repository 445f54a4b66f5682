"""pytest plugin for running llama.cpp's server tests through scripts/llama_server_suite.sh.

- Fetches nothing: the suite's session fixture ``ServerPreset.load_all`` (which starts every
  preset once so that llama-server downloads its model) becomes a no-op, and ``wget`` (imported
  by the suite's utils.py, used only to download test files) is a stub that fails if called.
- Records each test's outcome, one "<outcome> <nodeid>" line per test, into the file named by
  $SUITE_RESULTS (outcome: passed, failed or skipped; a failing setup or teardown is failed).
"""

from __future__ import annotations

import os
import sys
import types

import pytest

if "wget" not in sys.modules:
    try:
        import wget  # noqa: F401
    except ImportError:
        _stub = types.ModuleType("wget")

        def _no_download(url: str, out: str | None = None) -> str:
            raise RuntimeError(f"the suite harness fetches nothing (wanted {url})")

        _stub.download = _no_download  # type: ignore[attr-defined]
        sys.modules["wget"] = _stub

_outcomes: dict[str, str] = {}


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    utils = sys.modules.get("utils")
    if utils is not None and hasattr(utils, "ServerPreset"):
        utils.ServerPreset.load_all = staticmethod(lambda: None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    previous = _outcomes.get(report.nodeid)
    if report.when == "call" or report.outcome != "passed":
        if previous != "failed":  # a failure in any phase sticks
            _outcomes[report.nodeid] = report.outcome
    elif previous is None:
        _outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("SUITE_RESULTS")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            for nodeid in sorted(_outcomes):
                f.write(f"{_outcomes[nodeid]} {nodeid}\n")
