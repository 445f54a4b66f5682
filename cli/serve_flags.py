"""llama-server flags of ``cacheflow serve`` beyond the engine's: server-wide sampling defaults,
chat-template choice, reasoning, model tags and switches that have nothing to change in CacheFlow.

Each flag keeps llama-server's names, LLAMA_ARG_* variable and meaning; ``serve_flag_options``
adds them to the command and ``request_defaults``/``chat_options`` turn the parsed values into
the server's settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click

from pycacheflow.reasoning import DEFAULT_REASONING_FORMAT, REASONING_FORMATS
from pycacheflow.server.config import RequestDefaults

_DEFAULTS = RequestDefaults()


def _env(name: str) -> str:
    return f"LLAMA_ARG_{name}"


def _option(*names: str, **kwargs: object) -> Callable:
    return click.option(*names, **kwargs)


# (names, destination, type, default, env, help) of the sampling defaults, llama-server's values.
_SAMPLING: tuple[tuple[tuple[str, ...], str, object, object, str, str], ...] = (
    (("--temp", "--temperature"), "temp", float, _DEFAULTS.temperature, "TEMP",
     "Default temperature of requests that set none (0 = greedy)."),
    (("--top-k",), "top_k", int, _DEFAULTS.top_k, "TOP_K",
     "Default top-k (0 = disabled)."),
    (("--top-p",), "top_p", float, _DEFAULTS.top_p, "TOP_P",
     "Default top-p (1.0 = disabled)."),
    (("--min-p",), "min_p", float, _DEFAULTS.min_p, "MIN_P",
     "Default min-p (0.0 = disabled)."),
    (("-s", "--seed"), "seed", int, _DEFAULTS.seed, "SEED",
     "Default RNG seed of requests (-1 = random per request)."),
    (("--repeat-penalty",), "repeat_penalty", float, _DEFAULTS.repeat_penalty, "REPEAT_PENALTY",
     "Default penalty of repeated tokens (1.0 = disabled)."),
    (("--repeat-last-n",), "repeat_last_n", int, _DEFAULTS.repeat_last_n, "REPEAT_LAST_N",
     "Default number of last tokens the penalties look at (0 = disabled, -1 = context size)."),
    (("--presence-penalty",), "presence_penalty", float, _DEFAULTS.presence_penalty,
     "PRESENCE_PENALTY", "Default presence penalty (0.0 = disabled)."),
    (("--frequency-penalty",), "frequency_penalty", float, _DEFAULTS.frequency_penalty,
     "FREQUENCY_PENALTY", "Default frequency penalty (0.0 = disabled)."),
)
# llama-server's other samplers (no LLAMA_ARG_* variables there either); `cacheflow generate`
# has them too (other_sampler_options), with the same defaults (SamplingParams' are the same).
_OTHER_SAMPLERS: tuple[tuple[tuple[str, ...], str, object, object, str | None, str], ...] = (
    (("--dry-multiplier",), "dry_multiplier", float, _DEFAULTS.dry_multiplier, None,
     "Default DRY repetition penalty multiplier (0.0 = disabled)."),
    (("--dry-base",), "dry_base", float, _DEFAULTS.dry_base, None,
     "Default DRY base (a value below 1.0 is ignored, as llama-server does)."),
    (("--dry-allowed-length",), "dry_allowed_length", int, _DEFAULTS.dry_allowed_length, None,
     "Default length of a repetition DRY lets pass unpenalised."),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, _DEFAULTS.dry_penalty_last_n, None,
     "Default number of last tokens DRY scans (0 = disabled, -1 = context size)."),
    (("--xtc-probability",), "xtc_probability", float, _DEFAULTS.xtc_probability, None,
     "Default XTC probability (0.0 = disabled)."),
    (("--xtc-threshold",), "xtc_threshold", float, _DEFAULTS.xtc_threshold, None,
     "Default XTC threshold (above 0.5 = disabled)."),
    (("--typical", "--typical-p"), "typical_p", float, _DEFAULTS.typical_p, None,
     "Default locally typical sampling p (1.0 = disabled)."),
    (("--mirostat",), "mirostat", int, _DEFAULTS.mirostat, None,
     "Default Mirostat (0 = disabled, 1 = Mirostat, 2 = Mirostat 2.0; replaces top-k, "
     "top-p, typical, ...)."),
    (("--mirostat-lr",), "mirostat_eta", float, _DEFAULTS.mirostat_eta, None,
     "Default Mirostat learning rate, eta."),
    (("--mirostat-ent",), "mirostat_tau", float, _DEFAULTS.mirostat_tau, None,
     "Default Mirostat target entropy, tau."),
    (("--dynatemp-range",), "dynatemp_range", float, _DEFAULTS.dynatemp_range, None,
     "Default dynamic temperature range (0.0 = disabled)."),
    (("--dynatemp-exp",), "dynatemp_exponent", float, _DEFAULTS.dynatemp_exponent, None,
     "Default dynamic temperature exponent."),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", float, _DEFAULTS.top_n_sigma, None,
     "Default top-n-sigma (-1.0 = disabled)."),
    (("--min-keep",), "min_keep", int, _DEFAULTS.min_keep, None,
     "Default min_keep: the fewest tokens top-p, min-p, typical and XTC leave (CacheFlow's; "
     "llama-server has only the request field)."),
)


def serve_flag_options(command: Callable) -> Callable:
    """Decorate ``serve`` with the flags of this module."""
    options = [
        _option(*names, dest, type=kind, default=default, show_default=True, envvar=_env(env),
                help=text)  # fmt: skip
        for names, dest, kind, default, env, text in _SAMPLING
    ]
    options += _other_sampler_option_list()
    options += [
        _option("--ignore-eos", is_flag=True, envvar=_env("IGNORE_EOS"),
                help="Requests that set no ignore_eos generate past the end-of-generation token."),
        _option("--jinja/--no-jinja", "jinja", default=True, show_default=True,
                envvar=_env("JINJA"),
                help="Render chat templates with Jinja (jinja2, as transformers does); "
                "--no-jinja uses llama.cpp's built-in templates."),
        _option("--chat-template-file", type=click.Path(exists=True, dir_okay=False,
                                                         path_type=Path),
                envvar=_env("CHAT_TEMPLATE_FILE"),
                help="Chat template from a file (Jinja text or a built-in name)."),
        _option("--chat-template-kwargs", envvar=_env("CHAT_TEMPLATE_KWARGS"),
                help="JSON object of extra chat-template variables, e.g. '{\"key\": 1}'."),
        _option("--reasoning-format", type=click.Choice(REASONING_FORMATS), default=None,
                envvar=_env("THINK"),
                help="Chat answers: 'none' leaves a reasoning block in the content; 'deepseek', "
                "'deepseek-legacy' and 'auto' move it to reasoning_content, when the chat "
                "template marks reasoning (e.g. <think>...</think>). Default: deepseek."),
        _option("-rea", "--reasoning", "reasoning", default="auto", show_default=True,
                envvar=_env("REASONING"), callback=_reasoning_switch,
                help="Thinking in the chat: on, off or auto (the template's enable_thinking: "
                "on when the template marks reasoning)."),
        _option("--reasoning-effort", default="default", show_default=True,
                envvar=_env("REASONING_EFFORT"),
                help="Reasoning effort given to the chat template (reasoning_effort), e.g. low, "
                "medium, high; 'default' keeps the template's."),
        _option("--reasoning-budget", type=click.IntRange(min=-1), default=-1, show_default=True,
                envvar=_env("THINK_BUDGET"),
                help="Token budget of a chat answer's thinking (llama.cpp's reasoning-budget "
                "sampler; templates that mark reasoning): -1 unrestricted, 0 end at once, N > 0 "
                "at most N tokens, then the end marker is forced."),
        _option("--reasoning-budget-message", default="", envvar=_env("THINK_BUDGET_MESSAGE"),
                help="Text forced before the end-of-thinking marker when the budget is spent."),
        _option("--prefill-assistant/--no-prefill-assistant", "prefill_assistant",
                default=True, show_default=True, envvar=_env("PREFILL_ASSISTANT"),
                help="A final assistant message is continued (prefilled), not closed."),
        _option("--tags", envvar=_env("TAGS"),
                help="Model tags, comma-separated (informational, shown by /models)."),
        _option("--offline", is_flag=True, envvar=_env("OFFLINE"),
                help="Never download: without -m the default model must be in the cache."),
        _option("--ui/--no-ui", "--webui/--no-webui", "enable_ui", default=True,
                show_default=True, envvar=_env("WEBUI"), help="Serve the chat page at /."),
        # Switches whose effect CacheFlow has already (no context shift, no warm-up run),
        # accepted so that llama-server command lines run unchanged.
        _option("--no-context-shift", is_flag=True, hidden=True, expose_value=False),
        _option("--warmup/--no-warmup", default=True, hidden=True, expose_value=False),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _other_sampler_option_list(per_request: bool = False) -> list[Callable]:
    """The options of _OTHER_SAMPLERS; per_request: their help without "Default " (generate's
    values are the request's own, not a server's default)."""
    options = [
        _option(*names, dest, type=kind, default=default, show_default=True,
                help=_own_value_help(text) if per_request else text)  # fmt: skip
        for names, dest, kind, default, _env_name, text in _OTHER_SAMPLERS
    ]
    options.append(
        _option("--dry-sequence-breaker", "dry_sequence_breakers", multiple=True,
                help="A DRY sequence breaker (repeatable); the first one given replaces the "
                "defaults ('\\n', ':', '\"', '*'); 'none' = no breakers."))  # fmt: skip
    return options


def _own_value_help(text: str) -> str:
    """"Default DRY base ..." as "DRY base ...", "Default number of ..." as "Number of ..."."""
    text = text.removeprefix("Default ")
    return text[:1].upper() + text[1:]


def other_sampler_options(command: Callable) -> Callable:
    """Decorate a command with the flags of llama-server's DRY, XTC, typical, mirostat,
    dynamic temperature, top-n-sigma and min-keep settings (``other_sampler_values`` reads
    them)."""
    for option in reversed(_other_sampler_option_list(per_request=True)):
        command = option(command)
    return command


_TRUTHY = ("on", "enabled", "true", "1")  # llama.cpp's common_arg_utils::is_truthy
_FALSEY = ("off", "disabled", "false", "0")
_AUTOY = ("auto", "-1")


def _reasoning_switch(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """-rea as llama-server reads it: "on", "off" or "auto" (and their other spellings)."""
    for name, spellings in (("on", _TRUTHY), ("off", _FALSEY), ("auto", _AUTOY)):
        if value in spellings:
            return name
    raise click.BadParameter(f"unknown value for --reasoning: {value!r} (on, off or auto)")


def reasoning_template_kwargs(options: dict[str, object]) -> dict[str, object]:
    """The chat-template variables -rea and --reasoning-effort set, as llama-server puts them in
    its default template kwargs: enable_thinking (-rea on / off) and reasoning_effort."""
    kwargs: dict[str, object] = {}
    if options["reasoning"] != "auto":
        kwargs["enable_thinking"] = options["reasoning"] == "on"
    if options["reasoning_effort"] != "default":
        kwargs["reasoning_effort"] = options["reasoning_effort"]
    return kwargs


def request_defaults(options: dict[str, object]) -> RequestDefaults:
    """The server-wide sampling defaults from the parsed flags.

    Raises:
        click.BadParameter: a value out of llama-server's range.
    """
    try:
        return RequestDefaults(
            temperature=float(options["temp"]),
            top_k=int(options["top_k"]),
            top_p=float(options["top_p"]),
            min_p=float(options["min_p"]),
            seed=int(options["seed"]),
            repeat_penalty=float(options["repeat_penalty"]),
            repeat_last_n=int(options["repeat_last_n"]),
            presence_penalty=float(options["presence_penalty"]),
            frequency_penalty=float(options["frequency_penalty"]),
            ignore_eos=bool(options["ignore_eos"]),
            reasoning_format=str(options["reasoning_format"] or DEFAULT_REASONING_FORMAT),
            reasoning_budget=int(options["reasoning_budget"]),
            reasoning_budget_message=str(options["reasoning_budget_message"] or ""),
            **other_sampler_values(options),
        )
    except ValueError as exc:  # name the flag, not the field
        message = str(exc)
        for field, flag in _FLAG_OF_DEFAULT.items():
            if message.startswith(field + " "):
                message = flag + message[len(field):]
        raise click.UsageError(message) from None


def other_sampler_values(options: dict[str, object]) -> dict[str, object]:
    """The RequestDefaults (and SamplingParams) fields of the DRY, XTC, typical, mirostat,
    dynatemp, top-n-sigma and min-keep flags, read as llama-server reads them (common/arg.cpp): --dry-base below 1 keeps
    the default; the first --dry-sequence-breaker replaces the default breakers, "none" clears
    them (and empty ones are skipped, as llama.cpp's DRY sampler skips them)."""
    out: dict[str, object] = {}
    for name in ("dry_multiplier", "dry_base", "xtc_probability", "xtc_threshold", "typical_p",
                 "mirostat_tau", "mirostat_eta", "dynatemp_range", "dynatemp_exponent",
                 "top_n_sigma"):  # fmt: skip
        out[name] = float(options[name])
    for name in ("dry_allowed_length", "dry_penalty_last_n", "mirostat", "min_keep"):
        out[name] = int(options[name])
    if out["dry_base"] < 1.0:
        out["dry_base"] = _DEFAULTS.dry_base
    given = tuple(options["dry_sequence_breakers"] or ())
    if given:
        breakers: list[str] = []
        for value in given:
            if value == "none":
                breakers.clear()
            elif value:
                breakers.append(value)
        out["dry_sequence_breakers"] = tuple(breakers)
    return out


# RequestDefaults fields whose range errors name their llama-server flag
_FLAG_OF_DEFAULT = {"top_k": "--top-k", "seed": "--seed", "repeat_last_n": "--repeat-last-n",
                    "reasoning_budget": "--reasoning-budget", "temperature": "--temp",
                    "dry_allowed_length": "--dry-allowed-length",
                    "dry_penalty_last_n": "--dry-penalty-last-n", "min_keep": "--min-keep",
                    "mirostat": "--mirostat"}  # fmt: skip


def chat_template_option(options: dict[str, object]) -> str | None:
    """--chat-template, or the text of --chat-template-file (not both)."""
    template, path = options["chat_template"], options["chat_template_file"]
    if template and path:
        raise click.UsageError("set --chat-template or --chat-template-file, not both")
    if path is not None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--chat-template-file") from None
    return str(template) if template else None


def chat_template_kwargs(options: dict[str, object]) -> dict[str, object]:
    """--chat-template-kwargs as a dict, with what -rea and --reasoning-effort set ({} when
    none is set)."""
    text = options["chat_template_kwargs"]
    if not text:
        return reasoning_template_kwargs(options)
    try:
        value = json.loads(str(text))
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--chat-template-kwargs") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--chat-template-kwargs")
    return {**value, **reasoning_template_kwargs(options)}
