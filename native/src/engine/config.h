// config.h - validated engine configuration (copy of cf_engine_config with kv_mode resolved).
#pragma once

#include "cacheflow.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cf {

// llama.cpp's LLAMA_MAX_SEQ: its sequence ids (slots) are below this. The stock KV modes run at
// most this many sequences; paged mode has no such cap (batch_builder.h).
constexpr int32_t kLlamaMaxSeq = 256;
// cf_engine_config.sampling_threads: at most this many; 0 resolves to min(kAutoSamplingThreads,
// hardware threads / 2), at least 1.
constexpr int32_t kMaxSamplingThreads = 64;
constexpr int32_t kAutoSamplingThreads = 8;

struct EngineConfig {
    std::string model_path;
    int32_t n_ctx = 0;  // requested total KV rows; 0 = max_num_seqs * min(n_ctx_train, 2048)
    int32_t max_num_seqs = 16;
    int32_t max_num_batched_tokens = 512;
    int32_t n_threads = 0;  // 0 = default_thread_count() (resolved by from_c)
    int32_t n_gpu_layers = 0;
    cf_kv_mode kv_mode = CF_KV_MODE_STOCK;  // AUTO until LlamaSession resolves it (PAGED or STOCK)
    int32_t block_size = 16;
    cf_sched_policy policy = CF_SCHED_POLICY_FCFS;
    int32_t flash_attn = -1;
    cf_log_level log_level = CF_LOG_LEVEL_ERROR;
    int32_t profile_capacity = 0;  // profiler ring events; 0 = off
    int64_t kv_cache_bytes = 0;    // KV memory budget; 0 = from n_ctx (LlamaSession resolves it)
    cf_paged_attention paged_attention = CF_PAGED_ATTENTION_INVARIANT;  // paged mode CPU attention kernel
    bool enable_prefix_caching = true;  // paged mode: share cached prompt prefixes across requests
    cf_preemption_mode preemption_mode = CF_PREEMPTION_MODE_AUTO;  // paged mode (stock never preempts)
    int64_t swap_space_bytes = (int64_t) 4 << 30;  // paged mode: host memory for swapped-out blocks
    int32_t priority_aging_ms = 1000;              // PRIORITY policy aging, ms per level; 0 = off
    int32_t sampling_threads = 1;  // threads sampling top-k candidate rows (SamplingPool), resolved: >= 1
    // Device placement (engine/devices.h): "" = none / llama.cpp's default device list
    std::string rpc_servers;       // comma-separated "host:port" of rpc-server processes
    std::string devices;           // comma-separated device names, "none" = no offload device
    cf_split_mode split_mode = CF_SPLIT_MODE_LAYER;
    int32_t main_gpu = 0;          // split_mode none: index into the devices in use; -1 = none
    std::vector<float> tensor_split;  // proportions per device in use (finite, >= 0); empty = by free memory
    cf_kv_streaming kv_streaming = CF_KV_STREAMING_AUTO;  // resolved by LlamaSession (ON or OFF)
    int32_t kv_stream_blocks = 64;  // R (cacheflow.h)
    int32_t kv_stream_depth = 2;    // D, CUDA
    int32_t long_prefill_token_threshold = 0;  // resolved (cacheflow.h): 0 = off, else > 0

    bool kv_unified() const { return kv_mode == CF_KV_MODE_STOCK_UNIFIED; }
    bool paged() const { return kv_mode == CF_KV_MODE_PAGED; }

    // Validate; throws cf::Error (INVALID_ARGUMENT naming the field). Does not touch the model file,
    // so kv_mode AUTO stays AUTO until the model is loaded.
    static EngineConfig from_c(const cf_engine_config & config);
};

// The threads n_threads = 0 stands for: one per physical core of the process's affinity mask (config.cpp).
int32_t default_thread_count();
cf_engine_config default_engine_config();
cf_sampling_params default_sampling_params();

}  // namespace cf
