// config.cpp - defaults and validation of the engine configuration.
#include "engine/config.h"

#include "core/error.h"
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace cf {

namespace {

void check_range(const char * name, int32_t value, int32_t lo, int32_t hi) {
    if (value < lo || value > hi) {
        fail_invalid(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got " + std::to_string(value));
    }
}

void check_at_least(const char * name, int32_t value, int32_t lo) {
    if (value < lo) {
        fail_invalid(std::string(name) + " must be >= " + std::to_string(lo) + ", got " + std::to_string(value));
    }
}

int32_t resolve_sampling_threads(int32_t sampling_threads) {
    if (sampling_threads > 0) {
        return sampling_threads;
    }
    const int32_t half = (int32_t) std::thread::hardware_concurrency() / 2;
    return std::max(1, std::min(kAutoSamplingThreads, half));
}

cf_kv_mode resolve_kv_mode(int32_t kv_mode) {
    check_range("kv_mode", kv_mode, CF_KV_MODE_AUTO, CF_KV_MODE_PAGED);
    return (cf_kv_mode) kv_mode;  // AUTO: LlamaSession picks PAGED or STOCK once the model is loaded
}

// The device fields that can be checked without the backends (devices.cpp checks names and counts).
void check_devices(const cf_engine_config & c) {
    check_range("split_mode", c.split_mode, CF_SPLIT_MODE_NONE, CF_SPLIT_MODE_ROW);
    if (c.split_mode == CF_SPLIT_MODE_ROW) {
        // llama.cpp's row split needs a backend's split buffer type (ggml-cuda's), which keeps the KV cache
        // on the main device; neither the RPC backend nor the paged pools have one
        throw Error(CF_STATUS_UNSUPPORTED, "split_mode row is not supported (llama.cpp's row split needs ggml-cuda's "
                                           "split buffers, and the paged KV pools are per layer); use split_mode "
                                           "layer");
    }
    check_at_least("main_gpu", c.main_gpu, -1);
    check_range("num_tensor_split", c.num_tensor_split, 0, (int32_t) llama_max_devices());
    if (c.num_tensor_split > 0 && c.tensor_split == nullptr) {
        fail_invalid("tensor_split is NULL but num_tensor_split is " + std::to_string(c.num_tensor_split));
    }
    double sum = 0.0;
    for (int32_t i = 0; i < c.num_tensor_split; ++i) {
        const float value = c.tensor_split[i];
        if (!std::isfinite(value) || value < 0.0f) {
            fail_invalid("tensor_split[" + std::to_string(i) + "] must be a finite proportion >= 0, got " +
                         std::to_string(value));
        }
        sum += value;
    }
    if (c.num_tensor_split > 0 && sum <= 0.0) {
        fail_invalid("tensor_split proportions must not all be 0");
    }
}

}  // namespace

// n_threads = 0: one thread per physical core this process may run on. llama.cpp's default (no -t) counts physical
// cores too (common_cpu_get_num_math: SMT siblings share a core's vector units, so a second thread per core slows
// ggml's matrix kernels down); unlike it, this follows the affinity mask (taskset, cgroup cpusets) and does not leave
// out the E-cores of hybrid x86 CPUs; llama.cpp's explicit -t -1 means every logical CPU. On Linux: the CPUs of the
// affinity mask, one per distinct topology/thread_siblings_list (a CPU without one counts as its own core);
// elsewhere, or if the mask cannot be read (more than CPU_SETSIZE CPU ids), std::thread::hardware_concurrency().
// At most GGML_MAX_N_THREADS.
int32_t default_thread_count() {
    const int32_t logical = std::min((int32_t) std::max(1u, std::thread::hardware_concurrency()), GGML_MAX_N_THREADS);
#if defined(__linux__)
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
        return logical;
    }
    std::set<std::string> cores;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &mask)) {
            continue;
        }
        std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
        std::string siblings;
        if (!std::getline(f, siblings) || siblings.empty()) {
            siblings = "cpu" + std::to_string(cpu);  // no topology (some containers): a core of its own
        }
        cores.insert(siblings);
    }
    return cores.empty() ? logical : std::min((int32_t) cores.size(), GGML_MAX_N_THREADS);
#else
    return logical;
#endif
}

EngineConfig EngineConfig::from_c(const cf_engine_config & c) {
    if (c.model_path == nullptr || c.model_path[0] == '\0') {
        fail_invalid("model_path is required");
    }
    check_at_least("n_ctx", c.n_ctx, 0);
    check_at_least("max_num_seqs", c.max_num_seqs, 1);
    const bool stock = c.kv_mode == CF_KV_MODE_STOCK || c.kv_mode == CF_KV_MODE_STOCK_UNIFIED;
    if (stock && c.max_num_seqs > kLlamaMaxSeq) {
        fail_invalid("max_num_seqs must be <= " + std::to_string(kLlamaMaxSeq) + " with the stock KV cache "
                     "(llama.cpp's LLAMA_MAX_SEQ), got " + std::to_string(c.max_num_seqs) +
                     "; kv_mode=paged has no such limit");
    }
    check_at_least("max_num_batched_tokens", c.max_num_batched_tokens, 1);
    check_range("n_threads", c.n_threads, 0, GGML_MAX_N_THREADS);  // ggml's thread pool limit (512)
    check_at_least("n_gpu_layers", c.n_gpu_layers, -1);
    check_at_least("block_size", c.block_size, 1);
    check_range("policy", c.policy, CF_SCHED_POLICY_FCFS, CF_SCHED_POLICY_PRIORITY);
    check_range("flash_attn", c.flash_attn, -1, 1);
    check_range("log_level", c.log_level, CF_LOG_LEVEL_NONE, CF_LOG_LEVEL_DEBUG);
    check_at_least("profile_capacity", c.profile_capacity, 0);
    check_range("paged_attention", c.paged_attention, CF_PAGED_ATTENTION_INVARIANT, CF_PAGED_ATTENTION_GGML);
    check_range("enable_prefix_caching", c.enable_prefix_caching, 0, 1);
    check_range("preemption_mode", c.preemption_mode, CF_PREEMPTION_MODE_AUTO, CF_PREEMPTION_MODE_SWAP);
    if (c.priority_aging_ms < 0) {
        fail_invalid("priority_aging_ms must be >= 0, got " + std::to_string(c.priority_aging_ms));
    }
    check_range("sampling_threads", c.sampling_threads, 0, kMaxSamplingThreads);
    if (c.swap_space_bytes < 0) {
        fail_invalid("swap_space_bytes must be >= 0, got " + std::to_string(c.swap_space_bytes));
    }
    check_devices(c);
    check_range("kv_streaming", c.kv_streaming, CF_KV_STREAMING_AUTO, CF_KV_STREAMING_ON);
    check_range("kv_stream_blocks", c.kv_stream_blocks, 1, 65536);
    check_range("kv_stream_depth", c.kv_stream_depth, 1, 65536);
    check_at_least("long_prefill_token_threshold", c.long_prefill_token_threshold, -1);
    if (c.kv_streaming == CF_KV_STREAMING_ON && stock) {
        fail_invalid("kv_streaming=on needs the paged KV cache (kv_mode paged or auto)");
    }
    if (c.kv_streaming == CF_KV_STREAMING_ON && c.rpc_servers != nullptr && c.rpc_servers[0] != '\0') {
        fail_invalid("kv_streaming=on does not work with rpc_servers: the paged attention op of an rpc-server "
                     "cannot read the engine's host memory");
    }
    if (c.max_num_batched_tokens < c.max_num_seqs) {
        // every running sequence's decode token must fit one step (llama.cpp sizes its output
        // buffer by n_seq_max and aborts on a smaller n_batch)
        fail_invalid("max_num_batched_tokens (" + std::to_string(c.max_num_batched_tokens) +
                     ") must be at least max_num_seqs (" + std::to_string(c.max_num_seqs) + ")");
    }
    if (c.kv_cache_bytes < 0) {
        fail_invalid("kv_cache_bytes must be >= 0, got " + std::to_string(c.kv_cache_bytes));
    }
    if (c.kv_cache_bytes > 0 && c.n_ctx > 0) {
        fail_invalid("set n_ctx or kv_cache_bytes, not both (n_ctx=" + std::to_string(c.n_ctx) +
                     ", kv_cache_bytes=" + std::to_string(c.kv_cache_bytes) + ")");
    }
    if (c.n_ctx > 0 && c.n_ctx < c.max_num_seqs) {
        // llama.cpp sizes its per-step output buffer from n_ctx: fewer rows than sequences
        // would abort inside llama_decode instead of failing here.
        fail_invalid("n_ctx (" + std::to_string(c.n_ctx) + ") must be at least max_num_seqs (" +
                     std::to_string(c.max_num_seqs) + "): every running sequence needs KV room");
    }

    EngineConfig out;
    out.model_path = c.model_path;
    out.n_ctx = c.n_ctx;
    out.max_num_seqs = c.max_num_seqs;
    out.max_num_batched_tokens = c.max_num_batched_tokens;
    out.n_threads = c.n_threads > 0 ? c.n_threads : default_thread_count();
    out.n_gpu_layers = c.n_gpu_layers;
    out.kv_mode = resolve_kv_mode(c.kv_mode);
    out.block_size = c.block_size;
    out.policy = (cf_sched_policy) c.policy;
    out.flash_attn = c.flash_attn;
    out.log_level = (cf_log_level) c.log_level;
    out.profile_capacity = c.profile_capacity;
    out.kv_cache_bytes = c.kv_cache_bytes;
    out.paged_attention = (cf_paged_attention) c.paged_attention;
    out.enable_prefix_caching = c.enable_prefix_caching == 1;
    out.preemption_mode = (cf_preemption_mode) c.preemption_mode;
    out.swap_space_bytes = c.swap_space_bytes;
    out.priority_aging_ms = c.priority_aging_ms;
    out.sampling_threads = resolve_sampling_threads(c.sampling_threads);
    out.rpc_servers = c.rpc_servers != nullptr ? c.rpc_servers : "";
    out.devices = c.devices != nullptr ? c.devices : "";
    out.split_mode = (cf_split_mode) c.split_mode;
    out.main_gpu = c.main_gpu;
    out.tensor_split.assign(c.tensor_split, c.tensor_split + c.num_tensor_split);
    out.kv_streaming = (cf_kv_streaming) c.kv_streaming;
    out.kv_stream_blocks = c.kv_stream_blocks;
    out.kv_stream_depth = c.kv_stream_depth;
    out.long_prefill_token_threshold = c.long_prefill_token_threshold >= 0
                                           ? c.long_prefill_token_threshold
                                           : std::max(1, c.max_num_batched_tokens / 2);
    if (!out.rpc_servers.empty() && out.n_gpu_layers == 0 && out.devices != "none") {
        fail_invalid("rpc_servers needs n_gpu_layers != 0 (-1 = all layers): with 0 no layer goes to an RPC device");
    }
    return out;
}

cf_engine_config default_engine_config() {
    cf_engine_config c;
    c.model_path = nullptr;
    c.n_ctx = 0;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 512;
    c.n_threads = 0;
    c.n_gpu_layers = 0;
    c.kv_mode = CF_KV_MODE_AUTO;
    c.block_size = 16;
    c.policy = CF_SCHED_POLICY_FCFS;
    c.flash_attn = -1;
    c.log_level = CF_LOG_LEVEL_ERROR;
    c.profile_capacity = 0;
    c.kv_cache_bytes = 0;
    c.paged_attention = CF_PAGED_ATTENTION_INVARIANT;
    c.enable_prefix_caching = 1;
    c.preemption_mode = CF_PREEMPTION_MODE_AUTO;
    c.swap_space_bytes = (int64_t) 4 << 30;  // vLLM's default swap space
    c.priority_aging_ms = 1000;
    c.sampling_threads = 0;
    c.rpc_servers = nullptr;
    c.devices = nullptr;
    c.split_mode = CF_SPLIT_MODE_LAYER;
    c.main_gpu = 0;
    c.tensor_split = nullptr;
    c.num_tensor_split = 0;
    c.kv_streaming = CF_KV_STREAMING_AUTO;
    c.kv_stream_blocks = 64;
    c.kv_stream_depth = 2;
    c.long_prefill_token_threshold = -1;
    return c;
}

namespace {
// llama-server's default DRY sequence breakers (common_params_sampling), static: a
// cf_sampling_params_default() copy may point at them for as long as the library is loaded.
const char * const kDefaultDryBreakers[] = {"\n", ":", "\"", "*"};
}  // namespace

cf_sampling_params default_sampling_params() {
    cf_sampling_params p;
    p.max_tokens = 16;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = CF_SEED_RANDOM;
    p.stop_token_ids = nullptr;
    p.num_stop_token_ids = 0;
    p.stop_strings = nullptr;
    p.num_stop_strings = 0;
    p.ignore_eos = 0;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.logit_bias_token_ids = nullptr;
    p.logit_bias_values = nullptr;
    p.num_logit_bias = 0;
    p.grammar = nullptr;
    p.cache_prompt = 1;
    p.logprobs = 0;
    p.top_logprobs = 0;
    p.post_sampling_probs = 0;
    p.return_progress = 0;
    p.reasoning_budget = -1;
    p.reasoning_start_tokens = nullptr;
    p.num_reasoning_start_tokens = 0;
    p.reasoning_end_tokens = nullptr;
    p.num_reasoning_end_tokens = 0;
    p.reasoning_forced_tokens = nullptr;
    p.num_reasoning_forced_tokens = 0;
    p.reasoning_prefill_tokens = nullptr;
    p.num_reasoning_prefill_tokens = 0;
    p.dry_multiplier = 0.0f;
    p.dry_base = 1.75f;
    p.dry_allowed_length = 2;
    p.dry_penalty_last_n = 64;
    p.dry_sequence_breakers = kDefaultDryBreakers;
    p.num_dry_sequence_breakers = (int32_t) (sizeof(kDefaultDryBreakers) / sizeof(kDefaultDryBreakers[0]));
    p.xtc_probability = 0.0f;
    p.xtc_threshold = 0.1f;
    p.typical_p = 1.0f;
    p.mirostat = 0;
    p.mirostat_tau = 5.0f;
    p.mirostat_eta = 0.1f;
    p.dynatemp_range = 0.0f;
    p.dynatemp_exponent = 1.0f;
    p.top_n_sigma = -1.0f;
    p.min_keep = 0;
    return p;
}

}  // namespace cf
