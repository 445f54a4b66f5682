"""ServerConfig: how ``cacheflow serve`` behaves over HTTP (the engine has its EngineConfig)."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

from pycacheflow.reasoning import DEFAULT_REASONING_FORMAT, REASONING_FORMATS
from pycacheflow.sampling_params import DEFAULT_DRY_SEQUENCE_BREAKERS

_INT32_MAX = 2**31 - 1

N_PREDICT_UNLIMITED = -1  # llama-server's "-n -1": generate until EOS or the context is full
CORS_ANY = "*"
CORS_LOCALHOST = "localhost"  # llama-server's special value: localhost origins only
# The largest request body (server/body_limit.py): 16 MiB is some four million tokens of text or
# two million token ids, beyond any model's context, and well below the 100 MB at which
# llama-server's HTTP library refuses a body
DEFAULT_MAX_BODY_BYTES = 16 * 2**20


@dataclass(frozen=True)
class RequestDefaults:
    """Server-wide sampling defaults (llama-server's --temp, --top-k, ... flags): a request
    that does not set a field gets the value here, then the field's usual checks and clamps.

    Attributes:
        temperature: 0 = greedy.
        top_k: 0 = disabled.
        top_p: 1.0 = disabled.
        min_p: 0.0 = disabled.
        seed: -1 = a random seed per request.
        repeat_penalty: 1.0 = disabled.
        repeat_last_n: tokens the penalties look back over; 0 = disabled, -1 = the context.
        presence_penalty: 0.0 = disabled.
        frequency_penalty: 0.0 = disabled.
        ignore_eos: keep generating past end-of-generation tokens.
        reasoning_format: llama-server's --reasoning-format for chat answers: "none" leaves a
            reasoning block in the content; "deepseek", "deepseek-legacy" and "auto" move it to
            ``reasoning_content`` (pycacheflow.reasoning).
        reasoning_budget: llama-server's --reasoning-budget: the most tokens of a chat
            answer's reasoning block for requests that set no ``reasoning_budget_tokens``
            (llama.cpp's reasoning-budget sampler, for templates that mark reasoning); -1 = no
            limit, 0 = the block is closed as soon as it opens.
        reasoning_budget_message: --reasoning-budget-message: text forced before the block's
            end marker when the budget is spent ("" = the end marker alone).
        dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
        dry_sequence_breakers, xtc_probability, xtc_threshold, typical_p, mirostat,
        mirostat_tau, mirostat_eta, dynatemp_range, dynatemp_exponent, top_n_sigma, min_keep:
            llama-server's --dry-*, --xtc-*, --typical, --mirostat*, --dynatemp-*,
            --top-nsigma and --min-keep (``SamplingParams`` says what each does); all off by
            default.
        max_choices: the most completions of one prompt a request may ask for (``n`` /
            ``n_cmpl``, whose hard limits are [1, this]); the server sets it to its slots (-np),
            as llama-server's n_parallel.

    The values are llama-server's defaults (common_params_sampling, common_params).

    Raises:
        ValueError: a value that is not finite, a count below -1, or an unknown format.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    reasoning_format: str = DEFAULT_REASONING_FORMAT
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    typical_p: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_n_sigma: float = -1.0
    min_keep: int = 0
    max_choices: int = 128

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        if self.repeat_last_n < -1:
            raise ValueError(f"repeat_last_n must be >= -1, got {self.repeat_last_n}")
        if self.seed < -1:
            raise ValueError(f"seed must be >= -1 (-1 = random), got {self.seed}")
        if self.reasoning_budget < -1:
            raise ValueError(f"reasoning_budget must be >= -1 (-1 = no limit), got "
                             f"{self.reasoning_budget}")  # fmt: skip
        # what a request field of the same name may hold (protocol.py's readers), so that a
        # server-wide default can never make every request fail
        for name, high in (("top_k", _INT32_MAX), ("repeat_last_n", _INT32_MAX),
                           ("reasoning_budget", _INT32_MAX), ("seed", 0xFFFFFFFF)):  # fmt: skip
            if not -_INT32_MAX - 1 <= getattr(self, name) <= high:
                raise ValueError(f"{name} must be in [{-_INT32_MAX - 1}, {high}], got "
                                 f"{getattr(self, name)}")  # fmt: skip
        for name, low in (("dry_allowed_length", 0), ("dry_penalty_last_n", -1),
                          ("min_keep", 0)):  # fmt: skip
            if not low <= getattr(self, name) <= _INT32_MAX:
                raise ValueError(f"{name} must be in [{low}, {_INT32_MAX}], got "
                                 f"{getattr(self, name)}")  # fmt: skip
        if self.mirostat not in (0, 1, 2):  # llama-server would abort at the first request
            raise ValueError(f"mirostat must be 0, 1 or 2, got {self.mirostat}")
        if self.dry_base < 1.0:
            raise ValueError(f"dry_base must be >= 1, got {self.dry_base}")
        if not all(isinstance(b, str) and b for b in self.dry_sequence_breakers):
            raise ValueError(f"dry_sequence_breakers must be non-empty strings, got "
                             f"{self.dry_sequence_breakers!r}")  # fmt: skip
        if self.reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, "
                             f"got {self.reasoning_format!r}")  # fmt: skip

    def as_fields(self) -> dict[str, object]:
        """The defaults as request fields (names as in a /completion body); a new dict."""
        return dict(self._fields)

    @functools.cached_property
    def _fields(self) -> dict[str, object]:
        # once per instance (frozen; scalars and tuples of str): asdict deep-copies, ~14 us a call,
        # and every generating request asks
        return asdict(self)


@dataclass(frozen=True)
class ServerConfig:
    """HTTP-side settings of one server; validated on construction.

    Attributes:
        model_name: the model id shown by /v1/models and in responses (llama-server: the
            alphabetically first --alias, else the -m path).
        model_path: path of the GGUF file, for /props.
        aliases: all --alias names (the first is ``model_name``).
        api_keys: accepted keys; empty = no authentication.
        n_predict: default tokens to generate when a request does not say; -1 = until EOS or
            the sequence's context is full.
        chat_template: template for chat requests (llama.cpp built-in name or template text);
            None = the model's own.
        enable_metrics: serve GET /metrics.
        enable_slots: serve GET /slots.
        cache_prompt: the server's --cache-prompt (False: the engine's prefix cache is off,
            so no request reuses a prefix whatever its ``cache_prompt`` field says).
        shutdown_timeout_s: on SIGINT/SIGTERM, seconds that in-flight requests may still run
            before they are aborted.
        sse_ping_s: send an SSE comment ping on a stream silent for this many seconds; None =
            never.
        cors_origins: origins browsers may call from: ("*",) = any, ("localhost",) = localhost
            origins only (llama-server's special values), else the exact origins.
        cors_methods: methods a CORS preflight allows.
        cors_headers: request headers a CORS preflight allows; ("*",) = any.
        cors_credentials: allow credentials (with origins "*", each request's Origin is
            echoed, as llama-server does).
        defaults: sampling defaults of requests that set none.
        jinja: render chat templates with Jinja (False: llama.cpp's built-in templates).
        chat_template_kwargs: extra chat-template variables (requests may add more).
        prefill_assistant: continue a final assistant message instead of closing it.
        tags: model tags shown by /models.
        n_ctx_slot: tokens per slot (prompt + output), as llama-server's -c / -np; 0 = the
            engine's context per sequence.
        enable_ui: serve the chat page at GET / (public, as llama-server's web UI).
        verbose: add ``__verbose`` (the rendered prompt) to chat answers, as llama-server -v.
        max_body_bytes: the largest request body, bytes: a larger one is answered 413 without
            being read into memory (server/body_limit.py); 0 = no limit.

    Raises:
        ValueError: a value out of range; the message names it.
    """

    model_name: str
    model_path: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)
    api_keys: tuple[str, ...] = field(default_factory=tuple)
    n_predict: int = N_PREDICT_UNLIMITED
    chat_template: str | None = None
    enable_metrics: bool = False
    enable_slots: bool = True
    cache_prompt: bool = True
    shutdown_timeout_s: float = 10.0
    sse_ping_s: float | None = 30.0
    cors_origins: tuple[str, ...] = (CORS_ANY,)
    cors_methods: tuple[str, ...] = ("GET", "POST", "DELETE", "OPTIONS")
    cors_headers: tuple[str, ...] = (CORS_ANY,)
    cors_credentials: bool = True
    defaults: RequestDefaults = field(default_factory=RequestDefaults)
    jinja: bool = True
    chat_template_kwargs: dict[str, object] = field(default_factory=dict)
    prefill_assistant: bool = True
    tags: tuple[str, ...] = field(default_factory=tuple)
    n_ctx_slot: int = 0
    enable_ui: bool = True
    verbose: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must be non-empty")
        if self.n_predict < N_PREDICT_UNLIMITED:
            raise ValueError(f"n_predict must be >= -1 (-1 = unlimited), got {self.n_predict}")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")
        if self.sse_ping_s is not None and self.sse_ping_s <= 0:
            raise ValueError(f"sse_ping_s must be > 0 or None, got {self.sse_ping_s}")
        if self.n_ctx_slot < 0:
            raise ValueError(f"n_ctx_slot must be >= 0 (0 = the engine's), got {self.n_ctx_slot}")
        if self.max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be >= 0 (0 = no limit), got "
                             f"{self.max_body_bytes}")  # fmt: skip
        if any(not key for key in self.api_keys):
            raise ValueError("api_keys must not contain an empty key")
        for name in ("cors_origins", "cors_methods", "cors_headers"):
            values = getattr(self, name)
            if not values or not all(values):
                raise ValueError(f"{name} must be non-empty names, got {values!r}")
