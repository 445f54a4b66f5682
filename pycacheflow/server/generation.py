"""The generating endpoints: /completion, /v1/completions and /v1/chat/completions.

Each HTTP request submits its prompts through one ``RequestGroup`` and then either waits for
all of them (JSON answer) or streams their deltas as server-sent events. Whatever way the
handler ends (finished, client gone, cancelled at shutdown, error), the group is closed,
which aborts unfinished engine requests and so frees their KV blocks.

    parse body ─► prepare and submit prompts ─► stream? ─ no ─► wait (or disconnect) ─► JSON
                                                     └─ yes ─► SSE (_EventStream): per wake-up
                                                        the events of every delta, one write
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, StreamingResponse

from pycacheflow import errors
from pycacheflow.server import responses, sse
from pycacheflow.server.pieces import Piece, PieceJoiner
from pycacheflow.server.protocol import GenerationRequest, parse_chat, parse_completion
from pycacheflow.server.state import SHUTDOWN_MESSAGE
from pycacheflow.server.streams import RequestGroup

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from pycacheflow.outputs import StreamDelta
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


async def handle(receive: Receive, api: Api, state: ServerState, body: object) -> ASGIApp:
    """Run one generating request; errors propagate to the app's error handlers.

    Args:
        receive: the request's ASGI receive (its body already read): to see the client go.
        api: the endpoint's format.
        state: the app's shared state.
        body: the decoded JSON body.

    Returns:
        The response, an ASGI app (a JSONResponse, or the stream of a streamed request).
    """
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
    streaming = False  # once True, the response owns the group
    try:
        for prompt in prompts:
            resolved = await state.prepare_prompt(prompt, with_text=api is Api.LLAMA)
            jobs += state.submit(group, req, resolved, reasoning)
        if req.stream:
            chunks = (_ChatChunks(state, req, jobs, reasoning) if api is Api.OAI_CHAT
                      else _CHUNKS[api](state, req, jobs))  # fmt: skip
            streaming = True
            return _EventStream(state, group, jobs, chunks)
        done = await _until_done_or_disconnect(receive, _collect(state, group, jobs))
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
    receive: Receive, work: Awaitable[list[Completion]]
) -> list[Completion]:
    """Await ``work`` unless the client disconnects first (then cancel it)."""
    work_task = asyncio.ensure_future(work)
    gone_task = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({work_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work_task, gone_task):
            if not task.done():
                task.cancel()
    if not work_task.done():
        raise ClientDisconnected()
    return work_task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
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
                responses.completion_final(d, j.index, req, j.settings,
                                           state.prompt_text(d.output, j)),
                req.response_fields,
            )
            for j, d in zip(jobs, done)
        ]  # fmt: skip
        return bodies[0] if len(bodies) == 1 else bodies
    if api is Api.OAI_COMPLETION:
        return responses.oai_completion(responses.ResponseIds("cmpl", state.model_name), done,
                                        req.num_choices)  # fmt: skip
    splits = [reasoning.split(d.output.text) for d in done] if reasoning else None
    body = responses.chat_completion(responses.ResponseIds("chatcmpl", state.model_name), done,
                                     splits)  # fmt: skip
    if req.verbose or state.config.verbose:
        body["__verbose"] = {"prompt": state.prompt_text(done[0].output, jobs[0])}
    return body


# ---------------------------------------------------------------------------- streaming


def _close(state: ServerState, group: RequestGroup, jobs: list[Job]) -> None:
    state.metrics.finished_by_reason["abort"] += group.close()  # idempotent
    state.groups.discard(group)
    state.release(jobs)


# what Starlette's StreamingResponse(media_type=sse.MEDIA_TYPE, headers=sse.HEADERS) sends
_SSE_HEADERS = StreamingResponse((), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS).raw_headers


class _EventStream:
    """The SSE response of a streamed request, as a raw ASGI app: one coroutine per stream
    that takes the group's deltas (``RequestGroup.take``) at each wake-up and sends the bytes
    of all of them in one body message, until the last delta (that message also ends the
    body); a ping (an SSE comment) when nothing came for ``sse_ping_s``. The bytes are those
    Starlette's StreamingResponse sent with the former async generators; a stream now costs
    no task group and no generator chain per chunk: a task runs the loop, another waits for
    the client to go away (``disconnect``: the stream ends and its requests are aborted).

    However it ends (done, an error event, the client gone, cancelled at shutdown, even before
    its first write) it closes the group: unfinished requests are aborted, slots released.

    Args:
        state: the app's state.
        group: the HTTP request's engine requests (the stream owns it from now on).
        jobs: their jobs.
        chunks: the endpoint's formatter (``_LlamaChunks``, ``_OaiCompletionChunks``,
            ``_ChatChunks``).
    """

    def __init__(
        self, state: ServerState, group: RequestGroup, jobs: list[Job], chunks: _Chunks
    ) -> None:
        self._state, self._group, self._jobs, self._chunks = state, group, jobs, chunks
        self._started = False  # the 200 and SSE headers are out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = None
        try:
            # the status line waits for the stream's first bytes (a delta or a ping): an error
            # before any of them is a plain JSON error with its status, as llama-server answers
            # a stream whose first result is an error
            watcher = asyncio.ensure_future(_disconnected(receive))
            watcher.add_done_callback(self._on_disconnect)
            # The stream loop runs as a task of its own: each wake-up (one per stream chunk)
            # resumes its two frames only, not the whole chain of ASGI callers above this one
            # (uvicorn's cycle, its proxy-headers and Starlette's error middleware, CORS, ...),
            # ~0.3 us a frame. Cancelling this task (shutdown) cancels the awaited one.
            await asyncio.ensure_future(self._run(send))
        except asyncio.CancelledError:
            # a forced shutdown (a second Ctrl-C) cancels the stream: end it with the error the
            # graceful shutdown sends, best effort (the connection may be gone already), and
            # return instead of raising, which the ASGI server would log as a traceback
            await self._end_cancelled(send)
        finally:
            if watcher is not None:
                watcher.remove_done_callback(self._on_disconnect)
                watcher.cancel()
            _close(self._state, self._group, self._jobs)

    def _on_disconnect(self, watcher: asyncio.Future) -> None:
        if not watcher.cancelled() and watcher.exception() is None:
            self._group.disconnect()

    async def _end_cancelled(self, send: Send) -> None:
        error = responses.error_body(SHUTDOWN_MESSAGE, 503, "unavailable_error")
        try:
            await self._end_with_error(send, error, [])
        except (OSError, RuntimeError, asyncio.CancelledError):
            pass  # the client or the transport is gone

    async def _end_with_error(self, send: Send, error: dict[str, object], parts: list[bytes]) -> None:
        """End the response with ``error`` after ``parts``: an SSE error event once the stream has
        bytes, else (its first result is the error) a plain JSON error with its status."""
        if self._started or parts:
            await self._send(send, b"".join(parts) + sse.event(error), False)
            return
        reply = JSONResponse(error, status_code=int(error["error"]["code"]))  # type: ignore[index]
        self._started = True
        await send({"type": "http.response.start", "status": reply.status_code, "headers": reply.raw_headers})
        await send({"type": "http.response.body", "body": reply.body})

    async def _send(self, send: Send, body: bytes, more: bool) -> None:
        if not self._started:
            self._started = True
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await send({"type": "http.response.body", "body": body, "more_body": more})

    async def _run(self, send: Send) -> None:
        group, chunks = self._group, self._chunks
        ping_s = self._state.config.sse_ping_s
        while True:
            parts: list[bytes] = []
            end = False
            error: dict[str, object] | None = None
            try:
                for index, delta in group.take():
                    chunks.delta(index, delta, parts)
                if group.finished:
                    parts.append(chunks.end())
                    end = True
            except errors.ShutdownError as exc:
                error = responses.error_body(str(exc), 503, "unavailable_error")
            except errors.InvalidArgumentError as exc:  # e.g. its grammar left no token to sample
                error = responses.error_body(str(exc), 400, "invalid_request_error")
            except errors.CacheFlowError as exc:
                error = responses.error_body(str(exc), 500, "server_error")
            if error is not None:
                await self._end_with_error(send, error, parts)
                return
            data = b"".join(parts)
            if data or end:
                await self._send(send, data, not end)
            if end or group.disconnected:
                return
            if not await group.wait(ping_s):
                await self._send(send, sse.PING, True)
            if group.disconnected:
                return


class _Chunks:
    """The SSE bytes of one endpoint's stream (state of one HTTP request; the loop's thread).

    Args:
        state: the app's state.
        req: the request.
        jobs: its jobs, by index.
    """

    def __init__(self, state: ServerState, req: GenerationRequest, jobs: list[Job]) -> None:
        self.state, self.req, self.jobs = state, req, jobs

    def delta(self, index: int, delta: StreamDelta, parts: list[bytes]) -> None:
        """Append the events of one delta of job ``index`` to ``parts``.

        Raises:
            As ``ServerState.finish`` on the last delta (an error event is sent instead, after
            what was appended: the events the former generators had sent before it).
        """
        raise NotImplementedError

    def end(self) -> bytes:
        """The events after every job's last delta (OpenAI: usage, [DONE])."""
        return b""


class _LlamaChunks(_Chunks):
    """/completion's stream: a chunk per piece (``tokens``, ``tokens_predicted``, ``id_slot``),
    the final result last; no [DONE]."""

    def __init__(self, state: ServerState, req: GenerationRequest, jobs: list[Job]) -> None:
        super().__init__(state, req, jobs)
        self.joiners = [PieceJoiner(state.pieces.raw) for _ in jobs]

    def delta(self, index: int, delta: StreamDelta, out: list[bytes]) -> None:
        state, job = self.state, self.jobs[index]
        state.track(job, delta)
        if delta.progress:
            out.append(sse.events([
                responses.with_progress(responses.completion_partial(
                    index, "", (), job.num_decoded, state.slot_id(job)), p,
                    self.req.timings_per_token)
                for p in delta.progress
            ]))  # fmt: skip
        pieces: list[Piece] = []
        if (delta.text or delta.token_ids) and not job.discard_output:
            state.progress(job, delta)
            pieces = self.joiners[index].join_delta(delta)
        if delta.output is not None:
            pieces += self.joiners[index].flush()
        if pieces:
            slot_id = state.slot_id(job)
            for p in pieces:
                if p.logprobs:
                    out.append(sse.event(responses.completion_partial(
                        index, p.text, p.token_ids, p.num_decoded, slot_id,
                        state.stream_probs(job, p.logprobs))))  # fmt: skip
                else:
                    out.append(sse.completion_partial_event(index, p.text, p.token_ids,
                                                            p.num_decoded, slot_id))  # fmt: skip
        if delta.output is not None:
            done = state.finish(job, delta.output)
            prompt_text = state.prompt_text(done.output, job)
            out.append(sse.event(responses.completion_final(done, index, self.req, job.settings,
                                                            prompt_text)))  # fmt: skip


class _OaiCompletionChunks(_Chunks):
    """/v1/completions' stream: a text_completion chunk per piece, the last chunk of each
    choice (finish_reason, usage, timings), OpenAI's usage chunk if asked, [DONE]."""

    def __init__(self, state: ServerState, req: GenerationRequest, jobs: list[Job]) -> None:
        super().__init__(state, req, jobs)
        self.ids = responses.ResponseIds("cmpl", state.model_name)
        self.envelope = sse.members(self.ids.envelope("text_completion"))
        self.finished: list = []
        self.joiners = [PieceJoiner(state.pieces.raw) for _ in jobs]

    def delta(self, index: int, delta: StreamDelta, out: list[bytes]) -> None:
        state, job, ids = self.state, self.jobs[index], self.ids
        state.track(job, delta)
        if delta.progress:
            out.append(sse.events([
                responses.with_progress(responses.oai_completion_chunk(ids, index, "", None), p,
                                        self.req.timings_per_token)
                for p in delta.progress
            ]))  # fmt: skip
        pieces: list[Piece] = []
        if (delta.text or delta.logprobs) and not job.discard_output:
            state.progress(job, delta)
            pieces = self.joiners[index].join_delta(delta)
        if delta.output is not None:
            pieces += self.joiners[index].flush()
        for p in pieces:
            if p.logprobs:
                out.append(sse.event(responses.oai_completion_chunk(
                    ids, index, p.text, None, state.stream_probs(job, p.logprobs))))  # fmt: skip
            else:
                out.append(sse.oai_completion_chunk_event(self.envelope, index, p.text))
        if delta.output is not None:
            done = state.finish(job, delta.output)
            out.append(sse.event(responses.oai_completion_last_chunk(ids, index, done)))
            self.finished.append(done.output)

    def end(self) -> bytes:
        if self.req.include_usage:  # OpenAI's usage chunk: empty choices, every choice's usage
            usage = responses.oai_completion_usage_chunk(self.ids, self.finished, self.req.num_choices)
            return sse.event(usage) + sse.DONE
        return sse.DONE


class _ChatChunks(_Chunks):
    """/v1/chat/completions' stream: the role chunk of each choice first, then only chunks
    that change the message (llama-server: one per diff), content or reasoning_content; the
    closing chunks of each choice; [DONE]."""

    def __init__(
        self,
        state: ServerState,
        req: GenerationRequest,
        jobs: list[Job],
        reasoning: ChatReasoning | None = None,
    ) -> None:
        super().__init__(state, req, jobs)
        self.ids = responses.ResponseIds("chatcmpl", state.model_name)
        self.envelope = sse.members(self.ids.envelope("chat.completion.chunk"))
        self.sent_role: set[int] = set()
        self.joiners = [PieceJoiner(state.pieces.raw, hold_all_empty=True) for _ in jobs]
        self.messages = [_ChatDeltas(reasoning) for _ in jobs]

    def delta(self, index: int, delta: StreamDelta, parts: list[bytes]) -> None:
        # A delta's events go out together or (its last one failing) not at all, as before.
        state, job, ids = self.state, self.jobs[index], self.ids
        state.track(job, delta)
        chunks = [  # llama-server: each with the role delta
            responses.with_progress(
                responses.chat_chunk(ids, {"role": "assistant", "content": None}, None, index), p,
                self.req.timings_per_token)
            for p in delta.progress
        ]  # fmt: skip
        if chunks:
            self.sent_role.add(index)
        if index not in self.sent_role and (delta.text or delta.logprobs
                                            or delta.output is not None):  # fmt: skip
            chunks.append(responses.chat_chunk(ids, {"role": "assistant", "content": None}, None,
                                               index))  # fmt: skip
            self.sent_role.add(index)
        out = [sse.events(chunks)] if chunks else []
        if (delta.text or delta.logprobs) and not job.discard_output:
            state.progress(job, delta)
            for p in self.joiners[index].join_delta(delta):
                for d, lps in self.messages[index].deltas(p):
                    if lps:
                        out.append(sse.event(responses.chat_chunk(
                            ids, d, None, index, state.stream_probs(job, lps))))  # fmt: skip
                    else:
                        out.append(sse.chat_chunk_event(self.envelope, d, index))
        if delta.output is not None:
            done = state.finish(job, delta.output)
            out.append(sse.events(responses.chat_last_chunks(ids, done, self.req.include_usage,
                                                             index)))  # fmt: skip
        parts += out

    def end(self) -> bytes:
        return sse.DONE


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


_CHUNKS: dict[Api, Callable[[ServerState, GenerationRequest, list[Job]], _Chunks]] = {
    Api.LLAMA: _LlamaChunks,
    Api.OAI_COMPLETION: _OaiCompletionChunks,
}
