"""LLM: the friendly Python entry point (batch generation, streaming, server hooks)."""

from __future__ import annotations

import logging
import operator
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

from pycacheflow import errors
from pycacheflow._ffi import ffi
from pycacheflow._native import Engine, token_array_slice
from pycacheflow.chat_template import ChatFormatter
from pycacheflow.config import EngineConfig
from pycacheflow.engine import EngineRunner, RequestStream
from pycacheflow.outputs import (
    EngineStats,
    ModelInfo,
    RequestOutput,
    StreamDelta,
    budget_note,
    rounding_note,
)
from pycacheflow.profiler import DEFAULT_PROFILE_CAPACITY, Profile, ProfileCollector
from pycacheflow.request_state import RequestState
from pycacheflow.sampling_params import SamplingParams
from pycacheflow.text import encode_utf8, is_exact_int_list

logger = logging.getLogger("pycacheflow.llm")

PromptInput = Union[str, Sequence[int]]  # text, or token ids


@dataclass
class _Pending:
    """A request submitted through ``add_request`` and not yet fully consumed."""

    state: RequestState
    stream: RequestStream


@dataclass(frozen=True)
class PreparedPrompt:
    """A text prompt tokenized into the engine's form once (``LLM.prepare_prompt``, on any
    thread), so that submitting it (``add_request``, ``add_choices``) does no work per token:
    no check of ids the tokenizer made, no conversion.

    Attributes:
        prompt: the text (``RequestOutput.prompt``).
        token_ids: the tokens that will be submitted.
        tokens: the same as the engine's ``int32_t[]`` (``_native.token_array``).
    """

    prompt: str | None
    token_ids: tuple[int, ...]
    tokens: object = field(repr=False, compare=False)


@dataclass(frozen=True)
class _Prepared:
    """A validated prompt, ready to submit (``tokens``: its int32_t[] when prepared ahead)."""

    prompt: str | None
    token_ids: Sequence[int]
    params: SamplingParams
    tokens: object = None

    @property
    def engine_tokens(self) -> object:
        """What the engine's add_request takes: the prepared array, else the ids."""
        return self.token_ids if self.tokens is None else self.tokens


class LLM:
    """A loaded model serving many requests at once.

    Generation runs on the engine's native step thread; Python only submits requests and
    consumes output events in batches. All methods are thread-safe.

    Args:
        model: GGUF path; None = the default model (SmolLM2-135M-Instruct Q4_1), downloaded to
            the user cache on first use.
        config: a full EngineConfig (its ``model`` is used when ``model`` is None).
        profile: record profiler events (``profile()``, ``export_trace``); sets
            ``profile_capacity`` to DEFAULT_PROFILE_CAPACITY unless the config sets one.
        warn_rounded_ctx: log a rounded n_ctx, or a kv_cache_bytes budget whose tokens were
            rounded down (``budget_note``); False for callers that say it their way.
        **config_kwargs: EngineConfig fields (n_ctx, max_num_seqs, kv_mode, ...) overriding
            ``config``. An n_ctx that llama.cpp rounds up (to multiples of 256) is logged as a
            warning on the ``pycacheflow.llm`` logger (``rounding_note``) unless
            ``warn_rounded_ctx`` is False; ``info.n_ctx`` gives the size used.

    Raises:
        ValueError/TypeError: a bad config value. ModelLoadError, UnsupportedError,
        OutOfMemoryError: the engine could not be built.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        config: EngineConfig | None = None,
        profile: bool = False,
        warn_rounded_ctx: bool = True,
        **config_kwargs: object,
    ) -> None:
        self.config = _make_config(model, config, config_kwargs)
        if profile and self.config.profile_capacity == 0:
            self.config = replace(self.config, profile_capacity=DEFAULT_PROFILE_CAPACITY)
        self._engine = Engine(self.config)
        self._info = self._engine.info()
        budget = budget_note(self.config.kv_cache_bytes, self._info)
        if budget is not None and warn_rounded_ctx:
            logger.warning("pycacheflow: kv_cache_bytes=%d %s", self.config.kv_cache_bytes, budget)
        note = rounding_note(self.config.n_ctx, self._info)
        if note is not None and warn_rounded_ctx:
            logger.warning("pycacheflow: n_ctx %d rounded to %d tokens of KV cache (%s); at most "
                           "%d tokens per sequence", self.config.n_ctx, self._info.n_ctx, note,
                           self._info.n_ctx_per_seq)  # fmt: skip
        self._profiler: ProfileCollector | None = None
        if self.config.profile_capacity > 0:
            self._profiler = ProfileCollector(self._engine.profile_drain)
        self._runner = EngineRunner(self._engine)  # starts the native and dispatcher threads
        self._lock = threading.Lock()  # guards _pending
        self._pending: dict[int, _Pending] = {}  # add_request'ed, not yet fully consumed
        # Stops native threads before interpreter teardown even without close().
        self._chat_formatter: ChatFormatter | None = None  # built on first use
        self._finalizer = weakref.finalize(self, _close, self._profiler, self._runner)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the engine and free it; unfinished requests are dropped. Idempotent."""
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def info(self) -> ModelInfo:
        """Model and capacity facts (n_vocab, n_ctx_per_seq, resolved kv_mode, ...)."""
        return self._info

    def stats(self) -> EngineStats:
        """Engine-wide counters now (steps, tokens, KV use, preemptions)."""
        return self._engine.stats()

    # ------------------------------------------------------------------ profiling

    def profile(self, clear: bool = False) -> Profile:
        """The profiler events recorded so far (needs ``profile=True``).

        Args:
            clear: forget the returned events, so that the next call starts empty.

        Raises:
            UnsupportedError: the LLM was built without profiling.
        """
        if self._profiler is None:
            raise errors.UnsupportedError("profiling is off: build the LLM with profile=True")
        self._profiler.poll()
        events = self._profiler.events(clear=clear)
        metadata = {
            "model": os.path.basename(self.config.model_path),
            "description": self._info.description,
            "kv_mode": self._info.kv_mode_name,
            "max_num_seqs": self._info.max_num_seqs,
            "n_threads": self._info.n_threads,
        }
        return Profile(events, self._profiler.num_dropped, self._info.n_ctx, metadata)

    def export_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the profile so far as a Chrome trace JSON (Perfetto, chrome://tracing).

        Raises:
            UnsupportedError: the LLM was built without profiling.
        """
        self.profile().write_chrome_trace(path)

    # ------------------------------------------------------------------ text helpers

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """Tokenize text as prompts are tokenized (BOS added if the model wants it)."""
        return self._engine.tokenize(text, add_special, parse_special)

    def eog_token_ids(self) -> list[int]:
        """The model's end-of-generation token ids (what ``ignore_eos`` keeps going past and
        llama-server's ``ignore_eos`` bans), increasing."""
        return self._engine.eog_tokens()

    def token_piece(self, token_id: int, special: bool = True) -> bytes:
        """The raw bytes of one token (special tokens as their text, or as nothing with
        ``special=False``); a piece of a multi-byte character is not valid UTF-8 on its own."""
        return self._engine.detokenize_bytes([token_id], unparse_special=special)

    def detokenize(
        self, token_ids: Sequence[int] | PreparedPrompt, skip_special: bool = True
    ) -> str:
        """Detokenize; ``skip_special`` renders special tokens (e.g. "<|im_end|>") as nothing.
        A PreparedPrompt's tokens are read from its engine array (no conversion)."""
        if isinstance(token_ids, PreparedPrompt):
            token_ids = token_ids.tokens
        return self._engine.detokenize(token_ids, unparse_special=not skip_special)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = True,
        template: str | None = None,
        *,
        jinja: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
        chat_template_kwargs: Mapping[str, object] | None = None,
    ) -> str:
        """Render chat messages with the model's template (or another one).

        With ``jinja`` (the default) the model's Jinja template (or ``template`` when it is
        template text) is rendered by jinja2 as transformers does (pycacheflow.chat_template);
        a built-in name, or ``jinja=False``, uses llama.cpp's built-in template matcher.

        Args:
            messages: [{"role": "system"|"user"|"assistant"|..., "content": str, ...}, ...].
            add_generation_prompt: end with the assistant turn opener.
            template: a llama.cpp built-in template name ("chatml", "llama3", ...) or template
                text; None = the model's own (its tool_use variant for a request with tools,
                when the GGUF has one; ChatML when it has no template, as llama-server).
            jinja: render Jinja templates with jinja2 (False: llama.cpp's matcher).
            continue_final_message: the model continues the last (assistant) message; needs
                ``add_generation_prompt=False``.
            tools: OpenAI tool definitions for the template (Jinja only).
            chat_template_kwargs: more template variables (Jinja only).

        Raises:
            UnsupportedError: llama.cpp's matcher does not know the template.
            InvalidArgumentError: conflicting arguments, or the template raised.
        """
        return self.chat_formatter.apply(messages, add_generation_prompt, template, jinja=jinja,
                                         continue_final_message=continue_final_message,
                                         tools=tools, kwargs=chat_template_kwargs)  # fmt: skip

    @property
    def chat_formatter(self) -> ChatFormatter:
        """The model's chat renderer (also says which template text it renders with and what
        that template supports, for the server's /props)."""
        if self._chat_formatter is None:
            bos, eos = (self.detokenize([t], skip_special=False) if t >= 0 else ""
                        for t in (self._info.token_bos, self._info.token_eos))  # fmt: skip
            self._chat_formatter = ChatFormatter(
                str(self.config.model_path), self._engine.apply_chat_template, bos, eos
            )
        return self._chat_formatter

    # ------------------------------------------------------------------ batch generation

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_chat_template: bool = False,
    ) -> list[RequestOutput]:
        """Generate completions for all prompts concurrently.

        Every prompt is tokenized and checked before anything is submitted, so a bad prompt
        raises without starting work. The prompts are submitted together: the engine step that
        admits the first sees all of them, so the batches (and with them the exact outputs) do
        not depend on thread timing. If the call is interrupted, its requests are aborted.

        Args:
            prompts: a str, a list of str, or a list of token-id lists ([[1, 2, 3]]).
            params: one SamplingParams for all, one per prompt, or None (greedy, 16 tokens).
            use_chat_template: wrap each text prompt as a user message of the chat template.

        Returns:
            One RequestOutput per prompt, in input order.

        Raises:
            PromptTooLongError: a prompt does not fit a sequence (prompt + 1 >= n_ctx_per_seq).
            InvalidArgumentError: empty prompt, token id out of range, or text that is not
                valid UTF-8 (a lone surrogate). TypeError: bad input.
            ShutdownError: the LLM was closed.
        """
        prepared = self._prepare_all(prompts, params, use_chat_template)
        submitted: list[tuple[RequestState, RequestStream]] = []
        try:
            # one submission: the engine schedules the batch as a whole, whatever the timing
            streams = self._runner.add_requests([(p.token_ids, p.params) for p in prepared])
            for p, stream in zip(prepared, streams):
                state = RequestState(stream.request_id, p.prompt, p.token_ids, p.params.stop,
                                 p.params.logprobs is not None)
                submitted.append((state, stream))
            for state, stream in submitted:
                while not state.finished:
                    state.add(stream.get())
        finally:
            for state, stream in submitted:
                if not state.finished:
                    self._runner.abort(stream.request_id)
        return [state.output for state, _ in submitted]

    # ------------------------------------------------------------------ streaming

    def stream(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        use_chat_template: bool = False,
    ) -> Iterator[str]:
        """Generate one completion and yield its text as it is produced.

        Pieces never split a UTF-8 character and never include a stop string or text after it.
        Closing the generator early aborts the request.

        Raises:
            Same as ``generate``, before the first piece.
        """
        request_id = self.add_request(prompt, params, use_chat_template=use_chat_template)
        outputs = self.iter_outputs(request_id)
        try:
            for delta in outputs:
                if delta.text:
                    yield delta.text
        finally:
            outputs.close()  # aborts the request if the caller stopped early

    def add_request(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        use_chat_template: bool = False,
        priority: int = 0,
        notify: Callable[[], None] | None = None,
    ) -> int:
        """Submit one request without waiting (for servers); consume it with ``iter_outputs``.

        Args:
            prompt: text, token ids, or a ``prepare_prompt`` result (submitted as it is).
            params: sampling parameters (None = defaults).
            use_chat_template: wrap a text prompt as a user message of the chat template
                (not for a prepared prompt).
            priority: smaller runs first under the "priority" policy.
            notify: called on the dispatcher thread whenever new output is queued for this
                request (e.g. to wake an asyncio loop); must be cheap and must not block.

        Returns:
            The request id.

        Raises:
            Same as ``generate``; TypeError / InvalidArgumentError for a priority that is not an
            int32.
        """
        priority = _checked_priority(priority)
        p = self._prepare_all([prompt], params, use_chat_template, single=True)[0]
        with self._lock:
            stream = self._runner.add_request(p.engine_tokens, p.params, priority, notify)
            state = RequestState(stream.request_id, p.prompt, p.token_ids, p.params.stop,
                                 p.params.logprobs is not None)
            self._pending[stream.request_id] = _Pending(state, stream)
        return stream.request_id

    def add_choices(
        self,
        prompt: PromptInput,
        params: Sequence[SamplingParams],
        *,
        priority: int = 0,
        notify: Callable[[], None] | None = None,
    ) -> list[int]:
        """Submit len(params) completions of one prompt (OpenAI ``n``) without waiting; consume
        each with ``iter_outputs``.

        In paged KV mode the choices share the prompt's KV: the first computes the prompt, the
        others fork its blocks (copy-on-write) and compute only its last token, so each samples
        independently (with its own params and seed) from logits of its own. In the stock
        modes each computes the prompt itself.

        Args:
            prompt: text, token ids or a ``prepare_prompt`` result.
            params: one SamplingParams per choice (at least one).
            priority, notify: as ``add_request`` (notify is shared by the choices).

        Returns:
            The request ids, one per choice, in order.

        Raises:
            Same as ``generate``.
        """
        if not params:
            raise ValueError("add_choices needs at least one SamplingParams")
        priority = _checked_priority(priority)
        prepared = self._prepare_all([prompt] * len(params), list(params), False, single=True)
        with self._lock:
            streams = self._runner.add_choices(
                prepared[0].engine_tokens, [p.params for p in prepared], priority, notify
            )
            for p, stream in zip(prepared, streams):
                state = RequestState(stream.request_id, p.prompt, p.token_ids, p.params.stop,
                                 p.params.logprobs is not None)
                self._pending[stream.request_id] = _Pending(state, stream)
        return [stream.request_id for stream in streams]

    def iter_outputs(self, request_id: int, timeout: float | None = None) -> Iterator[StreamDelta]:
        """Yield a request's output as StreamDeltas until its last one (which has ``output``).

        One consumer per request. Closing the iterator early, or a timeout, aborts the request.

        Args:
            request_id: an id returned by ``add_request``.
            timeout: seconds to wait for each batch of output; None = forever.

        Raises:
            NotFoundError: unknown id or already consumed. queue.Empty: timeout passed.
            ShutdownError: the LLM was closed first.
        """
        with self._lock:
            pending = self._pending.pop(request_id, None)
        if pending is None:
            raise errors.NotFoundError(f"no pending request with id {request_id}")
        try:
            while not pending.state.finished:
                delta = pending.state.add(pending.stream.get(timeout))
                if delta.text or delta.token_ids or delta.finished:
                    yield delta
        finally:
            if not pending.state.finished:
                self._runner.abort(request_id)

    def take_outputs(self, request_id: int) -> list[StreamDelta]:
        """Everything queued for a request right now, without blocking, as one delta (output
        that arrived in several drains is coalesced); [] if nothing is queued.

        For event-loop servers: pass ``notify`` to ``add_request`` to learn when to call this.
        After the delta with ``output`` the id is forgotten. One consumer per request; do not
        mix with ``iter_outputs`` for the same request.

        Raises:
            NotFoundError: unknown id, or its last delta was already taken.
        """
        pending = self._pending.get(request_id)  # one dict read: atomic, no lock needed
        if pending is None:
            raise errors.NotFoundError(f"no pending request with id {request_id}")
        if pending.state.finished:
            return []
        chunks = pending.stream.take_queued()  # all at once: one call per wake-up, not per chunk
        if not chunks:
            return []
        for i, chunk in enumerate(chunks):
            if isinstance(chunk, BaseException):
                raise chunk  # the runner failed the stream (the chunks before it are dropped)
            if chunk.final is not None:  # the dispatcher queues nothing after a final chunk
                del chunks[i + 1 :]
                with self._lock:
                    self._pending.pop(request_id, None)
                break
        return [pending.state.add(chunks)]

    def abort(self, request_id: int) -> bool:
        """Abort a request; its consumer still gets a final delta with finish_reason "abort".

        Returns:
            False if the id is unknown or the request already finished.
        """
        return self._runner.abort(request_id)

    # ------------------------------------------------------------------ preparation

    def _prepare_all(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        params: SamplingParams | Sequence[SamplingParams] | None,
        use_chat_template: bool,
        single: bool = False,
    ) -> list[_Prepared]:
        """Checked prompts; an error names ``prompts[i]``, or ``prompt`` when ``single`` (the
        one prompt of add_request / add_choices)."""
        prompt_list = _normalize_prompts(prompts, single)
        params_list = _normalize_params(params, len(prompt_list))
        return [
            self._prepare(prompt, p, use_chat_template, "prompt" if single else f"prompts[{index}]")
            for index, (prompt, p) in enumerate(zip(prompt_list, params_list))
        ]

    def prepare_prompt(self, text: str) -> PreparedPrompt:
        """Tokenize a text prompt as ``tokenize_prompt`` does, into the engine's form, so that
        ``add_request`` / ``add_choices`` of the result do no work per token (thread-safe; the
        native call releases the GIL): a server prepares prompts on a worker thread and
        submits them on its event loop. The tokenizer's ids need no check; the length is
        checked when the prompt is submitted, as for any prompt.

        Raises:
            InvalidArgumentError: text without a UTF-8 form (as ``tokenize`` raises it).
        """
        tokens, num_tokens = self._engine.tokenize_array(text, add_special=True,
                                                         parse_special=True)  # fmt: skip
        start = 1 if self._doubled_bos(tokens, num_tokens) else 0
        tokens = token_array_slice(tokens, start, num_tokens)
        return PreparedPrompt(text, tuple(ffi.unpack(tokens, num_tokens - start)), tokens)

    def _prepare(
        self, prompt: PromptInput, params: SamplingParams, use_chat_template: bool, label: str
    ) -> _Prepared:
        if isinstance(prompt, PreparedPrompt):
            if use_chat_template:
                raise ValueError("use_chat_template does not apply to a prepared prompt")
            self._validate_length(len(prompt.token_ids), label)
            return _Prepared(prompt.prompt, prompt.token_ids, params, prompt.tokens)
        return _Prepared(*self._prompt_tokens(prompt, use_chat_template, label), params)

    def _prompt_tokens(
        self, prompt: PromptInput, use_chat_template: bool, label: str
    ) -> tuple[str | None, list[int]]:
        """(the prompt as given if text, else None; its checked token ids)."""
        if isinstance(prompt, str):
            encode_utf8(prompt, label)
            text = prompt
            if use_chat_template:
                text = self.apply_chat_template([{"role": "user", "content": prompt}])
            token_ids = self._tokenize_prompt(text)
            original: str | None = prompt
        else:
            # exact ints (a tokenizer's output) are copied in C, others (bools, numpy ints) by int()
            exact = is_exact_int_list(prompt)
            token_ids, original = (list(prompt) if exact else [int(t) for t in prompt]), None
        self._validate_tokens(token_ids, label)
        return original, token_ids

    def tokenize_prompt(self, text: str) -> list[int]:
        """The token ids a text prompt is submitted as (BOS added if the model wants it, once)."""
        return self._tokenize_prompt(text)

    def _tokenize_prompt(self, text: str) -> list[int]:
        token_ids = self._engine.tokenize(text, add_special=True, parse_special=True)
        return token_ids[1:] if self._doubled_bos(token_ids, len(token_ids)) else token_ids

    def _doubled_bos(self, token_ids: Sequence[int], num_tokens: int) -> bool:
        """Text that starts with the BOS token's text (chat templates do; SmolLM2's BOS is
        <|im_start|>) plus the BOS the tokenizer adds gives two: keep one."""
        bos = self._info.token_bos
        return bool(self._info.add_bos) and num_tokens >= 2 and token_ids[0] == token_ids[1] == bos

    def _validate_length(self, num_tokens: int, label: str) -> None:
        limit = self._info.n_ctx_per_seq
        if not num_tokens:
            raise errors.InvalidArgumentError(f"{label} is empty")
        if num_tokens >= limit:
            raise errors.PromptTooLongError(
                f"{label} has {num_tokens} tokens; a sequence holds at most "
                f"{limit} (prompt + output), so prompts must be shorter than {limit} tokens"
            )

    def _validate_tokens(self, token_ids: list[int], label: str) -> None:
        n_vocab = self._info.n_vocab
        self._validate_length(len(token_ids), label)
        in_range = min(token_ids) >= 0 and max(token_ids) < n_vocab  # C loops; the culprit below
        bad = None if in_range else next(t for t in token_ids if not 0 <= t < n_vocab)
        if bad is not None:
            raise errors.InvalidArgumentError(
                f"{label}: token id {bad} out of range [0, {n_vocab})"
            )


def _checked_priority(priority: object) -> int:
    """A request priority as the engine takes it (int32).

    Raises:
        TypeError: not an integer (bools and floats included).
        InvalidArgumentError: outside [-2**31, 2**31 - 1].
    """
    if isinstance(priority, bool) or not hasattr(priority, "__index__"):
        raise TypeError(f"priority must be an int, got {priority!r:.40}")
    value = operator.index(priority)
    if not -(2**31) <= value < 2**31:
        raise errors.InvalidArgumentError(
            f"priority {value} is out of range [{-(2**31)}, {2**31 - 1}] (smaller runs first)"
        )
    return value


def _close(profiler: ProfileCollector | None, runner: EngineRunner) -> None:
    if profiler is not None:
        profiler.close()  # its last drain needs the engine
    runner.close()


def _make_config(
    model: str | os.PathLike[str] | None,
    config: EngineConfig | None,
    overrides: Mapping[str, object],
) -> EngineConfig:
    if config is None:
        if model is None:
            from pycacheflow.model_hub import ensure_default_model

            model = ensure_default_model()
        return EngineConfig(model=model, **overrides)
    changes = dict(overrides)
    if model is not None:
        changes["model"] = model
    return replace(config, **changes) if changes else config


def _all_ints(values: Iterable[object]) -> bool:
    """Every value is an int (bools count, as isinstance says); fast for a list of plain ints."""
    return is_exact_int_list(values) or all(isinstance(v, int) for v in values)


def _normalize_prompts(
    prompts: PromptInput | Sequence[PromptInput], single: bool = False
) -> list[PromptInput]:
    """The prompts as a list, each a str, a PreparedPrompt or a sequence of ints; an error names
    ``prompts[i]``, or ``prompt`` when ``single``.

    Raises:
        TypeError: anything else, with the accepted types.
    """
    if isinstance(prompts, (str, PreparedPrompt)):
        return [prompts]
    # a sequence only: a dict's keys or a set's arbitrary order must not become the prompts
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Sequence):
        raise TypeError(
            "prompts must be a str, a list of str or a list of token-id lists, "
            f"got {type(prompts).__name__}"
        )
    prompts = list(prompts)
    for i, p in enumerate(prompts):
        label = "prompt" if single else f"prompts[{i}]"
        if isinstance(p, int):
            raise TypeError(
                f"{label} is an int; pass token-id prompts as a list of lists, e.g. [[1, 2, 3]]"
            )
        if isinstance(p, (str, PreparedPrompt)):
            continue
        # not iterable (None, a float): a TypeError naming the prompt, not the bare one of iter()
        if not isinstance(p, Iterable) or not _all_ints(p):
            raise TypeError(f"{label} must be a str or a list of int token ids, got {p!r:.80}")
    return prompts


def _normalize_params(
    params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(params, SamplingParams):
        return [params] * num_prompts
    if isinstance(params, (dict, str, bytes)) or not isinstance(params, Iterable):
        raise TypeError(
            "params must be a SamplingParams, a list of them (one per prompt) or None, "
            f"got {type(params).__name__}; e.g. SamplingParams(max_tokens=4)"
        )
    params = list(params)
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")
    if len(params) != num_prompts:
        raise ValueError(f"got {len(params)} SamplingParams for {num_prompts} prompts")
    return params
