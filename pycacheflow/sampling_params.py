"""SamplingParams: how one request is sampled and when it stops."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from pycacheflow.errors import InvalidArgumentError
from pycacheflow.text import encode_utf8

# Limits of the C ABI's types (cf_sampling_params): counts and token ids are int32_t, seeds
# int64_t (CF_SEED_RANDOM, -1, is spelled ``seed=None`` here), the sampling floats float.
INT32_MAX = 2**31 - 1
MAX_SEED = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
# The most alternatives ``logprobs`` may ask for per position: OpenAI's limit of top_logprobs and
# vLLM's default max_logprobs. Without one, a request could have the whole vocabulary (49,152
# entries for SmolLM2) rendered for every token; llama.cpp's server suite asks for 10.
MAX_LOGPROBS = 20


_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "dry_multiplier", "dry_base", "xtc_probability",
                 "xtc_threshold", "typical_p", "mirostat_tau", "mirostat_eta", "dynatemp_range",
                 "dynatemp_exponent", "top_n_sigma")
_INT_FIELDS = ("max_tokens", "top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n",
               "mirostat", "min_keep")

# llama-server's default DRY sequence breakers (common_params_sampling.dry_sequence_breakers)
DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", "\"", "*")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class ReasoningBudget:
    """A limit on the tokens of a reasoning block (llama.cpp's reasoning-budget sampler,
    common/reasoning-budget.h; llama-server's ``--reasoning-budget``), immutable.

    The block opens with the token sequence ``start`` and closes with ``end``; once ``tokens``
    tokens were sampled inside it (and the last one completed a UTF-8 character), the sampler
    forces ``forced`` one token per step, closing the block; a block that opens again gets a
    fresh budget. Token sequences are stored as tuples of ids, each checked against the
    vocabulary when the request is added.

    Attributes:
        tokens: the budget, >= 0 (0: the block closes as soon as it opens).
        start: the block's opening tokens (e.g. those of ``<think>``), not empty.
        end: its closing tokens (e.g. ``</think>``), not empty.
        forced: what is forced when the budget is spent; () = ``end`` (llama-server: the
            tokens of ``--reasoning-budget-message``, then ``end``).
        prefill: tokens the prompt already holds of the answer (a chat template's generation
            prompt that opened the block), fed to the sampler before the first token.
    """

    tokens: int
    start: tuple[int, ...]
    end: tuple[int, ...]
    forced: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _require_c_int("reasoning budget tokens", self.tokens)
        if self.tokens < 0:
            raise ValueError(f"reasoning budget tokens must be >= 0, got {self.tokens}")
        for name in ("start", "end", "forced", "prefill"):
            ids = _as_tuple(f"reasoning budget {name}", getattr(self, name))
            for token_id in ids:
                _require_c_int(f"reasoning budget {name} entry", token_id)
            object.__setattr__(self, name, ids)
        if not self.start or not self.end:
            raise ValueError("a reasoning budget needs start and end token sequences")
        if not self.forced:
            object.__setattr__(self, "forced", self.end)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping parameters of one request (immutable).

    The defaults decode greedily, so outputs are deterministic.

    Attributes:
        max_tokens: tokens to generate at most, in [1, 2**31). The request also ends with
            "length" when its sequence's context is full.
        temperature: in [0, FLOAT32_MAX]; 0 = greedy (argmax), ignoring top_k/top_p/min_p/seed
            (unless XTC or typical_p is on: the argmax of what they and those leave, as
            llama-server's temperature 0).
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
        logprobs: report token probabilities (vLLM's ``logprobs``, llama-server's ``n_probs``):
            None = none (the default); n in [0, MAX_LOGPROBS] (20) = the log-probability of each
            sampled token and of the n most likely tokens at its position
            (``RequestOutput.logprobs``; fewer where the vocabulary is smaller). The request is
            then sampled on the CPU from its logits; its tokens are the same as without.
        post_sampling_probs: with ``logprobs``: the probabilities after the sampler chain (the
            distribution the token was drawn from; tokens it excluded are not listed; greedy:
            the sampled token with probability 1) instead of the softmax of the raw logits.
        return_progress: report the prompt's progress as the engine computes it (llama-server's
            ``return_progress``): ``StreamDelta.progress`` gets one ``PromptProgress`` when the
            request is first scheduled and one after each step that computed a chunk of its
            prompt. Changes no output.
        reasoning_budget: a ``ReasoningBudget`` limiting the tokens of reasoning blocks, or
            None (no limit). A request with one is sampled on the CPU from its whole logits.

    llama-server's other samplers (llama.cpp's own; defaults are llama-server's, all off). The
    chain runs in llama-server's order: logit bias, penalties, DRY, grammar, top_n_sigma, top_k,
    typical_p, top_p, min_p, XTC, temperature (dynamic with ``dynatemp_range``), the draw. A
    request with one of them on is sampled on the CPU from its whole logits.

        dry_multiplier: DRY ("don't repeat yourself"): a token that would extend a sequence seen
            in the last ``dry_penalty_last_n`` tokens (prompt and output) beyond
            ``dry_allowed_length`` tokens loses ``dry_multiplier * dry_base ** (length -
            dry_allowed_length)`` from its logit; finite, 0 = disabled. Acts on greedy requests
            too.
        dry_base: >= 1 (1.75).
        dry_allowed_length: >= 0 (2).
        dry_penalty_last_n: tokens DRY scans, >= -1; 0 = disabled, -1 = the context (64).
        dry_sequence_breakers: texts a repetition does not reach back over (non-empty strings;
            llama-server's "\\n", ":", "\"", "*" by default; () = none). Stored as a tuple.
        xtc_probability: XTC ("exclude top choices"): the chance per token, in [0, 1], that every
            candidate of probability >= ``xtc_threshold`` but the least likely of them is
            removed; 0 = disabled. Acts on greedy requests too (seeded with ``seed``).
        xtc_threshold: in [0, 1]; > 0.5 disables XTC (0.1).
        typical_p: locally typical sampling's probability mass; >= 1 = disabled. It may drop
            the most likely token, so it acts on greedy requests too.
        mirostat: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0: replaces everything after the grammar
            with temperature -> mirostat, as llama-server (no penalties, DRY, top-k, ...);
            greedy requests stay greedy.
        mirostat_tau: Mirostat's target entropy (5.0).
        mirostat_eta: Mirostat's learning rate (0.1).
        dynatemp_range: dynamic temperature: each token's temperature is in [max(0, temperature
            - range), temperature + range], by the distribution's entropy; <= 0 = disabled.
            Sampled requests only (temperature > 0).
        dynatemp_exponent: how the entropy maps to that range (1.0).
        top_n_sigma: keep the tokens within n standard deviations of the largest logit; <= 0 =
            disabled (-1.0).
        min_keep: the fewest tokens top_p, min_p, typical_p and XTC leave, >= 0 (0 and 1 alike).

    Each value is validated once, by the layer that owns it: here only what Python owns (types,
    that a value has a C form: int32_t, int64_t seed, float, UTF-8 text); the ranges by the
    native engine (cf_sampling_params_check, on construction), whose message is raised as is;
    except a negative logprobs and an empty stop string, checked here first so that the message
    names this class's argument, not the C field (top_logprobs, stop_strings[i]).

    Raises:
        ValueError: on construction, for a value out of range (InvalidArgumentError with the
            engine's message) or without a C form; the message names the field.
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
    logprobs: int | None = None
    post_sampling_probs: bool = False
    return_progress: bool = False
    reasoning_budget: ReasoningBudget | None = None
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

    def __post_init__(self) -> None:
        # Normalise containers first (frozen: assign through object.__setattr__).
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        object.__setattr__(self, "stop", _as_tuple("stop", stop, "a string or a list of strings"))
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids))
        breakers = self.dry_sequence_breakers
        breakers = (breakers,) if isinstance(breakers, str) else breakers
        object.__setattr__(self, "dry_sequence_breakers",
                           _as_tuple("dry_sequence_breakers", breakers,
                                     "a string or a list of strings"))  # fmt: skip
        self._check_c_types()
        self._normalise_logit_bias()
        from pycacheflow._native import check_sampling_params

        check_sampling_params(self)  # the ranges: the native engine's rules and messages
        if self.logprobs is not None and self.logprobs > MAX_LOGPROBS:  # the API's cap
            raise InvalidArgumentError(
                f"logprobs must be at most {MAX_LOGPROBS} (token probabilities per position, as "
                f"OpenAI's top_logprobs and vLLM's max_logprobs), got {self.logprobs}"
            )

    def _check_c_types(self) -> None:
        """What Python owns: types, and that each value has a C form (cf_sampling_params)."""
        for name in _INT_FIELDS:
            _require_c_int(name, getattr(self, name))
        for name in _FLOAT_FIELDS:
            _require_c_float(name, getattr(self, name))
        if self.seed is not None:  # None is spelled CF_SEED_RANDOM (-1) in C
            _require_int("seed", self.seed)
            if not 0 <= self.seed <= MAX_SEED:
                raise ValueError(f"seed must be in [0, 2**63) or None, got {self.seed}")
        for i, s in enumerate(self.stop):
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {s!r}")
            # here, not natively: the C check names cf_sampling_params' stop_strings[i]
            if not s:
                raise InvalidArgumentError(f"stop[{i}] must be a non-empty string")
            encode_utf8(s, "stop string")  # ValueError (InvalidArgumentError) if it cannot be
        for token_id in self.stop_token_ids:
            _require_c_int("stop_token_ids entry", token_id)
        for s in self.dry_sequence_breakers:
            if not isinstance(s, str):
                raise TypeError(f"dry_sequence_breakers entries must be str, got {s!r}")
            encode_utf8(s, "dry sequence breaker")
        if self.logprobs is not None:
            _require_c_int("logprobs", self.logprobs)
            if self.logprobs < 0:  # the C check names cf_sampling_params' top_logprobs
                raise InvalidArgumentError(
                    f"logprobs must be >= 0 (or None for no probabilities), got {self.logprobs}"
                )
        for name in ("ignore_eos", "cache_prompt", "post_sampling_probs", "return_progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        budget = self.reasoning_budget
        if budget is not None and not isinstance(budget, ReasoningBudget):
            raise TypeError(f"reasoning_budget must be a ReasoningBudget or None, got {budget!r}")
        if not isinstance(self.grammar, str):
            raise TypeError(f"grammar must be a str, got {self.grammar!r}")
        encode_utf8(self.grammar, "grammar")

    def _normalise_logit_bias(self) -> None:
        bias = self.logit_bias
        pairs = tuple(bias.items()) if isinstance(bias, dict) else _as_tuple("logit_bias", bias)
        checked = []
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"logit_bias entries must be (token_id, bias) pairs, got {pair!r}")
            token_id, value = pair
            _require_c_int("logit_bias token id", token_id)
            if not _is_number(value):
                raise TypeError(f"logit_bias values must be numbers, got {value!r}")
            if math.isfinite(value):  # a C float: clamp huge finite biases
                value = min(max(float(value), -FLOAT32_MAX), FLOAT32_MAX)
            checked.append((token_id, float(value)))
        object.__setattr__(self, "logit_bias", tuple(checked))

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0), i.e. deterministic."""
        return self.temperature == 0.0


def _require_int(name: str, value: object) -> None:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")


def _require_c_int(name: str, value: object) -> None:
    """An int that fits the C ABI's int32_t (the engine checks the range)."""
    _require_int(name, value)
    if not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise ValueError(f"{name} must fit a C int32_t ([-2**31, 2**31)), got {value}")


def _require_c_float(name: str, value: object) -> None:
    """A number a C float can hold: NaN and infinities pass (the engine says where they are
    allowed); finite values beyond FLOAT32_MAX would turn into infinities."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if math.isfinite(value) and abs(value) > FLOAT32_MAX:
        raise ValueError(f"{name} must fit a C float (magnitude at most {FLOAT32_MAX:.4g}), "
                         f"got {value}")  # fmt: skip


def _as_tuple(name: str, value: object, what: str = "a list") -> tuple:
    if value is None:
        return ()
    if not isinstance(value, Iterable) or isinstance(value, (bytes, dict)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    return tuple(value)
