"""Token probabilities (SamplingParams.logprobs, llama-server's n_probs, OpenAI's logprobs) end
to end: the engine's numbers on the tiny model (sorted, at most one in total, the greedy token
on top, the same tokens as without them, batched or alone), streamed equal to non-streamed, and
the three server endpoints on the real model.
"""

from __future__ import annotations

import math

import httpx
import pytest
from serve_helpers import ServerProcess, stream_events

from pycacheflow import SamplingParams

pytestmark = pytest.mark.e2e

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "2 + 2 ="]
N = 12


def check_entries(logprobs, num_top):
    """Each position: log-probabilities <= 0, the top list sorted in decreasing order, of length
    num_top, summing to at most 1; the sampled token's own value where it is listed."""
    for lp in logprobs:
        values = [v for _, v in lp.top]
        assert lp.logprob <= 0.0 and all(v <= 0.0 for v in values)
        assert len(lp.top) == num_top and values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
        listed = dict(lp.top)
        if lp.token_id in listed:
            assert listed[lp.token_id] == pytest.approx(lp.logprob, abs=1e-6)


def test_greedy_tokens_are_unchanged_and_on_top(tiny_llm):
    plain = SamplingParams(max_tokens=N, ignore_eos=True)
    with_probs = SamplingParams(max_tokens=N, ignore_eos=True, logprobs=5)
    expected = [o.token_ids for o in tiny_llm.generate(PROMPTS, plain)]
    # a batch mixing rows with probabilities (CPU sampling) and plain greedy rows (in-graph)
    outs = tiny_llm.generate(PROMPTS + PROMPTS, [with_probs] * 4 + [plain] * 4)
    assert [o.token_ids for o in outs] == expected + expected
    assert all(o.logprobs is None for o in outs[4:])
    for out in outs[:4]:
        assert [lp.token_id for lp in out.logprobs] == list(out.token_ids)
        check_entries(out.logprobs, 5)
        assert all(lp.top[0][0] == lp.token_id for lp in out.logprobs)  # greedy: the argmax
        assert "".join(lp.text for lp in out.logprobs) == out.text


def test_raw_probabilities_do_not_depend_on_the_batch(tiny_llm):
    params = SamplingParams(max_tokens=N, ignore_eos=True, logprobs=3)
    alone = tiny_llm.generate([PROMPTS[0]], params)[0].logprobs
    batched = tiny_llm.generate(PROMPTS, params)[0].logprobs
    assert [(lp.token_id, [t for t, _ in lp.top]) for lp in alone] == [
        (lp.token_id, [t for t, _ in lp.top]) for lp in batched
    ]
    for a, b in zip(alone, batched):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


def test_zero_top_logprobs_reports_the_sampled_token_only(tiny_llm):
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=0)
    out = tiny_llm.generate(PROMPTS[2], params)[0]
    assert len(out.logprobs) == 4 and all(lp.top == () and lp.logprob <= 0 for lp in out.logprobs)


def test_streamed_probabilities_equal_the_final_ones(tiny_llm):
    params = SamplingParams(max_tokens=N, ignore_eos=True, logprobs=4)
    request_id = tiny_llm.add_request(PROMPTS[1], params)
    deltas = list(tiny_llm.iter_outputs(request_id))
    streamed = tuple(lp for d in deltas for lp in d.logprobs)
    assert streamed == deltas[-1].output.logprobs
    assert streamed == tiny_llm.generate(PROMPTS[1], params)[0].logprobs


def test_post_sampling_probabilities_are_the_chains(tiny_llm):
    params = SamplingParams(max_tokens=N, ignore_eos=True, temperature=1.0, top_k=8, seed=11,
                            logprobs=10, post_sampling_probs=True)  # fmt: skip
    out = tiny_llm.generate(PROMPTS[3], params)[0]
    # seeded sampling runs on the CPU either way: the same tokens without probabilities
    plain = SamplingParams(max_tokens=N, ignore_eos=True, temperature=1.0, top_k=8, seed=11)
    assert out.token_ids == tiny_llm.generate(PROMPTS[3], plain)[0].token_ids
    for lp in out.logprobs:
        probs = [math.exp(v) for _, v in lp.top]
        assert 0 < len(probs) <= 8 and all(p > 0 for p in probs)  # top_k left 8 candidates
        assert probs == sorted(probs, reverse=True)
        assert sum(probs) == pytest.approx(1.0, abs=1e-4)  # all candidates are listed
        assert dict(lp.top)[lp.token_id] == pytest.approx(lp.logprob, abs=1e-6)  # listed


def test_post_sampling_greedy_is_certain(tiny_llm):
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=5, post_sampling_probs=True)
    out = tiny_llm.generate(PROMPTS[0], params)[0]
    assert all(lp.logprob == 0.0 and lp.top == ((lp.token_id, 0.0),) for lp in out.logprobs)


# ---------------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def client(real_model_path):
    proc = ServerProcess(["-m", str(real_model_path), "-np", "4", "-c", "2048"])
    proc.wait_ready()
    with httpx.Client(base_url=proc.base_url, timeout=120) as c:
        yield c
    assert proc.stop() == 0, proc.log()
    proc.close()


def test_completion_probabilities_streamed_equal_non_streamed(client):
    body = {"prompt": PROMPTS[0], "n_predict": 6, "temperature": 0, "ignore_eos": True,
            "n_probs": 3}  # fmt: skip
    result = client.post("/completion", json=body).json()
    probs = result["completion_probabilities"]
    assert len(probs) == 6 and all(len(p["top_logprobs"]) == 3 for p in probs)
    assert all(p["id"] == p["top_logprobs"][0]["id"] for p in probs)  # greedy: the top token
    assert "".join(p["token"] for p in probs) == result["content"]
    assert result["generation_settings"]["n_probs"] == 3
    events = stream_events(client, "/completion", {**body, "stream": True})
    partials = [e for e in events if not e["stop"]]
    assert [len(e["completion_probabilities"]) for e in partials] == [1] * 6
    assert [e["completion_probabilities"][0] for e in partials] == probs
    assert "completion_probabilities" not in events[-1]
    plain = client.post("/completion", json={**body, "n_probs": 0}).json()
    assert plain["content"] == result["content"] and "completion_probabilities" not in plain


def test_oai_endpoints_report_logprobs(client):
    body = {"prompt": PROMPTS[1], "max_tokens": 4, "temperature": 0, "logprobs": 2}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert len(choice["logprobs"]["content"]) == 4
    events = stream_events(client, "/v1/completions", {**body, "stream": True})
    streamed = [c for e in events[:-1] if e["choices"] and e["choices"][0]["logprobs"]
                for c in e["choices"][0]["logprobs"]["content"]]  # fmt: skip
    assert streamed == choice["logprobs"]["content"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
            "logprobs": True, "top_logprobs": 2}  # fmt: skip
    choice = client.post("/v1/chat/completions", json=chat).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    events = stream_events(client, "/v1/chat/completions", {**chat, "stream": True})
    streamed = [c for e in events[:-1] if e["choices"] and "logprobs" in e["choices"][0]
                for c in e["choices"][0]["logprobs"]["content"]]  # fmt: skip
    assert streamed == content


def test_probability_counts_are_capped_at_20(client):
    """At most MAX_LOGPROBS (20, OpenAI's top_logprobs and vLLM's max_logprobs) per position:
    more is a 400 naming the field (n_probs 10**6 returned the whole vocabulary per token); up
    to it the counts follow llama-server (post-sampling: the candidates left; a count <= 0 or
    false asks for none)."""
    body = {"prompt": PROMPTS[2], "n_predict": 1, "temperature": 0}
    most = client.post("/completion", json={**body, "n_probs": 20}).json()
    assert len(most["completion_probabilities"][0]["top_logprobs"]) == 20
    sampled = {**body, "n_probs": 20, "post_sampling_probs": True, "temperature": 0.8,
               "top_k": 5, "top_p": 1.0, "min_p": 0.0, "seed": 3}  # fmt: skip
    top = client.post("/completion", json=sampled).json()["completion_probabilities"][0]
    assert len(top["top_probs"]) == 5  # the candidates top_k left
    for none in ({"n_probs": -3}, {"n_probs": False}, {"logprobs": 0}):
        assert "completion_probabilities" not in client.post("/completion",
                                                              json={**body, **none}).json()
    oai = {"prompt": PROMPTS[2], "max_tokens": 1, "temperature": 0}
    choice = client.post("/v1/completions", json={**oai, "logprobs": False}).json()["choices"][0]
    assert choice["logprobs"] is None
    choice = client.post("/v1/completions", json={**oai, "logprobs": True}).json()["choices"][0]
    assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 1  # true = 1, as llama-server
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "temperature": 0,
            "logprobs": True, "top_logprobs": 20}  # fmt: skip
    content = client.post("/v1/chat/completions", json=chat).json()["choices"][0]["logprobs"]
    assert len(content["content"][0]["top_logprobs"]) == 20
    for path, over, message in (
        ("/completion", {**body, "n_probs": 10**6},
         "Field 'n_probs': value must be at most 20 (token probabilities per position), "
         "got 1000000"),
        ("/v1/completions", {**oai, "logprobs": 21},
         "Field 'logprobs': value must be at most 20 (token probabilities per position), got 21"),
        ("/v1/chat/completions", {**chat, "top_logprobs": 21},
         "Field 'top_logprobs': value must be between 0 and 20, got 21"),
    ):  # fmt: skip
        response = client.post(path, json=over)
        assert response.status_code == 400
        assert response.json()["error"] == {"code": 400, "message": message,
                                            "type": "invalid_request_error"}  # fmt: skip
    assert client.post("/completion", json={**body, "n_probs": 3}).status_code == 200  # still serving


@pytest.mark.parametrize(
    "path,body,fragment",
    [
        ("/completion", {"prompt": "x", "n_probs": 2.5}, "Field 'n_probs': expected an integer"),
        ("/completion", {"prompt": "x", "n_probs": "3"}, "Field 'n_probs'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "logprobs": True, "top_logprobs": -1}, "Field 'top_logprobs'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "top_logprobs": 5}, "requires logprobs"),
    ],
)  # fmt: skip
def test_bad_probability_fields_are_400(client, path, body, fragment):
    response = client.post(path, json=body)
    assert response.status_code == 400 and fragment in response.json()["error"]["message"]
