"""The generating endpoints: /completion, /v1/completions and /v1/chat/completions.

Each HTTP request submits its prompts through one ``RequestGroup`` and then either waits for
all of them (JSON answer) or streams their deltas as server-sent events. Whatever way the
handler ends (finished, client gone, cancelled at shutdown, error), the group is closed,
which aborts unfinished engine requests and so frees their KV blocks.

    parse body ─► submit prompts ─► stream? ─ no ─► wait (or client disconnect) ─► JSON
                                        └─ yes ─► SSE: one event per delta, final event(s)
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response, StreamingResponse

from pycacheflow import errors
from pycacheflow.server import responses, sse
from pycacheflow.server.pieces import Piece, PieceJoiner, delta_pieces
from pycacheflow.server.protocol import GenerationRequest, parse_chat, parse_completion
from pycacheflow.server.streams import RequestGroup

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import Receive, Scope, Send

    from pycacheflow.server.chat_reasoning import ChatReasoning
    from pycacheflow.server.responses import Completion
    from pycacheflow.server.state import Job, ServerState


class Api(enum.Enum):
    """Response format of a generating endpoint."""

    LLAMA = "completion"  # llama-server's native /completion
    OAI_COMPLETION = "text_completion"
    OAI_CHAT = "chat.completion"


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


async def handle(request: Request, api: Api, state: ServerState, body: object) -> Response:
    """Run one generating request; errors propagate to the app's error handlers."""
    parse = parse_chat if api is Api.OAI_CHAT else parse_completion
    req = parse(body, state.config.n_predict, state.config.defaults)
    prompts, reasoning = req.prompts, None
    if api is Api.OAI_CHAT:
        prompt = state.render_chat(req.messages, req.tools, req.template_kwargs,
                                   req.add_generation_prompt, req.continue_final_message)
        prompts, reasoning = (prompt,), state.chat_reasoning(req, prompt)
    group = RequestGroup(state.llm, waker=state.waker())
    state.groups.add(group)
    jobs: list[Job] = []
    streaming = False  # once True, the response's body iterator owns the group
    try:
        for prompt in prompts:
            token_ids = await state.resolve_prompt_off_loop(prompt)
            jobs += state.submit(group, req, token_ids, reasoning)
        if req.stream:
            stream = (_stream_chat(state, group, req, jobs, reasoning) if api is Api.OAI_CHAT
                      else _STREAMERS[api](state, group, req, jobs))  # fmt: skip
            body_iterator = _closing(stream, state, group, jobs)
            streaming = True
            return _EventStream(body_iterator, lambda: _close(state, group, jobs))
        done = await _until_done_or_disconnect(request, _collect(state, group, jobs))
    finally:
        if not streaming:
            _close(state, group, jobs)
    return JSONResponse(_json_body(api, state, req, jobs, done, reasoning))


async def _collect(state: ServerState, group: RequestGroup, jobs: list[Job]) -> list[Completion]:
    done: dict[int, Completion] = {}
    async for index, delta in group.deltas():
        state.track(jobs[index], delta)
        if delta.output is not None:
            done[index] = state.finish(jobs[index], delta.output)
    return [done[i] for i in range(len(jobs))]


async def _until_done_or_disconnect(
    request: Request, work: Awaitable[list[Completion]]
) -> list[Completion]:
    """Await ``work`` unless the client disconnects first (then cancel it)."""
    work_task = asyncio.ensure_future(work)
    gone_task = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work_task, gone_task):
            if not task.done():
                task.cancel()
    if not work_task.done():
        raise ClientDisconnected()
    return work_task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _json_body(
    api: Api,
    state: ServerState,
    req: GenerationRequest,
    jobs: list[Job],
    done: list[Completion],
    reasoning: ChatReasoning | None = None,
) -> object:
    if api is Api.LLAMA:
        bodies = [
            responses.select_fields(
                responses.completion_final(d, j.index, req, j.settings, state.prompt_text(d.output)),
                req.response_fields,
            )
            for j, d in zip(jobs, done)
        ]
        return bodies[0] if len(bodies) == 1 else bodies
    if api is Api.OAI_COMPLETION:
        return responses.oai_completion(responses.ResponseIds("cmpl", state.model_name), done)
    splits = [reasoning.split(d.output.text) for d in done] if reasoning else None
    body = responses.chat_completion(responses.ResponseIds("chatcmpl", state.model_name), done,
                                     splits)  # fmt: skip
    if req.verbose or state.config.verbose:
        body["__verbose"] = {"prompt": state.prompt_text(done[0].output)}
    return body


# ---------------------------------------------------------------------------- streaming


async def _closing(
    stream: AsyncIterator[bytes], state: ServerState, group: RequestGroup, jobs: list[Job]
) -> AsyncIterator[bytes]:
    """Relay ``stream``; send errors as an SSE error event; always close the group."""
    try:
        async for chunk in stream:
            yield chunk
    except errors.ShutdownError as exc:
        yield sse.event(responses.error_body(str(exc), 503, "unavailable_error"))
    except errors.InvalidArgumentError as exc:  # e.g. its grammar left no token to sample
        yield sse.event(responses.error_body(str(exc), 400, "invalid_request_error"))
    except errors.CacheFlowError as exc:
        yield sse.event(responses.error_body(str(exc), 500, "server_error"))
    finally:
        _close(state, group, jobs)


def _close(state: ServerState, group: RequestGroup, jobs: list[Job]) -> None:
    state.metrics.finished_by_reason["abort"] += group.close()  # idempotent
    state.groups.discard(group)
    state.release(jobs)


class _EventStream(StreamingResponse):
    """An SSE response that runs ``on_close`` however it ends, even if its body iterator was
    never started (client gone before the first write)."""

    def __init__(self, body_iterator: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(body_iterator, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _stream_llama(
    state: ServerState, group: RequestGroup, req: GenerationRequest, jobs: list[Job]
) -> AsyncIterator[bytes]:
    joiners = [PieceJoiner(state.pieces.raw) for _ in jobs]
    async for index, delta in group.deltas(state.config.sse_ping_s):
        if delta is None:
            yield sse.PING
            continue
        job = jobs[index]
        state.track(job, delta)
        if delta.progress:
            yield sse.events([
                responses.with_progress(responses.completion_partial(
                    index, "", (), job.num_decoded, state.slot_id(job)), p, req.timings_per_token)
                for p in delta.progress
            ])  # fmt: skip
        pieces = []
        if (delta.text or delta.token_ids) and not job.discard_output:
            state.progress(job, delta)
            pieces = joiners[index].join(delta_pieces(delta))
        if delta.output is not None:
            pieces += joiners[index].flush()
        if pieces:
            slot_id = state.slot_id(job)
            yield sse.events([
                responses.completion_partial(index, p.text, p.token_ids, p.num_decoded, slot_id,
                                             state.stream_probs(job, p.logprobs))
                for p in pieces
            ])  # fmt: skip
        if delta.output is not None:
            done = state.finish(job, delta.output)
            prompt_text = state.prompt_text(done.output)
            yield sse.event(responses.completion_final(done, index, req, job.settings, prompt_text))


async def _stream_oai_completion(
    state: ServerState, group: RequestGroup, req: GenerationRequest, jobs: list[Job]
) -> AsyncIterator[bytes]:
    ids = responses.ResponseIds("cmpl", state.model_name)
    finished = []
    joiners = [PieceJoiner(state.pieces.raw) for _ in jobs]
    async for index, delta in group.deltas(state.config.sse_ping_s):
        if delta is None:
            yield sse.PING
            continue
        job = jobs[index]
        state.track(job, delta)
        if delta.progress:
            yield sse.events([
                responses.with_progress(responses.oai_completion_chunk(ids, index, "", None), p,
                                        req.timings_per_token)
                for p in delta.progress
            ])  # fmt: skip
        pieces = []
        if (delta.text or delta.logprobs) and not job.discard_output:
            state.progress(job, delta)
            pieces = joiners[index].join(delta_pieces(delta))
        if delta.output is not None:
            pieces += joiners[index].flush()
        if pieces:
            yield sse.events([
                responses.oai_completion_chunk(ids, index, p.text, None,
                                               state.stream_probs(job, p.logprobs))
                for p in pieces
            ])  # fmt: skip
        if delta.output is not None:
            done = state.finish(job, delta.output)
            yield sse.event(responses.oai_completion_last_chunk(ids, index, done))
            finished.append(done.output)
    if req.include_usage:  # OpenAI's usage chunk: empty choices, the usage of every choice
        yield sse.event(responses.oai_completion_usage_chunk(ids, finished))
    yield sse.DONE


async def _stream_chat(
    state: ServerState,
    group: RequestGroup,
    req: GenerationRequest,
    jobs: list[Job],
    reasoning: ChatReasoning | None = None,
) -> AsyncIterator[bytes]:
    ids = responses.ResponseIds("chatcmpl", state.model_name)
    sent_role: set[int] = set()
    # a chat stream sends only chunks that change the message (llama-server: one per diff)
    joiners = [PieceJoiner(state.pieces.raw, hold_all_empty=True) for _ in jobs]
    messages = [_ChatDeltas(reasoning) for _ in jobs]
    async for index, delta in group.deltas(state.config.sse_ping_s):
        if delta is None:
            yield sse.PING
            continue
        job = jobs[index]
        state.track(job, delta)
        chunks = [  # llama-server: each with the role delta
            responses.with_progress(
                responses.chat_chunk(ids, {"role": "assistant", "content": None}, None, index), p,
                req.timings_per_token)
            for p in delta.progress
        ]  # fmt: skip
        if chunks:
            sent_role.add(index)
        if index not in sent_role and (delta.text or delta.logprobs or delta.output is not None):
            chunks.append(responses.chat_chunk(ids, {"role": "assistant", "content": None}, None,
                                               index))  # fmt: skip
            sent_role.add(index)
        if (delta.text or delta.logprobs) and not job.discard_output:
            state.progress(job, delta)
            for p in joiners[index].join(delta_pieces(delta)):
                chunks += [responses.chat_chunk(ids, d, None, index, state.stream_probs(job, lps))
                           for d, lps in messages[index].deltas(p)]  # fmt: skip
        if delta.output is not None:
            done = state.finish(job, delta.output)
            chunks += responses.chat_last_chunks(ids, done, req.include_usage, index)
        if chunks:
            yield sse.events(chunks)
    yield sse.DONE


class _ChatDeltas:
    """The chat deltas of one streamed choice: its pieces as they are, or, when its template
    has reasoning, split into reasoning_content and content deltas (pieces that change neither
    send nothing; their probabilities go with the next delta)."""

    def __init__(self, reasoning: ChatReasoning | None) -> None:
        self._stream = reasoning.stream() if reasoning else None
        self._held: tuple = ()  # probabilities of pieces that sent nothing

    def deltas(self, piece: Piece) -> list[tuple[dict[str, object], tuple]]:
        """(delta, token probabilities of its chunk) in order; the last delta carries them."""
        if self._stream is None:
            return [({"content": piece.text}, piece.logprobs)]
        split = self._stream.feed(piece.text)
        deltas = [{name: text} for name, text in (("reasoning_content", split.reasoning),
                                                  ("content", split.content)) if text]  # fmt: skip
        logprobs = self._held + piece.logprobs
        if not deltas:
            self._held = logprobs
            return []
        self._held = ()
        return [(d, ()) for d in deltas[:-1]] + [(deltas[-1], logprobs)]


_Streamer = Callable[
    ["ServerState", RequestGroup, GenerationRequest, "list[Job]"], AsyncIterator[bytes]
]
_STREAMERS: dict[Api, _Streamer] = {
    Api.LLAMA: _stream_llama,
    Api.OAI_COMPLETION: _stream_oai_completion,
    Api.OAI_CHAT: _stream_chat,
}
