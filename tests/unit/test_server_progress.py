"""Prompt progress in `cacheflow serve` without an engine: which requests ask the engine for it
(protocol.py) and the JSON of its chunks (responses.py), in llama-server's shapes."""

from __future__ import annotations

import pytest

from pycacheflow.outputs import PromptProgress
from pycacheflow.server import responses
from pycacheflow.server.protocol import parse_chat, parse_completion

MS = 1_000_000


def test_return_progress_reaches_the_engine_on_streams_only():
    def params(**body):
        return parse_completion({"prompt": "hi", **body}, default_n_predict=4).params

    assert params(stream=True, return_progress=True).return_progress
    assert not params(return_progress=True).return_progress  # llama-server: streams only
    assert not params(stream=True).return_progress
    chat = parse_chat({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "return_progress": True, "timings_per_token": True}, 4)  # fmt: skip
    assert chat.params.return_progress and chat.timings_per_token
    with pytest.raises(ValueError, match="Field 'return_progress'"):
        params(stream=True, return_progress="yes")


def test_progress_chunks_have_llama_servers_fields():
    first = PromptProgress(total=40, cached=8, processed=8, time_ns=5 * MS,
                           first_scheduled_ns=5 * MS)  # fmt: skip
    later = PromptProgress(40, 8, 24, 25 * MS + 600_000, 5 * MS)
    assert responses.prompt_progress(later) == {"total": 40, "cache": 8, "processed": 24,
                                                "time_ms": 20}  # fmt: skip
    t0, t1 = responses.progress_timings(first), responses.progress_timings(later)
    assert (t0["cache_n"], t0["prompt_n"], t0["prompt_ms"]) == (8, 0, 0.0)
    assert t0["prompt_per_second"] == 0.0 and t0["prompt_per_token_ms"] == 0.0
    assert (t1["prompt_n"], t1["prompt_ms"]) == (16, pytest.approx(20.6))
    assert t1["prompt_per_token_ms"] == pytest.approx(20.6 / 16)
    assert t1["prompt_per_second"] == pytest.approx(16 / 0.0206)
    assert all(t1[k] == 0 for k in ("predicted_n", "predicted_ms", "predicted_per_second"))
    body = responses.with_progress({"content": ""}, later, timings_per_token=False)
    assert set(body) == {"content", "prompt_progress"}
    assert "timings" in responses.with_progress({}, later, timings_per_token=True)
