"""Pieces shared by the `cacheflow` commands."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pycacheflow.config import (
    DEFAULT_SWAP_SPACE_BYTES,
    PAGED_ATTENTIONS,
    PREEMPTION_MODES,
    KV_STREAMING_MODES,
    EngineConfig,
)
from cli.kv_stream import flag_message
from pycacheflow.errors import CacheFlowError, InvalidArgumentError, OutOfMemoryError
from pycacheflow.outputs import budget_note, rounding_note

if TYPE_CHECKING:
    from pycacheflow.llm import LLM
    from pycacheflow.outputs import ModelInfo


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_MAX_SIZE_BYTES = 2**62  # the engine's kv_cache_bytes limit


class ByteSize(click.ParamType):
    """A memory size: bytes, or a number with a unit (K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB,
    TiB)."""

    name = "SIZE"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        number = text.rstrip("BbIiKkMmGgTt")
        unit = text[len(number) :].lower()
        try:
            size = float(number)
        except ValueError:
            size = -1.0
        if unit not in _SIZE_UNITS or not 0 <= size < math.inf:  # also NaN
            self.fail(f"{value!r} is not a size (e.g. 268435456, 256MiB, 1.5GiB, 512M)", param, ctx)
        if size * _SIZE_UNITS[unit] >= _MAX_SIZE_BYTES:
            self.fail(f"{value!r} is too large (at most 4 EiB)", param, ctx)
        return int(size * _SIZE_UNITS[unit])


KV_CACHE_MEMORY_HELP = (
    "KV memory budget (e.g. 256MiB, 1GiB; bytes without a unit) instead of --ctx-size: "
    "the cache gets as many tokens as fit, the same memory in every KV mode; 0 (the default) = "
    "size the cache from --ctx-size instead."
)

BLOCK_SIZE_OPTION = click.option(
    "--block-size",
    type=int,
    default=16,
    show_default=True,
    help="Tokens per KV block (paged mode; block_size).",
)

PAGED_ATTENTION_OPTION = click.option(
    "--paged-attention",
    type=click.Choice(PAGED_ATTENTIONS),
    default="invariant",
    show_default=True,
    help="Paged mode CPU attention: invariant = a request's outputs do not depend on chunking, "
    "batching or block placement (close to stock's, not bit-identical); ggml = llama.cpp's "
    "flash-attention arithmetic (stock's logits in the same batches, not invariant).",
)


CACHE_PROMPT_OPTION = click.option(
    "--cache-prompt/--no-cache-prompt",
    default=True,
    show_default=True,
    help="Prefix caching (paged mode): requests reuse the KV blocks of prompt prefixes computed "
    "before, by any request; --no-cache-prompt turns it off for the engine (outputs are the same).",
)


PREEMPTION_OPTION = click.option(
    "--preemption",
    type=click.Choice(PREEMPTION_MODES),
    default="auto",
    show_default=True,
    help="Paged mode, when the KV pool is full: 'swap' copies a preempted sequence's blocks to "
    "host memory and back (exact resume, no recompute) while --swap-space holds it, else "
    "recomputes it (engine stats count both), 'recompute' computes its prompt and "
    "output again, 'auto' picks the cheaper per sequence while --swap-space lasts. The stock "
    "KV modes never preempt.",
)

LONG_PREFILL_OPTION = click.option(
    "--long-prefill-token-threshold",
    "long_prefill_token_threshold",
    type=click.IntRange(min=-1),
    default=-1,
    show_default=True,
    help="A sequence with more than this many prompt tokens left to compute is a long prefill: in "
    "each step at most one gets budget before the shorter ones, so a short prompt queued behind a "
    "long one starts at the next step (outputs do not change). -1 = half the step's token "
    "budget, 0 = off.",
)

SWAP_SPACE_OPTION = click.option(
    "--swap-space",
    type=click.FloatRange(min=0, max=2**31),  # 2 EiB: beyond it the bytes overflow the engine's int64 field
    default=DEFAULT_SWAP_SPACE_BYTES / 2**30,
    show_default=True,
    help="GiB of host memory for swapped-out KV blocks (paged mode; on the CPU its pages are backed "
    "only when used, on CUDA it is pinned at start for the copy stream); 0 = none, preempted "
    "sequences are recomputed.",
)


KV_STREAMING_OPTION = click.option(
    "--kv-streaming",
    type=click.Choice(KV_STREAMING_MODES),
    default="auto",
    show_default=True,
    help="KV streaming (paged mode): 'on' moves middle KV blocks of running sequences to host slots of "
    "--swap-space under pool pressure (before preempting) and stages them back each decode, so a prompt "
    "larger than the device pool still runs; 'auto' is off (on the CPU the staging copy is pure cost; on "
    "CUDA decode is host-link bound while blocks are staged, so it is for contexts the pool cannot hold; "
    "see the README). Not with RPC servers.",
)

KV_STREAM_BLOCKS_OPTION = click.option(
    "--kv-stream-blocks",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="KV streaming: host-resident blocks of the running sequences together, at most (the staging "
    "capacity, at most 65536). Needs as many host slots of --swap-space, one KV block each (every "
    "layer's K and V of one block of tokens; the default model's is 360 KiB, so 4 GiB holds 11,650), "
    "checked at start; on the CPU the pool grows by this many blocks. Only with KV streaming on.",
)

KV_STREAM_DEPTH_OPTION = click.option(
    "--kv-stream-depth",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="KV streaming on CUDA: layers whose staging copies may be in flight at once (a warning on the "
    "CPU, which stages one layer at a time).",
)


def kv_stream_options(f):
    """--kv-streaming, --kv-stream-blocks, --kv-stream-depth."""
    return KV_STREAMING_OPTION(KV_STREAM_BLOCKS_OPTION(KV_STREAM_DEPTH_OPTION(f)))


# EngineConfig field -> the option that sets it, and the click parameter of that option (the commands'
# option maps include them, so that the engine's messages about these fields land under their flags).
KV_STREAM_OPTION_NAMES = {
    "kv_streaming": "--kv-streaming",
    "kv_stream_blocks": "--kv-stream-blocks",
    "kv_stream_depth": "--kv-stream-depth",
    "swap_space_bytes": "--swap-space",
}
KV_STREAM_PARAMS = {
    "kv_streaming": "kv_streaming",
    "kv_stream_blocks": "kv_stream_blocks",
    "kv_stream_depth": "kv_stream_depth",
    "swap_space_bytes": "swap_space",
}


def kv_stream_config(options: dict) -> dict[str, object]:
    """The EngineConfig fields of the kv_stream_options."""
    return {
        "kv_streaming": str(options["kv_streaming"]),
        "kv_stream_blocks": int(options["kv_stream_blocks"]),
        "kv_stream_depth": int(options["kv_stream_depth"]),
    }


class ThreadCount(click.ParamType):
    """-t/--threads: an int >= -1; -1 (`cacheflow serve`'s default) reads as 0, the engine's default
    (EngineConfig.n_threads: one thread per physical core, the count llama.cpp takes without -t; its explicit -1
    means every logical CPU). Larger values are checked by the engine (at most 512)."""

    name = "integer"

    def convert(self, value, param, ctx) -> int:
        n = click.INT.convert(value, param, ctx)
        if n < -1:
            self.fail(f"{n} is not a thread count (0 or -1: one per physical core)", param, ctx)
        return max(n, 0)


THREADS = ThreadCount()


def swap_space_bytes(gib: float) -> int:
    """--swap-space GiB as bytes (swap_space_bytes)."""
    return int(gib * 2**30)


def to_click_error(exc: CacheFlowError) -> click.ClickException:
    """A runtime failure as the one-line `Error: <Type>: <message>` click prints (exit 1)."""
    # Native InvalidArgument on init/submit is still a runtime failure from the user's view.
    return click.ClickException(f"{type(exc).__name__}: {flag_message(str(exc))}")


def engine_error(exc: CacheFlowError, option_names: dict[str, str]) -> click.ClickException:
    """An engine's refusal to start, as click reports it: a value it refused (InvalidArgumentError)
    as a usage error under the option that set the field (exit 2), anything else as
    ``Error: <Type>: <message>`` (exit 1).

    Args:
        exc: what the engine raised.
        option_names: EngineConfig field -> the command's option (e.g. "kv_cache_bytes" ->
            "--kv-cache-memory").
    """
    if isinstance(exc, InvalidArgumentError):
        return click.UsageError(_under_option(str(exc), option_names))
    return to_click_error(exc)


def load_llm(
    model: Path | None,
    config_kwargs: dict[str, object],
    memory_options: str = "",
    option_names: dict[str, str] | None = None,
    explicit: set[str] | frozenset[str] = frozenset(),
    hints: dict[str, str] | None = None,
    n_ctx_slot: int = 0,
    ctx_size: int | None = None,
) -> LLM:
    """Build the engine for a command (model None = the default model, fetched if needed).

    Args:
        model: the GGUF file; None = the default model.
        config_kwargs: EngineConfig fields.
        memory_options: the command's options that size the KV cache (e.g. "--ctx-size or
            --kv-cache-memory"), named when the cache does not fit in memory.
        option_names: EngineConfig field -> the command's option (e.g. "max_num_seqs" ->
            "-c/--concurrency"): a value the engine refuses is reported under its option.
        explicit: the fields whose options the user gave (``explicit_fields``): a message about
            two fields is reported under the one the user set.
        hints: option -> a sentence appended when a value is reported under that option.
        n_ctx_slot: the server's context per slot, for the notice of a rounded context.
        ctx_size: the context size the user asked for, for that notice; None = the config's
            n_ctx (serve passes the n_ctx it computed from -c, so it gives -c here).

    Raises:
        click.UsageError: a bad config value (exit 2), refused by EngineConfig (types) or by the
            engine (ranges, with the engine's message).
        click.ClickException: the library or the model could not be loaded, or the KV cache
            does not fit in memory (exit 1).
    """
    try:
        if model is None:
            from pycacheflow.model_hub import ensure_default_model

            model = ensure_default_model(progress=True)
        config = EngineConfig(model=model, **config_kwargs)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(_under_option(str(exc), option_names, explicit, hints)) from None
    except CacheFlowError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        from pycacheflow.llm import LLM

        llm = LLM(config=config, warn_rounded_ctx=False)  # the command's notice names its option
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    except OutOfMemoryError as exc:
        message = str(exc)
        if "of swap space" in message:  # the host swap pool (Swapper), not the KV cache
            message = message.replace("swap_space_bytes", "--swap-space")
            hint = "\nThe swap space does not fit in host memory: lower --swap-space (GiB)."
        else:
            hint = f"\nThe KV cache does not fit: lower {memory_options}." if memory_options else ""
        raise click.ClickException(f"{type(exc).__name__}: {message}{hint}") from None
    except InvalidArgumentError as exc:
        # A value the engine refused: it owns the ranges of its settings; its message (which
        # starts with the field's name) is kept as is, under the option that set the field.
        raise click.UsageError(_under_option(str(exc), option_names, explicit, hints)) from None
    except CacheFlowError as exc:
        raise to_click_error(exc) from None
    for line in paged_flag_warnings(llm.info.kv_mode_name):
        click.echo(line, err=True)
    notice = ctx_size_notice(config.n_ctx if ctx_size is None else ctx_size, llm.info, n_ctx_slot)
    if notice:
        click.echo(notice, err=True)
    budget = budget_note(config.kv_cache_bytes, llm.info)
    if budget:
        click.echo(f"cacheflow: --kv-cache-memory {config.kv_cache_bytes} bytes {budget}", err=True)
    return llm


def _under_option(
    message: str,
    option_names: dict[str, str] | None,
    explicit: set[str] | frozenset[str] = frozenset(),
    hints: dict[str, str] | None = None,
) -> str:
    """``Invalid value for OPTION: message`` when the message is about a field an option sets.

    The engine's messages start with the field they are about; one that relates two fields
    ("max_num_batched_tokens (512) must be at least max_num_seqs (100000)") is reported under
    the option the user gave, so that ``-c 100000`` is not blamed on --batch-tokens.
    """
    option_names = option_names or {}
    words = [w.split("[", 1)[0].split("=", 1)[0].strip("(),:;=") for w in message.split()]
    fields = [w for w in words if w in option_names]
    if not fields:
        return flag_message(message)
    chosen = next((f for f in fields if f in explicit), fields[0])
    option = option_names[chosen]
    hint = (hints or {}).get(option)
    text = _in_option_terms(flag_message(message), option_names)
    return f"Invalid value for {option}: {text}" + (f" ({hint})" if hint else "")


def _in_option_terms(message: str, option_names: dict[str, str]) -> str:
    """The engine's message with the EngineConfig fields it names written as the command's options:
    ``kv_cache_bytes=1024`` becomes ``--kv-cache-memory 1024``, a bare ``n_ctx`` ``-c/--ctx-size``. A message
    about one field without its value ("n_ctx must be >= 0, got -1") stays: "Invalid value for OPTION" names it."""
    if not option_names:
        return message
    names = "|".join(sorted(map(re.escape, option_names), key=len, reverse=True))
    if len(set(re.findall(rf"\b({names})\b", message))) < 2 and not re.search(rf"\b({names})=", message):
        return message
    message = re.sub(rf"\b({names})=([\w.]+)", lambda m: f"{option_names[m.group(1)]} {m.group(2)}", message)
    return re.sub(rf"\b({names})\b", lambda m: option_names[m.group(1)], message)


# Options of the paged KV cache alone (click parameter -> flag): with llama.cpp's stock KV cache (--kv-mode stock or
# stock-unified, or auto where the paged cache cannot run) they change nothing.
PAGED_ONLY_PARAMS = {"paged_attention": "--paged-attention", "block_size": "--block-size"}


def paged_flag_warnings(kv_mode_name: str) -> list[str]:
    """Lines for stderr about paged-only flags the user gave when the engine runs a stock KV cache.

    Args:
        kv_mode_name: the loaded engine's resolved KV mode (``LLM.info.kv_mode_name``: "paged",
            "stock" or "stock-unified").
    """
    ctx = click.get_current_context(silent=True)
    if ctx is None or kv_mode_name == "paged":
        return []
    given = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return [
        f"cacheflow: warning: {flag} has no effect: the engine runs llama.cpp's {kv_mode_name} KV cache, "
        "and the option applies to --kv-mode paged"
        for name, flag in PAGED_ONLY_PARAMS.items()
        if name in ctx.params and ctx.get_parameter_source(name) in given
    ]


def explicit_fields(param_of_field: dict[str, str]) -> set[str]:
    """The EngineConfig fields whose click parameters the user gave (command line or environment).

    Args:
        param_of_field: EngineConfig field -> the click parameter's name (e.g. "max_num_seqs" ->
            "concurrency").
    """
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return set()
    given = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return {f for f, name in param_of_field.items() if ctx.get_parameter_source(name) in given}


def ctx_size_notice(n_ctx: int, info: ModelInfo, n_ctx_slot: int = 0) -> str | None:
    """The line that says what a rounded --ctx-size became, or None if it was used as given.

    llama.cpp allocates the KV cache in multiples of 256 rows (per sequence in the stock split
    mode), so e.g. 1000 tokens over 4 stock sequences become 1024, 256 per sequence.

    Args:
        n_ctx: the requested KV capacity in tokens; 0 = the default (no notice).
        info: the engine's resolved capacity.
        n_ctx_slot: the server's context per slot (-c / -np, from the rounded -c), which then
            bounds a request instead of the engine's context per sequence; 0 = none.
    """
    note = rounding_note(n_ctx, info)
    if note is None:
        return None
    if n_ctx_slot > 0 and info.n_ctx > (n_ctx + 255) // 256 * 256:
        # serve -c C -np N: each slot's share is padded (llama-context.cpp)
        note = note.replace("256 per sequence", "256").replace("256", "256 per slot", 1)
    limit = (f"at most {min(n_ctx_slot, info.n_ctx_per_seq)} tokens per slot" if n_ctx_slot > 0
             else f"at most {info.n_ctx_per_seq} tokens per sequence")  # fmt: skip
    return f"cacheflow: --ctx-size {n_ctx} rounded to {info.n_ctx} tokens of KV cache ({note}); {limit}"
