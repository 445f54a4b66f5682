"""ServerState: what every handler shares (engine, config, metrics, slots), and the per-request
bookkeeping between an HTTP request and its engine requests (``Job``).

Everything here runs on the event loop thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from pycacheflow import errors
from pycacheflow.reasoning import WHITESPACE as _WS
from pycacheflow.reasoning import generation_prompt, open_tail
from pycacheflow.sampling_params import INT32_MAX, ReasoningBudget
from pycacheflow.server.chat_reasoning import ChatReasoning
from pycacheflow.server.logprobs import TokenPieces, probs_json
from pycacheflow.server.metrics import ServerMetrics
from pycacheflow.server.protocol import ProtocolError
from pycacheflow.server.responses import Completion, generation_settings, stop_type_of
from pycacheflow.server.slots import SlotTable
from pycacheflow.server.streams import LoopWaker, WorkerPool
from pycacheflow.text import is_exact_int_list

if TYPE_CHECKING:
    from pycacheflow.llm import LLM, PreparedPrompt, PromptInput
    from pycacheflow.outputs import RequestOutput, StreamDelta, TokenLogprobs
    from pycacheflow.reasoning import ReasoningMarkers
    from pycacheflow.sampling_params import SamplingParams
    from pycacheflow.server.config import ServerConfig
    from pycacheflow.server.protocol import GenerationRequest
    from pycacheflow.server.streams import RequestGroup

logger = logging.getLogger("cacheflow.server")


@dataclass
class Job:
    """One engine request of an HTTP request.

    Attributes:
        index: position among the HTTP request's prompts.
        request_id: its engine request id.
        prompt: what was submitted (text or token ids).
        settings: its effective generation settings (for /slots and /completion).
        num_decoded: tokens streamed so far.
        discard_output: n_predict was 0: the prompt is evaluated (one token is generated
            because the engine needs max_tokens >= 1) but no output is reported.
        max_tokens: the engine's limit of output tokens for it.
        limited_by_context: ``max_tokens`` is the room left in the slot's context, smaller
            than the request's n_predict: reaching it means the output was truncated.
        logprobs: the request asked for token probabilities (``SamplingParams.logprobs``).
        post_sampling_probs: they are post-sampling probabilities ("prob", not "logprob").
        stream: the answer is streamed (the final answer then carries no probabilities).
        prompt_text: the prompt detokenized (special tokens rendered), when it was computed
            with the tokens (``ServerState.prepare_prompt``); None: on demand.
    """

    index: int
    request_id: int
    prompt: PromptInput
    settings: dict[str, object]
    discard_output: bool = False
    max_tokens: int = 0
    limited_by_context: bool = False
    num_decoded: int = 0
    slot_released: bool = False
    logprobs: bool = False
    post_sampling_probs: bool = False
    stream: bool = False
    prompt_text: str | None = None


# why a request ended by the server's shutdown gets a 503 (finish, and a stream cancelled by a forced exit)
SHUTDOWN_MESSAGE = "the server is shutting down; the request was aborted"

class Prompt(NamedTuple):
    """One prompt of a request, resolved for submission (``ServerState.prepare_prompt``).

    Attributes:
        token_ids: its tokens.
        prepared: for a text prompt, the same in the engine's form (``LLM.prepare_prompt``);
            None for token ids (checked when submitted).
        text: the tokens detokenized with special tokens rendered (/completion's ``prompt``),
            when asked for; else None.
    """

    token_ids: Sequence[int]
    prepared: PreparedPrompt | None = None
    text: str | None = None


class ServerState:
    """Shared by all handlers of one app.

    Args:
        llm: the engine (not owned: the caller closes it after the server stopped).
        config: HTTP-side settings.
    """

    def __init__(self, llm: LLM, config: ServerConfig) -> None:
        self.llm = llm
        self.info = llm.info
        # n / n_cmpl are limited to the slots, as llama-server's hard limits [1, n_parallel]
        self.config = replace(config, defaults=replace(config.defaults, max_choices=self.info.max_num_seqs))
        self.metrics = ServerMetrics()
        # llama-server's context per slot (-c / -np), within the engine's per sequence and, as
        # llama-server's n_ctx_slot(), the trained context
        self.n_ctx_slot = min(config.n_ctx_slot or self.info.n_ctx_per_seq, self.info.n_ctx_per_seq)
        if 0 < self.info.n_ctx_train < self.n_ctx_slot:
            logger.warning("the slot context (%d) exceeds the training context of the model "
                           "(%d) - capping", self.n_ctx_slot, self.info.n_ctx_train)  # fmt: skip
            self.n_ctx_slot = self.info.n_ctx_train
        self.slots = SlotTable(self.info.max_num_seqs, self.n_ctx_slot)
        self.groups: set[RequestGroup] = set()  # of HTTP requests in flight
        self._waker: LoopWaker | None = None  # created on the loop, on first use
        self.shutting_down = False
        self.start_time_unix = int(time.time())  # llama-server's Process-Start-Time-Unix
        self._warned_fields: set[str] = set()
        self._eog_token_ids: tuple[int, ...] | None = None  # the model's, on first ignore_eos
        self.pieces = TokenPieces(llm)  # token texts of probabilities
        self._template_props: dict[str, object] | None = None  # /props' template fields
        self._thinking: bool | None = None  # the default template has reasoning markers
        # tokenizes prompts off the event loop (the native calls release the GIL); made on
        # the loop, on first use
        self._prompt_pool: WorkerPool | None = None

    def waker(self) -> LoopWaker:
        """The event loop's shared LoopWaker (call on the loop)."""
        if self._waker is None:
            self._waker = LoopWaker()
        return self._waker

    @property
    def model_name(self) -> str:
        """The model id of responses."""
        return self.config.model_name

    @property
    def model_ftype(self) -> str:
        """llama-server's ``model_ftype``, llama.cpp's name of the file type (e.g. "Q4_1",
        "Q4_K - Medium", "(guessed) F16"): the last part of llama_model_desc, which is
        "<arch> <size> <ftype>"."""
        parts = self.info.description.split(" ", 2)
        return parts[2] if len(parts) == 3 else ""

    def default_settings(self) -> dict[str, object]:
        """Generation settings of a request that sets nothing (for /props and idle slots)."""
        from pycacheflow.server.protocol import parse_completion

        request = parse_completion({"prompt": ""}, self.config.n_predict, self.config.defaults)
        return generation_settings(request, self.n_ctx_slot, self.model_name)

    def chat_template_props(self) -> dict[str, object]:
        """/props' template fields, as llama-server's: ``chat_template`` (the text chat
        requests are rendered with; a built-in name stays a name), ``chat_template_caps`` and,
        with --jinja and the model's own template, ``chat_template_tool_use`` when the GGUF has
        that variant. Computed once (the caps render probe conversations)."""
        if self._template_props is None:
            formatter, template = self.llm.chat_formatter, self.config.chat_template
            try:
                caps = formatter.caps(template)
            except errors.InvalidArgumentError:  # not Jinja text jinja2 compiles (--no-jinja)
                caps = {}
            props = {"chat_template": formatter.reported_source(template),
                     "chat_template_caps": caps}  # fmt: skip
            tool_use = formatter.tool_use_source() if template is None else None
            if self.config.jinja and tool_use:
                props["chat_template_tool_use"] = tool_use
            self._template_props = props
        return self._template_props

    def render_chat(
        self,
        messages: Sequence[Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] = (),
        template_kwargs: Mapping[str, object] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool | None = None,
    ) -> str:
        """The prompt text of a chat request, rendered with the server's template settings.

        ``continue_final_message`` None: continue a final assistant message when the server
        prefills (--prefill-assistant), as llama-server does.

        Raises:
            ProtocolError: the messages or options do not fit together, or the template failed.
        """
        config = self.config
        if continue_final_message is None:
            continue_final_message = self._prefills(messages)
            if continue_final_message:
                if len(messages) >= 2 and messages[-2]["role"] == "assistant":
                    raise ProtocolError(
                        "Cannot have 2 or more assistant messages at the end of the list."
                    )
                add_generation_prompt = False
        # llama-server passes enable_thinking to every template: on when the template has
        # reasoning markers, unless -rea off or the kwargs say otherwise
        kwargs = {"enable_thinking": self._supports_thinking(), **config.chat_template_kwargs,
                  **(template_kwargs or {})}  # fmt: skip
        try:
            return self.llm.apply_chat_template(
                messages,
                add_generation_prompt,
                config.chat_template,
                jinja=config.jinja,
                continue_final_message=continue_final_message,
                tools=list(tools) or None,
                chat_template_kwargs=kwargs,
            )
        except errors.InvalidArgumentError as exc:
            raise ProtocolError(str(exc)) from None

    def chat_reasoning(self, request: GenerationRequest, prompt: str) -> ChatReasoning | None:
        """How the answers of a chat request, rendered as ``prompt``, split into content and
        reasoning; None when its template has no reasoning markers (all content).

        Raises:
            ProtocolError: the template failed (rendering the prompt without the generation
                prompt, to find what that added).
        """
        markers = self._reasoning_markers(bool(request.tools))
        if markers is None:
            return None
        tail = ""
        continues = request.continue_final_message
        if continues is None:
            continues = self._prefills(request.messages)
        if request.add_generation_prompt and not continues:  # what the generation prompt opened
            without = self.render_chat(request.messages, request.tools, request.template_kwargs,
                                       False, False)  # fmt: skip
            tail = open_tail(markers, generation_prompt(prompt, without))
        return ChatReasoning(markers, request.reasoning_format != "none", tail)

    def _prefills(self, messages: Sequence[Mapping[str, object]]) -> bool:
        """A final assistant message is continued (--prefill-assistant)."""
        return bool(self.config.prefill_assistant and messages
                    and messages[-1]["role"] == "assistant")  # fmt: skip

    def _supports_thinking(self) -> bool:
        """llama-server's template_supports_thinking: --jinja and the default template has
        reasoning markers."""
        if self._thinking is None:
            self._thinking = self.config.jinja and self._reasoning_markers(False) is not None
        return self._thinking

    def _reasoning_markers(self, tools: bool) -> ReasoningMarkers | None:
        config = self.config
        try:
            return self.llm.chat_formatter.reasoning_markers(config.chat_template, config.jinja,
                                                             tools)  # fmt: skip
        except errors.InvalidArgumentError:  # the template does not compile: no reasoning
            return None

    # ------------------------------------------------------------------ submission

    def resolve_prompt(self, prompt: PromptInput) -> list[int]:
        """The token ids of a prompt: text is tokenized as the LLM would (BOS once); in a mixed
        list each text piece is tokenized without BOS, except a text piece at the start, which
        gets the model's BOS as a text prompt would (llama-server's rule).

        Raises:
            ProtocolError: text without a UTF-8 form.
        """
        try:
            if isinstance(prompt, str):
                return self.llm.tokenize_prompt(prompt)
            return self.tokenize_mixed(prompt, add_special=True, parse_special=True)
        except errors.InvalidArgumentError as exc:
            raise ProtocolError(str(exc)) from None

    async def prepare_prompt(self, prompt: PromptInput, with_text: bool = False) -> Prompt:
        """A prompt resolved as ``resolve_prompt`` resolves it, a text prompt in the engine's
        form (``LLM.prepare_prompt``: converted once, no check of the tokenizer's ids), and with
        ``with_text`` also detokenized (for /completion's ``prompt``).

        A prompt with text is done on a worker thread: llama.cpp's tokenizer takes
        milliseconds for a prompt of a thousand tokens (a few per token, the pre-tokenizer's
        regex), which on the event loop delayed every stream's tokens and every other request
        (the server topped out near 160 requests/s on an H200 host); the native calls release
        the GIL, so concurrent requests tokenize in parallel, and the per-token work that
        follows (the check, the conversion, the detokenized prompt) leaves the loop with it.
        Token ids alone are resolved here (their text, if wanted, is made when the request
        ends).

        Raises:
            ProtocolError: text without a UTF-8 form.
        """
        if isinstance(prompt, list) and not any(isinstance(piece, str) for piece in prompt):
            return self._prepare(prompt, False)
        if self._prompt_pool is None:
            self._prompt_pool = WorkerPool(name="cacheflow-prompt")
        return await self._prompt_pool.run(self._prepare, prompt, with_text)

    def _prepare(self, prompt: PromptInput, with_text: bool) -> Prompt:
        """``prepare_prompt``'s work (any thread). Only the tokenizer's ids skip the checks of
        ids: the ids of a request are checked when it is submitted, as they always were."""
        if not isinstance(prompt, str):
            token_ids = self.resolve_prompt(prompt)
            text = self.llm.detokenize(token_ids, skip_special=False) if with_text else None
            return Prompt(token_ids, None, text)
        try:
            prepared = self.llm.prepare_prompt(prompt)  # tokenized as resolve_prompt does
        except errors.InvalidArgumentError as exc:
            raise ProtocolError(str(exc)) from None
        text = self.llm.detokenize(prepared, skip_special=False) if with_text else None
        return Prompt(prepared.token_ids, prepared, text)

    def tokenize_mixed(
        self, pieces: list[str | int], add_special: bool, parse_special: bool
    ) -> list[int]:
        """Token ids of text pieces and token ids; only a leading text piece gets BOS."""
        if is_exact_int_list(pieces):  # ids only
            return list(pieces)
        token_ids: list[int] = []
        for i, piece in enumerate(pieces):
            if isinstance(piece, str):
                token_ids += self.llm.tokenize(piece, add_special and i == 0, parse_special)
            else:
                token_ids.append(piece)
        return token_ids

    def submit(
        self,
        group: RequestGroup,
        request: GenerationRequest,
        prompt: Prompt | list[int],
        reasoning: ChatReasoning | None = None,
    ) -> list[Job]:
        """Submit one prompt of ``request`` to the engine through ``group``, as
        ``prepare_prompt`` returned it (or its token ids as ``resolve_prompt`` returned them):
        its ``num_choices`` completions (choice i of a seeded request uses seed + i, so they
        differ). Several choices go in together and share the prompt's KV (``LLM.add_choices``:
        the engine forks it, copy-on-write), each sampled independently. ``reasoning``: a chat
        request's (``chat_reasoning``), for its reasoning budget.

        Returns:
            One job per choice, in order.

        Raises:
            ProtocolError: the prompt is empty, too long or has a bad token id (400).
        """
        if not isinstance(prompt, Prompt):
            prompt = Prompt(prompt)
        token_ids = prompt.token_ids
        self._warn_ignored(request)  # (n is within [1, slots]: the parser's bound, config.defaults.max_choices)
        # (not resolved again: each pass over a 1,000-token list costs ~35 us of the event loop)
        changes: dict[str, object] = {}  # to the request's params: one replace, one check
        if request.logit_bias or request.params.ignore_eos:
            changes["logit_bias"] = self._logit_bias(request)
        budget = self._reasoning_budget(request, reasoning)
        if budget is not None:
            changes["reasoning_budget"] = budget
        n_predict = request.n_predict
        room = self.n_ctx_slot - len(token_ids)  # tokens the slot's context has left for output
        if token_ids and room <= 0:
            raise self._too_long(len(token_ids))
        wanted = self.info.n_ctx_per_seq if n_predict < 0 else max(1, n_predict)
        max_tokens = max(1, min(wanted, room))
        params = [_choice_params(request.params, i, max_tokens, changes)
                  for i in range(request.num_choices)]  # fmt: skip
        submitted = token_ids if prompt.prepared is None else prompt.prepared
        try:
            if len(params) == 1:
                indices = [group.submit(submitted, params[0], request.priority)]
            else:
                indices = group.submit_choices(submitted, params, request.priority)
        except errors.PromptTooLongError:
            raise self._too_long(len(token_ids)) from None
        except errors.InvalidArgumentError as exc:
            raise ProtocolError(str(exc)) from None
        jobs = []
        request_ids = group.request_ids
        for choice_params, index in zip(params, indices):
            settings = generation_settings(request, self.n_ctx_slot, self.model_name,
                                           choice_params)  # fmt: skip
            request_id = request_ids[index]
            self.slots.add(request_id, settings)
            jobs.append(Job(index, request_id, token_ids, settings, discard_output=n_predict == 0,
                            max_tokens=max_tokens, limited_by_context=room < wanted,
                            logprobs=choice_params.logprobs is not None,
                            post_sampling_probs=choice_params.post_sampling_probs,
                            stream=request.stream, prompt_text=prompt.text))  # fmt: skip
        return jobs

    def _reasoning_budget(
        self, request: GenerationRequest, reasoning: ChatReasoning | None
    ) -> ReasoningBudget | None:
        """The reasoning budget of a chat request, as llama-server builds its sampler
        (server-common.cpp, common/sampling.cpp): none without both reasoning markers in the
        template, or without a budget (-1) and a grammar; else the markers' tokens (whitespace
        trimmed), the budget message's tokens then the end marker's as the forced sequence, and
        the generation prompt's opened block (``ChatReasoning.tail``) fed first. With a budget
        the engine holds the grammar off inside reasoning blocks."""
        grammar = bool(request.params.grammar)
        if reasoning is None or (request.reasoning_budget < 0 and not grammar):
            return None
        start, end = (m.strip(_WS) for m in (reasoning.markers.start, reasoning.markers.end))
        if not start or not end:
            return None
        # a grammar (grammar, json_schema, response_format) shapes the answer: without a budget an
        # unlimited one tells the engine where the reasoning block ends (llama-server's INT_MAX)
        tokens = request.reasoning_budget if request.reasoning_budget >= 0 else INT32_MAX

        def tokens_of(text: str) -> tuple[int, ...]:
            return tuple(self.llm.tokenize(text, False, True)) if text else ()

        end_ids = tokens_of(end)
        return ReasoningBudget(tokens, tokens_of(start), end_ids,
                               tokens_of(request.reasoning_budget_message) + end_ids,
                               tokens_of(reasoning.tail))  # fmt: skip

    def _logit_bias(self, request: GenerationRequest) -> tuple:
        """(token id, bias) pairs of a request, by llama-server's rules: texts become their
        tokens; ids outside the vocabulary are dropped; ``ignore_eos`` appends -inf for every
        end-of-generation token (so the EOG tokens are never sampled, rather than sampled and
        not stopped at; a logit bias alone keeps a row's sampling in-graph)."""
        n_vocab, pairs = self.info.n_vocab, []
        for key, bias in request.logit_bias:
            if isinstance(key, str):
                pairs += [(t, bias) for t in self.llm.tokenize(key, False, False)]
            elif 0 <= key < n_vocab:
                pairs.append((key, bias))
        if request.params.ignore_eos:
            if self._eog_token_ids is None:
                self._eog_token_ids = tuple(self.llm.eog_token_ids())
            pairs += [(t, -math.inf) for t in self._eog_token_ids]
        return tuple(pairs)

    def slot_id(self, job: Job) -> int:
        """The engine slot the job runs (or ran) in, in [0, max_num_seqs) (for ``id_slot``)."""
        return self.slots.slot_of(job.request_id)

    def track(self, job: Job, delta: StreamDelta) -> None:
        """Record the engine slot a delta reports (call for every delta, before ``finish``)."""
        self.slots.update(job.request_id, delta.slot_id)

    def _too_long(self, num_prompt_tokens: int) -> ProtocolError:
        """llama-server's exceed_context_size_error (400)."""
        return ProtocolError(
            f"request ({num_prompt_tokens} tokens) exceeds the available context size "
            f"({self.n_ctx_slot} tokens), try increasing it",
            error_type="exceed_context_size_error",
            extra={"n_prompt_tokens": num_prompt_tokens, "n_ctx": self.n_ctx_slot},
        )

    def _warn_ignored(self, request: GenerationRequest) -> None:
        for name in request.ignored_fields:
            if name not in self._warned_fields:
                self._warned_fields.add(name)
                logger.warning("request field %r is not implemented by CacheFlow; ignored", name)

    # ------------------------------------------------------------------ completion

    def finish(self, job: Job, output: RequestOutput) -> Completion:
        """Account a finished request (metrics, slot) and describe how it stopped.

        Raises:
            ShutdownError: it was aborted because the server is shutting down.
            InvalidArgumentError: its own samplers ended it (the engine says why).
            DecodeError: it ended with "error" otherwise, or was aborted by the engine.
        """
        slot_id = self.slot_id(job)
        self._release(job)
        self.metrics.observe(output)
        if output.finish_reason == "abort" and self.shutting_down:
            raise errors.ShutdownError(SHUTDOWN_MESSAGE)
        if output.error is not None:  # the request's own doing (its grammar): a client error
            raise errors.InvalidArgumentError(output.error)
        if output.finish_reason in ("error", "abort"):
            raise errors.DecodeError(
                f"request {output.request_id} ended with {output.finish_reason}"
            )
        if job.discard_output:
            output = _without_output(output)
        stopping_word = self._stopping_word(output, job)
        truncated = (
            job.limited_by_context
            and output.finish_reason == "length"
            and len(output.token_ids) >= job.max_tokens
        )
        stop_type = stop_type_of(output, stopping_word)
        probs = None
        if job.logprobs and not job.stream and output.logprobs:
            probs = self._final_probs(output, stop_type, stopping_word, job.post_sampling_probs)
        return Completion(output, stop_type, stopping_word, slot_id, truncated, probs)

    def _final_probs(
        self, output: RequestOutput, stop_type: str, stopping_word: str, post_sampling: bool
    ) -> list[dict[str, object]]:
        """The probabilities of a non-streamed answer; as llama-server, without the last
        tokens of a stop word (as many as the word has tokens)."""
        entries = output.logprobs
        if stop_type == "word":
            num_stop_tokens = len(self.llm.tokenize(stopping_word, False, False))
            entries = entries[: max(0, len(entries) - num_stop_tokens)]
        return probs_json(entries, post_sampling, self.pieces)

    def stream_probs(
        self, job: Job, entries: Sequence[TokenLogprobs]
    ) -> list[dict[str, object]] | None:
        """The probabilities of the tokens of one stream chunk (one entry each; usually one
        token), or None when it has none."""
        return probs_json(entries, job.post_sampling_probs, self.pieces) if entries else None

    def progress(self, job: Job, delta: StreamDelta) -> None:
        """Account streamed output of a job (for /slots and ``tokens_predicted``)."""
        job.num_decoded += len(delta.token_ids)
        self.slots.progress(job.request_id, len(delta.token_ids), delta.text)

    def abort_all(self) -> int:
        """Abort the engine requests of every HTTP request in flight (at shutdown); their
        handlers answer 503 or end their streams with an error event.

        Returns:
            The number of HTTP requests affected.
        """
        self.shutting_down = True
        for group in self.groups:
            group.abort()
        return len(self.groups)

    def release(self, jobs: list[Job]) -> None:
        """Free the slots of jobs that did not finish (aborted); idempotent."""
        for job in jobs:
            self._release(job)

    def _release(self, job: Job) -> None:
        if not job.slot_released:
            job.slot_released = True
            self.slots.remove(job.request_id)

    def _stopping_word(self, output: RequestOutput, job: Job) -> str:
        return output.stop_string or ""  # the engine names the stop string that ended it

    def prompt_text(self, output: RequestOutput, job: Job | None = None) -> str:
        """The processed prompt (special tokens rendered), as /completion's ``prompt``: the
        job's, when it was made with its tokens (off the loop), else now."""
        if job is not None and job.prompt_text is not None:
            return job.prompt_text
        return self.llm.detokenize(output.prompt_token_ids, skip_special=False)


def _choice_params(
    params: SamplingParams, choice: int, max_tokens: int, changes: Mapping[str, object]
) -> SamplingParams:
    """The sampling parameters of a request's ``choice``-th completion: ``changes`` and
    ``max_tokens`` applied, and a seeded request's choices use seed + choice (mod 2^32), so
    they differ (one replace: each runs every check of SamplingParams again)."""
    if choice and params.seed is not None:
        changes = {**changes, "seed": (params.seed + choice) % 2**32}
    return replace(params, max_tokens=max_tokens, **changes)


def _without_output(output: RequestOutput) -> RequestOutput:
    metrics = replace(output.metrics, num_output_tokens=0, tpot_s=None, itl_s=())
    return replace(output, text="", token_ids=(), finish_reason="length", metrics=metrics,
                   logprobs=None)  # fmt: skip
