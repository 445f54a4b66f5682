"""`cacheflow serve` over the toy libcacheflow (tests/fakes/fake_cacheflow.c): HTTP mechanics
without llama.cpp, in seconds.

The fake "model" has byte tokens and generates its prompt over and over, one token per 1 ms
step, with a context of 256 tokens per sequence; its chat template renders
"<role>content|" per message plus "A:". So expected texts are known exactly.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from serve_helpers import ServerProcess, parse_metrics, sse_data, stream_events

from cli.main import cacheflow

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
FAKE_SOURCE = REPO / "tests" / "fakes" / "fake_cacheflow.c"
FAKE_CTX_PER_SEQ = 256
FAKE_MAX_NUM_SEQS = 16  # the fake reports it whatever -np says


@pytest.fixture(scope="module")
def fake_env(tmp_path_factory) -> dict[str, str]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake libcacheflow")
    out = tmp_path_factory.mktemp("fakecf") / "libcacheflow_fake.so"
    subprocess.run([cc, "-std=c11", "-O1", "-shared", "-fPIC", f"-I{REPO / 'native' / 'include'}",
                    str(FAKE_SOURCE), "-o", str(out), "-lpthread"], check=True)  # fmt: skip
    return {"CACHEFLOW_LIB": str(out)}


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fakemodel") / "fake.gguf"
    path.write_bytes(b"GGUF")
    return path


def start(fake_env, fake_model, *args: str) -> ServerProcess:
    server = ServerProcess(["-m", str(fake_model), "-np", "4", *args], env=fake_env)
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def server(fake_env, fake_model):
    proc = start(fake_env, fake_model, "--metrics", "--alias", "fake-model")
    yield proc
    assert proc.stop() == 0, proc.log()
    proc.close()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def test_info_endpoints(client):
    assert client.get("/health").json() == {"status": "ok"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "fake-model"
    assert client.get("/models").json()["data"][0]["id"] == "fake-model"
    props = client.get("/props").json()
    assert props["total_slots"] == FAKE_MAX_NUM_SEQS and props["model_alias"] == "fake-model"
    assert props["default_generation_settings"]["n_ctx"] == FAKE_CTX_PER_SEQ
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == list(range(FAKE_MAX_NUM_SEQS))
    assert not any(s["is_processing"] for s in slots)


def test_props_has_llama_servers_fields(client):
    """Every top-level field of llama-server's /props (server-context.cpp get_res_props)."""
    props = client.get("/props").json()
    llama_server = {"default_generation_settings", "total_slots", "model_alias", "model_ftype",
                    "model_path", "modalities", "media_marker", "endpoint_slots",
                    "endpoint_props", "endpoint_metrics", "ui", "ui_settings", "chat_template",
                    "chat_template_caps", "bos_token", "eos_token", "build_info", "is_sleeping",
                    "cors_proxy_enabled"}  # fmt: skip
    assert llama_server <= set(props), llama_server - set(props)
    assert props["media_marker"].startswith("<__media_") and props["media_marker"].endswith("__>")
    assert props["media_marker"] == client.get("/props").json()["media_marker"]  # one per process
    assert props["cors_proxy_enabled"] is False and props["endpoint_props"] is False
    details = client.get("/models").json()["models"][0]["details"]
    assert details["format"] == "gguf"


@pytest.mark.parametrize(
    "method,path,status,fragment",
    [
        ("GET", "/cors-proxy", 403, "this feature is disabled"),
        ("POST", "/cors-proxy", 403, "this feature is disabled"),
        ("POST", "/props", 501, "does not support changing global properties"),
        ("POST", "/slots/0?action=save", 501, "does not support slots action"),
        ("POST", "/v1/embeddings", 501, "does not support embeddings"),
        ("POST", "/embedding", 501, "does not support embeddings"),
        ("POST", "/rerank", 501, "does not support reranking"),
        ("POST", "/v1/responses", 501, "Responses API"),
        ("POST", "/v1/messages", 501, "Anthropic Messages API"),
        ("POST", "/infill", 501, "infill"),
        ("POST", "/lora-adapters", 501, "LoRA"),
        ("POST", "/v1/chat/completions/control", 501, "reasoning control"),
    ],
)
def test_features_cacheflow_lacks_answer_as_llama_server(client, method, path, status, fragment):
    """A feature llama-server turns off without its flag gets llama-server's status for that
    case (403 for the CORS proxy, 501 not_supported_error otherwise); an API CacheFlow lacks
    fails with 501 naming it, not with a 404."""
    response = client.request(method, path, json={})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error["message"]
    if status == 403:  # llama-server's res_403: no "code"
        assert error == {"message": "this feature is disabled", "type": "feature_disabled"}
    else:
        assert (error["code"], error["type"]) == (501, "not_supported_error")
    assert client.get("/lora-adapters").json() == []  # none loaded, as llama-server without --lora


def test_text_endpoints(client):
    assert client.post("/tokenize", json={"content": "hi"}).json() == {"tokens": [104, 105]}
    pieces = client.post("/tokenize", json={"content": "hi", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": 104, "piece": "h"}, {"id": 105, "piece": "i"}]}
    assert client.post("/detokenize", json={"tokens": [104, 105]}).json() == {"content": "hi"}
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert client.post("/apply-template", json=body).json() == {"prompt": "<user>x|A:"}


def test_completion_json_and_stream(client):
    body = {"prompt": "abc", "n_predict": 7, "return_tokens": True}
    result = client.post("/completion", json=body).json()
    assert result["content"] == "abcabca" and result["tokens"] == list(b"abcabca")
    assert result["stop"] is True and result["stop_type"] == "limit"
    assert result["tokens_predicted"] == 7 and result["tokens_evaluated"] == 3
    assert result["model"] == "fake-model" and result["timings"]["predicted_n"] == 7
    events = stream_events(client, "/completion", {**body, "stream": True})
    assert "[DONE]" not in events  # llama-server's /completion stream has no [DONE]
    assert "".join(e["content"] for e in events) == "abcabca"
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1]["stop_type"] == "limit" and events[-1]["content"] == ""


def test_a_token_inside_a_character_sends_no_chunk(client):
    """The fake's tokens are bytes, so "€" takes three: llama-server sends no chunk for a token
    that ends inside a character, and the bytes (and tokens) go out with the next chunk."""
    body = {"prompt": "€é", "n_predict": 25, "stream": True}  # 5 bytes, 5 times
    paths = (("/completion", lambda e: e["content"]),
             ("/v1/completions", lambda e: e["choices"][0]["text"]))  # fmt: skip
    for path, text_of in paths * 3:  # a delta may hold several tokens: try more than once
        events = stream_events(client, path, body)
        chunks = [e for e in events if e != "[DONE]"][:-1]  # not the closing chunk
        assert all(text_of(e) for e in chunks), [text_of(e) for e in chunks]
        assert "".join(text_of(e) for e in chunks) == "€é" * 5
    events = stream_events(client, "/completion", body)
    assert [t for e in events for t in e["tokens"]] == list("€é".encode() * 5)
    assert events[-2]["tokens_predicted"] == 25


def test_completion_stop_word_and_zero_n_predict(client):
    result = client.post("/completion", json={"prompt": "abcXd", "n_predict": 20,
                                              "stop": ["Xd"]}).json()  # fmt: skip
    assert result["content"] == "abc"
    assert (result["stop_type"], result["stopping_word"]) == ("word", "Xd")
    zero = client.post("/completion", json={"prompt": "abc", "n_predict": 0}).json()
    assert zero["content"] == "" and zero["tokens_predicted"] == 0


def test_multiple_prompts(client):
    results = client.post("/completion", json={"prompt": ["ab", "xyz"], "n_predict": 4}).json()
    assert [r["content"] for r in results] == ["abab", "xyzx"]
    oai = client.post("/v1/completions", json={"prompt": ["ab", "xyz"], "max_tokens": 4}).json()
    assert [c["text"] for c in oai["choices"]] == ["abab", "xyzx"]
    assert oai["usage"]["completion_tokens"] == 8


def test_oai_completion_stream_ends_with_done(client):
    events = stream_events(client, "/v1/completions", {"prompt": "ab", "max_tokens": 5,
                                                       "stream": True})  # fmt: skip
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "ababa"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert {c["object"] for c in chunks} == {"text_completion"}
    # OpenAI's include_usage adds a last chunk with empty choices and the total usage
    events = stream_events(client, "/v1/completions", {"prompt": ["ab", "x"], "max_tokens": 3,
                           "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 6


def test_chat_json_and_stream_with_usage(client):
    body = {"model": "anything", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    chat = client.post("/v1/chat/completions", json=body).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "<user>"}
    body.update(stream=True, stream_options={"include_usage": True})
    events = stream_events(client, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "<user>"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert "timings" in chunks[-1]


BAD_REQUESTS = [
    ("/completion", b"{not json", "Invalid JSON"),
    # Python's json reads NaN and Infinity; JSON (and llama-server's parser) has neither
    ("/completion", b'{"prompt": "a", "temperature": NaN}', "NaN is not a JSON value"),
    ("/completion", b'{"prompt": "a", "logit_bias": {"5": -Infinity}}', "-Infinity is not"),
    ("/completion", b'{"prompt": "a", "logit_bias": [[5, 1e400]]}',
     "Field 'logit_bias': a bias must be a finite number or false"),
    ("/completion", b"[1, 2]", "JSON object"),
    ("/completion", b'{"prompt": "a", "n_predict": -5}', "n_predict"),
    ("/completion", b'{"prompt": "a", "n_predict": "ten"}', "n_predict"),
    ("/completion", b'{"prompt": "a", "temperature": "hot"}', "temperature"),
    ("/completion", b'{"prompt": "a", "stop": 3}', "stop"),
    ("/completion", b'{"n_predict": 3}', "prompt"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 1.5}', "max_tokens"),
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "content"),
    # messages without content, as llama-server rejects them
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}',
     "Field 'messages[0]': all non-assistant messages must contain 'content'"),
    ("/v1/chat/completions", b'{"messages": [{"role": "system", "content": "a"}, {}]}',
     "Field 'messages[1]': all non-assistant messages must contain 'content'"),
    ("/v1/chat/completions", b'{"messages": [{"role": "assistant"}]}',
     "must contain either 'content' or 'tool_calls'"),
    ("/apply-template", b'{"messages": [{"role": "user"}]}', "must contain 'content'"),
    ("/v1/chat/completions", b'{"messages": [{"content": "a"}]}', "'role' must be a non-empty"),
    ("/completion", b'{"prompt": [1, 99999]}', "token id"),
    # Beyond the C ABI's int32_t / float
    ("/completion", b'{"prompt": "a", "n_predict": 1099511627776}', "Field 'n_predict'"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 1099511627776}', "Field 'max_tokens'"),
    ("/completion", b'{"prompt": "a", "top_k": 1099511627776}', "Field 'top_k'"),
    ("/completion", b'{"prompt": "a", "seed": 1180591620717411303424}', "Field 'seed'"),
    ("/completion", b'{"prompt": "a", "temperature": 1e300}', "temperature must fit a C float (magnitude at most 3.403e+38)"),
    # Text with no UTF-8 form: raw bytes that are not UTF-8, or JSON escapes of lone surrogates.
    ("/completion", b'{"prompt": "caf\xe9"}', "Invalid JSON in request body"),
    ("/completion", b'{"prompt": "a\\ud800b"}',
     "Field 'prompt' is not valid UTF-8 text: lone surrogate U+D800 at character 1"),
    ("/v1/completions", b'{"prompt": ["ok", "\\udcff"]}', "Field 'prompt[1]' is not valid UTF-8"),
    ("/completion", b'{"prompt": [1, "\\ud800"]}', "Field 'prompt' (piece 1) is not"),
    ("/completion", b'{"prompt": "a", "stop": ["\\ud800"]}', "stop string is not valid UTF-8"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
     "Field 'messages[0]'.content is not valid UTF-8"),
    ("/tokenize", b'{"content": "\\ud800"}', "Field 'content' is not valid UTF-8"),
    # nesting deeper than Python's parser recurses (was a 500 from its RecursionError)
    ("/v1/completions", b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    ("/completion", b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}", "nested too deeply"),
    # tool_choice as llama-server reads it
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a"}], "tool_choice": "bogus"}',
     "Invalid tool_choice: bogus"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}],'
     b' "grammar": "root ::= [a]"}', "Cannot use custom grammar constraints with tools."),
    # token ids beyond int32 (were a 500 from the C ABI conversion)
    ("/detokenize", b'{"tokens": [99999999999999999999999]}', "Field 'tokens[0]': token id"),
    ("/tokenize", b'{"content": [99999999999999999999999]}', "Field 'content[0]': token id"),
    # negative probability counts (the first two were a 200 without probabilities)
    ("/completion", b'{"prompt": "a", "n_probs": -1}', "Field 'n_probs': value must be at least 0"),
    ("/v1/completions", b'{"prompt": "a", "logprobs": -1}',
     "Field 'logprobs': value must be at least 0"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": -1}',
     "Field 'top_logprobs'"),
]


@pytest.mark.parametrize("path,raw,fragment", BAD_REQUESTS)
def test_bad_requests_are_400(client, path, raw, fragment):
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert fragment in error["message"]


def test_tool_choice_required_is_refused_by_name(client):
    """With tools, llama-server constrains a "required" answer to a tool call and parses it into
    message.tool_calls; cacheflow serve parses no tool calls, so it refuses the request by name
    (501) instead of answering with plain text. "none", "auto" and an object (llama-server reads
    a non-string as "auto") pass the check (this fake model has no Jinja template for tools)."""
    body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}  # fmt: skip
    response = client.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    assert response.status_code == 501, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"]) == (501, "not_supported_error")
    assert 'tool_choice "required" is not supported' in error["message"]
    for choice in ("auto", "none", {"type": "function", "function": {"name": "f"}}):
        answer = client.post("/v1/chat/completions", json={**body, "tool_choice": choice})
        assert answer.status_code == 400 and "tools need a Jinja chat template" in answer.text


def test_prompt_over_context_is_400_while_a_stream_continues(client, server):
    body = {"prompt": "abcd", "n_predict": 200, "stream": True}
    with client.stream("POST", "/completion", json=body) as response:
        lines = response.iter_lines()
        first = next(sse_data(lines))
        with httpx.Client(base_url=server.base_url, timeout=30) as other:
            too_long = other.post("/completion", json={"prompt": "x" * FAKE_CTX_PER_SEQ})
            bad = other.post("/completion", content=b"{")
        rest = list(sse_data(lines))
    assert too_long.status_code == 400 and bad.status_code == 400
    error = too_long.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["n_prompt_tokens"] == FAKE_CTX_PER_SEQ and error["n_ctx"] == FAKE_CTX_PER_SEQ
    text = first["content"] + "".join(e["content"] for e in rest)
    assert text == ("abcd" * 50) and rest[-1]["stop"] is True


def test_disconnect_aborts_the_request(client, server):
    before = parse_metrics(client.get("/metrics").text)
    body = {"prompt": "ab", "stream": True}
    with (
        httpx.Client(base_url=server.base_url) as other,
        other.stream("POST", "/completion", json=body) as resp,
    ):
        next(sse_data(resp.iter_lines()))  # one event, then hang up
    for _ in range(100):
        after = parse_metrics(client.get("/metrics").text)
        if after['cacheflow:requests_finished_total{reason="abort"}'] > 0:
            break
        threading.Event().wait(0.02)
    key = 'cacheflow:requests_finished_total{reason="abort"}'
    assert after[key] == before[key] + 1
    assert after["llamacpp:requests_processing"] == 0
    assert not any(s["is_processing"] for s in client.get("/slots").json())


TRUNCATED_BODIES = [
    ("/completion", b"Content-Length: 100\r\n", b'{"prompt":'),
    ("/v1/chat/completions", b"Transfer-Encoding: chunked\r\n",
     b'20\r\n{"messages": [{"role": "user", '),  # fmt: skip
    ("/tokenize", b"Content-Length: 100\r\n", b'{"content":'),  # a Starlette-routed endpoint
]


def test_a_client_gone_while_sending_its_body_logs_no_traceback(client, server):
    """A body cut off by the client logged starlette's ClientDisconnect as a ~30-line
    "Exception in ASGI application" traceback; now it is quiet and the server stays healthy."""
    host, port = server.base_url.removeprefix("http://").split(":")
    for path, framing, partial in TRUNCATED_BODIES:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            sock.sendall(head.encode() + framing + b"\r\n" + partial)
            time.sleep(0.1)  # the server has read the partial body before the close
    time.sleep(0.3)  # the disconnects reach the handlers
    assert client.get("/health").status_code == 200
    assert client.post("/completion", json={"prompt": "ab", "n_predict": 2}).json()["content"]
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


def test_requests_beyond_the_slots_get_slot_ids_in_range(server):
    """More concurrent requests than slots: every id_slot is one of the slots (was -1)."""
    num_requests = FAKE_MAX_NUM_SEQS + 8
    results: list[object] = [None] * num_requests

    def send(i: int) -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            body = {"prompt": "abc", "n_predict": 40, "stream": True}
            results[i] = stream_events(c, "/completion", body)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(num_requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for events in results:
        slot_ids = {e["id_slot"] for e in events}
        assert len(slot_ids) == 1 and 0 <= slot_ids.pop() < FAKE_MAX_NUM_SEQS, events[-1]


def test_metrics_text_parses(client):
    client.post("/completion", json={"prompt": "ab", "n_predict": 3})
    samples = parse_metrics(client.get("/metrics").text)
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:n_decode_total", "llamacpp:requests_processing",
                 "cacheflow:time_to_first_token_seconds_count",
                 "cacheflow:time_per_output_token_seconds_bucket{le=\"+Inf\"}",
                 "cacheflow:kv_blocks_used", "cacheflow:kv_blocks_free",
                 "cacheflow:prefix_cache_hit_rate", "cacheflow:preemptions_total",
                 "cacheflow:prefix_cache_blocks", "cacheflow:prefix_cache_evictions_total",
                 "cacheflow:prefix_cache_hit_tokens_total",
                 "cacheflow:swap_bytes_total", "cacheflow:preemptions_swap_total",
                 "cacheflow:recomputed_tokens_total", "cacheflow:swapped_sequences",
                 'cacheflow:sampled_rows_total{route="top_k"}',
                 'cacheflow:cuda_graph_evaluations_total{mode="replayed"}',
                 "cacheflow:padding_tokens_total", "cacheflow:lookahead_decodes_total",
                 "cacheflow:lookahead_adopted_total"):  # fmt: skip
        assert name in samples, name
    assert samples["llamacpp:tokens_predicted_total"] >= 3


def test_unknown_route_is_404_in_openai_format(client):
    response = client.get("/v2/nothing")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


def test_wrong_method_is_405_with_allow(client):
    response = client.put("/health")
    assert response.status_code == 405
    assert "GET" in response.headers["allow"]
    assert response.json()["error"]["message"].startswith("PUT /health:")


def test_api_key(fake_env, fake_model):
    proc = start(fake_env, fake_model, "--api-key", "k1,k2")
    try:
        with httpx.Client(base_url=proc.base_url, timeout=30) as c:
            body = {"prompt": "ab", "n_predict": 2}
            assert c.get("/health").status_code == 200  # public
            missing = c.post("/completion", json=body)
            assert missing.status_code == 401
            assert missing.json()["error"] == {
                "code": 401,
                "message": "Invalid API Key",
                "type": "authentication_error",
            }
            wrong = c.post("/completion", json=body, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            ok = c.post("/completion", json=body, headers={"Authorization": "Bearer k2"})
            assert ok.status_code == 200 and ok.json()["content"] == "ab"
            assert c.get("/v1/models", headers={"X-Api-Key": "k1"}).status_code == 200
            # Browsers send no key with a CORS preflight: it is answered before the key check.
            preflight = c.options("/completion", headers=preflight_headers(ORIGIN))
            assert preflight.status_code == 200
            assert preflight.headers["access-control-allow-origin"] == ORIGIN
            rejected = c.post("/completion", json=body, headers={"Origin": ORIGIN})
            assert rejected.status_code == 401  # and readable by the page:
            assert rejected.headers["access-control-allow-origin"] == ORIGIN
    finally:
        assert proc.stop() == 0
        proc.close()


ORIGIN = "http://app.example:3000"


def preflight_headers(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }


def test_cors_preflight_and_origin_by_default(client):
    """As llama-server by default: any Origin is echoed back, with credentials allowed."""
    preflight = client.options("/v1/chat/completions", headers=preflight_headers(ORIGIN))
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert preflight.headers["access-control-allow-credentials"] == "true"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert preflight.headers["access-control-allow-headers"] == "*"  # --cors-headers, as is
    answer = client.post("/completion", json={"prompt": "ab", "n_predict": 2},
                         headers={"Origin": ORIGIN})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["content"] == "ab"
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-origin" not in client.get("/health").headers  # no Origin


def test_cors_origins_localhost(fake_env, fake_model):
    proc = start(fake_env, fake_model, "--cors-origins", "localhost", "--no-cors-credentials")
    try:
        with httpx.Client(base_url=proc.base_url, timeout=30) as c:
            local = c.options("/completion", headers=preflight_headers("http://localhost:5173"))
            assert local.status_code == 200
            assert local.headers["access-control-allow-origin"] == "http://localhost:5173"
            assert local.headers["access-control-allow-credentials"] == "false"
            # llama-server answers any preflight; a foreign origin just gets no Allow-Origin
            other = c.options("/completion", headers=preflight_headers(ORIGIN))
            assert other.status_code == 200
            assert "access-control-allow-origin" not in other.headers
            health = c.get("/health", headers={"Origin": ORIGIN})
            assert "access-control-allow-origin" not in health.headers
    finally:
        assert proc.stop() == 0
        proc.close()


@pytest.fixture(scope="module")
def slow_fake_env(tmp_path_factory) -> dict[str, str]:
    """The fake with 50 ms steps: a stream of its 256-token context lasts ~12 s."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake libcacheflow")
    folder = tmp_path_factory.mktemp("fakecf_slow")
    source = FAKE_SOURCE.read_text().replace("{0, 1000000}", "{0, 50000000}")
    assert "{0, 50000000}" in source, "the fake's step sleep moved: update this fixture"
    (folder / "fake_slow.c").write_text(source)
    out = folder / "libcacheflow_fake_slow.so"
    subprocess.run([cc, "-std=c11", "-O1", "-shared", "-fPIC", f"-I{REPO / 'native' / 'include'}",
                    str(folder / "fake_slow.c"), "-o", str(out), "-lpthread"], check=True)  # fmt: skip
    return {"CACHEFLOW_LIB": str(out)}


def test_a_second_sigint_ends_streams_with_the_shutdown_error(slow_fake_env, fake_model):
    """Ctrl-C twice (uvicorn's forced exit cancels the streams): each stream still ends with the
    503 event of a graceful shutdown, and the server logs no traceback."""
    proc = start(slow_fake_env, fake_model)
    lasts: list[object] = []

    def read_stream() -> None:
        body = {"prompt": "abcdefgh", "stream": True, "ignore_eos": True}
        with (
            httpx.Client(base_url=proc.base_url, timeout=30) as c,
            c.stream("POST", "/completion", json=body) as resp,
        ):
            lasts.append(list(sse_data(resp.iter_lines()))[-1])

    try:
        readers = [threading.Thread(target=read_stream) for _ in range(3)]
        for reader in readers:
            reader.start()
        deadline = 100
        while proc.log().count("POST /completion") < 3 and deadline:  # the streams have started
            threading.Event().wait(0.05)
            deadline -= 1
        threading.Event().wait(0.5)
        proc.proc.send_signal(signal.SIGINT)
        threading.Event().wait(0.5)
        proc.proc.send_signal(signal.SIGINT)
        for reader in readers:
            reader.join(30)
        assert len(lasts) == 3 and all(last["error"]["code"] == 503 for last in lasts), lasts
        assert proc.proc.wait(30) == 0, proc.log()  # it exits by itself (stop() would add a SIGTERM)
        assert "Traceback" not in proc.log(), proc.log()
    finally:
        proc.close()


@pytest.mark.parametrize(
    "sig,grace_s", [(signal.SIGTERM, "0"), (signal.SIGINT, "5")], ids=["SIGTERM", "SIGINT"]
)
def test_graceful_shutdown_exits_0(fake_env, fake_model, sig, grace_s):
    """In-flight streams finish within the grace time, or end with a 503 error event."""
    proc = start(fake_env, fake_model, "--shutdown-timeout", grace_s)
    try:
        body = {"prompt": "ab", "stream": True, "ignore_eos": True}
        with (
            httpx.Client(base_url=proc.base_url, timeout=30) as c,
            c.stream("POST", "/completion", json=body) as resp,
        ):
            events = sse_data(resp.iter_lines())
            next(events)
            proc.proc.send_signal(sig)
            last = list(events)[-1]
        if grace_s == "0":
            assert last.get("stop") is True or last["error"]["code"] == 503
        else:
            assert last["stop"] is True and last["stop_type"] == "limit"
        assert proc.stop(timeout_s=20) == 0, proc.log()
        assert "Traceback" not in proc.log()
        with pytest.raises(httpx.TransportError):
            httpx.get(proc.base_url + "/health", timeout=1)
    finally:
        proc.close()


def test_unsupported_llama_server_flag_is_named():
    result = CliRunner().invoke(cacheflow, ["serve", "--adaptive-target", "0.5"])
    assert result.exit_code == 2
    assert "unsupported llama-server flag --adaptive-target: " in result.output
    result = CliRunner().invoke(cacheflow, ["serve", "--no-such-thing"])
    assert result.exit_code == 2 and "--no-such-thing" in result.output


def test_n_choices_input_tokens_and_verbose(client):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 3,
            "verbose": True}  # fmt: skip
    chat = client.post("/v1/chat/completions", json=body).json()
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == "<use" for c in chat["choices"])
    assert chat["usage"]["completion_tokens"] == 12 and chat["__verbose"]["prompt"] == "<user>hi|A:"
    events = stream_events(client, "/v1/chat/completions", {**body, "stream": True})
    ends = [c["choices"][0]["index"] for c in events[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(ends) == [0, 1, 2]
    texts = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "n": 2}).json()
    assert [c["text"] for c in texts["choices"]] == ["ab", "ab"]
    # as llama-server: at most one choice per slot (n_cmpl's hard limit is n_parallel)
    many = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "n": 17})
    assert many.status_code == 400
    assert "Field 'n': value must be between 1 and 16, got 17" in many.json()["error"]["message"]
    for bad in (0, -1):  # the same bounds below
        none = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "n": bad})
        assert none.status_code == 400
        assert f"Field 'n': value must be between 1 and 16, got {bad}" in none.json()["error"]["message"]
    count = client.post("/chat/completions/input_tokens", json={"messages": body["messages"]})
    assert count.json() == {"input_tokens": len("<user>hi|A:")}


def test_llama_server_shapes_of_slots_metrics_and_models(client):
    idle = client.get("/slots").json()[0]
    assert set(idle) == {"id", "id_task", "n_ctx", "speculative", "is_processing"}
    props = client.get("/props").json()["default_generation_settings"]
    assert props["next_token"][0]["n_decoded"] == 0 and props["params"]["seed"] == -1
    client.post("/completion", json={"prompt": "ab", "n_predict": 3})
    response = client.get("/metrics")
    assert int(response.headers["Process-Start-Time-Unix"]) > 0
    text = response.text
    assert "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total " in text
    assert "# TYPE llamacpp:n_tokens_max counter\n" in text
    assert "llamacpp:spec_decode_num_drafts_total 0" in text
    # the throughput gauges cover the window since the previous scrape
    assert "llamacpp:predicted_tokens_seconds 0.0\n" in client.get("/metrics").text


def test_web_page_flags_and_aliases(fake_env, fake_model):
    proc = start(fake_env, fake_model, "--api-key", "k", "--alias", "zeta,alpha", "--tags", "a,b",
                 "--temp", "0", "-s", "42", "--repeat-penalty", "1.1")  # fmt: skip
    try:
        with httpx.Client(base_url=proc.base_url, timeout=30) as c:
            page = c.get("/")  # public, as llama-server's web UI
            assert page.status_code == 200 and page.text.startswith("<!doctype html>")
            assert "/v1/chat/completions" in page.text and "http" not in page.text.split("<script>")[1]
            model = c.get("/v1/models", headers={"X-Api-Key": "k"}).json()["data"][0]
            assert model["id"] == "alpha" and model["tags"] == ["a", "b"]  # ids sorted, as std::set
            params = c.get("/props", headers={"X-Api-Key": "k"}).json()["default_generation_settings"]["params"]
            assert (params["temperature"], params["seed"], params["repeat_penalty"]) == (0.0, 42, 1.1)
    finally:
        assert proc.stop() == 0
        proc.close()
    proc = start(fake_env, fake_model, "--no-ui", "--no-slots")
    try:
        assert httpx.get(proc.base_url + "/").status_code == 404
        for path, flag in (("/metrics", "--metrics"), ("/slots", "--slots")):  # llama-server's
            error = httpx.get(proc.base_url + path).json()["error"]  # words, flag included
            assert error["code"] == 501 and error["message"].endswith(f"Start it with `{flag}`")
    finally:
        assert proc.stop() == 0
        proc.close()


def test_truncated_only_when_the_slot_context_is_full(client):
    """llama-server's ``truncated``: the output stopped because the slot's context was full,
    not at the request's own n_predict (the fake's context is 256 tokens per slot)."""
    full = client.post("/completion", json={"prompt": "ab", "n_predict": 1000}).json()
    assert full["truncated"] is True and full["tokens_predicted"] == FAKE_CTX_PER_SEQ - 2
    short = client.post("/completion", json={"prompt": "ab", "n_predict": 3}).json()
    assert short["truncated"] is False and short["stop_type"] == "limit"
    events = stream_events(client, "/completion", {"prompt": "ab", "n_predict": 1000,
                                                   "stream": True})  # fmt: skip
    assert events[-1]["truncated"] is True


def test_system_fingerprint_is_the_build(client):
    """OpenAI's system_fingerprint in llama-server's build_info form, "b<release>" from the
    library's cf_version (the fake's is "fake"); the same on every route and chunk."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answers = [client.post("/v1/chat/completions", json=chat).json(),
               client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2}).json()]
    answers += stream_events(client, "/v1/chat/completions", {**chat, "stream": True})[:-1]
    assert {a["system_fingerprint"] for a in answers} == {"bfake"}


def test_props_show_the_template_chat_requests_are_rendered_with(client, fake_env, fake_model,
                                                                  tmp_path):  # fmt: skip
    """llama-server's /props: the template text (here the fake GGUF's metadata cannot be read,
    so "" and no caps beyond plain text), and with --chat-template-file that file's text,
    its capabilities and the fields a llama.cpp UI reads."""
    props = client.get("/props").json()
    assert props["chat_template"] == "" and props["ui"] is True and props["ui_settings"] == {}
    assert props["build_info"] == "bfake" and props["cors_proxy_enabled"] is False
    assert "chat_template_tool_use" not in props
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    proc = start(fake_env, fake_model, "--chat-template-file", str(template))
    try:
        with httpx.Client(base_url=proc.base_url, timeout=30) as c:
            props = c.get("/props").json()
            assert props["chat_template"] == template.read_text()
            caps = props["chat_template_caps"]
            assert caps["supports_system_role"] and caps["supports_string_content"]
            assert not caps["supports_tools"] and not caps["supports_typed_content"]
            body = {"messages": [{"role": "user", "content": "x"}]}
            assert c.post("/apply-template", json=body).json() == {"prompt": "user: x\n"}
    finally:
        assert proc.stop() == 0
        proc.close()
    proc = start(fake_env, fake_model, "--chat-template", "chatml")
    try:
        props = httpx.get(proc.base_url + "/props", timeout=30).json()
        assert props["chat_template"].startswith("{% for message in messages %}<|im_start|>")
    finally:
        assert proc.stop() == 0
        proc.close()


def test_several_listen_addresses_no_slots_and_the_default_n_predict(fake_env, fake_model):
    """llama-server's --host A,B (one socket each, same port), --no-slots (/slots is 501) and
    -n (the output limit of a request that sets none)."""
    server = ServerProcess(["-m", str(fake_model), "-np", "2", "--no-slots", "-n", "5"],
                           env=fake_env, host="127.0.0.1,127.0.0.2")  # fmt: skip
    try:
        server.wait_ready()
        for host in ("127.0.0.1", "127.0.0.2"):
            assert httpx.get(f"http://{host}:{server.port}/health").json() == {"status": "ok"}
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            slots = c.get("/slots")
            assert slots.status_code == 501 and slots.json()["error"]["code"] == 501
            assert c.get("/props").json()["endpoint_slots"] is False
            assert c.post("/completion", json={"prompt": "ab"}).json()["content"] == "ababa"
            limited = c.post("/completion", json={"prompt": "ab", "n_predict": 2}).json()
            assert limited["content"] == "ab"
    finally:
        assert server.stop() == 0, server.log()
        server.close()


def test_token_array_and_mixed_prompts_and_the_slot_context(client):
    """llama-server's prompts as token ids, or text pieces and ids mixed; /slots shows each
    slot's context (the fake's tokens are bytes: 104 = "h", 105 = "i")."""
    ids = client.post("/completion", json={"prompt": [104, 105], "n_predict": 3}).json()
    assert ids["content"] == "hih" and ids["tokens_evaluated"] == 2
    mixed = client.post("/completion", json={"prompt": ["h", 105, "!"], "n_predict": 4}).json()
    assert mixed["content"] == "hi!h" and mixed["tokens_evaluated"] == 3
    oai = client.post("/v1/completions", json={"prompt": [[104, 105], "ab"], "max_tokens": 2})
    assert [c["text"] for c in oai.json()["choices"]] == ["hi", "ab"]
    assert {s["n_ctx"] for s in client.get("/slots").json()} == {FAKE_CTX_PER_SEQ}


# A chat template that marks reasoning (<think>reasoning_content</think>) and renders a user
# turn as its bare content, so that the fake, which generates its prompt, answers with the
# user's text: the model "thinks" exactly what the test writes.
THINKING_TEMPLATE = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}"
    "<think>{{ m.reasoning_content or '' }}</think>{{ m.content }}"
    "{%- else -%}{{ m.content }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt and enable_thinking is false -%}/no_think{%- endif -%}"
)


def test_reasoning_moves_to_reasoning_content(fake_env, fake_model, tmp_path):
    """As llama-server: the template's markers (found by probing it) split the answer into
    message.reasoning_content and content, streamed as reasoning_content deltas then content
    deltas; reasoning_format "none" (request or --reasoning-format) leaves it in the content;
    -rea off tells the template enable_thinking false."""
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    said = "<think>two and two</think>four"
    body = {"messages": [{"role": "user", "content": said}], "max_tokens": len(said)}
    proc = start(fake_env, fake_model, "--chat-template-file", str(template))
    try:
        with httpx.Client(base_url=proc.base_url, timeout=30) as c:
            message = c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
            assert message == {"role": "assistant", "content": "four",
                               "reasoning_content": "two and two"}  # fmt: skip
            events = stream_events(c, "/v1/chat/completions", {**body, "stream": True})
            deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
            assert "".join(d.get("reasoning_content", "") for d in deltas) == "two and two"
            assert "".join(d.get("content") or "" for d in deltas) == "four"
            assert all(len(d) == 1 for d in deltas[1:-1])  # one part per chunk, none empty
            assert all(next(iter(d.values())) for d in deltas[1:-1])
            last_reasoning = max(i for i, d in enumerate(deltas) if "reasoning_content" in d)
            assert all("content" not in d for d in deltas[1:last_reasoning])
            raw = c.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
            assert raw["choices"][0]["message"] == {"role": "assistant", "content": said}
            settings = c.get("/props").json()["default_generation_settings"]["params"]
            assert settings["reasoning_format"] == "deepseek"
            prompt = c.post("/apply-template", json=body).json()["prompt"]
            assert prompt == said  # enable_thinking true: the template supports thinking
    finally:
        assert proc.stop() == 0, proc.log()
        proc.close()
    proc = start(fake_env, fake_model, "--chat-template-file", str(template),
                 "--reasoning-format", "none", "-rea", "off")  # fmt: skip
    try:
        with httpx.Client(base_url=proc.base_url, timeout=30) as c:
            prompt = c.post("/apply-template", json=body).json()["prompt"]
            assert prompt == said + "/no_think"
            answer = c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
            assert answer == {"role": "assistant", "content": said}
    finally:
        assert proc.stop() == 0, proc.log()
        proc.close()
