"""Owning wrappers over the C ABI; the only module that calls ``lib.*``.

``_check`` is the one place where a ``cf_status`` becomes an exception. ``Engine`` owns a
``cf_engine_t`` (freed by ``close()``, ``with``, or garbage collection) and converts between
Python values and C structs; it adds no behaviour of its own.

Importing this module loads libcacheflow.so and raises ImportError if it is missing.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from pycacheflow import errors
from pycacheflow._ffi import ffi, load_library
from pycacheflow.config import (
    KV_MODES,
    LOG_LEVELS,
    PAGED_ATTENTIONS,
    POLICIES,
    PREEMPTION_MODES,
    KV_STREAMING_MODES,
    SPLIT_MODES,
    c_enum_name,
)
from pycacheflow.outputs import DeviceInfo, EngineStats, ModelInfo, OutputEvent, PriorityTTFT
from pycacheflow.profiler import ProfileEvent
from pycacheflow.sampling_params import DEFAULT_DRY_SEQUENCE_BREAKERS
from pycacheflow.text import encode_utf8

if TYPE_CHECKING:
    from pycacheflow.config import EngineConfig
    from pycacheflow.sampling_params import SamplingParams

lib = load_library()

SEED_RANDOM: int = lib.CF_SEED_RANDOM

_STATUS_ERRORS: dict[int, type[errors.CacheFlowError]] = {
    lib.CF_STATUS_INVALID_ARGUMENT: errors.InvalidArgumentError,
    lib.CF_STATUS_MODEL_LOAD_FAILED: errors.ModelLoadError,
    lib.CF_STATUS_PROMPT_TOO_LONG: errors.PromptTooLongError,
    lib.CF_STATUS_OUT_OF_MEMORY: errors.OutOfMemoryError,
    lib.CF_STATUS_NOT_FOUND: errors.NotFoundError,
    lib.CF_STATUS_UNSUPPORTED: errors.UnsupportedError,
    lib.CF_STATUS_BUFFER_TOO_SMALL: errors.BufferTooSmallError,
    lib.CF_STATUS_DECODE_FAILED: errors.DecodeError,
    lib.CF_STATUS_SHUTDOWN: errors.ShutdownError,
    lib.CF_STATUS_INTERNAL: errors.InternalError,
}

_KV_MODE_VALUES = {name: getattr(lib, c_enum_name("CF_KV_MODE_", name)) for name in KV_MODES}
_KV_MODE_NAMES = {value: name for name, value in _KV_MODE_VALUES.items()}
_POLICY_VALUES = {name: getattr(lib, c_enum_name("CF_SCHED_POLICY_", name)) for name in POLICIES}
_LOG_LEVEL_VALUES = {name: getattr(lib, c_enum_name("CF_LOG_LEVEL_", name)) for name in LOG_LEVELS}
_PAGED_ATTENTION_VALUES = {
    name: getattr(lib, c_enum_name("CF_PAGED_ATTENTION_", name)) for name in PAGED_ATTENTIONS
}
_PREEMPTION_MODE_VALUES = {
    name: getattr(lib, c_enum_name("CF_PREEMPTION_MODE_", name)) for name in PREEMPTION_MODES
}
_KV_STREAMING_VALUES = {name: getattr(lib, c_enum_name("CF_KV_STREAMING_", name)) for name in KV_STREAMING_MODES}
_SPLIT_MODE_VALUES = {name: getattr(lib, c_enum_name("CF_SPLIT_MODE_", name)) for name in SPLIT_MODES}

_DRAIN_CAPACITY = 1024  # events moved per cf_engine_drain call
_DRAIN_TEXT_BYTES = 1 << 16  # text bytes per cf_engine_drain_outputs call (grown on demand)
_INITIAL_TEXT_BYTES = 1024
_DRAIN_LOGPROBS = 1 << 12  # token probabilities per cf_engine_drain_outputs call (grown on demand)
_NUMPY_TYPES = {"int32_t": np.int32, "int64_t": np.int64, "float": np.float32}


def _struct_dtype(c_type: str) -> np.dtype:
    """A numpy structured dtype with the C struct's field names, offsets and size, so that an
    array of the structs is read as columns without copying field by field."""
    ctype = ffi.typeof(c_type)
    fields = ctype.fields
    return np.dtype(
        {
            "names": [name for name, _ in fields],
            "formats": [_NUMPY_TYPES[f.type.cname] for _, f in fields],
            "offsets": [f.offset for _, f in fields],
            "itemsize": ffi.sizeof(ctype),
        }
    )


EVENT_DTYPE = _struct_dtype("cf_output_event")
LOGPROB_DTYPE = _struct_dtype("cf_token_logprob")  # fields token_id (int32), logprob (float32)


def _check(rc: int, library: object = None) -> None:
    """Raise the exception class of a failed cf_status, with cf_last_error() as message.

    Call right after the cf_* call, on the same thread (the message is thread-local).

    Args:
        rc: the cf_status returned.
        library: the cffi library that returned it (its cf_last_error holds the message);
            None = the module's.

    Raises:
        CacheFlowError subclass: rc < 0 (InternalError for a status unknown to this module).
    """
    if rc == lib.CF_STATUS_OK:
        return
    message = ffi.string((library or lib).cf_last_error()).decode("utf-8", errors="replace")
    cls = _STATUS_ERRORS.get(rc, errors.InternalError)
    raise cls(message or f"cf_status {rc}", status=rc)


def default_threads() -> int:
    """The CPU threads n_threads = 0 stands for (cf_default_threads): one per physical core of the affinity mask."""
    return int(lib.cf_default_threads())


def version() -> str:
    """The native library's version string, e.g. "0.1.0 (llama.cpp 0c1e570)"."""
    return ffi.string(lib.cf_version()).decode()


def list_devices(rpc_servers: Sequence[str] = ()) -> list[DeviceInfo]:
    """The devices of this build and machine, CPU first (``cf_device_list``; --list-devices).

    Args:
        rpc_servers: "host:port" of rpc-server processes to register first (for the process's
            lifetime, as an engine does); their devices are listed as "RPC<n>".

    Returns:
        One DeviceInfo per device; ``name`` is what ``EngineConfig.devices`` takes.

    Raises:
        InvalidArgumentError: a malformed or unreachable rpc server (the message names
            rpc_servers).
        UnsupportedError: the build has no RPC backend and rpc_servers is not empty.
    """
    servers = ffi.new("char[]", ",".join(rpc_servers).encode("utf-8"))
    count = ffi.new("int32_t *")
    try:
        _check(lib.cf_device_list(servers, ffi.NULL, 0, count))
    except errors.BufferTooSmallError:
        pass
    out = ffi.new("cf_device_info[]", max(count[0], 1))
    _check(lib.cf_device_list(servers, out, count[0], count))
    return [_device_info(d) for d in out[0 : count[0]]]


def _device_info(d: object) -> DeviceInfo:
    name, description = ffi.string(d.name).decode(), ffi.string(d.description).decode()
    return DeviceInfo(name, description, d.type, d.memory_total_bytes, d.memory_free_bytes)


def clock_ns() -> int:
    """Now on the monotonic clock that stamps output events, in nanoseconds."""
    return lib.cf_clock_ns()


def json_schema_to_grammar(schema_json: str) -> str:
    """The GBNF grammar of a JSON schema, from llama.cpp's converter (cf_json_schema_to_grammar).

    Args:
        schema_json: the schema as JSON text; "{}" means any JSON object.

    Returns:
        The grammar (rule "root"), for ``SamplingParams.grammar``.

    Raises:
        InvalidArgumentError: not JSON, or a schema the converter rejects (the message starts
            with "json_schema: " and gives the converter's reason).
    """
    data = encode_utf8(schema_json, "json_schema")
    capacity = _INITIAL_TEXT_BYTES + 8 * len(data)
    while True:
        buf = ffi.new("char[]", capacity)
        out = ffi.new("int32_t *")
        try:
            _check(lib.cf_json_schema_to_grammar(data, len(data), buf, capacity, out))
        except errors.BufferTooSmallError:
            capacity = _grown(capacity, out[0])
            continue
        return ffi.unpack(buf, out[0]).decode("utf-8")


def kv_cache_rows_for_budget(kv_cache_bytes: int, kv_bytes_per_token: int, kv_mode: str,
                             max_num_seqs: int) -> tuple[int, int]:
    """KV rows a cache of ``kv_cache_bytes`` gets, by the engine's rule (cf_kv_cache_rows_for_budget).

    Args:
        kv_cache_bytes: the budget in bytes, >= 0.
        kv_bytes_per_token: ``ModelInfo.kv_bytes_per_token`` of the model, >= 1.
        kv_mode: a name of ``config.KV_MODES``: "stock" (split mode) rounds per sequence.
        max_num_seqs: sequences the cache serves at once, >= 1.

    Returns:
        ``(n_ctx, min_rows)``: the rows the engine would allocate (0 when the budget holds fewer
        than ``min_rows``) and the fewest rows that would do.

    Raises:
        InvalidArgumentError: an argument out of range.
    """
    n_ctx = ffi.new("int64_t *")
    min_rows = ffi.new("int64_t *")
    rc = lib.cf_kv_cache_rows_for_budget(kv_cache_bytes, kv_bytes_per_token, _KV_MODE_VALUES[kv_mode], max_num_seqs,
                                         n_ctx, min_rows)
    if rc == lib.CF_STATUS_INVALID_ARGUMENT and min_rows[0] > 0:
        return 0, int(min_rows[0])  # the arguments were valid: the budget is too small
    _check(rc)
    return int(n_ctx[0]), int(min_rows[0])


_INFO_TEXT = ("description", "arch", "kv_devices")  # char[] fields of cf_model_info


def kv_mode_name(value: int) -> str:
    """Name ("paged", "stock", ...) of a cf_kv_mode value."""
    return _KV_MODE_NAMES.get(value, str(value))


def _engine_config(config: EngineConfig, keep: list) -> object:
    """cf_engine_config for ``config``; ``keep`` receives buffers that must outlive init."""
    c = ffi.new("cf_engine_config *", lib.cf_engine_default_config())
    path = ffi.new("char[]", os.fsencode(config.model_path))  # any bytes a file name has
    keep.append(path)
    c.model_path = path
    c.n_ctx = config.n_ctx
    c.max_num_seqs = config.max_num_seqs
    c.max_num_batched_tokens = config.max_num_batched_tokens
    c.n_threads = config.n_threads
    c.n_gpu_layers = config.n_gpu_layers
    c.kv_mode = _KV_MODE_VALUES[config.kv_mode]
    c.block_size = config.block_size
    c.policy = _POLICY_VALUES[config.policy]
    c.flash_attn = -1 if config.flash_attn is None else int(config.flash_attn)
    c.log_level = _LOG_LEVEL_VALUES[config.log_level]
    c.profile_capacity = config.profile_capacity
    c.kv_cache_bytes = config.kv_cache_bytes
    c.paged_attention = _PAGED_ATTENTION_VALUES[config.paged_attention]
    c.enable_prefix_caching = int(config.enable_prefix_caching)
    c.preemption_mode = _PREEMPTION_MODE_VALUES[config.preemption_mode]
    c.swap_space_bytes = config.swap_space_bytes
    c.priority_aging_ms = config.priority_aging_ms
    c.sampling_threads = config.sampling_threads
    c.kv_streaming = _KV_STREAMING_VALUES[config.kv_streaming]
    c.kv_stream_blocks = config.kv_stream_blocks
    c.kv_stream_depth = config.kv_stream_depth
    c.long_prefill_token_threshold = config.long_prefill_token_threshold
    if config.rpc_servers:
        c.rpc_servers = _keep_str(",".join(config.rpc_servers), keep)
    if config.devices is not None:
        c.devices = _keep_str(",".join(config.devices), keep)
    c.split_mode = _SPLIT_MODE_VALUES[config.split_mode]
    c.main_gpu = config.main_gpu
    if config.tensor_split:
        split = ffi.new("float[]", list(config.tensor_split))
        keep.append(split)
        c.tensor_split = split
        c.num_tensor_split = len(config.tensor_split)
    return c


def _keep_str(text: str, keep: list) -> object:
    """A NUL-terminated UTF-8 copy of text that lives as long as ``keep``."""
    buf = ffi.new("char[]", text.encode("utf-8"))
    keep.append(buf)
    return buf


@functools.lru_cache(maxsize=1)
def _default_sampling_params() -> object:
    """``cf_sampling_params_default()``, read once: the library's constant. Each native call
    releases the GIL, and an event loop that calls one waits to take it back (on a loaded
    host, behind the server's worker and dispatcher threads) before it runs the next request."""
    return lib.cf_sampling_params_default()


def _sampling_params(params: SamplingParams, keep: list) -> object:
    """cf_sampling_params for ``params``; ``keep`` receives the arrays it points into."""
    c = ffi.new("cf_sampling_params *", _default_sampling_params())
    c.max_tokens = params.max_tokens
    c.temperature = params.temperature
    c.top_k = params.top_k
    c.top_p = params.top_p
    c.min_p = params.min_p
    c.seed = SEED_RANDOM if params.seed is None else params.seed
    c.ignore_eos = int(params.ignore_eos)
    c.cache_prompt = int(params.cache_prompt)
    c.return_progress = int(params.return_progress)
    if params.logprobs is not None:
        c.logprobs, c.top_logprobs = 1, params.logprobs
        c.post_sampling_probs = int(params.post_sampling_probs)
    if params.stop_token_ids:
        ids = ffi.new("int32_t[]", list(params.stop_token_ids))
        keep.append(ids)
        c.stop_token_ids, c.num_stop_token_ids = ids, len(params.stop_token_ids)
    if params.stop:
        strings = [ffi.new("char[]", encode_utf8(s, "stop string")) for s in params.stop]
        array = ffi.new("const char *[]", strings)
        keep += [strings, array]
        c.stop_strings, c.num_stop_strings = array, len(strings)
    c.repeat_penalty = params.repeat_penalty
    c.repeat_last_n = params.repeat_last_n
    c.presence_penalty = params.presence_penalty
    c.frequency_penalty = params.frequency_penalty
    if params.logit_bias:
        token_ids = ffi.new("int32_t[]", [t for t, _ in params.logit_bias])
        values = ffi.new("float[]", [b for _, b in params.logit_bias])
        keep += [token_ids, values]
        c.logit_bias_token_ids, c.logit_bias_values = token_ids, values
        c.num_logit_bias = len(params.logit_bias)
    if params.grammar:
        grammar = ffi.new("char[]", encode_utf8(params.grammar, "grammar"))
        keep.append(grammar)
        c.grammar = grammar
    c.dry_multiplier = params.dry_multiplier
    c.dry_base = params.dry_base
    c.dry_allowed_length = params.dry_allowed_length
    c.dry_penalty_last_n = params.dry_penalty_last_n
    if params.dry_sequence_breakers != DEFAULT_DRY_SEQUENCE_BREAKERS:  # else the C default's
        breakers = [ffi.new("char[]", encode_utf8(s, "dry sequence breaker"))
                    for s in params.dry_sequence_breakers]  # fmt: skip
        array = ffi.new("const char *[]", breakers) if breakers else ffi.NULL
        keep += [breakers, array]
        c.dry_sequence_breakers, c.num_dry_sequence_breakers = array, len(breakers)
    c.xtc_probability = params.xtc_probability
    c.xtc_threshold = params.xtc_threshold
    c.typical_p = params.typical_p
    c.mirostat = params.mirostat
    c.mirostat_tau = params.mirostat_tau
    c.mirostat_eta = params.mirostat_eta
    c.dynatemp_range = params.dynatemp_range
    c.dynatemp_exponent = params.dynatemp_exponent
    c.top_n_sigma = params.top_n_sigma
    c.min_keep = params.min_keep
    budget = params.reasoning_budget
    if budget is not None:
        c.reasoning_budget = budget.tokens
        for name in ("start", "end", "forced", "prefill"):
            ids = getattr(budget, name)
            if ids:
                array = ffi.new("int32_t[]", list(ids))
                keep.append(array)
                setattr(c, f"reasoning_{name}_tokens", array)
                setattr(c, f"num_reasoning_{name}_tokens", len(ids))
    return c


def token_array(token_ids: Sequence[int]) -> object:
    """An ``int32_t[]`` copy of token ids (cffi cdata owning its memory; ``len()`` gives the
    number of tokens), which ``Engine.add_request``, ``add_requests`` and ``detokenize_bytes``
    take as it is: a prompt converted once (on any thread) is not converted again per call.

    Raises:
        OverflowError/TypeError: an id that is not an int or does not fit int32_t.
    """
    return ffi.new("int32_t[]", token_ids if isinstance(token_ids, (list, tuple))
                   else list(token_ids))  # fmt: skip


def token_array_slice(tokens: object, start: int, stop: int) -> object:
    """A new ``token_array`` of entries [start, stop) of an int32_t[] (one memory copy)."""
    out = ffi.new("int32_t[]", stop - start)
    ffi.memmove(out, tokens + start, 4 * (stop - start))
    return out


def _tokens(token_ids: Sequence[int] | object) -> object:
    """``token_ids`` as an int32_t[]: a ``token_array`` as it is, else a new one."""
    return token_ids if isinstance(token_ids, ffi.CData) else token_array(token_ids)


def check_sampling_params(params: SamplingParams) -> None:
    """Check ``params`` against the engine's rules (cf_sampling_params_check).

    Params equal to ones that passed are not checked again (``_check_sampling_params_once``):
    a server builds equal params for most requests, twice each (parsed, then with the slot's
    max_tokens), and each check is two native calls on its event loop, each releasing the GIL.

    Raises:
        InvalidArgumentError: a value out of range, with the engine's message (the one
            add_request would give); token ids are checked against a vocabulary on add.
    """
    try:
        hash(params)
    except TypeError:  # a field the caller set to something unhashable: check it every time
        _check_sampling_params_now(params)
        return
    _check_sampling_params_once(params)


_NUM_CHECKED_PARAMS = 256  # distinct params remembered as valid (least recently used go first)


@functools.lru_cache(maxsize=_NUM_CHECKED_PARAMS)
def _check_sampling_params_once(params: SamplingParams) -> None:
    """``_check_sampling_params_now``, remembered for params that pass (a failure raises, and
    lru_cache keeps no result). Safe because the check is a function of the C struct, and
    equal params give equal structs: ints and floats convert by value (1 == 1.0 == True give
    the same C number; -0.0 == 0.0 differ only in the sign bit, which no rule reads), and
    every sequence field is a tuple by now (``SamplingParams.__post_init__``)."""
    _check_sampling_params_now(params)


def _check_sampling_params_now(params: SamplingParams) -> None:
    keep: list = []
    _check(lib.cf_sampling_params_check(_sampling_params(params, keep)))


class _HandleGuard:
    """Hands out the engine handle to native calls and counts them, so that ``close`` never
    frees the engine under a call still running on another thread."""

    def __init__(self, handle: object) -> None:
        self._cond = threading.Condition()
        self._handle: object | None = handle
        self._num_calls = 0

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> object:
        with self._cond:
            if self._handle is None:
                raise errors.ShutdownError("engine is closed")
            self._num_calls += 1
            return self._handle

    def __exit__(self, *exc_info: object) -> None:
        with self._cond:
            self._num_calls -= 1
            if self._num_calls == 0:
                self._cond.notify_all()

    def close(self, wake: Callable[[object], object]) -> object | None:
        """Refuse new calls, ``wake(handle)`` blocked ones, wait for all to return.

        Returns:
            The handle, now unused, for the caller to free; None if already closed.
        """
        with self._cond:
            handle, self._handle = self._handle, None
        if handle is None:
            return None
        wake(handle)
        with self._cond:
            self._cond.wait_for(lambda: self._num_calls == 0)
        return handle


class Engine:
    """Owning handle of one native engine (``cf_engine_t``).

    Thread-safety follows cacheflow.h: every method except ``step`` may be called from several
    threads at once; ``step`` must not run while the step thread runs (``start``). ``close``
    may be called from any thread: it waits for native calls in flight (blocked ``drain``s are
    woken by stopping the step thread); later calls raise ShutdownError.

    Args:
        config: the engine configuration.

    Raises:
        InvalidArgumentError, ModelLoadError, UnsupportedError, OutOfMemoryError: from init.
    """

    def __init__(self, config: EngineConfig) -> None:
        keep: list = []
        c_config = _engine_config(config, keep)
        out = ffi.new("cf_engine_t *")
        # Bind the library this engine was created with: tests load a second (fake) library
        # into the module while real engines are alive, and a handle must never reach the
        # other library's functions.
        self._lib = lib
        _check(self._lib.cf_engine_init(c_config, out), self._lib)
        self._guard = _HandleGuard(ffi.gc(out[0], self._lib.cf_engine_free))
        self._local = threading.local()  # per-thread drain buffers
        self.config = config

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the step thread, abort all requests and free the engine. Idempotent."""
        handle = self._guard.close(wake=self._lib.cf_engine_stop)
        if handle is not None:
            ffi.release(handle)  # runs cf_engine_free now instead of at garbage collection

    @property
    def closed(self) -> bool:
        """True after ``close()``."""
        return self._guard.closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, fn: Callable[..., int], *args: object) -> None:
        """``fn(handle, *args)`` with the handle held open, then ``_check`` its status."""
        with self._guard as handle:
            _check(fn(handle, *args), self._lib)

    # ------------------------------------------------------------------ info

    def info(self) -> ModelInfo:
        """Model and capacity facts (``cf_engine_get_info``)."""
        out = ffi.new("cf_model_info *")
        self._call(self._lib.cf_engine_get_info, out)
        values = {}
        for name in ModelInfo._fields[:-1]:
            value = getattr(out, name)
            values[name] = ffi.string(value).decode() if name in _INFO_TEXT else value
        kv_devices = values["kv_devices"]
        values["kv_devices"] = tuple(kv_devices.split(",")) if kv_devices else ()
        return ModelInfo(**values, kv_mode_name=kv_mode_name(out.kv_mode))

    def stats(self) -> EngineStats:
        """Engine-wide counters (``cf_engine_get_stats``)."""
        out = ffi.new("cf_engine_stats *")
        self._call(self._lib.cf_engine_get_stats, out)
        counters = [getattr(out, name) for name in EngineStats._fields[:-1]]
        return EngineStats(*counters, ttft_by_priority=self.ttft_by_priority())

    def ttft_by_priority(self) -> tuple[PriorityTTFT, ...]:
        """TTFT per request priority since init (``cf_engine_get_ttft_by_priority``), ascending."""
        capacity = self._lib.CF_TTFT_PRIORITIES_MAX
        out = ffi.new("cf_priority_ttft[]", capacity)
        num = ffi.new("int32_t *")
        self._call(self._lib.cf_engine_get_ttft_by_priority, out, capacity, num)
        return tuple(
            PriorityTTFT(e.priority, e.num_requests, e.ttft_sum_ns / 1e9, e.ttft_max_ns / 1e9)
            for e in out[0 : min(num[0], capacity)]
        )

    # ------------------------------------------------------------------ requests

    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0
    ) -> int:
        """Queue a request (mutates engine state; thread-safe).

        Args:
            prompt_token_ids: [num_prompt_tokens] int32 token ids, each in [0, n_vocab), or
                their ``token_array`` (not copied again).
            params: sampling parameters.
            priority: smaller runs first under the "priority" policy; ignored otherwise.

        Returns:
            The new request id (> 0, never reused).

        Raises:
            InvalidArgumentError: empty prompt, token out of range, bad sampling field.
            PromptTooLongError: num_prompt_tokens >= n_ctx_per_seq.
            ShutdownError: the engine is stopping. A failure queues nothing.
        """
        keep: list = []
        c_params = _sampling_params(params, keep)
        tokens = _tokens(prompt_token_ids)
        out = ffi.new("int64_t *")
        self._call(self._lib.cf_engine_add_request, tokens, len(tokens), c_params, priority, out)
        return out[0]

    def add_requests(
        self, requests: Sequence[tuple]
    ) -> list[int]:
        """Queue several requests at once (mutates engine state; thread-safe).

        All are validated before any is queued, and they are queued together: the step that
        admits the first one sees all of them, so an offline batch is scheduled the same way
        whatever the thread timing.

        Args:
            requests: (prompt_token_ids, params, priority[, num_forks]) per request, as
                ``add_request``; num_forks k > 0 makes the next k requests choices of this one
                (same prompt and priority) that share its prompt's KV (cf_request.num_forks).

        Returns:
            The new request ids, in request order (consecutive).

        Raises:
            As ``add_request``, the message prefixed with "request i: "; a failure queues none.
        """
        if not requests:
            return []
        keep: list = []
        c_requests = ffi.new("cf_request[]", len(requests))
        for c, (tokens, params, priority, *forks) in zip(c_requests, requests):
            c_tokens = _tokens(tokens)
            keep.append(c_tokens)
            c.prompt_tokens = c_tokens
            c.num_prompt_tokens = len(c_tokens)
            c_params = _sampling_params(params, keep)
            keep.append(c_params)  # a struct field does not own what it points to
            c.params = c_params
            c.priority = priority
            c.num_forks = forks[0] if forks else 0
        out = ffi.new("int64_t[]", len(requests))
        self._call(self._lib.cf_engine_add_requests, c_requests, len(requests), out)
        return list(out)

    def abort(self, request_id: int) -> None:
        """Abort a waiting or running request; its final event has finish reason "abort".

        Raises:
            NotFoundError: unknown or already finished (nothing changes).
        """
        self._call(self._lib.cf_engine_abort_request, request_id)

    def has_work(self) -> bool:
        """True if any request is waiting or running."""
        with self._guard as handle:
            return bool(self._lib.cf_engine_has_work(handle))

    # ------------------------------------------------------------------ stepping

    def step(self) -> int:
        """Run one scheduler step synchronously (not while the step thread runs).

        Returns:
            Tokens computed in the step (0 = nothing to do).

        Raises:
            DecodeError: llama_decode failed; affected requests end with "error".
            InvalidArgumentError: the step thread is running.
        """
        out = ffi.new("int32_t *")
        self._call(self._lib.cf_engine_step, out)
        return out[0]

    def start(self) -> None:
        """Start the native step thread (no-op if running)."""
        self._call(self._lib.cf_engine_start)

    def stop(self) -> None:
        """Stop the native step thread after its current step; requests stay queued."""
        self._call(self._lib.cf_engine_stop)

    def drain(self, timeout_ms: int = 0, capacity: int = _DRAIN_CAPACITY) -> list[OutputEvent]:
        """Move queued output events out of the engine, oldest first (thread-safe).

        Args:
            timeout_ms: if none is queued, wait up to this long; 0 = do not wait, < 0 = until
                one arrives or the engine is stopped/freed. The GIL is released while waiting.
            capacity: most events returned by this call.

        Returns:
            Up to ``capacity`` events; empty on timeout.
        """
        events = ffi.new("cf_output_event[]", capacity)
        out = ffi.new("int32_t *")
        self._call(self._lib.cf_engine_drain, events, capacity, timeout_ms, out)
        return [_event(events[i]) for i in range(out[0])]

    def drain_outputs(
        self, timeout_ms: int = 0, capacity: int = _DRAIN_CAPACITY
    ) -> tuple[np.ndarray, bytes, np.ndarray]:
        """Move queued output events, their text and token probabilities out of the engine in
        one call (thread-safe).

        Args:
            timeout_ms: as ``drain``.
            capacity: most events returned by this call.

        Returns:
            (events, text, logprobs): events is a [num_events] array of EVENT_DTYPE (the fields
            of cf_output_event), oldest first; event i's UTF-8 text is
            text[events["text_offset"][i] : + events["text_len"][i]] and its token
            probabilities are logprobs[events["logprobs_offset"][i] : + events["num_logprobs"][i]]
            (a [num_logprobs] LOGPROB_DTYPE array: entry 0 the sampled token, then the most
            likely ones; empty when no request asked for them).
        """
        buffers = self._drain_buffers(capacity)
        events, text, logprobs = buffers.events, buffers.text, buffers.logprobs
        out_n, out_len, out_num_logprobs = buffers.out_n, buffers.out_len, buffers.out_num_logprobs
        while True:
            try:
                self._call(self._lib.cf_engine_drain_outputs, events, capacity, text, len(text),
                           logprobs, len(logprobs), timeout_ms, out_n, out_len,
                           out_num_logprobs)  # fmt: skip
                break
            except errors.BufferTooSmallError:
                if out_len[0] > len(text):
                    text = buffers.text = ffi.new("char[]", _grown(len(text), out_len[0]))
                if out_num_logprobs[0] > len(logprobs):
                    size = _grown(len(logprobs), out_num_logprobs[0])
                    logprobs = buffers.logprobs = ffi.new("cf_token_logprob[]", size)
        n, num_logprobs = out_n[0], out_num_logprobs[0]
        array = np.frombuffer(ffi.buffer(events, n * EVENT_DTYPE.itemsize), EVENT_DTYPE).copy()
        probs = np.frombuffer(
            ffi.buffer(logprobs, num_logprobs * LOGPROB_DTYPE.itemsize), LOGPROB_DTYPE
        ).copy()
        return array, ffi.buffer(text, out_len[0])[:], probs

    def _drain_buffers(self, capacity: int) -> _DrainBuffers:
        """This thread's reusable cffi buffers for ``drain_outputs``."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is None or buffers.capacity < capacity:
            buffers = self._local.buffers = _DrainBuffers(capacity)
        return buffers

    def profile_drain(self, capacity: int = _DRAIN_CAPACITY) -> tuple[list[ProfileEvent], int]:
        """Move recorded profiler events out of the engine's ring, in recording order (thread-safe,
        never waits).

        Args:
            capacity: most events returned by this call.

        Returns:
            (events, num_dropped): up to ``capacity`` events, and the events dropped so far
            because the ring was full (cumulative since init).

        Raises:
            UnsupportedError: the engine was built with profile_capacity 0.
        """
        events = ffi.new("cf_profile_event[]", capacity)
        out = ffi.new("int32_t *")
        dropped = ffi.new("int64_t *")
        self._call(lib.cf_engine_profile_drain, events, capacity, out, dropped)
        fields = ProfileEvent._fields
        result = [ProfileEvent(*(getattr(events[i], f) for f in fields)) for i in range(out[0])]
        return result, dropped[0]

    # ------------------------------------------------------------------ text

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """Tokenize UTF-8 text.

        Args:
            text: the text.
            add_special: add BOS/EOS as the model's tokenizer wants.
            parse_special: turn special-token text such as "<|im_start|>" into its token.

        Returns:
            Token ids.
        """
        tokens, num_tokens = self.tokenize_array(text, add_special, parse_special)
        return ffi.unpack(tokens, num_tokens)

    def tokenize_array(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> tuple[object, int]:
        """``tokenize`` into the engine's form: an int32_t[] (at least ``num_tokens`` long; the
        ids are its first ``num_tokens`` entries) and ``num_tokens``. Arguments as ``tokenize``."""
        data = encode_utf8(text, "text")
        capacity = len(data) + 8  # a token covers >= 1 byte, plus BOS/EOS
        while True:
            tokens = ffi.new("int32_t[]", capacity)
            out = ffi.new("int32_t *")
            flags = (int(add_special), int(parse_special))
            try:
                self._call(self._lib.cf_engine_tokenize, data, len(data), *flags, tokens, capacity, out)
            except errors.BufferTooSmallError:
                capacity = _grown(capacity, out[0])
                continue
            return tokens, out[0]

    def eog_tokens(self) -> list[int]:
        """The model's end-of-generation token ids (EOS, EOT, ...), increasing."""
        capacity = 16
        while True:
            tokens = ffi.new("int32_t[]", capacity)
            out = ffi.new("int32_t *")
            try:
                self._call(self._lib.cf_engine_eog_tokens, tokens, capacity, out)
            except errors.BufferTooSmallError:
                capacity = _grown(capacity, out[0])
                continue
            return ffi.unpack(tokens, out[0])

    def detokenize_bytes(
        self, token_ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False
    ) -> bytes:
        """Detokenize to raw UTF-8 bytes (a multi-byte character may be cut at either end).

        Args:
            token_ids: [num_tokens] int32 token ids in [0, n_vocab), or their ``token_array``.
            remove_special: drop BOS/EOS.
            unparse_special: render special tokens (e.g. "<|im_end|>") as text.

        Raises:
            InvalidArgumentError: a token id is out of range.
        """
        tokens = _tokens(token_ids)
        args = (tokens, len(tokens), int(remove_special), int(unparse_special))
        capacity = max(_INITIAL_TEXT_BYTES, 8 * len(tokens))
        return self._text_call(self._lib.cf_engine_detokenize, args, capacity)

    def detokenize(
        self, token_ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        """Detokenize to text (invalid UTF-8 becomes U+FFFD). Arguments as ``detokenize_bytes``."""
        return self.detokenize_bytes(token_ids, remove_special, unparse_special).decode(
            "utf-8", errors="replace"
        )

    def apply_chat_template(
        self,
        roles: Sequence[str],
        contents: Sequence[str],
        add_assistant: bool = True,
        template: str | None = None,
    ) -> str:
        """Render messages with a chat template.

        Args:
            roles: [num_messages] roles ("system", "user", "assistant").
            contents: [num_messages] message texts.
            add_assistant: end with the assistant turn opener.
            template: template name or Jinja text; None = the model's own.

        Raises:
            UnsupportedError: unknown template, or the model has none.
        """
        if len(roles) != len(contents):
            raise errors.InvalidArgumentError("roles and contents differ in length")
        keep = [ffi.new("char[]", encode_utf8(s, "chat role")) for s in roles]
        keep += [ffi.new("char[]", encode_utf8(s, "chat message")) for s in contents]
        c_roles = ffi.new("const char *[]", keep[: len(roles)])
        c_contents = ffi.new("const char *[]", keep[len(roles) :])
        if template is None:
            c_template = ffi.NULL
        else:
            c_template = ffi.new("char[]", encode_utf8(template, "chat template"))
        text_bytes = sum(len(s) for s in contents)
        args = (c_template, c_roles, c_contents, len(roles), int(add_assistant))
        capacity = _INITIAL_TEXT_BYTES + 2 * text_bytes
        data = self._text_call(self._lib.cf_engine_apply_chat_template, args, capacity)
        return data.decode("utf-8", errors="replace")

    def _text_call(self, fn: Callable[..., int], args: tuple, capacity: int) -> bytes:
        """``fn(handle, *args, buf, capacity, out_len)`` for a call that writes bytes, growing
        the buffer on CF_STATUS_BUFFER_TOO_SMALL."""
        while True:
            buf = ffi.new("char[]", capacity)
            out = ffi.new("int32_t *")
            try:
                self._call(fn, *args, buf, capacity, out)
            except errors.BufferTooSmallError:
                capacity = _grown(capacity, out[0])
                continue
            return ffi.unpack(buf, out[0])


class _DrainBuffers:
    """cffi out-buffers of one thread's ``drain_outputs`` calls (allocated once)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.events = ffi.new("cf_output_event[]", capacity)
        self.text = ffi.new("char[]", _DRAIN_TEXT_BYTES)
        self.logprobs = ffi.new("cf_token_logprob[]", _DRAIN_LOGPROBS)
        self.out_n = ffi.new("int32_t *")
        self.out_len = ffi.new("int32_t *")
        self.out_num_logprobs = ffi.new("int32_t *")


def _grown(capacity: int, needed: int) -> int:
    """Next buffer size after BUFFER_TOO_SMALL; never loops on a bogus "needed" value."""
    return needed if needed > capacity else 2 * capacity


def _event(e: object) -> OutputEvent:
    return OutputEvent(
        e.request_id,
        e.token_id,
        e.finish_reason,
        e.time_ns,
        e.arrival_ns,
        e.first_scheduled_ns,
        e.num_prompt_tokens,
        e.num_cached_tokens,
        e.num_output_tokens,
        e.num_preemptions,
        e.slot_id,
        e.text_len,
        e.text_offset,
        e.stop_string_index,
        e.num_logprobs,
        e.logprobs_offset,
        e.prompt_progress,
        e.num_prompt_processed,
        e.error_len,
    )
