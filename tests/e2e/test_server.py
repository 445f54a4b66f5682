"""`cacheflow serve` end to end with the real default model (SmolLM2-135M-Instruct) on
127.0.0.1: llama-server and OpenAI formats, greedy outputs equal to LLM.generate, 64 concurrent
streams, disconnects, bad input next to a running stream, metrics, the openai client, priority
and API keys. Request counts are bounded; outputs are short (greedy, EOS ignored).

HTTP mechanics are covered in more detail, without a model, by test_server_fake.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from serve_helpers import ServerProcess, parse_metrics, sse_data, stream_events

from pycacheflow import SamplingParams
from pycacheflow.gguf_metadata import chat_template_of

pytestmark = pytest.mark.e2e

NUM_SLOTS = 16
CTX_PER_SEQ = 512
NUM_CLIENTS = 64
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three primary colors:",
    "2 + 2 =",
    "Water boils at",
    "In machine learning, a transformer is",
    "My favourite food is",
]


def greedy_body(prompt: str, n: int, **extra: object) -> dict[str, object]:
    """A greedy llama-server request of exactly n tokens."""
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, **extra}


@pytest.fixture(scope="module")
def server(real_model_path):
    args = ["-m", str(real_model_path), "-np", str(NUM_SLOTS), "-c", str(NUM_SLOTS * CTX_PER_SEQ),
            "--metrics", "--alias", "smollm2"]  # fmt: skip
    proc = ServerProcess(args)
    proc.wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log()  # SIGTERM: graceful, exit status 0
    proc.close()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def test_health_props_models(client):
    assert client.get("/health").json() == {"status": "ok"}
    props = client.get("/props").json()
    assert props["total_slots"] == NUM_SLOTS
    # paged KV (the default for this model): one pool of -c tokens that any one sequence may fill
    cacheflow = props["cacheflow"]
    assert cacheflow["kv_mode"] == "paged" and cacheflow["n_ctx"] == NUM_SLOTS * CTX_PER_SEQ
    # llama-server's context per slot: -c split over the -np slots (the pool is shared anyway)
    assert props["default_generation_settings"]["n_ctx"] == CTX_PER_SEQ
    assert props["eos_token"] == "<|im_end|>"
    # the template chat requests are rendered with: the GGUF's own, as llama-server shows it
    assert props["chat_template"] == chat_template_of(props["model_path"])
    assert props["chat_template"].startswith("{% for message in messages %}")
    caps = props["chat_template_caps"]
    assert caps["supports_system_role"] and caps["supports_string_content"]
    assert not caps["supports_tools"] and not caps["supports_tool_calls"]
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert props["model_ftype"] == "Q4_1"  # llama.cpp's llama_ftype_name of the default model
    meta = client.get("/v1/models").json()["data"][0]["meta"]
    assert meta["ftype"] == "Q4_1"
    assert meta["vocab_type"] == 2  # LLAMA_VOCAB_TYPE_BPE, as llama-server reports SmolLM2's
    assert props["model_path"].endswith(".gguf") and props["build_info"].startswith("b")
    for path in ("/models", "/v1/models"):
        assert client.get(path).json()["data"][0]["id"] == "smollm2"


def test_completion_equals_llm_generate(client, real_llm):
    prompt = PROMPTS[0]
    expected = real_llm.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))[0]
    body = greedy_body(prompt, 12, return_tokens=True)
    result = client.post("/completion", json=body).json()
    assert result["content"] == expected.text
    assert result["tokens"] == list(expected.token_ids)
    assert result["tokens_evaluated"] == len(expected.prompt_token_ids)
    events = stream_events(client, "/completion", {**body, "stream": True})
    assert "".join(e["content"] for e in events) == expected.text
    assert [t for e in events for t in e["tokens"]] == list(expected.token_ids)
    assert events[-1]["stop"] is True and events[-1]["timings"]["predicted_n"] == 12


def test_oai_completion_and_chat_equal_llm_generate(client, real_llm):
    prompt, n = PROMPTS[1], 10
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    expected = real_llm.generate(prompt, params)[0].text
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    assert client.post("/v1/completions", json=body).json()["choices"][0]["text"] == expected
    events = stream_events(client, "/v1/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == expected

    chat_expected = real_llm.generate(PROMPTS[3], params, use_chat_template=True)[0].text
    chat = {"messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": n,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    message = client.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": chat_expected}
    events = stream_events(client, "/v1/chat/completions", {**chat, "stream": True})
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == chat_expected


async def _stream_text(client: httpx.AsyncClient, body: dict[str, object]) -> str:
    async with client.stream("POST", "/completion", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line async for line in response.aiter_lines()]
    events = list(sse_data(iter(lines)))
    assert events[-1]["stop"] is True
    # 64 clients on 16 slots: each request shows one slot id in [0, 16), as llama-server
    assert len({e["id_slot"] for e in events}) == 1 and 0 <= events[0]["id_slot"] < NUM_SLOTS
    return "".join(e["content"] for e in events)


def test_64_concurrent_streams_equal_each_alone(client, server):
    bodies = [greedy_body(f"Client {i % 8}: " + PROMPTS[i % len(PROMPTS)], 8)
              for i in range(NUM_CLIENTS)]  # fmt: skip
    alone = {}
    for body in bodies[:8]:  # 8 distinct prompts, each sent alone first
        alone[body["prompt"]] = client.post("/completion", json=body).json()["content"]

    async def run_all() -> list[str]:
        limits = httpx.Limits(max_connections=NUM_CLIENTS)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as c:
            return await asyncio.gather(*(_stream_text(c, b) for b in bodies))

    t0 = time.monotonic()
    texts = asyncio.run(run_all())
    wall_s = time.monotonic() - t0
    assert texts == [alone[b["prompt"]] for b in bodies], f"after {wall_s:.1f} s"
    samples = parse_metrics(client.get("/metrics").text)
    assert samples["llamacpp:requests_processing"] == 0


def _wait_idle(client: httpx.Client, timeout_s: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        samples = parse_metrics(client.get("/metrics").text)
        idle = samples["llamacpp:requests_processing"] + samples["llamacpp:requests_deferred"]
        if idle == 0 or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_disconnect_mid_stream_aborts_and_frees(client, server):
    key = 'cacheflow:requests_finished_total{reason="abort"}'
    before = parse_metrics(client.get("/metrics").text)[key]
    body = greedy_body(PROMPTS[2], 400, stream=True)
    with (
        httpx.Client(base_url=server.base_url, timeout=60) as other,
        other.stream("POST", "/completion", json=body) as response,
    ):
        events = sse_data(response.iter_lines())
        next(events), next(events)  # two tokens, then hang up
    samples = _wait_idle(client)
    assert samples["llamacpp:requests_processing"] == 0  # the engine dropped the sequence
    assert samples[key] == before + 1
    assert not any(s["is_processing"] for s in client.get("/slots").json())


def test_bad_requests_get_400_while_a_stream_continues(client, server):
    body = greedy_body(PROMPTS[4], 24)
    expected = client.post("/completion", json=body).json()["content"]
    n_ctx = client.get("/props").json()["default_generation_settings"]["n_ctx"]  # per sequence
    bad = [
        b"{not json",
        b'{"prompt": "x", "n_predict": "many"}',
        b'{"prompt": "x", "top_k": [1]}',
        b'{"prompt": "x", "n_predict": -5}',
        b'{"prompt": "' + b"hello " * (n_ctx + 10) + b'"}',
    ]
    with client.stream("POST", "/completion", json={**body, "stream": True}) as response:
        lines = response.iter_lines()
        first = next(sse_data(lines))
        with httpx.Client(base_url=server.base_url, timeout=60) as other:
            answers = [other.post("/completion", content=raw) for raw in bad]
        rest = list(sse_data(lines))
    assert [a.status_code for a in answers] == [400] * len(bad)
    assert all(a.json()["error"]["message"] for a in answers)
    assert answers[-1].json()["error"]["type"] == "exceed_context_size_error"
    assert first["content"] + "".join(e["content"] for e in rest) == expected


def test_metrics_text_parses(client):
    client.post("/completion", json=greedy_body(PROMPTS[5], 4))
    samples = parse_metrics(client.get("/metrics").text)
    assert samples["llamacpp:tokens_predicted_total"] >= 4
    assert samples["llamacpp:n_decode_total"] > 0
    assert samples["cacheflow:time_to_first_token_seconds_count"] >= 1
    assert "cacheflow:kv_blocks_free" in samples and "cacheflow:preemptions_total" in samples


def test_prompt_cache_is_reported(client):
    """A repeated prompt reuses the first one's KV blocks: llama-server's timings.cache_n,
    OpenAI's usage.prompt_tokens_details.cached_tokens and /metrics say how many tokens."""
    prompt = "Prefix caching test. " + "The quick brown fox jumps over the lazy dog. " * 6
    first = client.post("/completion", json=greedy_body(prompt, 4)).json()
    second = client.post("/completion", json=greedy_body(prompt, 4)).json()
    assert second["content"] == first["content"]
    n_prompt = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    assert first["timings"]["cache_n"] == 0 and n_prompt > 32
    assert second["timings"]["cache_n"] == n_prompt - 1  # the last token is computed again
    assert second["timings"]["prompt_n"] == 1
    off = client.post("/completion", json=greedy_body(prompt, 4, cache_prompt=False)).json()
    assert off["timings"]["cache_n"] == 0 and off["content"] == first["content"]
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "temperature": 0}
    client.post("/v1/chat/completions", json=body)
    usage = client.post("/v1/chat/completions", json=body).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    samples = parse_metrics(client.get("/metrics").text)
    assert samples["llamacpp:prompt_tokens_cached_total"] >= 2 * (n_prompt - 1)
    assert samples["cacheflow:prefix_cache_hit_tokens_total"] >= 2 * (n_prompt - 1)
    assert samples["cacheflow:prefix_cache_blocks"] > 0


def test_openai_client(server, real_llm):
    openai = pytest.importorskip("openai")
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sk-none", timeout=120)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    expected = real_llm.generate(PROMPTS[6], params)[0].text
    extra = {"extra_body": {"ignore_eos": True}, "temperature": 0, "max_tokens": 8}
    done = oai.completions.create(model="smollm2", prompt=PROMPTS[6], **extra)
    assert done.choices[0].text == expected and done.usage.completion_tokens == 8
    chunks = oai.completions.create(model="smollm2", prompt=PROMPTS[6], stream=True, **extra)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected

    chat_expected = real_llm.generate(PROMPTS[7], params, use_chat_template=True)[0].text
    messages = [{"role": "user", "content": PROMPTS[7]}]
    reply = oai.chat.completions.create(model="smollm2", messages=messages, **extra)
    assert reply.choices[0].message.content == chat_expected
    stream = oai.chat.completions.create(
        model="smollm2", messages=messages, stream=True,
        stream_options={"include_usage": True}, **extra)  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat_expected and chunks[-1].usage.completion_tokens == 8


MAX_BODY_BYTES = 16 * 2**20  # --max-body-size's default


def _padded_body(num_bytes: int) -> bytes:
    """A valid one-token /completion body of exactly ``num_bytes`` (JSON whitespace pads it)."""
    body = b'{"prompt": "x", "n_predict": 1}'
    return body[:-1] + b" " * (num_bytes - len(body)) + b"}"


def test_a_body_over_the_limit_is_a_413_while_a_stream_continues(client, server):
    """A 200 MB prompt was read whole (minutes of a core, 16 GB RSS). Over --max-body-size
    (16 MiB by default) a body is a 413 in the server's error format, declared (Content-Length)
    or chunked; one of exactly the limit is served; the stream beside them is untouched."""
    body = greedy_body(PROMPTS[5], 24)
    expected = client.post("/completion", json=body).json()["content"]

    def chunks(num_bytes: int) -> Iterator[bytes]:  # no length: sent chunked
        data = _padded_body(num_bytes)
        for start in range(0, len(data), 1 << 20):
            yield data[start : start + (1 << 20)]

    with client.stream("POST", "/completion", json={**body, "stream": True}) as response:
        lines = response.iter_lines()
        first = next(sse_data(lines))
        with httpx.Client(base_url=server.base_url, timeout=60) as other:
            declared = other.post("/completion", content=_padded_body(MAX_BODY_BYTES + 1))
            chunked = other.post("/v1/completions", content=chunks(MAX_BODY_BYTES + 1))
            at_limit = other.post("/completion", content=_padded_body(MAX_BODY_BYTES))
            after = other.post("/completion", json=greedy_body(PROMPTS[0], 2))  # same connection
        rest = list(sse_data(lines))
    assert declared.status_code == 413 and chunked.status_code == 413
    assert declared.json()["error"] == {
        "code": 413, "type": "invalid_request_error",
        "message": f"Request body of {MAX_BODY_BYTES + 1} bytes is larger than the server's "
                   f"limit of {MAX_BODY_BYTES} bytes (--max-body-size)"}  # fmt: skip
    assert chunked.json()["error"]["message"] == (
        f"Request body is larger than the server's limit of {MAX_BODY_BYTES} bytes "
        "(--max-body-size)")  # fmt: skip
    assert "connection" not in declared.headers  # the body was read and dropped: kept alive
    assert at_limit.status_code == 200 and after.status_code == 200, (at_limit.text, after.text)
    assert first["content"] + "".join(e["content"] for e in rest) == expected


def test_a_huge_declared_body_is_refused_before_it_is_sent(server):
    """A Content-Length too large to read and drop: the 413 comes straight after the headers and
    closes the connection (the body is never sent here)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 200000000000\r\n\r\n{")  # fmt: skip
        answer = b""
        while chunk := sock.recv(65536):  # until the server closes
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in head, head
    assert json.loads(payload)["error"]["code"] == 413


def test_ctx_size_0_gives_every_slot_the_trained_context(real_model_path):
    """-c 0 as llama-server's default (--fit on): each of the -np slots gets the trained context
    (8192 tokens for SmolLM2), the pool all of them; it was 2048 a slot."""
    proc = ServerProcess(["-m", str(real_model_path), "-np", "2", "-c", "0", "-t", "1"])
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.base_url, timeout=120) as c:
            props = c.get("/props").json()
            assert props["default_generation_settings"]["n_ctx"] == 8192
            assert props["cacheflow"]["n_ctx"] == 2 * 8192
            assert [s["n_ctx"] for s in c.get("/slots").json()] == [8192, 8192]
            long_prompt = [1] * 3000  # more than 2048, as a llama-server slot would take
            answer = c.post("/completion", json={"prompt": long_prompt, "n_predict": 1})
            assert answer.status_code == 200, answer.text
    finally:
        assert proc.stop() == 0, proc.log()
        proc.close()


def test_priority_and_api_key(real_model_path):
    """One slot, policy priority: of two queued requests the smaller priority runs first."""
    proc = ServerProcess(["-m", str(real_model_path), "-np", "1", "-c", str(CTX_PER_SEQ),
                          "--policy", "priority", "--api-key", "secret"])  # fmt: skip
    try:
        proc.wait_ready()
        auth = {"Authorization": "Bearer secret"}
        with httpx.Client(base_url=proc.base_url, timeout=120) as c:
            body = greedy_body(PROMPTS[0], 2)
            wrong = {"Authorization": "Bearer x"}
            assert c.post("/completion", json=body).status_code == 401
            assert c.post("/completion", json=body, headers=wrong).status_code == 401
            assert c.post("/completion", json=body, headers=auth).status_code == 200
        finished = asyncio.run(_priority_order(proc.base_url, auth))
        assert finished == ["urgent", "late"]
    finally:
        assert proc.stop() == 0, proc.log()
        proc.close()


async def _priority_order(base_url: str, headers: dict[str, str]) -> list[str]:
    finished: list[str] = []

    async def run(c: httpx.AsyncClient, name: str, priority: int, n: int) -> None:
        body = greedy_body(PROMPTS[1], n, priority=priority)
        assert (await c.post("/completion", json=body)).status_code == 200
        finished.append(name)

    async with httpx.AsyncClient(base_url=base_url, timeout=120, headers=headers) as c:
        blocker = asyncio.create_task(run(c, "blocker", 0, 160))  # takes the only slot (~1 s)
        await asyncio.sleep(0.3)
        late = asyncio.create_task(run(c, "late", 9, 2))
        await asyncio.sleep(0.1)
        urgent = asyncio.create_task(run(c, "urgent", 1, 2))
        await asyncio.gather(blocker, late, urgent)
    return [name for name in finished if name != "blocker"]


def test_sigterm_aborts_streams_after_the_grace_time(real_model_path):
    proc = ServerProcess(["-m", str(real_model_path), "-np", "2", "-c", str(2 * CTX_PER_SEQ),
                          "--shutdown-timeout", "0.5"])  # fmt: skip
    try:
        proc.wait_ready()
        body = greedy_body(PROMPTS[2], 400, stream=True)
        with (
            httpx.Client(base_url=proc.base_url, timeout=60) as c,
            c.stream("POST", "/completion", json=body) as response,
        ):
            events = sse_data(response.iter_lines())
            next(events)
            proc.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            last = list(events)[-1]
        assert last["error"]["code"] == 503 and time.monotonic() - t0 < 10
        assert proc.stop(timeout_s=20) == 0, proc.log()
        assert "Traceback" not in proc.log()
    finally:
        proc.close()


def test_tokenize_pieces_that_are_not_utf8_are_bytes(client):
    text = "unicode 媽 and emoji 🤗"
    tokens = client.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    pieces = [t["piece"] for t in tokens]
    raw = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in pieces)
    assert raw.decode() == text
    assert any(isinstance(p, list) for p in pieces)  # the emoji spans several byte tokens


def test_json_schemas_constrain_the_output(client):
    """``json_schema`` and ``response_format`` schemas become grammars through llama.cpp's
    converter: the output is the schema's only value, on every route; a bad schema is a 400
    with the converter's reason."""
    chat = [{"role": "user", "content": "Write an example"}]
    const = {"const": "forty-two"}
    answers = [
        client.post("/completion", json={"prompt": "Say:", "n_predict": 12, "json_schema": const}),
        client.post("/v1/chat/completions", json={"messages": chat, "max_tokens": 12,
                                                  "json_schema": const}),  # fmt: skip
        client.post("/v1/chat/completions", json={
            "messages": chat, "max_tokens": 12,
            "response_format": {"type": "json_schema", "json_schema": {"schema": const}}}),
    ]  # fmt: skip
    texts = [answers[0].json()["content"]]
    texts += [a.json()["choices"][0]["message"]["content"] for a in answers[1:]]
    assert texts == ['"forty-two"'] * 3
    bad = client.post("/v1/chat/completions", json={
        "messages": chat, "response_format": {"type": "json_object", "schema": {"type": "hiccup"}}})
    assert bad.status_code == 400
    assert "unrecognized type hiccup" in bad.json()["error"]["message"]


def test_ignore_eos_bans_the_end_of_generation_tokens(client, real_llm):
    """llama-server's ignore_eos: a -inf logit bias on every EOG token, listed in
    generation_settings; the output never contains one."""
    eog = real_llm.eog_token_ids()
    assert real_llm.info.token_eos in eog
    question = "What is 2+2? Answer with one number."
    chat = {"messages": [{"role": "user", "content": question}], "max_tokens": 24,
            "temperature": 0}  # fmt: skip
    plain = client.post("/v1/chat/completions", json=chat).json()
    assert plain["choices"][0]["finish_reason"] == "stop"  # at <|im_end|>, before 24 tokens
    body = {"prompt": question, "n_predict": 24, "temperature": 0, "return_tokens": True}
    settings = client.post("/completion", json=body).json()["generation_settings"]
    assert settings["logit_bias"] == []
    result = client.post("/completion", json={**body, "ignore_eos": True}).json()
    biases = result["generation_settings"]["logit_bias"]
    assert sorted(b["token"] for b in biases) == eog and {b["bias"] for b in biases} == {None}
    assert len(result["tokens"]) == 24 and not set(result["tokens"]) & set(eog)
    forced = client.post("/v1/chat/completions", json={**chat, "ignore_eos": True}).json()
    assert forced["choices"][0]["finish_reason"] == "length"


def test_n_choices_share_the_prompt_and_sample_independently(client):
    """n > 1: the choices fork the prompt's KV (the first computes it; see test_choices.py) and
    are sampled independently: greedy choices agree, seeded ones use seed + i."""
    body = {"prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    single = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    one = client.post("/v1/completions", json=body).json()["usage"]
    three = client.post("/v1/completions", json={**body, "n": 3}).json()
    greedy = three["choices"]
    assert [c["index"] for c in greedy] == [0, 1, 2] and {c["text"] for c in greedy} == {single}
    # the prompt is counted once, the completions of every choice (OpenAI's usage, llama-server's)
    assert three["usage"]["prompt_tokens"] == one["prompt_tokens"]
    assert three["usage"]["completion_tokens"] == 3 * one["completion_tokens"]
    chat = {"messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 4, "temperature": 0}
    chat_one = client.post("/v1/chat/completions", json=chat).json()["usage"]
    chat_two = client.post("/v1/chat/completions", json={**chat, "n": 2}).json()["usage"]
    assert chat_two["prompt_tokens"] == chat_one["prompt_tokens"]
    seeded = {**body, "temperature": 2.0, "seed": 7}
    answer = client.post("/v1/completions", json={**seeded, "n": 3}).json()
    texts = [c["text"] for c in answer["choices"]]
    alone = [client.post("/v1/completions", json={**seeded, "seed": 7 + i}).json()
             for i in range(3)]  # fmt: skip
    alone = [a["choices"][0]["text"] for a in alone]
    assert texts == alone and len(set(texts)) == 3


# SmolLM2's ChatML with reasoning markers: an assistant turn is "<think>reasoning</think>answer",
# and the generation prompt opens the block (as Qwen3's and DeepSeek-R1's templates do).
THINKING_CHATML = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' -%}<think>{{ m.reasoning_content or '' }}</think>{%- endif -%}"
    "{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if enable_thinking is not false -%}<think>{%- endif -%}{%- endif -%}"
)


def test_reasoning_budget_closes_the_thinking_block(real_model_path, tmp_path, client):
    """--reasoning-budget and reasoning_budget_tokens as llama-server: for a template that marks
    reasoning, N tokens of thinking (the greedy ones), then reasoning_budget_message and the end
    marker are forced and the answer goes on as content; -1 in the request means the server's
    budget; thinking_budget_tokens is an alias. A template without markers ignores the budget."""
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_CHATML)
    chat = {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    # the whole answer in content, behind the block the generation prompt opened
    raw = {**chat, "reasoning_format": "none"}

    def content(c: httpx.Client, **fields: object) -> str:
        answer = c.post("/v1/chat/completions", json={**raw, **fields})
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["message"]["content"]

    proc = ServerProcess(["-m", str(real_model_path), "-np", "2", "-c", "2048",
                          "--chat-template-file", str(template)])  # fmt: skip
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.base_url, timeout=120) as c:
            free = content(c)
            assert "</think>" not in free  # the model never closes the block by itself
            limited = content(c, reasoning_budget_tokens=5, reasoning_budget_message=" Enough.")
            thought, _, answer = limited.partition(" Enough.</think>")
            assert thought and free.startswith(thought) and answer
            assert free.startswith("<think>")
            assert content(c, thinking_budget_tokens=0).startswith("<think></think>")
            split = c.post("/v1/chat/completions", json={**chat, "reasoning_budget_tokens": 5,
                                                          "reasoning_budget_message": " Enough."})
            message = split.json()["choices"][0]["message"]
            reasoning = thought.removeprefix("<think>") + " Enough."
            assert message["reasoning_content"].strip() == reasoning.strip()
            assert message["content"].strip() == answer.strip()
            bad = c.post("/v1/chat/completions", json={**chat, "reasoning_budget_tokens": -2})
            assert bad.status_code == 400 and "reasoning_budget_tokens" in bad.text
            # a grammar shapes the answer after the block, with or without a budget (it used to
            # fight the forced end marker and abort the server)
            yes_no = {**chat, "grammar": 'root ::= "yes" | "no"', "max_tokens": 16}
            answer = c.post("/v1/chat/completions", json={**yes_no, "reasoning_budget_tokens": 4})
            assert answer.status_code == 200, answer.text
            message = answer.json()["choices"][0]["message"]
            assert message["content"] in ("yes", "no") and message["reasoning_content"]
            unbounded = c.post("/v1/chat/completions", json=yes_no)  # the model keeps thinking
            assert unbounded.status_code == 200, unbounded.text
            assert unbounded.json()["choices"][0]["message"]["content"] in ("", "yes", "no")
            assert c.get("/health").json() == {"status": "ok"}
    finally:
        assert proc.stop() == 0, proc.log()
        proc.close()
    proc = ServerProcess(["-m", str(real_model_path), "-np", "2", "-c", "2048",
                          "--chat-template-file", str(template), "--reasoning-budget", "0",
                          "--reasoning-budget-message", " Enough."])  # fmt: skip
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.base_url, timeout=120) as c:
            assert content(c).startswith("<think> Enough.</think>")
            assert content(c, reasoning_budget_tokens=-1).startswith("<think> Enough.</think>")
            thought = content(c, reasoning_budget_tokens=5).partition(" Enough.</think>")[0]
            assert thought and free.startswith(thought)
    finally:
        assert proc.stop() == 0, proc.log()
        proc.close()
    # the default model's template marks no reasoning: the budget changes nothing
    plain = {"messages": chat["messages"], "max_tokens": 8, "temperature": 0}
    outputs = [client.post("/v1/chat/completions", json={**plain, **extra}).json()
               for extra in ({}, {"reasoning_budget_tokens": 0})]  # fmt: skip
    assert outputs[0]["choices"] == outputs[1]["choices"]


def test_a_grammar_with_no_token_left_is_a_400_for_that_request_alone(client):
    """A grammar whose every token the request's logit bias bans: llama.cpp's grammar would
    abort the server; CacheFlow answers that request with a 400 giving the reason, and the server
    runs on. Streamed too, the error is the stream's first result, so the answer is that JSON 400,
    not a 200 stream with an error event (llama-server treats a stream's first error so)."""
    body = {"prompt": "Pick a digit:", "n_predict": 4, "grammar": "root ::= [0-9]",
            "logit_bias": [[str(d), False] for d in range(10)]}  # fmt: skip
    answer = client.post("/completion", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("grammar: no token the grammar allows was left to sample")
    for path, extra in (("/completion", {}), ("/v1/completions", {"max_tokens": 4}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Pick a digit"}]})):
        streamed = client.post(path, json={**body, **extra, "stream": True})
        assert streamed.status_code == 400, (path, streamed.text)
        assert streamed.headers["content-type"].startswith("application/json")
        assert streamed.json()["error"]["message"].startswith("grammar: no token the grammar allows")
    assert client.post("/completion", json=greedy_body("2 + 2 =", 4)).status_code == 200


def test_llama_servers_other_samplers_run_and_are_reported(client, real_llm):
    """dry_*, xtc_*, typical_p, mirostat*, dynatemp_*, top_n_sigma and min_keep are no longer
    ignored: the output is LLM.generate's with the same settings (not the plain chain's), and
    generation_settings (per response and /props' defaults) reports the values in effect."""
    params = SamplingParams(max_tokens=16, ignore_eos=True, dry_multiplier=2.0)
    expected = real_llm.generate(PROMPTS[3] + " red, blue, red, blue, red, blue,", params)[0]
    body = greedy_body(PROMPTS[3] + " red, blue, red, blue, red, blue,", 16, dry_multiplier=2.0,
                       return_tokens=True)  # fmt: skip
    result = client.post("/completion", json=body).json()
    assert result["tokens"] == list(expected.token_ids)
    plain = client.post("/completion", json={**body, "dry_multiplier": 0}).json()
    assert plain["tokens"] != result["tokens"]
    settings = client.post("/completion", json={
        **greedy_body(PROMPTS[0], 2), "dry_multiplier": 0.5, "dry_base": 0.5,
        "dry_allowed_length": 3, "dry_penalty_last_n": 16, "dry_sequence_breakers": ["\n", "ab"], "xtc_probability": 2,
        "xtc_threshold": 0.2, "typical_p": 0.9, "mirostat": 2, "mirostat_tau": 4,
        "mirostat_eta": 0.2, "dynatemp_range": 0.5, "dynatemp_exponent": 2, "top_n_sigma": 1.5,
        "min_keep": 3}).json()["generation_settings"]  # fmt: skip
    assert {k: settings[k] for k in ("dry_multiplier", "dry_base", "dry_allowed_length",
                                     "dry_penalty_last_n", "dry_sequence_breakers",
                                     "xtc_probability", "xtc_threshold", "typical_p", "mirostat",
                                     "mirostat_tau", "mirostat_eta", "dynatemp_range",
                                     "dynatemp_exponent", "top_n_sigma", "min_keep")} == {
        "dry_multiplier": 0.5, "dry_base": 1.75, "dry_allowed_length": 3, "dry_penalty_last_n": 16,
        "dry_sequence_breakers": ["\n", "ab"], "xtc_probability": 1.0, "xtc_threshold": 0.2,
        "typical_p": 0.9, "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
        "dynatemp_range": 0.5, "dynatemp_exponent": 2.0, "top_n_sigma": 1.5, "min_keep": 3,
    }  # fmt: skip  (dry_base below 1: the server's; xtc_probability clamped to 1)
    assert settings["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                                    "min_p", "xtc", "temperature"]  # fmt: skip
    defaults = client.get("/props").json()["default_generation_settings"]["params"]
    assert (defaults["dry_multiplier"], defaults["dry_base"], defaults["dry_penalty_last_n"],
            defaults["xtc_threshold"], defaults["mirostat"], defaults["top_n_sigma"],
            defaults["min_keep"]) == (0.0, 1.75, 64, pytest.approx(0.1), 0, -1.0, 0)  # fmt: skip
    assert defaults["dry_sequence_breakers"] == ["\n", ":", '"', "*"]
    bad = client.post("/completion", json={**greedy_body(PROMPTS[0], 2),
                                           "dry_sequence_breakers": []})  # fmt: skip
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == ("Field 'dry_sequence_breakers': Error: "
                                              "dry_sequence_breakers must be a non-empty array "
                                              "of strings")  # fmt: skip
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0.7,
        "seed": 3, "mirostat": 2, "xtc_probability": 0.5, "top_n_sigma": 1.0})  # fmt: skip
    assert chat.status_code == 200, chat.text
