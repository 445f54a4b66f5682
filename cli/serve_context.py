"""How `cacheflow serve` sizes the KV cache and each slot's context from llama-server's -c, -np
and -kvu, as llama-server of the pinned tree does:

    llama-context.cpp    n_ctx is padded to 256; with slots of their own (split KV), a slot's
                         context is pad(n_ctx / np) and n_ctx becomes np x that
    common/fit.cpp       -c 0 (--fit on, llama-server's default): every slot gets the model's
                         trained context (n_ctx_train), np x n_ctx_train in all; when that does not
                         fit in memory, less (down to 4096 tokens per slot)
    server-context.cpp   n_ctx_slot = min(the slot's context, n_ctx_train)

The slots share one context (one stream) when -np is automatic (llama-server then turns -kvu on)
or with -kvu; otherwise each has its own (np streams). CacheFlow's paged pool is shared by all
sequences either way; the slot context bounds a request (prompt + output) as in llama-server,
and the pool gets the tokens llama-server would allocate, so that np full slots fit.

The memory fit is llama-server's for a CPU build: the KV cache (f16 K and V rows of every layer,
from the GGUF's shape) plus the model file must leave --fit-target's 1 GiB of the host's memory;
otherwise the context shrinks linearly, aligned to 256 x streams, and a start-up note says so.
Only host memory is counted (llama-server fits device memory with -ngl): on a GPU a KV cache the
device cannot hold fails at start-up with the engine's out-of-memory error, which names -c.
Models with sliding-window layers keep fewer rows than n_ctx, so they are not fitted here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pycacheflow.errors import InvalidArgumentError
from pycacheflow.gguf_metadata import architecture_key, read_metadata

KV_PAD_TOKENS = 256  # llama.cpp pads n_ctx, and each slot's share, to this
FIT_MIN_CTX = 4096  # llama-server's --fit-ctx: the smallest context per slot --fit sets
FIT_MARGIN_BYTES = 1 << 30  # llama-server's --fit-target: memory --fit leaves free (1024 MiB)
_F16_BYTES = 2


@dataclass(frozen=True)
class ContextPlan:
    """The context sizes one `cacheflow serve` runs with.

    Attributes:
        n_ctx: EngineConfig.n_ctx, KV tokens over all sequences; 0 = the engine's default.
        n_ctx_slot: ServerConfig.n_ctx_slot, tokens per slot (prompt + output); 0 = the
            engine's context per sequence.
        note: a start-up note for stderr (the context was reduced to fit), or None.
    """

    n_ctx: int
    n_ctx_slot: int
    note: str | None = None


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a GGUF file, read without loading it.

    Attributes:
        n_ctx_train: the trained context, tokens.
        kv_bytes_per_token: f16 K and V bytes of one token over all layers; 0 = unknown.
        file_bytes: size of the file (about the weights' memory).
        sliding_window: the model has sliding-window attention layers.
    """

    n_ctx_train: int
    kv_bytes_per_token: int = 0
    file_bytes: int = 0
    sliding_window: bool = False


def pad(n_tokens: int) -> int:
    """``n_tokens`` rounded up to llama.cpp's KV granularity (0 stays 0)."""
    return (n_tokens + KV_PAD_TOKENS - 1) // KV_PAD_TOKENS * KV_PAD_TOKENS


def num_streams(parallel: int, kv_unified: bool) -> int:
    """KV streams as llama-server has them: 1 when the slots share the context (-np
    automatic, or -kvu), else one per slot."""
    return 1 if parallel <= 0 or kv_unified else parallel


def split_context(ctx_size: int, streams: int) -> tuple[int, int]:
    """(n_ctx, context per slot) of llama_context for a requested ``ctx_size`` > 0: padded to
    256, and with several streams each slot's share padded to 256 again (so n_ctx may grow)."""
    n_ctx = pad(ctx_size)
    if streams == 1:
        return n_ctx, n_ctx
    per_slot = pad(n_ctx // streams)
    return per_slot * streams, per_slot


def plan_context(
    ctx_size: int,
    parallel: int,
    kv_unified: bool,
    shape: ModelShape | None,
    memory_bytes: int | None = None,
    fit: bool = True,
    fit_target_bytes: int = FIT_MARGIN_BYTES,
    fit_min_ctx: int = FIT_MIN_CTX,
) -> ContextPlan:
    """The engine's n_ctx and the slot context for -c ``ctx_size``, -np ``parallel``, -kvu.

    Args:
        ctx_size: -c; 0 = the model's trained context per slot (llama-server's default).
        parallel: -np; <= 0 = automatic (one shared stream).
        kv_unified: -kvu.
        shape: the model's, for -c 0; None = unknown (the engine's default applies: max_num_seqs
            x min(n_ctx_train, 2048), each sequence up to the engine's context per sequence).
        memory_bytes: the memory to fit in; None = the host's.
        fit: --fit on (reduce a -c 0 context to fit memory) or off (the trained context
            whatever it needs).
        fit_target_bytes: --fit-target, the memory the fit leaves free, bytes.
        fit_min_ctx: --fit-ctx, the smallest context per slot the fit sets, tokens.
    """
    streams = num_streams(parallel, kv_unified)
    if ctx_size > 0:
        n_ctx, per_slot = split_context(ctx_size, streams)
        return ContextPlan(n_ctx, per_slot)
    if shape is None or shape.n_ctx_train <= 0:
        return ContextPlan(0, 0)
    n_ctx = streams * pad(shape.n_ctx_train)
    if not fit:
        return ContextPlan(n_ctx, shape.n_ctx_train)
    fitted, note = _fit(n_ctx, streams, shape, memory_bytes, fit_target_bytes, fit_min_ctx)
    return ContextPlan(fitted, min(fitted // streams, shape.n_ctx_train), note)


def _fit(
    n_ctx: int,
    streams: int,
    shape: ModelShape,
    memory_bytes: int | None,
    margin_bytes: int = FIT_MARGIN_BYTES,
    min_ctx: int = FIT_MIN_CTX,
) -> tuple[int, str | None]:
    """common_fit_params for the context alone: ``n_ctx`` if the KV cache and the weights
    leave margin_bytes of memory, else the most that does (aligned to 256 x streams), not
    below min_ctx per slot."""
    if shape.kv_bytes_per_token <= 0 or shape.sliding_window:
        return n_ctx, None
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    target = memory - margin_bytes - shape.file_bytes
    if n_ctx * shape.kv_bytes_per_token <= target:
        return n_ctx, None
    low = streams * min_ctx
    if n_ctx <= low:
        return n_ctx, None  # llama-server: at or below the minimum already, no change
    align = KV_PAD_TOKENS * streams
    fitted = max(low, target // shape.kv_bytes_per_token // align * align)
    gib = n_ctx * shape.kv_bytes_per_token / 2**30
    note = (
        f"cacheflow: -c 0: {streams} x the trained context ({shape.n_ctx_train} tokens) needs "
        f"{gib:.1f} GiB of KV cache, more than fits in {memory / 2**30:.1f} GiB of memory with "
        f"the model and {margin_bytes / 2**20:.0f} MiB left free (llama-server's --fit; "
        f"--fit off keeps the trained context); "
    )
    if fitted * shape.kv_bytes_per_token > target:
        return fitted, note + (f"not even {min_ctx} tokens per slot fit, trying that; "
                               "lower -np or give -c")  # fmt: skip
    return fitted, note + f"using {fitted // streams} tokens per slot"


def host_memory_bytes() -> int:
    """The host's physical memory (llama.cpp's CPU device: all of it counts as free)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def read_model_shape(path: Path) -> ModelShape | None:
    """The model's shape from its GGUF metadata, or None when it cannot be read there."""
    try:
        arch = read_metadata(path, ["general.architecture"]).get("general.architecture")
        if not isinstance(arch, str):
            return None
        names = ("context_length", "block_count", "embedding_length", "attention.head_count",
                 "attention.head_count_kv", "attention.key_length", "attention.value_length",
                 "attention.sliding_window")  # fmt: skip
        meta = read_metadata(path, [architecture_key(arch, n) for n in names])
        file_bytes = path.stat().st_size
    except (InvalidArgumentError, OSError):
        return None
    value = {n: meta.get(architecture_key(arch, n)) for n in names}
    n_ctx_train = value["context_length"]
    if not isinstance(n_ctx_train, int):
        return None
    return ModelShape(n_ctx_train, _kv_bytes_per_token(value), file_bytes,
                      value["attention.sliding_window"] is not None)  # fmt: skip


def _kv_bytes_per_token(value: dict[str, object]) -> int:
    """f16 K and V bytes of one token over all layers, as the engine counts them
    (llama_session.cpp); 0 when the metadata does not say."""
    n_layer, n_embd, n_head = (value[k] for k in ("block_count", "embedding_length",
                                                  "attention.head_count"))  # fmt: skip
    if not all(isinstance(v, int) and v > 0 for v in (n_layer, n_embd, n_head)):
        return 0
    head_kv = value["attention.head_count_kv"]
    if head_kv is None:
        head_kv = n_head
    heads_kv = head_kv if isinstance(head_kv, list) else [head_kv] * n_layer
    head_k = value["attention.key_length"] or n_embd // n_head
    head_v = value["attention.value_length"] or n_embd // n_head
    if not all(isinstance(h, int) for h in (*heads_kv, head_k, head_v)):
        return 0
    return sum(heads_kv) * (head_k + head_v) * _F16_BYTES
