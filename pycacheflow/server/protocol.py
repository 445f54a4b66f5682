"""Request parsing and validation for the llama-server compatible HTTP API.

A decoded JSON body goes in, a typed request comes out (pure Python, but for JSON schemas).
Every problem raises ``ProtocolError`` with a message naming the field, answered as HTTP 400 in
the OpenAI error format (``{"error": {"code", "message", "type"}}``), the way llama-server words
it ("Field 'n_predict': ...").

Field rules follow llama-server (tools/server/server-schema.cpp of the pinned tree):
  - a JSON ``null`` counts as absent (the server default applies);
  - numbers of the wrong type are errors; integral floats (``16.0``) are accepted as ints;
  - "hard" limits are errors (``n_predict`` < -1), "soft" limits are clamped (``top_p`` > 1);
  - unknown fields are ignored; known llama.cpp options that CacheFlow does not implement
    (n_keep, t_max_predict_ms, samplers, lora) are ignored too but listed in
    ``ignored_fields`` (the server logs them);
    options whose absence would change the response's shape (echo) are rejected;
  - token probabilities (``n_probs``, ``logprobs``, ``top_logprobs``): the ``logprobs`` module;
  - JSON schemas become GBNF grammars through llama.cpp's converter (``json_schema`` module).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Union

from pycacheflow.errors import InvalidArgumentError, UnsupportedError
from pycacheflow.reasoning import REASONING_FORMATS
from pycacheflow.sampling_params import SamplingParams
from pycacheflow.server import json_schema, logprobs
from pycacheflow.server.config import RequestDefaults
from pycacheflow.text import encode_utf8

INT32_MAX = 2**31 - 1
SEED_RANDOM_VALUES = (-1, 0xFFFFFFFF)  # llama.cpp's LLAMA_DEFAULT_SEED and its int32 spelling

# llama-server's sampling defaults (common_params_sampling), so unchanged clients get the same.
LLAMA_SERVER_DEFAULTS = RequestDefaults()
DEFAULT_TEMPERATURE = LLAMA_SERVER_DEFAULTS.temperature
DEFAULT_TOP_K = LLAMA_SERVER_DEFAULTS.top_k
DEFAULT_TOP_P = LLAMA_SERVER_DEFAULTS.top_p
DEFAULT_MIN_P = LLAMA_SERVER_DEFAULTS.min_p
_TOP_P_FLOOR = 1e-6  # top_p 0 keeps only the most likely token; SamplingParams needs > 0

# Known llama.cpp options CacheFlow does not implement, with their no-op value. A request that
# sets another value still runs (as llama-server would without that sampler) and the field is
# reported in ``ignored_fields``.
_IGNORED_OPTIONS: Mapping[str, object] = {
    "n_keep": None,
    "t_max_predict_ms": None,
    "samplers": None,
    "lora": None,
    # a slot of one's choosing: the continuous batcher places every request itself (the value is still checked: an
    # integer >= -1; llama-server wraps larger ones around its slot count)
    "id_slot": -1,
}

PromptInput = Union[str, list]  # text, or a list of token ids and text pieces


class ProtocolError(ValueError):
    """A request the server cannot accept.

    Attributes:
        status: HTTP status (400 unless said otherwise).
        error_type: OpenAI error type ("invalid_request_error", "exceed_context_size_error").
        extra: more fields for the error object (llama-server adds n_prompt_tokens, n_ctx).
    """

    def __init__(
        self,
        message: str,
        status: int = 400,
        error_type: str = "invalid_request_error",
        extra: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.extra = dict(extra or {})


@dataclass(frozen=True)
class GenerationRequest:
    """A validated /completion, /v1/completions or /v1/chat/completions request.

    Attributes:
        prompts: one prompt per completion: text, or a list of token ids and text pieces.
            Chat requests hold the message list in ``messages`` and an empty ``prompts``.
        messages: chat turns [{"role": str, "content": str}, ...]; () for completions.
        n_predict: tokens to generate at most; -1 = until EOS or context full; 0 = none.
        params: sampling parameters; ``max_tokens`` is filled in by ``with_max_tokens``.
        stream: answer with server-sent events.
        include_usage: OpenAI ``stream_options.include_usage``.
        priority: smaller runs first under the "priority" scheduling policy.
        return_tokens: /completion: fill ``tokens`` in non-streamed answers.
        response_fields: /completion: answer only these fields ("a/b" reaches into objects);
            () = all.
        logit_bias: (token id or text, bias) pairs as the request spelled them; the server
            tokenizes the texts (see ``read_logit_bias``).
        num_choices: completions per prompt (OpenAI ``n``, llama-server ``n_cmpl``), each an
            engine request of its own, sampled independently (a seeded request's choice i uses
            seed + i).
        verbose: add llama-server's ``__verbose`` object (the rendered prompt) to the answer.
        cache_prompt: the client's ``cache_prompt`` (also in ``params``: False = this request
            neither reads nor fills the prefix cache).
        timings_per_token: add ``timings`` to streamed chunks before the last (CacheFlow: to
            the prompt progress chunks; ``params.return_progress`` is set when the request
            streams and asked for ``return_progress``).
        ignored_fields: known llama.cpp options set to values CacheFlow does not implement.
        tools: chat: OpenAI tool definitions, passed to the chat template.
        template_kwargs: chat: the request's ``chat_template_kwargs``.
        add_generation_prompt: chat: end the prompt with the assistant turn opener.
        continue_final_message: chat: continue the last (assistant) message; None = when the
            last message is an assistant message and the server prefills (llama-server's
            --prefill-assistant).
        reasoning_format: how a chat answer's reasoning is returned (``RequestDefaults``); the
            request's field, else the server's --reasoning-format.
        reasoning_budget: chat: the most tokens of the answer's reasoning block (llama-server's
            ``reasoning_budget_tokens``, alias ``thinking_budget_tokens``; -1 there means the
            server's --reasoning-budget), -1 = no limit; applied only when the template marks
            reasoning.
        reasoning_budget_message: chat: text forced before the block's end marker when the
            budget is spent (``reasoning_budget_message``, else the server's).
    """

    prompts: tuple[PromptInput, ...]
    n_predict: int
    params: SamplingParams
    messages: tuple[dict[str, object], ...] = ()
    stream: bool = False
    include_usage: bool = False
    priority: int = 0
    return_tokens: bool = False
    response_fields: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int | str, float], ...] = ()
    num_choices: int = 1
    verbose: bool = False
    cache_prompt: bool = True
    timings_per_token: bool = False
    ignored_fields: tuple[str, ...] = field(default_factory=tuple)
    tools: tuple[dict[str, object], ...] = ()
    template_kwargs: Mapping[str, object] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None
    reasoning_format: str = LLAMA_SERVER_DEFAULTS.reasoning_format
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""

    def with_max_tokens(self, max_tokens: int) -> SamplingParams:
        """The sampling parameters with ``max_tokens`` set (>= 1)."""
        return replace(self.params, max_tokens=max_tokens)


# ---------------------------------------------------------------------------- field readers


def _present(body: Mapping[str, object], name: str) -> bool:
    return name in body and body[name] is not None


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _bad_type(name: str, expected: str, value: object) -> ProtocolError:
    return ProtocolError(f"Field '{name}': expected {expected}, got {_type_name(value)}")


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad_type(name, "an integer", value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ProtocolError(f"Field '{name}': expected an integer, got {value}")
        value = int(value)
    return value


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad_type(name, "a number", value)
    if not math.isfinite(value):
        raise ProtocolError(f"Field '{name}': must be finite, got {value}")
    return float(value)


def _utf8(text: str, where: str) -> str:
    """``text``, which must have a UTF-8 form (JSON can spell lone surrogates: "\\ud800")."""
    try:
        encode_utf8(text, where)
    except InvalidArgumentError as exc:
        raise ProtocolError(str(exc)) from None
    return text


def _as_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad_type(name, "a boolean", value)
    return value


def _as_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise _bad_type(name, "a string", value)
    return value


def read_int(
    body: Mapping[str, object],
    names: tuple[str, ...],
    default: int,
    low: int = -INT32_MAX - 1,
    high: int = INT32_MAX,
) -> int:
    """First present field of ``names`` as an int in [low, high] (hard limits), or ``default``.

    Raises:
        ProtocolError: wrong type or out of range.
    """
    for name in names:
        if _present(body, name):
            value = _as_int(name, body[name])
            if not low <= value <= high:
                raise ProtocolError(
                    f"Field '{name}': value must be between {low} and {high}, got {value}"
                )
            return value
    return default


def read_float(
    body: Mapping[str, object], name: str, default: float, low: float, high: float
) -> float:
    """Field ``name`` as a float clamped to [low, high] (soft limits), or ``default``."""
    if not _present(body, name):
        return default
    return min(high, max(low, _as_float(name, body[name])))


def read_bool(body: Mapping[str, object], name: str, default: bool) -> bool:
    """Field ``name`` as a bool, or ``default``."""
    return _as_bool(name, body[name]) if _present(body, name) else default


def read_str(body: Mapping[str, object], name: str, default: str | None) -> str | None:
    """Field ``name`` as a str, or ``default``."""
    return _as_str(name, body[name]) if _present(body, name) else default


def require_object(body: object) -> dict[str, object]:
    """The decoded JSON body as a dict.

    Raises:
        ProtocolError: the body is not a JSON object.
    """
    if not isinstance(body, dict):
        raise ProtocolError(f"request body must be a JSON object, got {_type_name(body)}")
    return body


# ---------------------------------------------------------------------------- prompts


def _is_token_list(value: list) -> bool:
    """llama-server's rule: an array with at least one number, of numbers and strings only, is
    one prompt; any other array is a list of prompts."""
    has_number = any(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return has_number and all(
        isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in value
    )


def _one_prompt(value: object, where: str) -> PromptInput:
    if isinstance(value, str):
        return _utf8(value, where)
    if isinstance(value, dict):
        if value.get("multimodal_data"):
            raise ProtocolError(f"{where}: multimodal_data is not supported (text models only)")
        if "prompt_string" not in value:
            raise ProtocolError(f"{where}: an object prompt needs a 'prompt_string' field")
        return _one_prompt(value["prompt_string"], f"{where}.prompt_string")
    if isinstance(value, list) and value and _is_token_list(value):
        return [_utf8(v, f"{where} (piece {i})") if isinstance(v, str) else v
                for i, v in enumerate(value)]  # fmt: skip
    raise ProtocolError(
        f"{where}: expected a string, an array of token ids and strings, or an object with "
        f"'prompt_string'; got {_type_name(value)}"
    )


def read_prompts(body: Mapping[str, object], name: str = "prompt") -> tuple[PromptInput, ...]:
    """The prompt field as one or more prompts (see llama-server's /completion docs).

    Raises:
        ProtocolError: missing, empty or of the wrong shape.
    """
    if not _present(body, name):
        raise ProtocolError(f'"{name}" is required')
    value = body[name]
    if isinstance(value, list) and not _is_token_list(value):
        if not value:
            raise ProtocolError(f"Field '{name}': must not be empty")
        return tuple(_one_prompt(v, f"Field '{name}[{i}]'") for i, v in enumerate(value))
    return (_one_prompt(value, f"Field '{name}'"),)


def read_mixed(body: Mapping[str, object], name: str) -> list[str | int]:
    """Field ``name`` as a list of text pieces and token ids ([] when absent)."""
    if not _present(body, name):
        return []
    value = body[name]
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(
        isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in value
    ):
        where = f"Field '{name}'"
        return [
            _utf8(v, where) if isinstance(v, str) else _token_id(f"{name}[{i}]", v)
            for i, v in enumerate(value)
        ]
    raise _bad_type(name, "a string or an array of strings and token ids", value)


def _token_id(name: str, value: int) -> int:
    """A token id that fits the engine's int32 (the vocabulary check is the engine's)."""
    if not -(2**31) <= value < 2**31:
        raise ProtocolError(f"Field '{name}': token id {value} is out of range")
    return value


def read_token_ids(body: Mapping[str, object], name: str) -> list[int]:
    """Field ``name`` as a list of ints ([] when absent)."""
    if not _present(body, name):
        return []
    value = body[name]
    if not isinstance(value, list):
        raise _bad_type(name, "an array of token ids", value)
    return [_token_id(f"{name}[{i}]", _as_int(f"{name}[{i}]", v)) for i, v in enumerate(value)]


def read_messages(body: Mapping[str, object]) -> tuple[dict[str, object], ...]:
    """Chat ``messages`` as [{"role", "content", ...}] with text content, checked by
    llama-server's rules (tools/server/server-common.cpp, common/chat.cpp):

      - every message is an object with a string ``role``;
      - a non-assistant message must have ``content``; an assistant message ``content`` or
        ``tool_calls`` (a JSON null content counts as present, and empty);
      - content is a string, null or a list of {"type": "text", "text": str} parts (joined);
      - ``tool_calls`` is a list of {"type": "function", "function": {"name": str, ...}}.

    Other keys of a message (name, tool_call_id, ...) are kept for the chat template. Every
    violation is a 400 naming the message (llama-server answers some of them, the ones its
    message parser finds, with a 500; a client error is a 400 here).

    Raises:
        ProtocolError: missing, empty, or a message of the wrong shape.
    """
    if not _present(body, "messages"):
        raise ProtocolError("'messages' is required")
    value = body["messages"]
    if not isinstance(value, list) or not value:
        raise ProtocolError("Field 'messages': expected a non-empty array of messages")
    return tuple(_message(m, i) for i, m in enumerate(value))


def _message(message: object, index: int) -> dict[str, object]:
    where = f"Field 'messages[{index}]'"
    if not isinstance(message, dict):
        raise ProtocolError(f"{where}: expected an object, got {_type_name(message)}")
    role = message.get("role")
    if "content" not in message:
        if role != "assistant":
            raise ProtocolError(f"{where}: all non-assistant messages must contain 'content'")
        if "tool_calls" not in message:
            raise ProtocolError(
                f"{where}: an assistant message must contain either 'content' or 'tool_calls'"
            )
    if not isinstance(role, str) or not role:
        raise ProtocolError(f"{where}: 'role' must be a non-empty string")
    _utf8(role, f"{where}.role")
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(_text_part(p, f"{where}.content[{j}]") for j, p in enumerate(content))
    else:
        raise ProtocolError(
            f"{where}: 'content' must be a string or an array of text parts, "
            f"got {_type_name(content)}"
        )
    if message.get("tool_calls") is not None:
        _check_tool_calls(message["tool_calls"], f"{where}.tool_calls")
    return {**message, "role": role, "content": _utf8(text, f"{where}.content")}


def _text_part(part: object, where: str) -> str:
    if not isinstance(part, dict) or "type" not in part:
        raise ProtocolError(f"{where}: expected an object with a 'type'")
    if part["type"] != "text":
        raise ProtocolError(
            f"{where}: unsupported content part type {part['type']!r} (only 'text'; "
            "CacheFlow serves text models)"
        )
    return _as_str(f"{where}.text", part.get("text"))


def _check_tool_calls(tool_calls: object, where: str) -> None:
    """llama-server's checks of an assistant message's tool calls."""
    if not isinstance(tool_calls, list):
        raise _bad_type(where, "an array of tool calls", tool_calls)
    for j, call in enumerate(tool_calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict) or "type" not in call:
            raise ProtocolError(f"{at}: missing tool call type")
        if call["type"] != "function":
            raise ProtocolError(f"{at}: unsupported tool call type {call['type']!r} (function)")
        function = call.get("function")
        if not isinstance(function, dict):
            raise ProtocolError(f"{at}: missing tool call function")
        if not isinstance(function.get("name"), str):
            raise ProtocolError(f"{at}: missing tool call name")


# ---------------------------------------------------------------------------- generation


def parse_completion(
    body: object, default_n_predict: int = -1, defaults: RequestDefaults = LLAMA_SERVER_DEFAULTS
) -> GenerationRequest:
    """A /completion, /completions or /v1/completions body.

    Args:
        body: the decoded JSON body.
        default_n_predict: the server's -n value, used when the request sets no limit.
        defaults: the server's sampling defaults, for the fields the request does not set.

    Raises:
        ProtocolError: invalid field (the message names it).
    """
    body = require_object(body)
    for name in ("suffix", "best_of"):  # OpenAI fields llama-server rejects too
        if _present(body, name):
            raise ProtocolError(f"Unsupported param: {name}")
    if read_bool(body, "echo", False):
        raise ProtocolError("Only no echo is supported")
    probs = logprobs.read_completion_logprobs(body)
    return _generation(body, read_prompts(body), (), default_n_predict, defaults, probs)


def parse_chat(
    body: object, default_n_predict: int = -1, defaults: RequestDefaults = LLAMA_SERVER_DEFAULTS
) -> GenerationRequest:
    """A /v1/chat/completions body (messages are rendered by the server's chat template);
    arguments as ``parse_completion``.

    Raises:
        ProtocolError: invalid field (the message names it).
    """
    body = require_object(body)
    options = read_chat_options(body, generating=True)  # before a schema becomes "grammar"
    probs = (logprobs.read_chat_logprobs(body), False)
    grammar = _schema_grammar(json_schema.chat_grammar, body)
    if grammar:
        body = {**body, "grammar": grammar}
    request = _generation(body, (), read_messages(body), default_n_predict, defaults, probs)
    # llama-server's order: reasoning_budget_tokens, else thinking_budget_tokens; -1 (or
    # neither) is the server's --reasoning-budget
    budget = read_int(body, ("reasoning_budget_tokens", "thinking_budget_tokens"), -1, low=-1)
    message = read_str(body, "reasoning_budget_message", None)
    return replace(
        request,
        **options,
        reasoning_budget=defaults.reasoning_budget if budget == -1 else budget,
        reasoning_budget_message=defaults.reasoning_budget_message if message is None else message,
    )


def _schema_grammar(pick: object, body: Mapping[str, object]) -> str:
    """``pick(body)`` (a json_schema module reader) with its errors as ProtocolError."""
    try:
        return pick(body)
    except json_schema.SchemaError as exc:
        raise ProtocolError(str(exc)) from None


def read_chat_options(body: Mapping[str, object], generating: bool = False) -> dict[str, object]:
    """The chat-template fields of a chat or /apply-template body, as GenerationRequest
    fields (tools, template_kwargs, add_generation_prompt, continue_final_message), after
    checking ``tool_choice`` (``generating``: a chat completion, not /apply-template).

    Raises:
        ProtocolError: a field of the wrong type, an unknown tool_choice, a grammar with tools,
            or both add_generation_prompt and continue_final_message true.
        UnsupportedError: a chat completion with tools and tool_choice "required".
    """
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise _bad_type("tools", "an array of objects", tools)
    _check_tool_choice(body, bool(tools), generating)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _bad_type("chat_template_kwargs", "an object", kwargs)
    kwargs = dict(kwargs or {})
    effort = read_str(body, "reasoning_effort", None)  # OpenAI's; llama-server's meaning:
    if effort == "none":  # no thinking
        kwargs.pop("reasoning_effort", None)
        kwargs["enable_thinking"] = False
    elif effort:  # the level, for the template
        kwargs["reasoning_effort"] = effort
    add_generation_prompt = read_bool(body, "add_generation_prompt", True)
    continue_final = (
        read_bool(body, "continue_final_message", False)
        if _present(body, "continue_final_message")
        else None
    )
    if continue_final and add_generation_prompt:
        raise ProtocolError(
            "Cannot set both add_generation_prompt and continue_final_message to true."
        )
    return {
        "tools": tuple(tools or ()),
        "template_kwargs": kwargs,
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final,
    }


def _check_tool_choice(body: Mapping[str, object], has_tools: bool, generating: bool) -> None:
    """``tool_choice`` as llama-server reads it (server-common.cpp and common/chat.cpp of the pinned
    tree): a string "auto" (the default), "none" or "required", anything else a 400 naming it; a
    value that is not a string counts as "auto". llama-server then parses the model's tool calls
    into ``message.tool_calls`` and, for "required", constrains the output to a call. CacheFlow
    renders the tools into the prompt but parses no tool calls (README, "Not covered"), so
    "required" with tools is refused (501) for a completion rather than answered with plain text;
    with tools and a choice other than "none", a grammar is refused as llama-server refuses it.

    Raises:
        ProtocolError: an unknown tool_choice, or a grammar with tools.
        UnsupportedError: tool_choice "required" with tools when ``generating``.
    """
    choice = body.get("tool_choice", "auto")
    if not isinstance(choice, str):
        choice = "auto"
    if choice not in ("auto", "none", "required"):
        raise ProtocolError(f"Invalid tool_choice: {choice}")
    if not has_tools or choice == "none":
        return
    if _present(body, "grammar"):
        raise ProtocolError("Cannot use custom grammar constraints with tools.")
    if choice == "required" and generating:
        raise UnsupportedError(
            'tool_choice "required" is not supported: cacheflow serve passes tools to the chat '
            "template but does not constrain or parse tool calls (message.tool_calls)"
        )


def _generation(
    body: dict[str, object],
    prompts: tuple[PromptInput, ...],
    messages: tuple[dict[str, str], ...],
    default_n_predict: int,
    defaults: RequestDefaults,
    probs: tuple[int | None, bool] = (None, False),
) -> GenerationRequest:
    """probs: (SamplingParams.logprobs, post_sampling_probs) as the endpoint read them."""
    grammar = _schema_grammar(json_schema.completion_grammar, body)
    if grammar:
        body = {**body, "grammar": grammar}
    num_choices = read_int(body, ("n_cmpl", "n"), 1, low=1, high=defaults.max_choices)
    read_int(body, ("id_slot",), -1, low=-1)  # checked only (_IGNORED_OPTIONS)
    n_predict = read_int(
        body, ("n_predict", "max_completion_tokens", "max_tokens"), default_n_predict, low=-1
    )
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _bad_type("stream_options", "an object", stream_options)
    stream = read_bool(body, "stream", False)
    # llama-server reports prompt progress on streams only
    return_progress = stream and read_bool(body, "return_progress", False)
    with_defaults = _with_defaults(body, defaults)
    return GenerationRequest(
        prompts=prompts,
        messages=messages,
        n_predict=n_predict,
        params=_sampling(with_defaults, max(1, n_predict), probs, return_progress, defaults),
        stream=stream,
        include_usage=read_bool(stream_options or {}, "include_usage", False),
        priority=read_int(body, ("priority",), 0),
        return_tokens=read_bool(body, "return_tokens", False),
        response_fields=tuple(read_str_list(body, "response_fields")),
        logit_bias=read_logit_bias(body),
        num_choices=num_choices,
        verbose=read_bool(body, "verbose", False),
        cache_prompt=read_bool(body, "cache_prompt", True),
        timings_per_token=read_bool(body, "timings_per_token", False),
        ignored_fields=_ignored(with_defaults),
        reasoning_format=_reasoning_format(body, defaults.reasoning_format),
    )


def _reasoning_format(body: Mapping[str, object], default: str) -> str:
    """llama-server's ``reasoning_format`` field (common_reasoning_format_from_name; an unknown
    name is a 500 there, a client error here)."""
    value = read_str(body, "reasoning_format", default)
    if value not in REASONING_FORMATS:
        raise ProtocolError(f"Unknown reasoning format: {value} (one of "
                            f"{', '.join(REASONING_FORMATS)})")  # fmt: skip
    return value


def _with_defaults(body: Mapping[str, object], defaults: RequestDefaults) -> dict[str, object]:
    """``body`` with the server's defaults for the sampling fields it does not set (a JSON
    null counts as not set)."""
    merged = defaults.as_fields()
    merged.update((name, value) for name, value in body.items() if value is not None)
    return merged


def _sampling(
    body: Mapping[str, object],
    max_tokens: int,
    probs: tuple[int | None, bool],
    return_progress: bool = False,
    defaults: RequestDefaults = LLAMA_SERVER_DEFAULTS,
) -> SamplingParams:
    read_str(body, "model", None)  # any model name is accepted (single-model server)
    seed = read_int(body, ("seed",), -1, low=-1, high=0xFFFFFFFF)
    other = _other_samplers(body, defaults)
    try:
        return SamplingParams(
            **other,
            max_tokens=max_tokens,
            temperature=read_float(body, "temperature", 0.0, 0.0, math.inf),
            top_k=max(0, read_int(body, ("top_k",), 0)),
            top_p=max(_TOP_P_FLOOR, read_float(body, "top_p", 1.0, 0.0, 1.0)),
            min_p=read_float(body, "min_p", 0.0, 0.0, 1.0),
            seed=None if seed in SEED_RANDOM_VALUES else seed,
            stop=_stop(body),
            ignore_eos=read_bool(body, "ignore_eos", False),
            cache_prompt=read_bool(body, "cache_prompt", True),
            repeat_penalty=read_float(body, "repeat_penalty", 1.0, -math.inf, math.inf),
            repeat_last_n=read_int(body, ("repeat_last_n",), 64, low=-1),
            presence_penalty=read_float(body, "presence_penalty", 0.0, -math.inf, math.inf),
            frequency_penalty=read_float(body, "frequency_penalty", 0.0, -math.inf, math.inf),
            grammar=read_str(body, "grammar", None) or "",
            logprobs=probs[0],
            post_sampling_probs=probs[1],
            return_progress=return_progress,
        )
    except (TypeError, ValueError) as exc:  # SamplingParams names the field
        raise ProtocolError(str(exc)) from None


_ANY = (-math.inf, math.inf)  # a float field without limits (llama-server sets none)


def _other_samplers(body: Mapping[str, object], defaults: RequestDefaults) -> dict[str, object]:
    """llama-server's DRY, XTC, typical_p, mirostat, dynamic temperature, top_n_sigma and
    min_keep fields (tools/server/server-schema.cpp), as SamplingParams fields: the same soft
    limits (clamped: xtc_* to [0, 1], mirostat to [0, 2]) and hard limits (errors:
    dry_allowed_length and min_keep >= 0); a dry_base below 1 is the server's (--dry-base), as
    llama-server replaces it. Where CacheFlow accepts more than llama-server: dry_penalty_last_n
    -1 is the context (as repeat_last_n -1; llama-server's hard limit is 0)."""
    dry_base = read_float(body, "dry_base", defaults.dry_base, *_ANY)
    return {
        "dry_multiplier": read_float(body, "dry_multiplier", 0.0, *_ANY),
        "dry_base": defaults.dry_base if dry_base < 1.0 else dry_base,
        "dry_allowed_length": read_int(body, ("dry_allowed_length",), 2, low=0),
        "dry_penalty_last_n": read_int(body, ("dry_penalty_last_n",), 64, low=-1),
        "dry_sequence_breakers": read_dry_sequence_breakers(body, defaults.dry_sequence_breakers),
        "xtc_probability": read_float(body, "xtc_probability", 0.0, 0.0, 1.0),
        "xtc_threshold": read_float(body, "xtc_threshold", 0.1, 0.0, 1.0),
        "typical_p": read_float(body, "typical_p", 1.0, *_ANY),
        "mirostat": min(2, max(0, read_int(body, ("mirostat",), 0))),
        "mirostat_tau": read_float(body, "mirostat_tau", 5.0, *_ANY),
        "mirostat_eta": read_float(body, "mirostat_eta", 0.1, *_ANY),
        "dynatemp_range": read_float(body, "dynatemp_range", 0.0, *_ANY),
        "dynatemp_exponent": read_float(body, "dynatemp_exponent", 1.0, *_ANY),
        "top_n_sigma": read_float(body, "top_n_sigma", -1.0, *_ANY),
        "min_keep": read_int(body, ("min_keep",), 0, low=0),
    }


def read_dry_sequence_breakers(
    body: Mapping[str, object], default: tuple[str, ...]
) -> tuple[str, ...]:
    """``dry_sequence_breakers`` as llama-server reads it: a non-empty JSON array of strings
    (anything else is an error); empty strings in it are skipped, as llama.cpp's DRY sampler
    skips them. Absent: ``default`` (the server's)."""
    if not _present(body, "dry_sequence_breakers"):
        return default
    value = body["dry_sequence_breakers"]
    if isinstance(value, tuple):  # the server's default, merged in by _with_defaults
        return value
    if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise ProtocolError("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be "
                            "a non-empty array of strings")  # fmt: skip
    return tuple(_utf8(v, "Field 'dry_sequence_breakers'") for v in value if v)


def read_logit_bias(body: Mapping[str, object]) -> tuple[tuple[int | str, float], ...]:
    """``logit_bias`` as llama-server reads it (tools/server/server-schema.cpp): [[token id or
    text, bias], ...] or OpenAI's {"token id or text": bias}; a bias of ``false`` bans the
    token (-inf). As llama-server: entries of another shape, and biases that are neither a
    number nor false, are skipped; an object key is a token id when it reads whole as a C
    ``strtol`` integer (" 12", "+12"; "12 " and "1_2" are texts); texts are tokenized later
    (each of their tokens gets the bias) and ids outside the vocabulary dropped.

    Where llama-server is silent, a client bug gets a 400 instead: a value that is neither an
    array nor an object (llama-server ignores the field), and a bias of +inf or NaN (JSON
    cannot spell them, but 1e400 overflows to inf). llama-server reads the key "" as token 0
    (an artefact of strtol); here it is an empty text, which biases nothing.

    Raises:
        ProtocolError: the field is neither an array nor an object, or a bias is not finite.
    """
    if not _present(body, "logit_bias"):
        return ()
    value = body["logit_bias"]
    if isinstance(value, dict):
        entries = [(_token_or_text(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        entries = [tuple(e) for e in value if isinstance(e, list) and len(e) == 2]
    else:
        raise _bad_type("logit_bias", "an array of [token, bias] pairs or an object", value)
    out = []
    for key, bias in entries:
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)):
            continue
        elif math.isnan(bias) or bias == math.inf:
            raise ProtocolError(f"Field 'logit_bias': a bias must be a finite number or false, "
                                f"got {bias} for {key!r}")  # fmt: skip
        is_id = isinstance(key, int) and not isinstance(key, bool)
        if is_id or isinstance(key, str):
            out.append((key, float(bias)))
    return tuple(out)


_STRTOL_INTEGER = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")


def _token_or_text(key: str) -> int | str:
    """An object key of logit_bias: a token id when all of it is a base-10 integer as C's
    strtol reads one (leading white space and a sign allowed), else a text."""
    return int(key) if _STRTOL_INTEGER.fullmatch(key) else key


def read_str_list(body: Mapping[str, object], name: str) -> list[str]:
    """Field ``name`` as a list of strings ([] when absent)."""
    if not _present(body, name):
        return []
    value = body[name]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad_type(name, "an array of strings", value)
    return value


def _stop(body: Mapping[str, object]) -> tuple[str, ...]:
    if not _present(body, "stop"):
        return ()
    value = body["stop"]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _bad_type("stop", "a string or an array of strings", value)
    return tuple(s for s in value if s)  # llama-server ignores empty stop words


def _ignored(body: Mapping[str, object]) -> tuple[str, ...]:
    return tuple(
        name
        for name, neutral in _IGNORED_OPTIONS.items()
        if _present(body, name) and body[name] != neutral and body[name] not in ([], {})
    )
