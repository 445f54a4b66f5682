"""SamplingParams: how one request is sampled and when it stops."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from pycacheflow.text import encode_utf8

# Limits of the C ABI's types (cf_sampling_params): counts and token ids are int32_t, seeds
# int64_t (CF_SEED_RANDOM, -1, is spelled ``seed=None`` here), the sampling floats float.
INT32_MAX = 2**31 - 1
MAX_SEED = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping parameters of one request (immutable).

    The defaults decode greedily, so outputs are deterministic.

    Attributes:
        max_tokens: tokens to generate at most, in [1, 2**31). The request also ends with
            "length" when its sequence's context is full.
        temperature: in [0, FLOAT32_MAX]; 0 = greedy (argmax), ignoring top_k/top_p/min_p/seed.
        top_k: keep the k most likely tokens, in [0, 2**31); 0 = disabled.
        top_p: nucleus sampling mass in (0, 1]; 1 = disabled.
        min_p: drop tokens below min_p * p(most likely), in [0, 1]; 0 = disabled.
        seed: RNG seed in [0, 2**63) for reproducible sampling; None = random.
        stop: stop strings. The request finishes when its output text contains one; the
            returned and streamed text ends right before the earliest occurrence. A single str
            is accepted as a one-element list. Stored as a tuple.
        stop_token_ids: token ids, each in [0, 2**31), that finish the request (the token is kept in
            ``token_ids``; special tokens render as no text). Stored as a tuple.
        ignore_eos: do not stop at the model's end-of-generation tokens.
        repeat_penalty: > 0; divides the logits of tokens seen in the last ``repeat_last_n``
            (prompt and output; positive logits, multiplies negative ones); 1 = disabled.
        repeat_last_n: the penalties' window in tokens, >= -1; 0 = disabled, -1 = the context.
        presence_penalty: subtracted from the logit of every token in the window; 0 = disabled.
        frequency_penalty: subtracted once per occurrence in the window; 0 = disabled.
        logit_bias: (token id, bias) pairs added to those tokens' logits (``-inf`` bans the
            token); a dict {token_id: bias} is accepted. Stored as a tuple of pairs.
        grammar: a GBNF grammar (llama.cpp's format, start rule "root") the output must follow;
            "" = none. The engine rejects one it cannot parse (InvalidArgumentError).
        The penalties, the logit bias and the grammar are llama.cpp's samplers, applied before
        top-k etc.; a greedy request with them picks the argmax of the changed logits.
        cache_prompt: reuse cached prompt prefixes and leave this request's KV blocks for later
            requests (the prefix cache, paged mode); False = it neither reads nor fills the
            cache. Changes speed only, never the output. ``RequestMetrics.num_cached_tokens``
            says how many prompt tokens were found.

    Raises:
        ValueError: on construction, for a value out of range; the message names it.
        TypeError: for a value of the wrong type.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    grammar: str = ""
    cache_prompt: bool = True

    def __post_init__(self) -> None:
        # Normalise containers first (frozen: assign through object.__setattr__).
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        object.__setattr__(self, "stop", _as_tuple("stop", stop))
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids))
        self._validate_numbers()
        self._validate_stops()
        for name in ("ignore_eos", "cache_prompt"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._validate_penalties_and_bias()

    def _validate_penalties_and_bias(self) -> None:
        for name in ("repeat_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
                raise ValueError(f"{name} must be finite, got {value}")
        if not self.repeat_penalty > 0:
            raise ValueError(f"repeat_penalty must be > 0 (1 = disabled), got {self.repeat_penalty}")
        _require_int("repeat_last_n", self.repeat_last_n)
        if not -1 <= self.repeat_last_n <= INT32_MAX:
            raise ValueError(f"repeat_last_n must be in [-1, 2**31) (-1 = the context), got "
                             f"{self.repeat_last_n}")  # fmt: skip
        bias = self.logit_bias
        pairs = tuple(bias.items()) if isinstance(bias, dict) else _as_tuple("logit_bias", bias)
        checked = []
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"logit_bias entries must be (token_id, bias) pairs, got {pair!r}")
            token_id, value = pair
            _require_int("logit_bias token id", token_id)
            if not 0 <= token_id <= INT32_MAX:
                raise ValueError(f"logit_bias token ids must be in [0, 2**31), got {token_id}")
            if not _is_number(value) or math.isnan(value) or value == math.inf:
                raise ValueError(f"logit_bias values must be finite or -inf, got {value!r}")
            if value != -math.inf:  # a C float: clamp huge finite biases
                value = min(max(float(value), -FLOAT32_MAX), FLOAT32_MAX)
            checked.append((token_id, float(value)))
        object.__setattr__(self, "logit_bias", tuple(checked))
        if not isinstance(self.grammar, str):
            raise TypeError(f"grammar must be a str, got {self.grammar!r}")
        encode_utf8(self.grammar, "grammar")

    def _validate_numbers(self) -> None:
        _require_int("max_tokens", self.max_tokens)
        if not 1 <= self.max_tokens <= INT32_MAX:
            raise ValueError(f"max_tokens must be in [1, 2**31), got {self.max_tokens}")
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if not _is_number(value):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        if not 0 <= self.temperature <= FLOAT32_MAX:
            raise ValueError(
                f"temperature must be in [0, {FLOAT32_MAX:.4g}] (a C float), got {self.temperature}"
            )
        _require_int("top_k", self.top_k)
        if not 0 <= self.top_k <= INT32_MAX:
            raise ValueError(f"top_k must be in [0, 2**31) (0 = disabled), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _require_int("seed", self.seed)
            if not 0 <= self.seed <= MAX_SEED:
                raise ValueError(f"seed must be in [0, 2**63) or None, got {self.seed}")

    def _validate_stops(self) -> None:
        for s in self.stop:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {s!r}")
            if not s:
                raise ValueError("stop strings must be non-empty, got ''")
            encode_utf8(s, "stop string")  # ValueError (InvalidArgumentError) if it cannot be
        for token_id in self.stop_token_ids:
            _require_int("stop_token_ids entry", token_id)
            if not 0 <= token_id <= INT32_MAX:
                raise ValueError(f"stop_token_ids entries must be in [0, 2**31), got {token_id}")

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0), i.e. deterministic."""
        return self.temperature == 0.0


def _require_int(name: str, value: object) -> None:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")


def _as_tuple(name: str, value: object) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, Iterable) or isinstance(value, (bytes, dict)):
        raise TypeError(f"{name} must be a list, got {value!r}")
    return tuple(value)
