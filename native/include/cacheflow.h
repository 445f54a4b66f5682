/*
 * cacheflow.h - the one public C ABI of CacheFlow (cf_*).
 *
 * CacheFlow is a multi-request inference engine on top of a pinned, patched llama.cpp.
 * This header must compile as plain C (C99). pycacheflow derives its cffi cdef from it by
 * stripping CF_API and the include guards; tests/unit/test_cdef.py fails on drift.
 *
 * Conventions (see shared STYLE.md section 3):
 *   - every fallible call returns cf_status (0 = ok, negative = error) and writes results
 *     through out-pointers; the message of the last error on the calling thread is
 *     cf_last_error();
 *   - only sized integers, float and size_t cross the ABI; booleans are int32_t (0/1);
 *   - times are nanoseconds of a monotonic clock (std::chrono::steady_clock), see cf_clock_ns();
 *   - ranges are half-open [start, end).
 *
 * Threading: a cf_engine_t may be used from several threads at once for add_request,
 * abort_request, drain, tokenize, detokenize, apply_chat_template, get_info and get_stats.
 * cf_engine_step must not be called while the engine's own step thread runs (cf_engine_start).
 */
#ifndef CACHEFLOW_H
#define CACHEFLOW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CF_API __declspec(dllexport)
#else
#define CF_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- status and errors */

typedef enum cf_status {
    CF_STATUS_OK = 0,
    CF_STATUS_INVALID_ARGUMENT = -1,  /* a bad value; the message names the argument       */
    CF_STATUS_MODEL_LOAD_FAILED = -2, /* missing, unreadable or corrupt model file          */
    CF_STATUS_PROMPT_TOO_LONG = -3,   /* prompt (+1 generated token) does not fit a sequence */
    CF_STATUS_OUT_OF_MEMORY = -4,     /* KV cache / pool cannot be allocated                */
    CF_STATUS_NOT_FOUND = -5,         /* unknown request id                                 */
    CF_STATUS_UNSUPPORTED = -6,       /* e.g. kv_mode not available for this model          */
    CF_STATUS_BUFFER_TOO_SMALL = -7,  /* out buffer too small; the out count holds the need */
    CF_STATUS_DECODE_FAILED = -8,     /* llama_decode returned an error                     */
    CF_STATUS_SHUTDOWN = -9,          /* the engine is stopping; no new requests            */
    CF_STATUS_INTERNAL = -10          /* a bug; the message says where                      */
} cf_status;

/* Message of the last failed cf_* call on this thread; "" if none. The pointer is owned by
 * the library and valid until the next cf_* call on the same thread. Thread-safe. */
CF_API const char * cf_last_error(void);

/* Library version string, e.g. "0.1.0+1a2b3c4 (llama.cpp 0c1e570, Release)": the package version, the
 * CacheFlow git commit it was built from ("-dirty" with uncommitted changes; no "+..." outside
 * a git checkout), the llama.cpp commit and CMake's build type (absent when none was set). Static storage. */
CF_API const char * cf_version(void);

/* The CPU threads n_threads = 0 stands for: one per physical core this process may run on (its affinity
 * mask; SMT siblings count once, as llama.cpp's default thread count), >= 1. */
CF_API int32_t cf_default_threads(void);

/* Current time of the monotonic clock the engine stamps events with, in nanoseconds. */
CF_API int64_t cf_clock_ns(void);

/* ---------------------------------------------------------------- engine configuration */

typedef enum cf_kv_mode {
    CF_KV_MODE_AUTO = 0,          /* paged where supported, else stock (resolved at init)     */
    CF_KV_MODE_STOCK = 1,         /* llama.cpp's KV cache, one stream per sequence (split)    */
    CF_KV_MODE_STOCK_UNIFIED = 2, /* llama.cpp's KV cache, one stream shared by all sequences */
    CF_KV_MODE_PAGED = 3          /* CacheFlow's block-table KV cache (paged attention)       */
} cf_kv_mode;

typedef enum cf_sched_policy {
    CF_SCHED_POLICY_FCFS = 0,     /* first come, first served                                 */
    CF_SCHED_POLICY_SJF = 1,      /* shortest predicted remaining work first                  */
    CF_SCHED_POLICY_PRIORITY = 2  /* lower priority value first (smaller = more urgent), ties by
                                     arrival; a more urgent request preempts a less urgent
                                     running one it cannot otherwise get in beside; waiting
                                     ages the effective priority (priority_aging_ms)          */
} cf_sched_policy;

typedef enum cf_preemption_mode {
    CF_PREEMPTION_MODE_AUTO = 0,      /* per victim, the cheaper of swap (its blocks' bytes out and
                                         back, at the measured copy rate) and recompute (its
                                         computed tokens, at the measured step rate), swap only
                                         while host slots last (the default)                  */
    CF_PREEMPTION_MODE_RECOMPUTE = 1, /* free the victim's blocks; it computes prompt and output
                                         again when re-admitted                               */
    CF_PREEMPTION_MODE_SWAP = 2       /* copy the victim's blocks to host memory and back when it
                                         resumes (exact resume); recompute only when host space
                                         is short                                             */
} cf_preemption_mode;

typedef enum cf_kv_streaming {
    CF_KV_STREAMING_AUTO = 0, /* the default: off, on the CPU and (until the engine's CUDA streaming path has
                                 run on a GPU) on CUDA; ON asks for streaming                              */
    CF_KV_STREAMING_OFF = 1,  /* every block of a running sequence is on the device                        */
    CF_KV_STREAMING_ON = 2    /* under pool pressure, before preempting, middle blocks of running sequences
                                 move to host slots of the swap space and are staged back into the paged
                                 attention op's staging rows each decode (FastFlowLM's layer-ahead KV
                                 streaming; native/src/kernels/kv_stream.h has the contract)             */
} cf_kv_streaming;

typedef enum cf_paged_attention {
    CF_PAGED_ATTENTION_INVARIANT = 0,  /* f32, one reduction order per (sequence, position): a
                                          sequence's outputs do not depend on how its prompt
                                          is chunked, on the other sequences of its steps or
                                          on where its blocks sit (the default)              */
    CF_PAGED_ATTENTION_GGML = 1        /* the arithmetic of llama.cpp's CPU flash attention, in
                                          its order and precision: the same logits as stock
                                          mode given the same batches, but like stock they
                                          change with chunking and batching                  */
} cf_paged_attention;

typedef enum cf_log_level {
    CF_LOG_LEVEL_NONE = 0,  /* silence llama.cpp and CacheFlow logs */
    CF_LOG_LEVEL_ERROR = 1,
    CF_LOG_LEVEL_WARN = 2,
    CF_LOG_LEVEL_INFO = 3,
    CF_LOG_LEVEL_DEBUG = 4
} cf_log_level;

typedef enum cf_split_mode {
    CF_SPLIT_MODE_NONE = 0,   /* the whole offloaded model on one device (main_gpu)         */
    CF_SPLIT_MODE_LAYER = 1,  /* each layer, with its weights and KV cache (in paged mode its
                                 K/V pools), on one of the devices, in proportion to
                                 tensor_split (the default, llama.cpp's -sm layer)          */
    CF_SPLIT_MODE_ROW = 2     /* llama.cpp's row split: refused (CF_STATUS_UNSUPPORTED)      */
} cf_split_mode;

/* Engine configuration. Get defaults from cf_engine_default_config() and change fields.
 * The engine copies what it needs during cf_engine_init; the caller keeps ownership of
 * model_path. */
typedef struct cf_engine_config {
    const char * model_path;         /* GGUF file; required                                    */
    int32_t n_ctx;                   /* total KV capacity in tokens over all sequences;
                                        0 = max_num_seqs * min(n_ctx_train, 2048)             */
    int32_t max_num_seqs;            /* max sequences running at once (>= 1), default 16;
                                        <= 256 with the stock KV cache (llama.cpp's limit)    */
    int32_t max_num_batched_tokens;  /* per-step token budget = llama n_batch = n_ubatch,
                                        default 512; chunked prefill splits prompts under it  */
    int32_t n_threads;               /* CPU threads for decode; 0 = physical cores (llama.cpp) */
    int32_t n_gpu_layers;            /* layers offloaded to a GPU backend; 0 = CPU only        */
    int32_t kv_mode;                 /* cf_kv_mode, default CF_KV_MODE_AUTO                    */
    int32_t block_size;              /* paged mode: tokens per KV block, default 16            */
    int32_t policy;                  /* cf_sched_policy, default CF_SCHED_POLICY_FCFS          */
    int32_t flash_attn;              /* -1 auto, 0 off, 1 on (stock modes)                     */
    int32_t log_level;               /* cf_log_level, default CF_LOG_LEVEL_ERROR               */
    int32_t profile_capacity;        /* events the profiler ring holds (>= 0); 0 = profiling
                                        off (the default); see cf_engine_profile_drain         */
    int64_t kv_cache_bytes;          /* KV memory budget in bytes (K and V rows of every layer,
                                        f16); 0 = size the cache from n_ctx (the default).
                                        When > 0, n_ctx must be 0: the cache gets the most
                                        tokens that fit, rounded down to llama.cpp's 256-token
                                        granularity (per sequence in stock split mode).
                                        CF_STATUS_INVALID_ARGUMENT if that is too small.       */
    int32_t paged_attention;         /* cf_paged_attention: the paged mode CPU attention kernel,
                                        default CF_PAGED_ATTENTION_INVARIANT                   */
    int32_t enable_prefix_caching;   /* paged mode: 1 = share the KV blocks of prompt prefixes
                                        across requests (automatic prefix caching: a hash
                                        chain over full blocks, cached blocks evicted least
                                        recently used when the pool needs them), 0 = off.
                                        Default 1. Ignored in the stock modes.                 */
    int32_t preemption_mode;         /* cf_preemption_mode, default CF_PREEMPTION_MODE_AUTO.
                                        Paged mode only: the stock modes never preempt (they
                                        reserve rows at admission), so they never swap.        */
    int64_t swap_space_bytes;        /* paged mode: host memory for swapped-out KV blocks, bytes
                                        (>= 0), default 4 GiB, allocated at init (pages are
                                        touched only when used); 0 = no swap space (swap falls
                                        back to recompute). Ignored in the stock modes.        */
    int32_t priority_aging_ms;       /* CF_SCHED_POLICY_PRIORITY: a queued request's effective
                                        priority drops by 1 (more urgent) per priority_aging_ms
                                        it has waited (not counting time running), so none
                                        waits forever; >= 0, default 1000; 0 = no aging.       */
    int32_t sampling_threads;        /* threads that sample a step's top-k candidate rows on the
                                        CPU (stochastic rows reduced in-graph to their 64
                                        largest logits), the stepping thread included; in
                                        [0, 64], default 0 = min(8, hardware threads / 2), at
                                        least 1; 1 = all on the stepping thread. Steps with
                                        fewer than 8 such rows sample them on the stepping
                                        thread alone. Tokens do not depend on it.              */
    /* Devices (llama-server's --rpc, -dev, -sm, -mg, -ts). The CPU always runs what is not
       offloaded; n_gpu_layers says how many layers are. See cf_device_list for names.         */
    const char * rpc_servers;        /* comma-separated "host:port" of rpc-server processes (of
                                        this build: `cacheflow rpc-server`); each one's devices
                                        join the device list, first. NULL or "" = none. The
                                        caller keeps ownership. A malformed or unreachable one
                                        is CF_STATUS_INVALID_ARGUMENT naming rpc_servers.
                                        Needs n_gpu_layers != 0. One rpc-server serves one
                                        engine at a time (it serves its clients in turn).    */
    const char * devices;            /* comma-separated device names, e.g. "RPC0,RPC1" or
                                        "CUDA0", in layer order; "none" = no offload; NULL or
                                        "" = the RPC devices of rpc_servers, then every GPU
                                        (llama.cpp's default). An unknown name is
                                        CF_STATUS_INVALID_ARGUMENT naming devices.           */
    int32_t split_mode;              /* cf_split_mode, default CF_SPLIT_MODE_LAYER             */
    int32_t main_gpu;                /* CF_SPLIT_MODE_NONE: index into the devices in use of the
                                        one that gets the model; -1 = none (CPU only); default
                                        0; checked against the device count at init            */
    const float * tensor_split;      /* CF_SPLIT_MODE_LAYER: proportion of the layers per device
                                        in use (finite, >= 0, not all 0), num_tensor_split of
                                        them; NULL = by free memory. Caller-owned.             */
    int32_t num_tensor_split;        /* entries of tensor_split, in [0, 16] and at most the
                                        number of devices in use; default 0                   */
    /* KV streaming (paged mode; README "KV streaming"): blocks of running sequences may live in the
       host slots of the swap space (swap_space_bytes) and are staged in per decode.             */
    int32_t kv_streaming;            /* cf_kv_streaming, default CF_KV_STREAMING_AUTO. ON needs paged
                                        mode and no rpc_servers (CF_STATUS_INVALID_ARGUMENT).  */
    int32_t kv_stream_blocks;        /* R: host-resident blocks of the running sequences together,
                                        at most, = the staging rows (blocks per layer slot); in
                                        [1, 65536], default 64; needs R host slots of swap space
                                        (one KV block each; else CF_STATUS_INVALID_ARGUMENT
                                        before the KV cache is allocated). Read only with
                                        streaming on. On the CPU the pool grows by R blocks of
                                        staging rows.                                          */
    int32_t kv_stream_depth;         /* CUDA: layers whose staging may be in flight at once, >= 1,
                                        default 2 (capped at the layer count); the CPU stages
                                        each layer just before its attention                   */
    int32_t long_prefill_token_threshold; /* a sequence with more than this many tokens left to
                                        compute is a long prefill: in a step, at most one gets
                                        budget before the shorter ones (at most this many
                                        tokens, then what they leave), so a short prompt behind
                                        a long one starts at the next step instead of waiting
                                        for the whole long prompt (vLLM's
                                        long_prefill_token_threshold with one long partial
                                        prefill; core/scheduler.h "Long prefills"). Outputs do
                                        not change. >= -1; -1 = max_num_batched_tokens / 2 (the
                                        default), 0 = off (chunks as large as the budget allows,
                                        in scheduling order).                                  */
} cf_engine_config;

typedef struct cf_engine * cf_engine_t;

/* Defaults for every field; model_path is NULL. Never fails. */
CF_API cf_engine_config cf_engine_default_config(void);

/* Load the model, create the llama.cpp context and the scheduler.
 * Ownership: on success *out_engine is a new engine the caller frees with cf_engine_free.
 * Returns CF_STATUS_INVALID_ARGUMENT (a field out of range; message names it),
 * CF_STATUS_MODEL_LOAD_FAILED (missing/corrupt file; message has the path),
 * CF_STATUS_UNSUPPORTED (kv_mode impossible for this model, or llama.cpp refused the context
 * settings; message has llama.cpp's reason), CF_STATUS_OUT_OF_MEMORY (the llama.cpp context, whose
 * largest buffer is the KV cache, cannot be allocated; message has the KV size and what to lower).
 * On failure *out_engine is set to NULL and nothing leaks. Thread-safe. */
CF_API cf_status cf_engine_init(const cf_engine_config * config, cf_engine_t * out_engine);

/* Stop the step thread if running, abort all requests, free everything. NULL is a no-op. */
CF_API void cf_engine_free(cf_engine_t engine);

/* ---------------------------------------------------------------- devices */

typedef struct cf_device_info {
    char name[64];               /* ggml's device name, what cf_engine_config.devices takes, e.g.
                                    "CPU", "CUDA0", "RPC0"; NUL-terminated                    */
    char description[128];       /* e.g. the GPU's model; an RPC device's "host:port"        */
    int32_t type;                /* ggml's enum ggml_backend_dev_type: 0 CPU, 1 GPU (RPC
                                    devices count as GPUs), 2 integrated GPU, 3 accelerator */
    int64_t memory_total_bytes;  /* as the device (or its rpc-server) reports it           */
    int64_t memory_free_bytes;
} cf_device_info;

/* The devices of this build and machine (llama-server's --list-devices), with those of
 * rpc_servers (as cf_engine_config.rpc_servers; NULL or "" = none) registered first; RPC servers
 * registered earlier in the process but not in rpc_servers are left out. Writes up to
 * capacity entries to out (NULL with capacity 0 only counts) and sets *out_count to the number of
 * devices. Returns CF_STATUS_BUFFER_TOO_SMALL when capacity < *out_count (the first capacity
 * entries are written), CF_STATUS_INVALID_ARGUMENT for a malformed or unreachable rpc server
 * (message names rpc_servers), CF_STATUS_UNSUPPORTED without the RPC backend. Registering a server
 * lasts for the process, as for an engine. Not safe against a concurrent cf_engine_init. */
CF_API cf_status cf_device_list(const char * rpc_servers, cf_device_info * out, int32_t capacity,
                                int32_t * out_count);

/* ---------------------------------------------------------------- model info and stats */

typedef struct cf_model_info {
    int32_t n_vocab;          /* vocabulary size                                            */
    int32_t n_ctx_train;      /* context length the model was trained with                  */
    int32_t n_ctx;            /* total KV capacity of this engine, tokens                   */
    int32_t n_ctx_per_seq;    /* max tokens (prompt + output) one sequence can hold         */
    int32_t max_num_seqs;
    int32_t max_num_batched_tokens;
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t kv_mode;          /* resolved cf_kv_mode (never AUTO)                           */
    int32_t block_size;       /* paged mode only; 0 otherwise                               */
    int32_t token_bos;        /* CF_TOKEN_NONE if the model has none                        */
    int32_t token_eos;
    int32_t add_bos;          /* 1 if tokenizing a prompt should add BOS                    */
    int32_t n_threads;
    int64_t model_size_bytes;
    int64_t n_params;
    char description[128];    /* e.g. "llama ?B Q4_1", NUL-terminated                      */
    char arch[32];            /* general.architecture, e.g. "llama"                         */
    int64_t kv_bytes_per_token; /* f16 K and V bytes of one token over all layers: 2 * n_layer
                                   * n_head_kv * (key_length + value_length) / 2 * 2; what
                                   cf_engine_config.kv_cache_bytes is divided by           */
    int32_t vocab_type;       /* llama.cpp's enum llama_vocab_type: 0 none, 1 SPM, 2 BPE, 3
                                 WPM, 4 UGM, 5 RWKV, 6 PLaMo-2 (llama-server's /v1/models
                                 meta.vocab_type)                                           */
    char kv_devices[256];     /* paged mode: the device holding each layer's K and V pools, in
                                 layer order, comma-separated ggml device names (e.g.
                                 "RPC0,RPC0,RPC1,RPC1"; "CPU" for host memory), truncated to
                                 255 bytes; "" in the stock modes. The one block table of the
                                 engine indexes every layer's pools alike.                 */
    int32_t num_fused_projections; /* weight matrices fused at load (patches/0019): one per
                                 layer whose Q/K/V, one per layer whose FFN gate/up weights
                                 lie back to back; 0 with CACHEFLOW_FUSE_PROJECTIONS=0     */
} cf_model_info;

CF_API cf_status cf_engine_get_info(cf_engine_t engine, cf_model_info * out_info);

typedef struct cf_engine_stats {
    int64_t num_steps;              /* steps run since init                                 */
    int32_t num_running;            /* sequences holding KV                                 */
    int32_t num_waiting;            /* requests not yet admitted                            */
    int64_t num_finished;           /* requests finished (any reason) since init            */
    int64_t num_prompt_tokens;      /* prompt tokens computed since init                    */
    int64_t num_generated_tokens;   /* tokens sampled since init                            */
    int32_t kv_tokens_used;         /* KV rows holding live tokens now (shared rows once)   */
    int32_t kv_tokens_capacity;     /* KV rows in the cache                                 */
    int32_t kv_blocks_total;        /* paged mode; 0 otherwise                              */
    int32_t kv_blocks_used;
    int64_t kv_bytes_reserved;      /* KV bytes set aside for running sequences             */
    int64_t kv_bytes_used;          /* KV bytes holding live tokens                         */
    int64_t num_preemptions;        /* paged mode: sequences preempted since init (any mode) */
    /* Prefix cache (paged mode with enable_prefix_caching; 0 otherwise), since init:          */
    int64_t prefix_cache_queried_tokens; /* tokens looked up at admission (the prompt; prompt
                                            and output again after a preemption)             */
    int64_t prefix_cache_hit_tokens;     /* of those, found in the cache (hit rate in tokens =
                                            hit / queried)                                   */
    int64_t prefix_cache_evictions;      /* cached blocks reused for other tokens             */
    int32_t prefix_cache_blocks;         /* blocks holding cached tokens now (in use or free) */
    /* Preemption (paged mode), since init; num_preemptions = swap + recompute:                */
    int64_t num_preemptions_swap;        /* sequences preempted by swapping their blocks out  */
    int64_t num_preemptions_recompute;   /* sequences preempted by dropping their KV          */
    int64_t num_recomputed_tokens;       /* computed tokens whose KV a recompute preemption
                                            dropped (to be computed again)                    */
    int32_t num_swapped;                 /* sequences swapped out now                         */
    int32_t swap_blocks_total;           /* host slots of the swap space (one block each)     */
    int32_t swap_blocks_used;            /* of those, held by swapped sequences now           */
    int64_t swap_out_bytes;              /* KV bytes copied device -> host                     */
    int64_t swap_in_bytes;               /* KV bytes copied host -> device                     */
    int64_t swap_out_ns;                 /* time spent in those copies, ns                     */
    int64_t swap_in_ns;
    int64_t num_preemptions_priority;    /* of num_preemptions, those that made room for a more
                                            urgent request (CF_SCHED_POLICY_PRIORITY) rather
                                            than for blocks a running sequence needed          */
    /* Sampled rows by route, since init (llama_session.h): their sum is num_generated_tokens.  */
    int64_t num_rows_sampled_in_graph;   /* token chosen in the graph (batched argmax, or a
                                            backend sampler chain of the row's slot)          */
    int64_t num_rows_sampled_top_k;      /* chosen on the CPU among the row's in-graph top-k
                                            candidates (patch 0006)                           */
    int64_t num_rows_sampled_host;       /* chosen on the CPU from the row's whole logits     */
    /* Where the steps that sample spent their time, ns since init (steady clock):              */
    int64_t decode_ns;                   /* llama_decode until its device work and copies are
                                            done (graph build, launches or graph replay, GPU) */
    int64_t sample_ns;                   /* choosing the tokens after that (CPU samplers, reads
                                            of in-graph results)                              */
    /* ggml-cuda graph evaluations of the whole process since start (every engine and context; 0
       without the CUDA backend), by how they ran: the share of replayed ones is the share of
       steps that reuse a captured CUDA graph                                                    */
    int64_t cuda_graphs_captured;        /* captured into a CUDA graph (then run)              */
    int64_t cuda_graphs_replayed;        /* replayed from a captured graph                      */
    int64_t cuda_graphs_direct;          /* launched kernel by kernel (warm-up, shape changed,
                                            graphs off)                                        */
    int64_t num_padding_tokens;          /* padding tokens decoded so that steps keep a few
                                            shapes whose CUDA graphs replay (batch_builder.h;
                                            paged mode on CUDA), since init                   */
    /* How swaps and copy-on-write copies move KV blocks (paged mode; engine/swapper.h):         */
    int32_t swap_on_copy_stream;         /* 1: one kernel per batch on CacheFlow's CUDA side
                                            stream, host pool pinned, no host wait (swap_*_ns
                                            are device times); 0: llama.cpp's per-block copies,
                                            host pool in pageable memory (host wall times)    */
    int64_t block_copy_bytes;            /* copy-on-write bytes copied device -> device        */
    /* Where every step that decodes spends its wall time, ns since init (steady clock); with
       decode_ns and sample_ns above (which count only the steps that sample) they split a
       decode-only step into host and device parts:                                             */
    int64_t prepare_ns;                  /* step start to its first llama_decode call: inbox,
                                            schedule, swaps and block copies, batch, slot
                                            samplers, KV plan (slot mapping, block tables)     */
    int64_t launch_ns;                   /* inside llama_decode (host: graph build, input
                                            uploads, kernel launches or graph replay; on the
                                            CPU backend the whole compute)                     */
    int64_t step_ns;                     /* the whole step, start to just before its outputs
                                            are published (>= prepare_ns + launch_ns)          */
    /* llama.cpp's graph reuse, since init (the warm-up decode included): a decode whose ggml
       graph has the previous one's topology reuses it (no graph build or allocation on the
       host; llm_graph_result::can_reuse), else the graph is built again:                       */
    int64_t num_llama_decodes;           /* llama_decode calls                                 */
    int64_t num_llama_graphs_reused;     /* ubatches that reused the previous graph
                                            (llama_perf_context's n_reused; a decode is one
                                            ubatch unless it has more than n_ubatch tokens)   */
    /* Swaps beside compute (paged mode; engine/swapper.h), since init. A sequence swapped in
       at step t joins the batch at step t + 1; a swap-out's device blocks are free from the
       next step on:                                                                            */
    int64_t num_swapped_in;              /* sequences swapped in (copies issued a step ahead)  */
    int64_t num_resumed;                 /* sequences that joined the batch the step after
                                            their swap-in                                      */
    int64_t num_deferred_seq_steps;      /* times a running sequence sat out a step because the
                                            blocks it needed were still being swapped out      */
    int64_t num_swaps_overlapped;        /* copy stream: swap batches (a step's swap-outs, its
                                            swap-ins) that the graph of the step issuing them
                                            did not wait for; 0 on llama.cpp's copies          */
    int64_t swap_overlapped_ns;          /* copy stream: device time of the swap batches issued
                                            without a wait by their step's graph, ns (copy
                                            time that could run beside compute)                */
    int64_t num_graphs_beside_copies;    /* copy stream: graph evaluations launched while such
                                            a swap batch was still running on the device       */
    int64_t num_graphs_overlapping_copies; /* copy stream, device timeline (CUDA events): graphs
                                            that began on the device before the swap batch
                                            beside them had ended                              */
    int64_t swap_compute_overlap_ns;     /* copy stream, device timeline: time such batches and
                                            the graphs beside them ran at once, ns             */
    /* KV streaming (cf_engine_config.kv_streaming; 0 when off), since init unless "now":        */
    int32_t kv_streaming;                /* 1 if on (resolved), else 0                         */
    int32_t kv_streamed_blocks;          /* host-resident blocks of running sequences now      */
    int64_t kv_stream_demotions;         /* blocks moved device -> host (in swap_out_bytes)     */
    int64_t kv_stream_promotions;        /* blocks moved host -> device (in swap_in_bytes)      */
    int64_t kv_staged_blocks;            /* blocks staged into the attention op, summed over
                                            decodes (each block once per decode, all layers)   */
    int64_t kv_staged_bytes;             /* their bytes (every layer's K and V rows)            */
    int64_t kv_staging_decodes;          /* llama_decode calls that staged at least one block  */
    int64_t kv_stream_cuda_wait_layers;  /* CUDA: layers whose attention waited for its staging
                                            copy (ggml-cuda's count; -1 unknown or the CPU)    */
    int64_t kv_stream_cuda_copy_ns;      /* CUDA: device time of the staging copies, ns; -1 on
                                            the CPU                                            */
    /* Async decode (paged mode; on by default for a model wholly on one CUDA device,
       CACHEFLOW_ASYNC_DECODE=0|1): a step's decode launched before the last step's tokens
       were read, its token ids taken on the device from that step's argmax                     */
    int64_t num_lookahead_decodes;       /* launched ahead                                     */
    int64_t num_lookahead_adopted;       /* of those, the step that followed was the one
                                            launched (the others were waited for and dropped)  */
} cf_engine_stats;

CF_API cf_status cf_engine_get_stats(cf_engine_t engine, cf_engine_stats * out_stats);

/* Time to first token (TTFT) by request priority, since init, under every policy. TTFT of a
 * request = the time its first output token was sampled - the time it was accepted (the
 * cf_output_event time_ns of its first token - arrival_ns), in ns; requests that end without a
 * token are not counted. One entry per priority value, for the first CF_TTFT_PRIORITIES_MAX
 * distinct values seen; requests of further values are not counted here. */
#define CF_TTFT_PRIORITIES_MAX 32

typedef struct cf_priority_ttft {
    int32_t priority;                    /* cf_engine_add_request's priority value             */
    int64_t num_requests;                /* requests of that priority with a first token        */
    int64_t ttft_sum_ns;                 /* sum of their TTFTs, ns (mean = sum / num_requests)  */
    int64_t ttft_max_ns;                 /* the largest of them, ns                             */
} cf_priority_ttft;

/* Copy the TTFT-by-priority table, ascending by priority, into out[0, min(capacity, n)), where
 * n = *out_num_priorities = the entries the engine holds (<= CF_TTFT_PRIORITIES_MAX, so an
 * array of that many always suffices; with a smaller one, call again with n). out is
 * caller-owned and may be NULL when capacity is 0. The table is the snapshot published with
 * cf_engine_get_stats at the end of each step. Returns CF_STATUS_INVALID_ARGUMENT (NULL engine
 * or out_num_priorities, capacity < 0, out NULL with capacity > 0; nothing written).
 * Thread-safe. */
CF_API cf_status cf_engine_get_ttft_by_priority(cf_engine_t engine, cf_priority_ttft * out, int32_t capacity,
                                                int32_t * out_num_priorities);

/* ---------------------------------------------------------------- requests */

#define CF_TOKEN_NONE (-1)
#define CF_SEED_RANDOM (-1)

/* Sampling parameters of one request. Pointers are read during cf_engine_add_request only
 * (the engine copies them). Validation errors name the field. */
typedef struct cf_sampling_params {
    int32_t max_tokens;                 /* >= 1: tokens to generate at most                  */
    float temperature;                  /* >= 0; 0 = greedy (argmax)                         */
    int32_t top_k;                      /* >= 0; 0 = disabled                                */
    float top_p;                        /* (0, 1]; 1 = disabled                              */
    float min_p;                        /* [0, 1]; 0 = disabled                              */
    int64_t seed;                       /* >= 0, or CF_SEED_RANDOM                           */
    const int32_t * stop_token_ids;     /* [num_stop_token_ids] int32, may be NULL if 0      */
    int32_t num_stop_token_ids;
    const char * const * stop_strings;  /* [num_stop_strings] UTF-8, may be NULL if 0        */
    int32_t num_stop_strings;
    int32_t ignore_eos;                 /* 1 = do not stop at end-of-generation tokens       */
    /* llama.cpp's penalties sampler over the last repeat_last_n tokens (prompt and output): */
    float repeat_penalty;               /* > 0; 1 = disabled                                 */
    int32_t repeat_last_n;              /* >= -1; 0 = disabled, -1 = the sequence's context  */
    float presence_penalty;             /* finite; 0 = disabled                              */
    float frequency_penalty;            /* finite; 0 = disabled                              */
    /* llama.cpp's logit-bias sampler: logit_bias_values[i] is added to the logit of token
     * logit_bias_token_ids[i] (-INFINITY bans it). Copied. */
    const int32_t * logit_bias_token_ids; /* [num_logit_bias], each in [0, n_vocab)          */
    const float * logit_bias_values;      /* [num_logit_bias], finite or -INFINITY           */
    int32_t num_logit_bias;
    /* A GBNF grammar (rule "root") the output must follow (llama.cpp's grammar sampler), or
     * NULL / "" for none; UTF-8, copied. An invalid grammar is CF_STATUS_INVALID_ARGUMENT. */
    const char * grammar;
    /* 1 = the request reuses cached prompt prefixes and leaves its blocks for others (the
     * default; needs enable_prefix_caching), 0 = it neither reads nor fills the prefix cache.
     * Not a sampling setting: it changes no output (the attention is invariant), only speed. */
    int32_t cache_prompt;
    /* Token probabilities (llama-server's n_probs, OpenAI's logprobs / top_logprobs), reported
     * with each output event (cf_output_event.num_logprobs): 1 = the log-probability of every
     * sampled token and of the top_logprobs most likely tokens at its position, 0 = none (the
     * default). A request with logprobs is sampled on the CPU from its logits row (not in-graph);
     * its tokens are the ones it would get without (greedy: the same argmax). */
    int32_t logprobs;
    int32_t top_logprobs;               /* >= 0: tokens listed besides the sampled one (capped at
                                           n_vocab; post_sampling_probs: at the candidates left);
                                           > 0 needs logprobs = 1                              */
    /* 0 = probabilities of the raw logits (softmax over the whole vocabulary, before any
     * sampler: llama-server's default); 1 = after the request's sampler chain (logit bias,
     * penalties, grammar, top_k, top_p, min_p, temperature: the distribution the token was drawn
     * from; tokens of probability 0 are left out; greedy: the sampled token, probability 1). */
    int32_t post_sampling_probs;
    /* 1 = report the prompt's progress (llama-server's return_progress): prompt progress events
     * (cf_output_event.prompt_progress) when the request is first scheduled, before any of its
     * prompt is computed, and after each step that computed a chunk of it; 0 = none (the
     * default). Changes no output. */
    int32_t return_progress;
    /* llama.cpp's reasoning-budget sampler (common/reasoning-budget.h; llama-server's
     * --reasoning-budget and reasoning_budget_tokens): at most reasoning_budget tokens inside a
     * reasoning block, which opens with the token sequence reasoning_start_tokens and closes
     * with reasoning_end_tokens (a closed block may open again, with a fresh budget). Once the
     * budget is spent, and the last token completed a UTF-8 character, the sampler forces
     * reasoning_forced_tokens (llama-server: --reasoning-budget-message's tokens, then the end
     * sequence) one token per step. -1 = no budget (the default; the arrays are then ignored),
     * 0 = the block closes as soon as it opens. reasoning_prefill_tokens: what the prompt
     * already holds of the answer (the chat template's generation prompt, e.g. an opened
     * <think>), fed to the sampler before the first token so that it knows the block is open.
     * Arrays copied; ids in [0, n_vocab). A request with a budget is sampled on the CPU from its
     * whole logits row (the forced token need not be among the likeliest). */
    int32_t reasoning_budget;                   /* >= -1                                      */
    const int32_t * reasoning_start_tokens;     /* [num_reasoning_start_tokens], >= 1 of them
                                                   when reasoning_budget >= 0                  */
    int32_t num_reasoning_start_tokens;
    const int32_t * reasoning_end_tokens;       /* [num_reasoning_end_tokens], likewise >= 1  */
    int32_t num_reasoning_end_tokens;
    const int32_t * reasoning_forced_tokens;    /* [num_reasoning_forced_tokens], likewise    */
    int32_t num_reasoning_forced_tokens;
    const int32_t * reasoning_prefill_tokens;   /* [num_reasoning_prefill_tokens], may be NULL
                                                   if 0                                        */
    int32_t num_reasoning_prefill_tokens;
    /* llama.cpp's DRY sampler ("don't repeat yourself", llama-server's dry_*): a token that
     * would extend a sequence already seen in the last dry_penalty_last_n tokens (prompt and
     * output) by more than dry_allowed_length tokens gets
     * dry_multiplier * dry_base ^ (length - dry_allowed_length) subtracted from its logit.
     * A repetition does not reach back over a sequence breaker (a text; the tokens that spell
     * it), and a single-token breaker is never penalised. Runs after the penalties, so it acts
     * on greedy requests too. */
    float dry_multiplier;               /* finite; 0 = disabled (the default)                */
    float dry_base;                     /* finite, >= 1; default 1.75                        */
    int32_t dry_allowed_length;         /* >= 0; default 2                                   */
    int32_t dry_penalty_last_n;         /* >= -1; 0 = disabled, -1 = the sequence's context;
                                           default 64                                        */
    const char * const * dry_sequence_breakers; /* [num_dry_sequence_breakers] non-empty UTF-8
                                           strings, copied; default: "\n", ":", "\"", "*"
                                           (a static array); 0 of them = no breakers         */
    int32_t num_dry_sequence_breakers;
    /* llama.cpp's XTC sampler ("exclude top choices"): with probability xtc_probability per
     * token, every candidate whose probability is >= xtc_threshold is removed except the least
     * likely of them (none when fewer than two are). Runs before the temperature, so it acts
     * on greedy requests too (the argmax of what it leaves); seeded with seed. */
    float xtc_probability;              /* [0, 1]; 0 = disabled (the default)                */
    float xtc_threshold;                /* [0, 1]; > 0.5 disables it; default 0.1            */
    /* llama.cpp's locally typical sampler: keeps the tokens whose surprise is closest to the
     * distribution's entropy, up to a cumulative probability of typical_p. It may drop the
     * most likely token, so it acts on greedy requests too. */
    float typical_p;                    /* finite; >= 1 = disabled (the default 1)           */
    /* Mirostat (llama.cpp's mirostat samplers): 1 = Mirostat, 2 = Mirostat 2.0, 0 = off (the
     * default). As llama-server, Mirostat replaces the chain after the logit bias and the
     * grammar with temperature -> mirostat: the penalties, DRY, top_n_sigma, top_k,
     * typical_p, top_p, min_p, XTC and the dynamic temperature are not applied. Greedy
     * requests (temperature 0) stay greedy. Seeded with seed. */
    int32_t mirostat;                   /* 0, 1 or 2                                         */
    float mirostat_tau;                 /* finite: target entropy (surprise); default 5      */
    float mirostat_eta;                 /* finite: learning rate; default 0.1                */
    /* Dynamic temperature (llama.cpp's temp_ext): with dynatemp_range > 0 the temperature of
     * each token is in [max(0, temperature - range), temperature + range], higher for a flatter
     * distribution: min + (max - min) * (entropy / max entropy) ^ dynatemp_exponent. Applies
     * to sampled requests only (temperature > 0). */
    float dynatemp_range;               /* finite; <= 0 = disabled (the default 0)           */
    float dynatemp_exponent;            /* finite; default 1                                 */
    /* llama.cpp's top-n-sigma sampler: keeps the tokens whose logit is within top_n_sigma
     * standard deviations of the largest (sampled requests only: it always keeps the argmax). */
    float top_n_sigma;                  /* finite; <= 0 = disabled (the default -1)          */
    /* The fewest candidates top_p, min_p, typical_p and XTC leave (llama-server's min_keep);
     * 0 and 1 both mean at least one. */
    int32_t min_keep;                   /* >= 0; default 0                                   */
} cf_sampling_params;

/* Defaults: max_tokens 16, temperature 0 (greedy), top_k 0, top_p 1, min_p 0, seed random,
 * no penalties (repeat 1, last_n 64, presence 0, frequency 0), no logit bias, no grammar,
 * cache_prompt 1, no logprobs (logprobs 0, top_logprobs 0, post_sampling_probs 0), no prompt
 * progress (return_progress 0), no reasoning budget (reasoning_budget -1), and llama-server's
 * defaults of its other samplers, all off: DRY (multiplier 0, base 1.75, allowed length 2,
 * last_n 64, breakers "\n" ":" "\"" "*"), XTC (probability 0, threshold 0.1), typical_p 1,
 * mirostat 0 (tau 5, eta 0.1), dynatemp_range 0 (exponent 1), top_n_sigma -1, min_keep 0.
 * The chain, in llama-server's order: [reasoning budget] [logit bias] [penalties] [DRY]
 * [grammar] [top_n_sigma] [top_k] [typical_p] [top_p] [min_p] [XTC] temperature (dynamic
 * with dynatemp_range) and the draw (mirostat: see above). A request with a penalty, a
 * grammar, a reasoning budget or one of DRY, XTC, typical_p, mirostat, dynamic temperature,
 * top_n_sigma or min_keep > 1 is sampled on the CPU from its whole logits row (greedy: the
 * argmax after those samplers that can change it: penalties, DRY, XTC, typical_p); other
 * rows, a logit bias included, keep the in-graph samplers. */
CF_API cf_sampling_params cf_sampling_params_default(void);

/* Checks every rule of cf_sampling_params that does not need a model, with the messages
 * cf_engine_add_request gives (token ids are checked against the vocabulary when a request is
 * added). Returns CF_STATUS_OK or CF_STATUS_INVALID_ARGUMENT (message: cf_last_error). The
 * Python SamplingParams calls it on construction, so bad values fail where they are written. */
CF_API cf_status cf_sampling_params_check(const cf_sampling_params * params);

typedef enum cf_finish_reason {
    CF_FINISH_REASON_NONE = 0,    /* still running                                          */
    CF_FINISH_REASON_STOP = 1,    /* end-of-generation token, stop token or stop string     */
    CF_FINISH_REASON_LENGTH = 2,  /* max_tokens reached or the sequence's context is full   */
    CF_FINISH_REASON_ABORT = 3,   /* cf_engine_abort_request                                */
    CF_FINISH_REASON_ERROR = 4    /* the engine could not continue this request             */
} cf_finish_reason;

/* Queue a request. prompt_tokens: [num_prompt_tokens] int32 token ids (copied), each in
 * [0, n_vocab). priority: smaller runs first under CF_SCHED_POLICY_PRIORITY (ignored otherwise).
 * On success *out_request_id is a new id (> 0, never reused by this engine).
 * Returns CF_STATUS_INVALID_ARGUMENT (empty prompt, token out of range, bad sampling field),
 * CF_STATUS_PROMPT_TOO_LONG (num_prompt_tokens >= n_ctx_per_seq), CF_STATUS_SHUTDOWN.
 * A failed call queues nothing and does not affect other requests. Thread-safe. */
CF_API cf_status cf_engine_add_request(cf_engine_t engine, const int32_t * prompt_tokens,
                                       int32_t num_prompt_tokens, const cf_sampling_params * params,
                                       int32_t priority, int64_t * out_request_id);

/* One request of cf_engine_add_requests; fields as the arguments of cf_engine_add_request. */
typedef struct cf_request {
    const int32_t * prompt_tokens;       /* [num_prompt_tokens] int32 (copied)                */
    int32_t num_prompt_tokens;
    const cf_sampling_params * params;   /* read during the call only                         */
    int32_t priority;
    /* >= 0: the next num_forks requests of the call are further choices of this one (OpenAI n):
     * the same prompt tokens and priority, num_forks 0, their own sampling parameters. In paged
     * mode they share this request's prompt KV: it computes its prompt up to the last token,
     * then each choice forks its blocks (copy-on-write) and computes only that last token, so
     * each samples independently from its own logits. A choice that cannot be admitted then
     * (no free sequence or block) computes its prompt itself; so do all in the stock modes.
     * 0 = none (a zero-initialised cf_request is a plain request). */
    int32_t num_forks;
} cf_request;

/* Queue num_requests requests at once: all are validated first, then all are queued together,
 * so the step that admits the first sees every one of them (an offline batch is scheduled as a
 * whole, independent of thread timing). out_request_ids: [num_requests], filled on success with
 * new ids in request order. Errors as cf_engine_add_request, the message prefixed with
 * "request i: ", and CF_STATUS_INVALID_ARGUMENT for a num_forks out of range or a choice whose
 * prompt, priority or num_forks do not match (cf_request.num_forks); a failed call queues none
 * of them. num_requests 0 is a no-op. Thread-safe. */
CF_API cf_status cf_engine_add_requests(cf_engine_t engine, const cf_request * requests, int32_t num_requests,
                                        int64_t * out_request_ids);

/* Abort a waiting or running request: its KV is freed before the next step and a final event
 * with CF_FINISH_REASON_ABORT is queued. Returns CF_STATUS_NOT_FOUND if the id is unknown or
 * already finished (nothing changes). Thread-safe. */
CF_API cf_status cf_engine_abort_request(cf_engine_t engine, int64_t request_id);

/* ---------------------------------------------------------------- stepping and outputs */

/* One output event. A request produces one event per generated token, in order; the last
 * event of a request has finish_reason != CF_FINISH_REASON_NONE (it may also carry the last
 * token, or token_id == CF_TOKEN_NONE for abort/error). The timing fields marked "final" are
 * set on the last event only (0 elsewhere), and on prompt progress events.
 *
 * Prompt progress (only for a request with cf_sampling_params.return_progress = 1): events
 * with prompt_progress = 1, token_id CF_TOKEN_NONE, finish_reason CF_FINISH_REASON_NONE, no text
 * and no probabilities. The first is queued when the request is first scheduled, before the
 * decode of that step (num_prompt_processed = num_cached_tokens); then one after each step that
 * computed a chunk of its prompt, ahead of that step's token event (num_prompt_processed = prompt
 * tokens in its KV after the step). num_prompt_processed strictly increases from event to event
 * and the last one equals num_prompt_tokens. A preemption does not repeat them: after it, a
 * progress event comes only when the recomputed prompt passes what was already reported.
 * On these events time_ns is when the step began (the first) or ended its decode (the others),
 * and first_scheduled_ns, num_prompt_tokens and num_cached_tokens are set.
 *
 * Text: the engine detokenizes the output incrementally (special tokens render as nothing) and
 * applies the stop strings itself. Each event carries the text its token released: whole UTF-8
 * characters only (a character split across tokens is held back until complete) and never a
 * stop string or what could still become one (held back until it cannot). A stop string ends
 * the request with CF_FINISH_REASON_STOP and is not part of the text, nor is anything after it,
 * even inside the same token. The final event releases whatever is still held (a character cut
 * at the end as U+FFFD). So the concatenated text of a request's events is its whole output
 * text, streamed or not. The bytes are in the text buffer of cf_engine_drain_outputs. */
typedef struct cf_output_event {
    int64_t request_id;
    int32_t token_id;             /* CF_TOKEN_NONE if this event carries no token            */
    int32_t finish_reason;        /* cf_finish_reason                                        */
    int64_t time_ns;              /* when the token was sampled (cf_clock_ns clock)          */
    int64_t arrival_ns;           /* final: when cf_engine_add_request accepted it           */
    int64_t first_scheduled_ns;   /* final: first step that computed any of its tokens       */
    int32_t num_prompt_tokens;    /* final                                                   */
    int32_t num_cached_tokens;    /* final: prompt tokens reused from the prefix cache       */
    int32_t num_output_tokens;    /* final: tokens generated                                 */
    int32_t num_preemptions;      /* final                                                   */
    int32_t slot_id;              /* the slot the request runs in: an id in [0, max_num_seqs)
                                     that no other running request holds (llama-server's
                                     id_slot); taken when it is first scheduled, given back
                                     when it finishes or is preempted (it may get another
                                     one when it resumes); CF_SLOT_ID_NONE if it never ran  */
    int32_t text_len;             /* bytes of UTF-8 text this event releases (may be 0)      */
    int64_t text_offset;          /* cf_engine_drain_outputs: where they start in its text
                                     buffer; cf_engine_drain: 0 (the text is not returned)  */
    int32_t stop_string_index;    /* final: index into the request's stop_strings of the one
                                     that ended it (CF_FINISH_REASON_STOP), else -1          */
    int32_t num_logprobs;         /* token probabilities of this event's token (the request
                                     set cf_sampling_params.logprobs): entry 0 is the sampled
                                     token, entries 1.. the most likely tokens in decreasing
                                     probability; 0 = none (not asked for, or no token)      */
    int64_t logprobs_offset;      /* cf_engine_drain_outputs: index of entry 0 in its
                                     logprobs buffer; else 0                                 */
    int32_t prompt_progress;      /* 1 = a prompt progress event (see above), else 0         */
    int32_t num_prompt_processed; /* progress events: prompt tokens in the request's KV
                                     (cached + computed), in [num_cached_tokens,
                                     num_prompt_tokens]; 0 on other events                   */
    int32_t error_len;            /* final event of a request that ended with
                                     CF_FINISH_REASON_ERROR because of itself (its grammar
                                     left no token to sample, or with KV streaming on it
                                     needed more KV blocks than the device pool and
                                     kv_stream_blocks give it): bytes of the UTF-8 reason,
                                     which follow this event's text in the text buffer
                                     (cf_engine_drain_outputs; not returned by
                                     cf_engine_drain); 0 otherwise (an engine failure that
                                     ended every request says why in the log)               */
} cf_output_event;

/* One token probability of cf_output_event: the natural log of the token's probability (<= 0;
 * finite: a probability that underflows is reported as -FLT_MAX, as llama-server does). */
typedef struct cf_token_logprob {
    int32_t token_id;
    float logprob;
} cf_token_logprob;

#define CF_SLOT_ID_NONE (-1)

/* Run one scheduler step synchronously: schedule (decode tokens of running sequences plus
 * prefill chunks of waiting ones under max_num_batched_tokens), one llama_decode, sample,
 * queue output events. *out_num_scheduled_tokens = tokens computed (0 = nothing to do).
 * Must not be called while the step thread runs (CF_STATUS_INVALID_ARGUMENT then).
 * Returns CF_STATUS_DECODE_FAILED if llama_decode failed (the affected requests are finished
 * with CF_FINISH_REASON_ERROR; the engine stays usable). */
CF_API cf_status cf_engine_step(cf_engine_t engine, int32_t * out_num_scheduled_tokens);

/* Start / stop the engine's own step thread, which steps whenever there is work and sleeps
 * otherwise. start on a started engine and stop on a stopped one are no-ops. stop waits for the
 * current step to finish; requests stay queued. */
CF_API cf_status cf_engine_start(cf_engine_t engine);
CF_API cf_status cf_engine_stop(cf_engine_t engine);

/* Move up to capacity queued events into events[0..*out_num_events), oldest first. If none is
 * queued, wait up to timeout_ms (0 = do not wait, < 0 = wait until one arrives or the engine
 * is freed/stopped). events: caller-owned [capacity] array. The events' text is dropped
 * (text_offset 0; text_len says how much there was), and so are their token probabilities
 * (logprobs_offset 0; num_logprobs says how many): use cf_engine_drain_outputs for them.
 * Thread-safe; the GIL is released by cffi during the wait. */
CF_API cf_status cf_engine_drain(cf_engine_t engine, cf_output_event * events, int32_t capacity,
                                 int32_t timeout_ms, int32_t * out_num_events);

/* As cf_engine_drain, and the events' text and token probabilities. Event i's bytes are
 * text[events[i].text_offset, events[i].text_offset + events[i].text_len), packed in event order
 * into the caller-owned text[0..text_capacity); *out_text_len = bytes written. Its probabilities
 * are logprobs[events[i].logprobs_offset, + events[i].num_logprobs), packed the same way into the
 * caller-owned logprobs[0..logprobs_capacity); *out_num_logprobs = entries written. logprobs may
 * be NULL (with logprobs_capacity 0): the probabilities are then dropped (logprobs_offset 0,
 * num_logprobs still says how many there were). Stops before the first event whose text or
 * probabilities do not fit (it stays queued). Returns CF_STATUS_BUFFER_TOO_SMALL (nothing taken,
 * *out_text_len and *out_num_logprobs = what the oldest event needs) when not even the oldest
 * event fits; CF_STATUS_INVALID_ARGUMENT for a NULL pointer (but logprobs), capacity < 1,
 * text_capacity < 0 or logprobs_capacity < 0. Thread-safe; blocks like cf_engine_drain. */
CF_API cf_status cf_engine_drain_outputs(cf_engine_t engine, cf_output_event * events, int32_t capacity,
                                         char * text, int32_t text_capacity, cf_token_logprob * logprobs,
                                         int32_t logprobs_capacity, int32_t timeout_ms,
                                         int32_t * out_num_events, int32_t * out_text_len,
                                         int32_t * out_num_logprobs);

/* 1 if any request is waiting or running (work remains), else 0. */
CF_API int32_t cf_engine_has_work(cf_engine_t engine);

/* ---------------------------------------------------------------- text */

/* Tokenize UTF-8 text[0..text_len) into tokens[0..capacity).
 * add_special: add BOS/EOS as the model's tokenizer wants. parse_special: treat special token
 * text such as "<|im_start|>" as special tokens. *out_num_tokens = tokens produced, or the
 * needed capacity with CF_STATUS_BUFFER_TOO_SMALL. Thread-safe. */
CF_API cf_status cf_engine_tokenize(cf_engine_t engine, const char * text, int32_t text_len,
                                    int32_t add_special, int32_t parse_special, int32_t * tokens,
                                    int32_t capacity, int32_t * out_num_tokens);

/* Detokenize tokens[0..num_tokens) into buf[0..capacity) (not NUL-terminated).
 * remove_special: drop BOS/EOS. unparse_special: render special tokens as text.
 * *out_len = bytes written, or the needed capacity with CF_STATUS_BUFFER_TOO_SMALL.
 * A token id out of range gives CF_STATUS_INVALID_ARGUMENT. Thread-safe. */
CF_API cf_status cf_engine_detokenize(cf_engine_t engine, const int32_t * tokens, int32_t num_tokens,
                                      int32_t remove_special, int32_t unparse_special, char * buf,
                                      int32_t capacity, int32_t * out_len);

/* The model's end-of-generation tokens (llama_vocab_is_eog: EOS, EOT, <|im_end|>, ...), in
 * increasing id order, into tokens[0..capacity) (caller-owned int32 array); *out_num_tokens =
 * tokens written, or the needed capacity with CF_STATUS_BUFFER_TOO_SMALL. What llama-server
 * bans with a -INFINITY logit bias for ignore_eos. Returns CF_STATUS_INVALID_ARGUMENT for a NULL
 * engine or out_num_tokens, or tokens NULL with capacity > 0. Thread-safe. */
CF_API cf_status cf_engine_eog_tokens(cf_engine_t engine, int32_t * tokens, int32_t capacity,
                                      int32_t * out_num_tokens);

/* Apply a chat template to num_messages messages (roles[i], contents[i], UTF-8) and write the
 * prompt text to buf[0..capacity) (not NUL-terminated). tmpl: a template name or Jinja text
 * understood by llama_chat_apply_template, or NULL for the model's own template.
 * add_assistant: end with the assistant turn opener. *out_len = bytes written, or the needed
 * capacity with CF_STATUS_BUFFER_TOO_SMALL. CF_STATUS_UNSUPPORTED if the template is unknown or
 * the model has none. Thread-safe. */
CF_API cf_status cf_engine_apply_chat_template(cf_engine_t engine, const char * tmpl,
                                               const char * const * roles,
                                               const char * const * contents, int32_t num_messages,
                                               int32_t add_assistant, char * buf, int32_t capacity,
                                               int32_t * out_len);

/* Convert a JSON schema to a GBNF grammar (rule "root") for cf_sampling_params.grammar, with
 * llama.cpp's own converter (common/json-schema-to-grammar.cpp, as llama-server's `json_schema`
 * and `response_format` do). schema: UTF-8 JSON text schema[0..schema_len); an empty object {}
 * means any JSON object. The grammar is written to buf[0..capacity) (caller-owned, not
 * NUL-terminated); *out_len = bytes written, or the needed capacity with
 * CF_STATUS_BUFFER_TOO_SMALL (call again with a larger buffer).
 * Returns CF_STATUS_INVALID_ARGUMENT for a NULL pointer or a negative length, and for a schema
 * the converter cannot use: the message starts with "json_schema: " and says why (not valid
 * JSON, or the converter's reason, e.g. an unknown "type"). On failure buf holds nothing useful.
 * Needs no engine; thread-safe. */
CF_API cf_status cf_json_schema_to_grammar(const char * schema, int32_t schema_len, char * buf,
                                           int32_t capacity, int32_t * out_len);

/* ---------------------------------------------------------------- KV cache sizing */

/* The KV rows (llama.cpp's n_ctx) a cache of kv_cache_bytes gets, as cf_engine_init sizes it from
 * cf_engine_config.kv_cache_bytes, for a model whose KV row (K and V of every layer, one token) takes
 * kv_bytes_per_token bytes (cf_model_info.kv_bytes_per_token). llama.cpp pads to multiples of 256
 * rows, so the budget is rounded down to whole multiples; kv_mode CF_KV_MODE_STOCK (split mode)
 * rounds each of max_num_seqs slices and needs 256 rows per sequence; any other kv_mode (the paged
 * pool, the unified stream) needs at least 256 rows and one per sequence. *out_n_ctx = the rows, and
 * *out_min_rows = the fewest rows that would do (either may be NULL). Returns
 * CF_STATUS_INVALID_ARGUMENT for kv_cache_bytes < 0, kv_bytes_per_token < 1 or max_num_seqs < 1, and
 * when the budget holds fewer rows than that (then *out_n_ctx = 0; the message gives rows and need).
 * Needs no engine; thread-safe. */
CF_API cf_status cf_kv_cache_rows_for_budget(int64_t kv_cache_bytes, int64_t kv_bytes_per_token, int32_t kv_mode,
                                             int32_t max_num_seqs, int64_t * out_n_ctx, int64_t * out_min_rows);

/* ---------------------------------------------------------------- profiler */

/* With cf_engine_config.profile_capacity > 0 the engine records timestamped events into a ring
 * buffer of that many events, allocated once at init: no allocation and no lock per event (the
 * stepping thread records while it holds the step anyway). When the ring is full new events are
 * dropped and counted; drain regularly (every few hundred steps at most) to lose none.
 * All times are cf_clock_ns() nanoseconds, the clock of cf_output_event.time_ns. */

typedef enum cf_profile_event_kind {
    CF_PROFILE_EVENT_NONE = 0,
    CF_PROFILE_EVENT_STEP_BEGIN = 1,               /* a step that computes tokens begins         */
    CF_PROFILE_EVENT_STEP_END = 2,                 /* done; recorded before its outputs are queued */
    CF_PROFILE_EVENT_REQUEST_ARRIVAL = 3,          /* cf_engine_add_request accepted it          */
    CF_PROFILE_EVENT_REQUEST_FIRST_SCHEDULED = 4,  /* first step that computes any of its tokens */
    CF_PROFILE_EVENT_REQUEST_FIRST_TOKEN = 5,      /* its first output token was sampled         */
    CF_PROFILE_EVENT_REQUEST_FINISH = 6,           /* its final output event was queued          */
    CF_PROFILE_EVENT_REQUEST_PREEMPT = 7,          /* preempted (paged: KV blocks freed; it waits
                                                      and recomputes); num_tokens = its tokens   */
    CF_PROFILE_EVENT_REQUEST_SWAP_OUT = 8,         /* preempted by swap: KV blocks to host memory */
    CF_PROFILE_EVENT_REQUEST_SWAP_IN = 9,          /* swapped in: KV blocks copied back           */
    CF_PROFILE_EVENT_REQUEST_PREFIX_HIT = 10,      /* prompt tokens found in the prefix cache    */
    CF_PROFILE_EVENT_REQUEST_PRIORITY_PREEMPT = 11, /* the reason of the PREEMPT or SWAP_OUT event
                                                      just before it: room for a more urgent
                                                      request (priority policy), not blocks    */
    CF_PROFILE_EVENT_REQUEST_KV_DEMOTE = 12,       /* KV streaming: blocks of it moved to host
                                                      slots (it keeps running)                 */
    CF_PROFILE_EVENT_REQUEST_KV_PROMOTE = 13       /* KV streaming: host-resident blocks of it
                                                      moved back into device blocks            */
} cf_profile_event_kind;

/* One profiler event. Fields a kind does not list are 0.
 *   STEP_BEGIN:  num_seqs, num_decode_tokens, num_prefill_tokens (the batch of this step).
 *   STEP_END:    num_waiting (requests not admitted after the step), kv_tokens_used (KV rows
 *                holding a token; paged: device rows, a block shared by the prefix cache or a
 *                fork counted once), kv_tokens_free (KV rows not set aside for any running
 *                sequence: n_ctx - reserved), kv_blocks_used (paged mode; 0 in stock modes),
 *                num_tokens (KV rows attended: the running sequences' computed tokens, a shared
 *                row once per holder).
 *   REQUEST_ARRIVAL:          request_id, num_tokens = prompt tokens. Recorded by the first step
 *                             after the call, stamped with the time the call accepted it, so
 *                             events are not always in time order: sort by time_ns.
 *   REQUEST_FIRST_SCHEDULED:  request_id, num_tokens = tokens computed in that step.
 *   REQUEST_FIRST_TOKEN:      request_id, num_tokens = 1.
 *   REQUEST_FINISH:           request_id, num_tokens = output tokens, finish_reason.
 *   REQUEST_PREFIX_HIT:       request_id, num_tokens = prompt tokens found in the prefix cache
 *                             (recorded with FIRST_SCHEDULED, when there were any).
 *   REQUEST_PREEMPT / SWAP_* (reserved): request_id, num_tokens (tokens recomputed), num_bytes
 *                             (bytes copied).
 *   REQUEST_PRIORITY_PREEMPT: request_id (the victim), num_tokens = its tokens; recorded right
 *                             after its PREEMPT or SWAP_OUT event (same step and time).
 *   REQUEST_KV_DEMOTE / KV_PROMOTE: request_id, num_tokens = KV rows moved (blocks x block_size),
 *                             num_bytes = bytes copied (every layer's K and V rows); one event per
 *                             request, step and direction, at the step's start (the copies run
 *                             with that step).
 * step_id = cf_engine_stats.num_steps when the event was recorded: the 1-based number of the
 * step it belongs to, or of the previous step for events recorded while a step reads its inbox
 * (arrivals, aborts), before it begins. */
typedef struct cf_profile_event {
    int64_t time_ns;
    int64_t step_id;
    int64_t request_id;           /* request events; 0 for step events                      */
    int64_t num_bytes;
    int32_t kind;                 /* cf_profile_event_kind                                  */
    int32_t num_seqs;
    int32_t num_decode_tokens;
    int32_t num_prefill_tokens;
    int32_t num_waiting;
    int32_t kv_tokens_used;
    int32_t kv_tokens_free;
    int32_t kv_blocks_used;
    int32_t num_tokens;
    int32_t finish_reason;        /* cf_finish_reason                                       */
} cf_profile_event;

/* Move up to capacity recorded events, in the order they were recorded, into
 * events[0..*out_num_events) (caller-owned [capacity] array); does not wait.
 * *out_num_dropped = events dropped so far because the ring was full (cumulative since init);
 * out_num_dropped may be NULL.
 * Returns CF_STATUS_INVALID_ARGUMENT (NULL engine, events or out_num_events, capacity < 1),
 * CF_STATUS_UNSUPPORTED (the engine was created with profile_capacity 0); on failure
 * *out_num_events is 0 and nothing is taken. Thread-safe (concurrent drains each get distinct
 * events); never blocks the step. */
CF_API cf_status cf_engine_profile_drain(cf_engine_t engine, cf_profile_event * events,
                                         int32_t capacity, int32_t * out_num_events,
                                         int64_t * out_num_dropped);

/* ---- block manager (paged KV bookkeeping; used by tests and tools) */

/* A block manager owns a pool of num_blocks KV blocks of block_size tokens each and one block
 * table per sequence; it only does bookkeeping (no tensors). Token pos of a sequence lives in
 * block table[pos / block_size] at slot block_id * block_size + pos % block_size. Blocks are
 * ref-counted: after cf_block_manager_fork parent and child share them. Appending to a shared,
 * partially filled last block first moves the sequence to a fresh block and records a copy
 * (src, dst) that the executor performs before writing that step's slots (copy-on-write).
 * The free list is FIFO: the block freed longest ago is allocated first.
 *
 * Sequence ids are chosen by the caller (>= 0, e.g. request ids). A sequence exists from its
 * first cf_block_manager_append_slots (or cf_block_manager_fork) until cf_block_manager_free_seq.
 *
 * Every failed call leaves the manager unchanged. Threading: one manager is not thread-safe;
 * the caller serializes calls on it. Distinct managers are independent. */

#define CF_BLOCK_ID_NONE (-1) /* pads exported block tables; never a valid block id */

typedef struct cf_block_manager * cf_block_manager_t;

/* Create a manager with num_blocks free blocks (>= 1) of block_size tokens each (>= 1);
 * num_blocks * block_size must fit int32_t (it bounds the slot ids).
 * Ownership: on success *out_mgr is a new manager the caller frees with cf_block_manager_free.
 * Returns CF_STATUS_INVALID_ARGUMENT (a size out of range or out_mgr NULL; the message names
 * it), CF_STATUS_OUT_OF_MEMORY (host allocation failed). On failure *out_mgr is set to NULL
 * (when out_mgr is not NULL) and nothing leaks. Thread-safe. */
CF_API cf_status cf_block_manager_init(int32_t num_blocks, int32_t block_size,
                                       cf_block_manager_t * out_mgr);

/* Free the manager, its tables and pending copies. NULL is a no-op. */
CF_API void cf_block_manager_free(cf_block_manager_t mgr);

/* *out_num_free_blocks = blocks in the free list, in [0, num_blocks].
 * Returns CF_STATUS_INVALID_ARGUMENT for a NULL argument. */
CF_API cf_status cf_block_manager_num_free_blocks(cf_block_manager_t mgr,
                                                  int32_t * out_num_free_blocks);

/* *out_can_allocate = 1 if cf_block_manager_append_slots(mgr, seq_id, num_new_tokens, ...)
 * would succeed now, else 0; counts the copy-on-write block if one is due. An unknown seq_id
 * counts as an empty sequence. Does not change the manager.
 * Returns CF_STATUS_INVALID_ARGUMENT (seq_id < 0, num_new_tokens < 0, a NULL pointer). */
CF_API cf_status cf_block_manager_can_allocate(cf_block_manager_t mgr, int64_t seq_id,
                                               int32_t num_new_tokens, int32_t * out_can_allocate);

/* Give the next num_new_tokens tokens of seq_id (positions [num_tokens, num_tokens +
 * num_new_tokens) of the sequence) one KV slot each, allocating blocks as needed; an unknown
 * seq_id is created (num_new_tokens 0 only creates it). slot_mapping: caller-owned
 * [capacity] int32 array; on success slot_mapping[0, num_new_tokens) holds the slot ids.
 * *out_num_cow = copies recorded by this call (0 or 1; collect them with
 * cf_block_manager_take_copies). out_num_cow may be NULL.
 * Returns CF_STATUS_INVALID_ARGUMENT (seq_id < 0, num_new_tokens < 0, a NULL pointer),
 * CF_STATUS_BUFFER_TOO_SMALL (capacity < num_new_tokens), CF_STATUS_OUT_OF_MEMORY (not enough
 * free blocks; the message says how many are needed and free). All-or-nothing: after any
 * failure no block is allocated, no copy recorded and seq_id is not created. Not thread-safe. */
CF_API cf_status cf_block_manager_append_slots(cf_block_manager_t mgr, int64_t seq_id,
                                               int32_t num_new_tokens, int32_t * slot_mapping,
                                               int32_t capacity, int32_t * out_num_cow);

/* Move the pending copy-on-write copies, oldest first, into src_block_ids[0, n) and
 * dst_block_ids[0, n) (caller-owned [capacity] int32 arrays), n = *out_num_copies. The executor
 * copies every row of each src block into its dst block, in order, before writing the slots of
 * the step that recorded them. Returns CF_STATUS_INVALID_ARGUMENT (a NULL pointer, capacity < 0),
 * CF_STATUS_BUFFER_TOO_SMALL (capacity < pending copies; *out_num_copies = the number pending,
 * none is taken). Not thread-safe. */
CF_API cf_status cf_block_manager_take_copies(cf_block_manager_t mgr, int32_t * src_block_ids,
                                              int32_t * dst_block_ids, int32_t capacity,
                                              int32_t * out_num_copies);

/* Create child_seq_id sharing every block of parent_seq_id (ref counts + 1) and its token
 * count; allocates nothing, so it cannot run out of blocks.
 * Returns CF_STATUS_INVALID_ARGUMENT (an id < 0, child == parent, child already exists),
 * CF_STATUS_NOT_FOUND (unknown parent). Nothing changes on failure. Not thread-safe. */
CF_API cf_status cf_block_manager_fork(cf_block_manager_t mgr, int64_t parent_seq_id,
                                       int64_t child_seq_id);

/* Drop seq_id's table; blocks whose ref count reaches 0 return to the free list, last block
 * first. Pending copies stay pending. Returns CF_STATUS_INVALID_ARGUMENT (NULL mgr),
 * CF_STATUS_NOT_FOUND (unknown seq_id; nothing changes). Not thread-safe. */
CF_API cf_status cf_block_manager_free_seq(cf_block_manager_t mgr, int64_t seq_id);

/* Write seq_id's block table into block_ids[0, capacity) (caller-owned int32 array): block ids
 * in token order, then CF_BLOCK_ID_NONE up to capacity. *out_num_blocks = blocks the sequence
 * holds (ceil(num_tokens / block_size)). Returns CF_STATUS_INVALID_ARGUMENT (a NULL pointer,
 * capacity < 0), CF_STATUS_NOT_FOUND (unknown seq_id), CF_STATUS_BUFFER_TOO_SMALL (capacity <
 * blocks held; *out_num_blocks = blocks held, block_ids untouched). Does not change the manager. */
CF_API cf_status cf_block_manager_block_table(cf_block_manager_t mgr, int64_t seq_id,
                                              int32_t * block_ids, int32_t capacity,
                                              int32_t * out_num_blocks);

/* *out_ref_count = holders of block_id (0 = free). Returns CF_STATUS_INVALID_ARGUMENT (a NULL
 * pointer, block_id outside [0, num_blocks)). Does not change the manager. */
CF_API cf_status cf_block_manager_ref_count(cf_block_manager_t mgr, int32_t block_id,
                                            int32_t * out_ref_count);

/* Check every invariant: free + used == total blocks, free blocks have ref count 0, each ref
 * count equals the number of tables holding the block, each table holds
 * ceil(num_tokens / block_size) blocks, holders of a shared block agree on its filled rows.
 * Returns CF_STATUS_OK, CF_STATUS_INVALID_ARGUMENT (NULL mgr) or CF_STATUS_INTERNAL with a
 * message describing the first violation found (a bug). O(num_blocks + blocks held). */
CF_API cf_status cf_block_manager_check_invariants(cf_block_manager_t mgr);

/* Write a human-readable dump (free list, ref counts, tables, pending copies) into
 * buf[0, capacity) (not NUL-terminated); *out_len = bytes written, or the needed capacity with
 * CF_STATUS_BUFFER_TOO_SMALL. Returns CF_STATUS_INVALID_ARGUMENT for a NULL pointer. */
CF_API cf_status cf_block_manager_dump(cf_block_manager_t mgr, char * buf, int32_t capacity,
                                       int32_t * out_len);

#ifdef __cplusplus
}
#endif

#endif /* CACHEFLOW_H */
