"""Jinja chat templates, rendered the way Hugging Face transformers renders them.

A model's GGUF carries its chat template as Jinja text (``tokenizer.chat_template``). It is
rendered with jinja2 in a sandbox (templates come with downloaded models), with transformers'
environment: ``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, the globals
``raise_exception`` and ``strftime_now``, and a ``tojson`` filter that keeps non-ASCII text.
The context holds ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``,
``tools`` (when given) and any extra keyword arguments (``chat_template_kwargs``).

Continuing a final assistant message (``continue_final_message``, llama-server's "assistant
prefill") renders every message but the last one with the generation prompt, then appends the
last message's content, so the model continues that text (llama-server's own rule; it does not
depend on how a template closes a turn).

llama.cpp's built-in template matcher (``llama_chat_apply_template``) remains available through
``LLM.apply_chat_template(..., jinja=False)`` for ``--no-jinja`` and the built-in names. A model
whose GGUF has no template gets ChatML, as in llama-server (``CHATML_SOURCE`` with Jinja, the
built-in "chatml" without).
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable, Mapping, Sequence

from pycacheflow.chat_template_caps import template_caps
from pycacheflow.errors import InvalidArgumentError, UnsupportedError
from pycacheflow.gguf_metadata import KEY_CHAT_TEMPLATE, read_string_metadata
from pycacheflow.reasoning import ReasoningMarkers, detect_markers
from pycacheflow.text import encode_utf8

Message = Mapping[str, object]

KEY_CHAT_TEMPLATE_TOOL_USE = KEY_CHAT_TEMPLATE + ".tool_use"
CHATML = "chatml"  # llama.cpp's built-in name of the ChatML format
# ChatML as Jinja: what llama-server renders (and reports in /props) for a model without a
# template, or for --chat-template chatml
CHATML_SOURCE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TemplateRenderError(InvalidArgumentError):
    """The template could not be rendered for these messages (it raised, or is malformed)."""


def looks_like_jinja(text: str) -> bool:
    """True for template text (as opposed to a built-in template name such as "chatml")."""
    return "{%" in text or "{{" in text


class ChatTemplate:
    """One compiled Jinja chat template.

    Args:
        source: the template text.
        bos_token: the model's BOS token text ("" if none), exposed as ``bos_token``.
        eos_token: the model's EOS token text ("" if none), exposed as ``eos_token``.

    Raises:
        UnsupportedError: jinja2 is not installed.
        TemplateRenderError: the template does not compile (the message has jinja2's reason).
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._caps: dict[str, bool] | None = None
        self._markers: tuple[ReasoningMarkers | None] | None = None  # (markers,) once probed
        try:
            self._template = _environment().from_string(source)
        except _jinja_errors() as exc:
            raise TemplateRenderError(f"chat template does not compile: {exc}") from None

    @property
    def caps(self) -> dict[str, bool]:
        """llama-server's ``chat_template_caps`` (pycacheflow.chat_template_caps), computed on
        first use."""
        if self._caps is None:
            self._caps = template_caps(self)
        return self._caps

    @property
    def reasoning_markers(self) -> ReasoningMarkers | None:
        """The markers this template writes around reasoning, as llama-server's analyzer finds
        them (pycacheflow.reasoning), or None when it has none; probed on first use."""
        if self._markers is None:
            self._markers = (detect_markers(self),)
        return self._markers[0]

    def variables(self) -> frozenset[str]:
        """The names the template reads from its context (``messages``, ``tools``, ...)."""
        import jinja2.meta

        return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(self.source)))

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        *,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
        kwargs: Mapping[str, object] | None = None,
    ) -> str:
        """The prompt text for ``messages``.

        Args:
            messages: [{"role": str, "content": str | None, ...}, ...]; other keys (tool_calls,
                name, ...) are passed to the template as they are.
            add_generation_prompt: end with the assistant turn opener.
            continue_final_message: the last message is an assistant message whose content the
                model continues (mutually exclusive with ``add_generation_prompt``).
            tools: OpenAI tool definitions, passed to the template as ``tools``.
            kwargs: more template variables (``chat_template_kwargs``); they cannot replace
                ``messages``.

        Raises:
            InvalidArgumentError: both ``add_generation_prompt`` and ``continue_final_message``,
                or nothing to continue.
            TemplateRenderError: the template raised (e.g. its ``raise_exception``).
        """
        if continue_final_message:
            if add_generation_prompt:
                raise InvalidArgumentError(
                    "Cannot set both add_generation_prompt and continue_final_message to true."
                )
            if not messages or messages[-1].get("role") != "assistant":
                raise InvalidArgumentError(
                    "continue_final_message needs an assistant message at the end of the list"
                )
            head = self.render(messages[:-1], True, tools=tools, kwargs=kwargs)
            return head + str(messages[-1].get("content") or "")
        context: dict[str, object] = dict(kwargs or {})
        context.update(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=context.get("bos_token", self.bos_token),
            eos_token=context.get("eos_token", self.eos_token),
        )
        if tools:
            context["tools"] = [dict(t) for t in tools]
        try:
            return self._template.render(**context)
        except _jinja_errors() as exc:
            raise TemplateRenderError(f"chat template failed: {exc}") from None
        except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError) as exc:
            # Python errors of an expression on this input (a list added to a string, a
            # missing key, ...): the request's messages do not fit the template, a 400
            message = f"chat template failed: {type(exc).__name__}: {exc}"
            raise TemplateRenderError(message) from None


@functools.lru_cache(maxsize=1)
def _environment() -> object:
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UnsupportedError(
            "Jinja chat templates need jinja2 (pip install jinja2); --no-jinja uses llama.cpp's "
            "built-in templates instead"
        ) from None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: object, indent: int | None = None, ensure_ascii: bool = False,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii,
                          separators=separators, sort_keys=sort_keys)  # fmt: skip

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _jinja_errors() -> tuple[type[Exception], ...]:
    import jinja2

    return (jinja2.exceptions.TemplateError,)


NativeApply = Callable[[Sequence[str], Sequence[str], bool, "str | None"], str]


class ChatFormatter:
    """Renders chat messages for one model: with Jinja (the GGUF's template, or template text
    given by the caller) or with llama.cpp's built-in matcher (``jinja=False``, or a built-in
    template name such as "chatml").

    Args:
        model_path: the GGUF file, read once for its template when first needed.
        native_apply: llama.cpp's renderer, ``(roles, contents, add_generation_prompt,
            template_or_None) -> str``.
        bos_token: the model's BOS token text, for Jinja templates.
        eos_token: the model's EOS token text, for Jinja templates.
    """

    def __init__(
        self, model_path: str, native_apply: NativeApply, bos_token: str, eos_token: str
    ) -> None:
        self._model_path = model_path
        self._native_apply = native_apply
        self._tokens = (bos_token, eos_token)
        self._compiled: dict[str, ChatTemplate] = {}
        self._metadata: dict[str, str] | None = None  # the GGUF's template keys, when read
        self._metadata_read = False

    def _templates(self) -> dict[str, str] | None:
        """The GGUF's template entries (default and tool_use, those present), or None when its
        metadata cannot be read here (llama.cpp, which loaded the model, then decides)."""
        if not self._metadata_read:
            try:
                self._metadata = read_string_metadata(
                    self._model_path, [KEY_CHAT_TEMPLATE, KEY_CHAT_TEMPLATE_TOOL_USE]
                )
            except (InvalidArgumentError, OSError):
                self._metadata = None
            self._metadata_read = True
        return self._metadata

    @property
    def model_template(self) -> str | None:
        """The GGUF's own Jinja template, or None when it has none (or its metadata cannot be
        read here)."""
        return (self._templates() or {}).get(KEY_CHAT_TEMPLATE)

    def _default_source(self, tools: bool = False) -> str | None:
        """llama-server's choice among the GGUF's templates: the tool_use variant for a
        request with tools (when there is one), else the default one, else the tool_use one,
        else ChatML; None when the metadata cannot be read."""
        found = self._templates()
        if found is None:
            return None
        default, tool_use = found.get(KEY_CHAT_TEMPLATE), found.get(KEY_CHAT_TEMPLATE_TOOL_USE)
        if tools and tool_use:
            return tool_use
        return default or tool_use or CHATML_SOURCE

    def template_source(
        self, template: str | None, jinja: bool = True, tools: bool = False
    ) -> str | None:
        """The Jinja text ``apply`` renders with for ``template`` (and a request with
        ``tools`` or not), or None when llama.cpp's built-in matcher renders it."""
        if not jinja:
            return None
        if template is not None:
            return template if looks_like_jinja(template) else None
        return self._default_source(tools)

    def reported_source(self, template: str | None) -> str:
        """The template text llama-server's /props shows as ``chat_template``: ``template``
        as given (a built-in name stays a name, but "chatml" is ChatML's Jinja text), else the
        model's default template (ChatML when it has none); "" when the model's metadata
        cannot be read here."""
        if template is not None:
            return CHATML_SOURCE if template == CHATML else template
        return self._default_source() or ""

    def tool_use_source(self) -> str | None:
        """The GGUF's tool_use template (/props' ``chat_template_tool_use``), if it has one."""
        return (self._templates() or {}).get(KEY_CHAT_TEMPLATE_TOOL_USE)

    def caps(self, template: str | None) -> dict[str, bool]:
        """llama-server's ``chat_template_caps`` for ``template`` (as ``apply``'s): of the
        tool_use template when there is one (the more capable), else of the reported one.

        Raises:
            TemplateRenderError: the template does not compile.
        """
        source = (self.tool_use_source() if template is None else None) or self.reported_source(
            template
        )
        return self._compile(source).caps

    def reasoning_markers(
        self, template: str | None, jinja: bool = True, tools: bool = False
    ) -> ReasoningMarkers | None:
        """The reasoning markers of the Jinja template ``apply`` renders with (arguments as
        ``template_source``); None without one, or when it has none.

        Raises:
            TemplateRenderError: the template does not compile.
        """
        source = self.template_source(template, jinja, tools)
        return None if source is None else self._compile(source).reasoning_markers

    def _compile(self, source: str) -> ChatTemplate:
        compiled = self._compiled.get(source)
        if compiled is None:
            compiled = self._compiled[source] = ChatTemplate(source, *self._tokens)
        return compiled

    def apply(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        template: str | None = None,
        *,
        jinja: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
        kwargs: Mapping[str, object] | None = None,
    ) -> str:
        """Render ``messages`` (arguments as ``ChatTemplate.render``; ``template`` as
        ``LLM.apply_chat_template``).

        Raises:
            InvalidArgumentError: bad arguments, or tools without a Jinja template.
            TemplateRenderError: the Jinja template failed.
            UnsupportedError: llama.cpp does not know the template (built-in matcher).
        """
        for message in messages:
            for key, what in (("role", "chat role"), ("content", "chat message")):
                if isinstance(message.get(key), str):
                    encode_utf8(message[key], what)  # InvalidArgumentError naming the value
        source = self.template_source(template, jinja, bool(tools))
        if source is not None:
            return self._compile(source).render(
                messages, add_generation_prompt, tools=tools, kwargs=kwargs,
                continue_final_message=continue_final_message,
            )  # fmt: skip
        if tools:
            raise InvalidArgumentError("tools need a Jinja chat template (--jinja)")
        if continue_final_message:
            if add_generation_prompt:
                raise InvalidArgumentError(
                    "Cannot set both add_generation_prompt and continue_final_message to true."
                )
            head = self.apply(messages[:-1], True, template, jinja=False) if messages[:-1] else ""
            return head + _text(messages[-1].get("content")) if messages else head
        roles = [_text(m.get("role")) for m in messages]
        contents = [_text(m.get("content")) for m in messages]
        if template is None and self._templates() is not None and not self.model_template:
            template = CHATML  # llama-server's format for a model without a template
        return self._native_apply(roles, contents, add_generation_prompt, template)


def _text(value: object) -> str:
    return "" if value is None else str(value)
