"""The multi-turn chat load of `cacheflow bench serve --dataset multi-turn`.

``concurrency`` conversations are in flight at once, each driven by its own task: it sends
turn 0 of a conversation to /v1/chat/completions (streamed, greedy, EOS ignored, prompt caching
asked for), waits for the whole reply, then sends turn 1 as the whole conversation so far
(system prompt, every earlier user message and the server's own replies, the new user message),
and so on; when a conversation's last turn is answered the task takes the next conversation not
yet started. A failed turn ends its conversation (its later turns would resend a reply that
does not exist).

Every turn is one request in the results (TTFT from its send, the client clock). The server's
final chunk reports the prompt length and the prompt tokens it reused
(``usage.prompt_tokens_details.cached_tokens``, or ``timings.cache_n``), so the hit rate is the
server's own count: llama-server's and CacheFlow's alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import orjson

from pycacheflow.bench import load_client
from pycacheflow.bench.datasets import Conversation, chat_messages
from pycacheflow.bench.online import OnlineRun

ENDPOINT = "/v1/chat/completions"


def chat_body(
    conversation: Conversation, replies: Sequence[str], model: str = "", cache_prompt: bool = True
) -> dict[str, object]:
    """The JSON body of the conversation's next turn (turn len(replies)).

    Args:
        conversation: the conversation.
        replies: the server's replies to the turns sent so far, in order.
        model: the "model" field ("default" if empty).
        cache_prompt: llama-server's per-request prompt cache switch.
    """
    return {
        "model": model or "default",
        "messages": chat_messages(conversation, replies),
        "max_tokens": conversation.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
        "cache_prompt": cache_prompt,
    }


async def _run(
    url: str,
    conversations: Sequence[Conversation],
    concurrency: int,
    model: str,
    cache_prompt: bool,
    timeout_s: float,
    on_finish: Callable[[], None] | None,
) -> load_client.ClientRun:
    client = load_client.make_client(url, ENDPOINT, timeout_s)
    pending = iter(conversations)  # shared by the tasks: one event loop, no lock needed
    client.run.start_s = time.perf_counter()

    async def drive() -> None:
        for conversation in pending:
            replies: list[str] = []
            for _ in range(conversation.num_turns):
                body = orjson.dumps(chat_body(conversation, replies, model, cache_prompt))
                stream = await client.one(load_client._Job(body, 0.0, 0), keep_text=True)
                if on_finish is not None:
                    on_finish()
                if stream is None:
                    break
                replies.append(stream.text)

    await asyncio.gather(*(drive() for _ in range(max(1, min(concurrency, len(conversations))))))
    client.run.end_s = time.perf_counter()
    return client.run


def run_conversations(
    base_url: str,
    conversations: Sequence[Conversation],
    concurrency: int,
    model: str = "",
    cache_prompt: bool = True,
    timeout_s: float = 600.0,
    on_finish: Callable[[], None] | None = None,
) -> OnlineRun:
    """Run every conversation against a server, ``concurrency`` at a time (closed loop).

    Args:
        base_url: e.g. "http://127.0.0.1:8080".
        conversations: the workload (``datasets.multi_turn_conversations``), taken in order.
        concurrency: conversations in flight at most, >= 1.
        model: the "model" field.
        cache_prompt: the requests' ``cache_prompt``.
        timeout_s: per turn.
        on_finish: called after each turn (progress bars).

    Returns:
        One RequestMetrics per answered turn (num_prompt_tokens and num_cached_tokens from the
        server's usage), one error message per failed turn.

    Raises:
        ValueError: a URL that is not http://host:port.
    """
    run = asyncio.run(
        _run(base_url, conversations, concurrency, model, cache_prompt, timeout_s, on_finish)
    )
    return OnlineRun(run.metrics, run.errors, run.end_s - run.start_s, run.client_busy_s,
                     run.num_chunks, 1)  # fmt: skip
