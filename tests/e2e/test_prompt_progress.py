"""llama-server's ``return_progress`` on `cacheflow serve` with the real default model: the
engine's prompt progress reports streamed as ``prompt_progress`` chunks, exact for a prompt of
known length and a known per-step budget (-b), with prefix cache hits counted as ``cache``.

One slot and -b 16: a prompt of P tokens of which C are cached is computed in ceil((P - C) / 16)
steps, so it gets 1 + ceil((P - C) / 16) reports: processed = C before any token is computed,
then C + 16, C + 32, ..., P.
"""

from __future__ import annotations

import math

import httpx
import pytest
from serve_helpers import ServerProcess, stream_events

pytestmark = pytest.mark.e2e

BATCH = 16
PROMPT_TOKENS = 40
TEXT = ("Paged attention stores the keys and values of every sequence in fixed-size blocks, "
        "shared through block tables, so that many requests fit in one pool. ") * 3  # fmt: skip


@pytest.fixture(scope="module")
def server(real_model_path):
    proc = ServerProcess(["-m", str(real_model_path), "-np", "1", "-c", "512", "-b", str(BATCH)])
    proc.wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log()
    proc.close()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def prompt_ids(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        tokens = c.post("/tokenize", json={"content": TEXT}).json()["tokens"]
    assert len(tokens) > PROMPT_TOKENS
    return tokens[:PROMPT_TOKENS]


def progress_of(chunks: list[object]) -> list[tuple[int, int, int]]:
    return [(c["prompt_progress"]["total"], c["prompt_progress"]["cache"],
             c["prompt_progress"]["processed"])
            for c in chunks if isinstance(c, dict) and "prompt_progress" in c]  # fmt: skip


def test_completion_reports_each_prompt_chunk_then_the_cached_repeat(client, prompt_ids):
    body = {"prompt": prompt_ids, "n_predict": 3, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_progress": True, "timings_per_token": True}  # fmt: skip
    chunks = stream_events(client, "/completion", {**body, "cache_prompt": False})
    assert progress_of(chunks) == [(40, 0, 0), (40, 0, 16), (40, 0, 32), (40, 0, 40)]
    reports = [c for c in chunks if "prompt_progress" in c]
    # every report precedes the first token, carries no text, and its timings only grow
    first_token = next(i for i, c in enumerate(chunks) if c.get("tokens"))
    assert chunks.index(reports[-1]) < first_token
    assert all(c["content"] == "" and c["tokens"] == [] and not c["stop"] for c in reports)
    timings = [c["timings"] for c in reports]
    assert [t["prompt_n"] for t in timings] == [0, 16, 32, 40]
    assert timings[0]["prompt_ms"] == 0.0 and reports[0]["prompt_progress"]["time_ms"] == 0
    assert all(a["prompt_ms"] <= b["prompt_ms"] for a, b in zip(timings, timings[1:]))
    assert timings[-1]["prompt_ms"] > 0 and all(t["predicted_n"] == 0 for t in timings)
    # the final timings agree with the last report
    assert chunks[-1]["stop"] and chunks[-1]["timings"]["prompt_n"] == 40

    stream_events(client, "/completion", body)  # fills the prefix cache
    warm = stream_events(client, "/completion", body)
    # a fully cached prompt still computes its last token (for its logits)
    assert progress_of(warm) == [(40, 39, 39), (40, 39, 40)]
    assert warm[-1]["timings"]["cache_n"] == 39


def test_chat_and_oai_completion_streams(client):
    messages = [{"role": "user", "content": TEXT}]
    body = {"messages": messages, "max_tokens": 2, "stream": True, "return_progress": True,
            "cache_prompt": False}  # fmt: skip
    chunks = stream_events(client, "/v1/chat/completions", body)
    final = next(c for c in chunks if isinstance(c, dict) and "timings" in c)
    total = final["timings"]["prompt_n"]
    expected = [0] + [min(total, BATCH * k) for k in range(1, math.ceil(total / BATCH) + 1)]
    assert progress_of(chunks) == [(total, 0, p) for p in expected]
    reports = [c for c in chunks if isinstance(c, dict) and "prompt_progress" in c]
    assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": None} for c in reports)
    assert all("timings" not in c for c in reports)  # no timings_per_token
    assert chunks[-1] == "[DONE]"

    oai = stream_events(client, "/v1/completions", {"prompt": TEXT, "max_tokens": 2,
                                                    "stream": True, "return_progress": True})
    reports = progress_of(oai)
    assert len(reports) >= 2 and reports[-1][2] == reports[-1][0]
    assert [p for _, _, p in reports] == sorted(set(p for _, _, p in reports))
    assert reports[0][1] == reports[0][2]  # the first: processed == cache


def test_no_progress_unless_asked_on_a_stream(client, prompt_ids):
    base = {"prompt": prompt_ids, "n_predict": 2, "temperature": 0}
    assert progress_of(stream_events(client, "/completion", {**base, "stream": True})) == []
    body = client.post("/completion", json={**base, "return_progress": True}).json()
    assert "prompt_progress" not in body
