"""EngineConfig: how an engine is built (model, capacity, KV mode, scheduling policy)."""

from __future__ import annotations

import os
from dataclasses import dataclass

# Names accepted here map one to one onto the C enums: "stock-unified" <-> CF_KV_MODE_STOCK_UNIFIED,
# "sjf" <-> CF_SCHED_POLICY_SJF, "warn" <-> CF_LOG_LEVEL_WARN (tests/unit/test_cdef.py checks it).
KV_MODES = ("auto", "stock", "stock-unified", "paged")
POLICIES = ("fcfs", "sjf", "priority")
LOG_LEVELS = ("none", "error", "warn", "info", "debug")
PAGED_ATTENTIONS = ("invariant", "ggml")
PREEMPTION_MODES = ("auto", "recompute", "swap")
KV_STREAMING_MODES = ("auto", "off", "on")
SPLIT_MODES = ("none", "layer", "row")  # CF_SPLIT_MODE_*; "row" is refused by the engine
DEFAULT_SWAP_SPACE_BYTES = 4 << 30  # cf_engine_default_config's (vLLM's default swap space)


def c_enum_name(prefix: str, name: str) -> str:
    """C constant of a config name, e.g. ``c_enum_name("CF_KV_MODE_", "stock-unified")``."""
    return prefix + name.upper().replace("-", "_")


@dataclass
class EngineConfig:
    """Configuration of one engine.

    Each value is validated once, by the layer that owns it: here only what Python owns (types,
    the C ABI's integer widths, the names of the choices); ranges and rules between fields
    (max_num_batched_tokens >= max_num_seqs, n_ctx or kv_cache_bytes) by the native engine, whose
    message ``LLM`` raises as is (InvalidArgumentError, a ValueError) before the model is loaded.

    Attributes:
        model: path of the GGUF model file.
        n_ctx: total KV capacity in tokens over all sequences; 0 = max_num_seqs *
            min(n_ctx_train, 2048).
        max_num_seqs: sequences running at once, >= 1 (the concurrency).
        max_num_batched_tokens: per-step token budget (llama.cpp n_batch = n_ubatch), >= 1;
            prompts longer than it are prefilled in chunks.
        n_threads: CPU threads for decode; 0 = one per physical core the process may use
            (llama.cpp's default; SMT siblings not counted).
        n_gpu_layers: layers offloaded to a GPU backend; 0 = CPU only; -1 = all (as llama.cpp).
        kv_mode: "auto" (paged where supported, else stock), "stock" (llama.cpp KV cache, one
            stream per sequence), "stock-unified" (one stream shared by all sequences) or
            "paged" (CacheFlow's block-table KV cache).
        block_size: tokens per KV block in paged mode, >= 1.
        policy: scheduling policy, "fcfs", "sjf" (shortest predicted work first) or "priority"
            (smaller priority value first; a more urgent request preempts a less urgent running
            one when it cannot get in otherwise, see native/src/core/scheduler.h).
        flash_attn: None = auto, True/False = force on/off (stock modes).
        log_level: "none", "error", "warn", "info" or "debug" (llama.cpp and CacheFlow logs).
        profile_capacity: events the native profiler ring holds, >= 0; 0 = profiling off (see
            ``pycacheflow.profiler``).
        kv_cache_bytes: KV memory budget in bytes (f16 K and V rows of every layer), >= 0;
            0 = size the cache from n_ctx. When set, n_ctx must be 0: the cache holds the most
            tokens that fit, in multiples of 256 (per sequence in "stock" split mode), so the
            same budget gives every KV mode the same memory. ``LLM.info.n_ctx`` says how
            many tokens that is.
        paged_attention: the paged mode CPU attention kernel: "invariant" (the default) computes
            in f32 with one reduction order per (sequence, position), so a request's outputs do
            not depend on how its prompt is chunked, on the other requests of its steps or on
            where its blocks sit; they are close to stock llama.cpp's but not bit-identical.
            "ggml" does the arithmetic of llama.cpp's CPU flash attention in its order and
            precision, so given the same batches its logits equal stock mode's bit for bit, but
            like stock's they change with chunking and batching.
        enable_prefix_caching: paged mode: share the KV blocks of prompt prefixes across
            requests (automatic prefix caching; default on). A request whose prompt starts with
            cached blocks computes only the rest (``RequestMetrics.num_cached_tokens``); cached
            blocks nobody holds are evicted least recently used when the pool needs room.
            Outputs are the same with it off (the invariant kernel). Per request:
            ``SamplingParams.cache_prompt``.
        preemption_mode: paged mode, what happens to a running sequence preempted when the
            pool is short of blocks: "swap" copies its blocks to host memory and back when it
            resumes (exact resume: no recompute, greedy outputs as if never preempted), or,
            when swap_space_bytes cannot hold a victim's blocks, recomputes it (stats count both);
            "recompute" frees them and computes prompt and output again when it is re-admitted;
            "auto" (the default) picks per victim the cheaper of the two by the engine's
            measured copy and compute rates, swapping only while host space lasts. The stock
            modes never preempt (they reserve rows at admission).
        swap_space_bytes: paged mode: host memory for swapped-out KV blocks, bytes (>= 0;
            default 4 GiB; on the CPU reserved lazily: pages are backed only when a swap writes
            them; with every pool on CUDA pinned at start, for the copy stream: engine/swapper.h).
            0 = none (swap falls back to recompute).
        priority_aging_ms: "priority" policy: a queued request's effective priority drops by 1
            (more urgent) per this many ms it has waited (time running does not count), so a
            low-priority request cannot wait forever; >= 0, default 1000; 0 = no aging.
        sampling_threads: threads that sample a step's top-k candidate rows on the CPU (the
            stochastic rows reduced in-graph to their 64 largest logits, e.g. llama-server's
            default sampling), the stepping thread included; in [0, 64]; 0 (the default) =
            min(8, hardware threads / 2), at least 1; 1 = all on the stepping thread. Steps with
            fewer than 8 such rows use the stepping thread alone. Outputs do not depend on it.
        rpc_servers: "host:port" of rpc-server processes of this build (``cacheflow rpc-server``),
            a sequence or one comma-separated str; their devices come first in the device list.
            Needs n_gpu_layers != 0. An unreachable or malformed one is an InvalidArgumentError
            naming rpc_servers at init. One rpc-server serves one engine at a time.
        devices: device names to offload to, in layer order (e.g. ("RPC0", "RPC1"), "CUDA0";
            ``pycacheflow.list_devices`` names them), a sequence or one comma-separated str;
            ("none",) = no offload; None = the RPC devices, then every GPU (llama.cpp's default).
        split_mode: "layer" (each layer, with its weights and KV cache, on one device: in paged
            mode each device holds the K/V pools of its own layers and one block table serves
            all of them), "none" (the whole model on main_gpu) or "row" (refused: llama.cpp's
            row split needs ggml-cuda's split buffers).
        main_gpu: split_mode "none": index of the device in use that gets the model; -1 = none.
        tensor_split: split_mode "layer": proportion of the layers per device in use (finite,
            >= 0), at most one per device; () = by free memory.
        kv_streaming: paged mode: "on" lets middle blocks of running sequences live in host slots of
            the swap space under pool pressure (before anyone is preempted) and stages them back into
            the attention op each decode (so a prompt larger than the device pool still runs); "off";
            "auto" (the default): off (on CUDA too, until the engine's CUDA streaming path has run on
            a GPU; "on" asks for it). Not with rpc_servers. README "KV streaming" has the rule.
        kv_stream_blocks: R, host-resident blocks of the running sequences together at most (the
            staging capacity per layer slot); in [1, 65536], default 64; needs R host slots of
            swap_space_bytes, one KV block each (every layer's K and V of block_size tokens), or
            the engine raises InvalidArgumentError naming both fields before it allocates the KV
            cache. On the CPU the pool grows by R blocks of staging rows. Read only when streaming
            is on.
        kv_stream_depth: CUDA: layers whose staging copies may be in flight at once (>= 1, default 2).
            Read only when streaming is on, on CUDA (the CPU stages one layer at a time).
        long_prefill_token_threshold: a sequence with more than this many tokens left to compute
            is a long prefill; in each step at most one long prefill gets budget before the
            shorter ones (this many tokens, then what they leave), so a short prompt queued behind
            a long one starts at the next step (vLLM's long_prefill_token_threshold; outputs do
            not change). -1 (the default) = max_num_batched_tokens // 2, 0 = off.

    Raises:
        ValueError: on construction, for a value that cannot cross the C ABI (an int of 2**31 or
            more, an unknown choice, an empty model path); the message names it.
        TypeError: for a value of the wrong type.
    """

    model: str | os.PathLike[str]
    n_ctx: int = 0
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0
    kv_mode: str = "auto"
    block_size: int = 16
    policy: str = "fcfs"
    flash_attn: bool | None = None
    log_level: str = "error"
    profile_capacity: int = 0
    kv_cache_bytes: int = 0
    paged_attention: str = "invariant"
    enable_prefix_caching: bool = True
    preemption_mode: str = "auto"
    swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES
    priority_aging_ms: int = 1000
    sampling_threads: int = 0
    rpc_servers: tuple[str, ...] = ()
    devices: tuple[str, ...] | None = None
    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    kv_streaming: str = "auto"
    kv_stream_blocks: int = 64
    kv_stream_depth: int = 2
    long_prefill_token_threshold: int = -1

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not os.fspath(self.model):
            raise ValueError(f"model must be a non-empty path, got {self.model!r}")
        for name in ("n_ctx", "max_num_seqs", "max_num_batched_tokens", "n_threads",
                     "n_gpu_layers", "block_size", "profile_capacity",
                     "priority_aging_ms", "sampling_threads", "long_prefill_token_threshold"):
            _check_int(name, getattr(self, name))  # int32_t in cf_engine_config
        _check_int("kv_cache_bytes", self.kv_cache_bytes, limit_bits=62)
        _check_choice("kv_mode", self.kv_mode, KV_MODES)
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("log_level", self.log_level, LOG_LEVELS)
        _check_choice("paged_attention", self.paged_attention, PAGED_ATTENTIONS)
        _check_int("swap_space_bytes", self.swap_space_bytes, limit_bits=62)
        _check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _check_choice("kv_streaming", self.kv_streaming, KV_STREAMING_MODES)
        for name in ("kv_stream_blocks", "kv_stream_depth"):
            _check_int(name, getattr(self, name))
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if self.flash_attn is not None and not isinstance(self.flash_attn, bool):
            raise TypeError(f"flash_attn must be None, True or False, got {self.flash_attn!r}")
        self.rpc_servers = _name_list("rpc_servers", self.rpc_servers)
        if self.devices is not None:
            self.devices = _name_list("devices", self.devices)
            if not self.devices:
                raise ValueError("devices must name at least one device (or be ('none',))")
        _check_choice("split_mode", self.split_mode, SPLIT_MODES)
        _check_int("main_gpu", self.main_gpu)
        self.tensor_split = _proportions("tensor_split", self.tensor_split)

    @property
    def model_path(self) -> str:
        """The model path as a str."""
        return os.fspath(self.model)


def _check_int(name: str, value: object, limit_bits: int = 31) -> None:
    """An int that fits the C field (|value| < 2**limit_bits); its range is the engine's to check."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not -(2**limit_bits) <= value < 2**limit_bits:
        raise ValueError(f"{name} must be < 2**{limit_bits} in magnitude, got {value}")


def _name_list(name: str, value: object) -> tuple[str, ...]:
    """A comma-separated str or a sequence of non-empty strs without commas, as a tuple."""
    if isinstance(value, str):
        value = tuple(value.split(",")) if value else ()
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} must be a str or a sequence of str, got {value!r}")
    for item in value:
        if not item.strip() or "," in item:
            raise ValueError(f"{name}: empty name or a comma inside one entry in {value!r}")
    return tuple(item.strip() for item in value)


def _proportions(name: str, value: object) -> tuple[float, ...]:
    """A sequence of numbers (ints or floats) as a tuple of floats; ranges are the engine's."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a sequence of numbers, got {value!r}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise TypeError(f"{name} must be a sequence of numbers, got {value!r}")
    return tuple(float(item) for item in value)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
