"""The chat page at ``GET /`` (pycacheflow/server/webui.html) used as a person would, in headless
Chromium against a real ``cacheflow serve`` on the default model: type a message, press Enter,
wait for the streamed reply and the timings line under it.

The browser is driven through its DevTools protocol over ``--remote-debugging-pipe``
(tests/e2e/cdp_helpers.py), so the only extra dependency is the browser itself, no chromedriver
and no Python package. To run it (Debian or Ubuntu; as root the browser runs with --no-sandbox)::

    apt-get install chromium
    pytest tests/e2e/test_webui_browser.py

Without a ``chromium`` (or ``chromium-browser``) on PATH the test is skipped, saying so.
The HTTP side of the page (served without a key, no absolute URLs in its script, --no-ui) is
covered without a browser by test_server_fake.py::test_web_page_flags_and_aliases.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from cdp_helpers import Chromium, find_chromium
from serve_helpers import ServerProcess

CHROMIUM = find_chromium()

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: no chromium or chromium-browser "
                                                "on PATH (apt-get install chromium)"),  # fmt: skip
]

MESSAGE = "What is the capital of France?"
MAX_TOKENS = 24
REPLY_TIMEOUT_S = 60.0
# The line showTimings() writes under a reply.
TIMINGS_RE = re.compile(r"prompt: (\d+) tokens, (\d+\.\d) tok/s · generation: (\d+) tokens, "
                        r"(\d+\.\d) tok/s")  # fmt: skip
# What the page shows, read in one evaluation: the bubbles by class, and the timings lines.
PAGE_STATE_JS = """JSON.stringify({
  user: [...document.querySelectorAll('.msg.user')].map(e => e.textContent),
  assistant: [...document.querySelectorAll('.msg.assistant')].map(e => e.textContent),
  error: [...document.querySelectorAll('.msg.error')].map(e => e.textContent),
  timings: [...document.querySelectorAll('.timings')].map(e => e.textContent),
})"""


@pytest.fixture(scope="module")
def server(real_model_path):
    # --temp 0: the page sends no temperature, so the server-wide default makes it greedy.
    # -t 1: with the browser beside it on a loaded 2-core machine, more decode threads than
    # free cores spin at llama.cpp's barriers (24 tokens: about 30 s with the default, 1 s).
    args = ["-m", str(real_model_path), "-np", "1", "-c", "1024", "--temp", "0", "-t", "1"]
    proc = ServerProcess(args)
    proc.wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log()
    proc.close()


@pytest.fixture
def browser():
    chromium = Chromium(CHROMIUM)
    for domain in ("Network", "Page", "Runtime", "Log"):
        chromium.send(f"{domain}.enable")
    yield chromium
    chromium.close()


def type_into(browser: Chromium, element_id: str, text: str) -> None:
    """Focus an element, select what it holds and type ``text`` over it (as keyboard input)."""
    focus_and_select = "(e => { e.focus(); e.select(); })"
    browser.evaluate(f"{focus_and_select}(document.getElementById('{element_id}'))")
    browser.send("Input.insertText", {"text": text})


def press_enter(browser: Chromium) -> None:
    """Press and release Enter in the focused element."""
    key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
    browser.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **key})
    browser.send("Input.dispatchKeyEvent", {"type": "keyUp", **key})


def wait_for_reply(browser: Chromium, timeout_s: float) -> dict[str, list[str]]:
    """Poll the page until a reply finished (its timings line) or failed; returns its state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = json.loads(browser.evaluate(PAGE_STATE_JS))
        if state["timings"] or state["error"] or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def open_page(browser: Chromium, url: str) -> None:
    """Navigate and wait until the document and its script have loaded."""
    browser.send("Page.navigate", {"url": url})
    deadline = time.monotonic() + 30
    while browser.evaluate("document.readyState") != "complete":
        assert time.monotonic() < deadline, "the page did not finish loading"
        time.sleep(0.05)


def test_chat_page_streams_a_reply_with_timings(server, browser):
    open_page(browser, server.base_url + "/")
    type_into(browser, "max", str(MAX_TOKENS))
    assert browser.evaluate("document.getElementById('max').value") == str(MAX_TOKENS)
    type_into(browser, "input", MESSAGE)
    press_enter(browser)  # the page's Enter handler clicks Send
    state = wait_for_reply(browser, REPLY_TIMEOUT_S)

    assert not state["error"], state
    assert state["timings"], f"no finished reply after {REPLY_TIMEOUT_S} s: {state}"
    assert state["user"] == [MESSAGE] and len(state["assistant"]) == 1
    reply = state["assistant"][0]
    assert reply.strip()
    timings = TIMINGS_RE.fullmatch(state["timings"][0])
    assert timings, state["timings"]
    prompt_n, generation_n = int(timings[1]), int(timings[3])
    assert prompt_n > 0 and 1 <= generation_n <= MAX_TOKENS
    assert browser.evaluate("document.getElementById('input').value") == ""

    # Greedy: the same conversation, not streamed, gives the text the page pieced together.
    body = {"messages": [{"role": "user", "content": MESSAGE}], "max_tokens": MAX_TOKENS}
    answer = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).json()
    assert answer["choices"][0]["message"]["content"] == reply
    assert answer["usage"]["completion_tokens"] == generation_n

    assert not browser.events_of("Runtime.exceptionThrown")
    console_errors = [e for e in browser.events_of("Runtime.consoleAPICalled")
                      if e["type"] == "error"]  # fmt: skip
    assert not console_errors
    log_errors = [e["entry"] for e in browser.events_of("Log.entryAdded")
                  if e["entry"]["level"] == "error"]  # fmt: skip
    assert not log_errors
    urls = [e["request"]["url"] for e in browser.events_of("Network.requestWillBeSent")]
    assert server.base_url + "/v1/chat/completions" in urls
    assert all(u.startswith(server.base_url + "/") for u in urls), urls
