// llama_session.cpp - model loading, context creation and the thin decode/logits bridge.
#include "engine/llama_session.h"

#include "core/error.h"
#include "engine/devices.h"
#include "engine/kv_budget.h"
#include "engine/paged_attn_support.h"
#include "engine/sampling.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "llama.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sys/stat.h>
#include <exception>
#include <thread>

static_assert(LLAMA_TOKEN_NULL == CF_TOKEN_NONE, "token sentinels must agree");

namespace cf {

namespace {

std::atomic<int> g_log_level{CF_LOG_LEVEL_ERROR};
std::atomic<bool> g_log_last_shown{false};  // whether the message a CONT line continues was shown
// While an ErrorCapture lives on this thread: llama.cpp's error lines logged on it, shown or not.
thread_local std::string * t_error_capture = nullptr;

bool shows(ggml_log_level level) {
    const int threshold = g_log_level.load(std::memory_order_relaxed);
    switch (level) {
        case GGML_LOG_LEVEL_ERROR: return threshold >= CF_LOG_LEVEL_ERROR;
        case GGML_LOG_LEVEL_WARN: return threshold >= CF_LOG_LEVEL_WARN;
        case GGML_LOG_LEVEL_INFO: return threshold >= CF_LOG_LEVEL_INFO;
        case GGML_LOG_LEVEL_CONT: return g_log_last_shown.load(std::memory_order_relaxed);
        default: return threshold >= CF_LOG_LEVEL_DEBUG;
    }
}

// A line on stderr about a setting the engine ignores or corrects (shown unless logging is off: at the default error
// level too, like the engine's other notices).
void notice(const std::string & text) {
    if (g_log_level.load(std::memory_order_relaxed) != CF_LOG_LEVEL_NONE) {
        std::fprintf(stderr, "cacheflow: %s\n", text.c_str());
    }
}

// While an ErrorCapture is active (model load, context creation) llama.cpp's error lines become
// part of the CacheFlow error that follows; they are printed as well only at info level or above.
void log_callback(ggml_log_level level, const char * text, void * /*user_data*/) {
    const bool captured = t_error_capture != nullptr && g_log_level.load(std::memory_order_relaxed) < CF_LOG_LEVEL_INFO;
    const bool show = shows(level) && !(captured && level == GGML_LOG_LEVEL_ERROR);
    if (level != GGML_LOG_LEVEL_CONT) {
        g_log_last_shown.store(show, std::memory_order_relaxed);
    }
    if (show) {
        std::fputs(text, stderr);
    }
    if (t_error_capture != nullptr && level == GGML_LOG_LEVEL_ERROR) {
        t_error_capture->append(text);
    }
}

// Collects llama.cpp's error lines while it lives (one thread; not nestable): llama.cpp reports why
// a call failed only in its log, and callers here need that reason for the cf_status and message.
class ErrorCapture {
  public:
    ErrorCapture() { t_error_capture = &text_; }
    ~ErrorCapture() { t_error_capture = nullptr; }
    ErrorCapture(const ErrorCapture &) = delete;
    ErrorCapture & operator=(const ErrorCapture &) = delete;

    bool contains(const char * fragment) const { return text_.find(fragment) != std::string::npos; }

    // The first captured line (where llama.cpp reports the cause), without trailing whitespace.
    std::string first_line() const {
        std::string line = text_.substr(0, text_.find('\n'));
        while (!line.empty() && line.back() == ' ') {
            line.pop_back();
        }
        return line;
    }

    // The last error line without its trailing newline, or "" if none was logged.
    std::string last_line() const {
        std::string text = text_;
        while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
            text.pop_back();
        }
        const size_t start = text.rfind('\n');
        return start == std::string::npos ? text : text.substr(start + 1);
    }

  private:
    std::string text_;
};

// Total memory of every backend device (host RAM and GPUs), in bytes.
// Memory of the devices this engine may put its KV cache on (the CPU and its offload devices): not
// every registered device, since an RPC server another engine of the process registered may be gone
// (ggml-rpc aborts the process when it cannot connect).
int64_t total_device_memory_bytes(const std::vector<ggml_backend_dev_t> & offload_devices) {
    int64_t total = 0;
    std::vector<ggml_backend_dev_t> devs = offload_devices;
    if (ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); cpu != nullptr) {
        devs.push_back(cpu);
    }
    for (ggml_backend_dev_t dev : devs) {
        size_t free_bytes = 0;
        size_t total_bytes = 0;
        ggml_backend_dev_memory(dev, &free_bytes, &total_bytes);
        total += (int64_t) total_bytes;
    }
    return total;
}

std::string format_bytes(int64_t bytes) {
    char text[32];
    if (bytes >= (int64_t{1} << 30)) {
        std::snprintf(text, sizeof(text), "%.1f GiB", (double) bytes / (double) (int64_t{1} << 30));
    } else {
        std::snprintf(text, sizeof(text), "%.1f MiB", (double) bytes / (double) (1 << 20));
    }
    return text;
}

using cuda_graph_counts_fn = void (*)(int64_t *);

// A CacheFlow function of ggml-cuda's registry (patches 0008-0010), nullptr without the CUDA backend
// or without that function (a build without CUDA graphs has no per-shape switch).
void * cuda_proc_address(const char * name) {
    ggml_backend_reg_t cuda = ggml_backend_reg_by_name("CUDA");
    return cuda == nullptr ? nullptr : ggml_backend_reg_get_proc_address(cuda, name);
}

// patch 0009's counters, looked up once; nullptr without the CUDA backend
cuda_graph_counts_fn cuda_graph_counts_getter() {
    static const cuda_graph_counts_fn getter =
        (cuda_graph_counts_fn) cuda_proc_address("ggml_backend_cuda_cf_graph_counts");
    return getter;
}

// ggml-cuda's F16 GEMM options of patches 0008, 0020 and 0021 (1: F32 output, 2: one F16 copy of each src1 per graph
// evaluation, 4: the residual add, the RMS norm and its weight in one kernel that also writes that F16 copy, 8: SWIGLU
// and paged attention write that F16 copy too); all four by default, CACHEFLOW_CUDA_GEMM (0-15, the sum of the bits
// wanted) for others (7: without 8; 3: without 4 and 8). On an H100 at B=64, 4 took the traced graph from 1,853 to
// 1,749 us and decode from 31.9k to 33.8k tok/s (results/h200_gpu/stop45); 8 took decode from 33.0k / 33.8k (7, first
// and last in the call) to 34.8k with the same greedy tokens (results/h200_gpu/stop46). Set when an engine opens.
// A build without the CUDA backend has no such function and nothing is set; the value is checked either way, so a
// malformed one is named on stderr there too.
void set_cuda_gemm_options() {
    const int options = env_int_in("CACHEFLOW_CUDA_GEMM", 0, 15, 15);
    auto set_options = (void (*)(int)) cuda_proc_address("ggml_backend_cuda_cf_set_gemm_options");
    if (set_options != nullptr) {
        set_options(options);
    }
}

// ggml-cuda keeps one CUDA graph per step shape (patch 0010), the shapes step padding produces;
// CACHEFLOW_CUDA_GRAPH_PER_SHAPE=0 keeps stock's one graph per context, for A/B runs.
void set_cuda_graph_per_shape() {
    const bool per_shape = env_int_in("CACHEFLOW_CUDA_GRAPH_PER_SHAPE", 0, 1, 1) == 1;  // checked on any build
    auto set = (void (*)(bool)) cuda_proc_address("ggml_backend_cuda_cf_set_graph_per_shape");
    if (set != nullptr) {
        set(per_shape);
    }
}

void init_backend_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_callback, nullptr);
        llama_backend_init();
        set_cuda_graph_per_shape();
    });
}

// Throws MODEL_LOAD_FAILED unless path names an existing regular file (or a link to one).
void check_model_file(const std::string & path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        throw Error(CF_STATUS_MODEL_LOAD_FAILED, "model file not found: " + path);
    }
    if (S_ISDIR(st.st_mode)) {
        throw Error(CF_STATUS_MODEL_LOAD_FAILED, "model path is a directory, not a GGUF file: " + path);
    }
}

// The model's layer count from its GGUF header ("<general.architecture>.block_count", read without the tensors), or
// -1 where the file does not say (then the caller treats the offload as partial).
int64_t gguf_block_count(const std::string & path) {
    gguf_init_params params{};
    params.no_alloc = true;
    params.ctx = nullptr;
    gguf_context * g = gguf_init_from_file(path.c_str(), params);
    if (g == nullptr) {
        return -1;
    }
    int64_t n = -1;
    const int64_t arch = gguf_find_key(g, "general.architecture");
    if (arch >= 0 && gguf_get_kv_type(g, arch) == GGUF_TYPE_STRING) {
        const int64_t key = gguf_find_key(g, (std::string(gguf_get_val_str(g, arch)) + ".block_count").c_str());
        if (key >= 0 && gguf_get_kv_type(g, key) == GGUF_TYPE_UINT32) {
            n = gguf_get_val_u32(g, key);
        }
    }
    gguf_free(g);
    return n;
}

llama_flash_attn_type flash_attn_type(int32_t flash_attn) {
    if (flash_attn < 0) {
        return LLAMA_FLASH_ATTN_TYPE_AUTO;
    }
    return flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
}

// Step padding's default (llama_session.h): in paged mode, where some layers run on a CUDA device
// whose graphs are not turned off; CACHEFLOW_STEP_PADDING=0 / 1 decides instead when set.
bool step_padding_wanted(int32_t n_gpu_layers, const std::vector<ggml_backend_dev_t> & offload_devices) {
    if (const int padding = env_int_in("CACHEFLOW_STEP_PADDING", 0, 1, -1); padding >= 0) {
        return padding == 1;
    }
    if (n_gpu_layers == 0 || std::getenv("GGML_CUDA_DISABLE_GRAPHS") != nullptr) {
        return false;
    }
    for (ggml_backend_dev_t dev : attention_devices(n_gpu_layers, offload_devices)) {
        if (std::strncmp(ggml_backend_dev_name(dev), "CUDA", 4) == 0) {
            return true;
        }
    }
    return false;
}

bool host_sampling_forced() {
    return env_int_in("CACHEFLOW_HOST_SAMPLING", 0, 1, 0) == 1;
}

void copy_cstr(char * dst, size_t capacity, const char * src) {
    std::snprintf(dst, capacity, "%s", src ? src : "");
}

// The paged attention kernel of the engine's setting (the op param of every paged attention node).
ggml_paged_attn_kernel paged_attn_kernel(cf_paged_attention setting) {
    return setting == CF_PAGED_ATTENTION_GGML ? GGML_PAGED_ATTN_KERNEL_GGML : GGML_PAGED_ATTN_KERNEL_INVARIANT;
}

// "<arch>.<key>" of the GGUF as an integer (e.g. attention.key_length: Gemma 3's heads are 256
// wide while n_embd / n_head = 160), or fallback when absent.
int64_t meta_int(const llama_model * model, const char * key, int64_t fallback) {
    char arch[64];
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch)) < 0) {
        return fallback;
    }
    char value[32];
    const std::string full = std::string(arch) + "." + key;
    if (llama_model_meta_val_str(model, full.c_str(), value, sizeof(value)) < 0) {
        return fallback;
    }
    const long long parsed = std::atoll(value);
    return parsed > 0 ? (int64_t) parsed : fallback;
}

// Why the paged KV path cannot serve this model with this config, or "". llama.cpp refuses the rest
// (MLA, sparse attention, quantized KV) when the paged context is created.
std::string paged_unsupported_reason(const llama_model * model, const EngineConfig & config,
                                     const std::vector<ggml_backend_dev_t> & offload_devices) {
    if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model)) {
        return "it has recurrent layers";
    }
    if (llama_model_n_swa(model) > 0) {
        return "it has sliding-window attention layers";
    }
    // the devices its attention layers land on must run the paged attention op (today: the CPU only)
    const int64_t n_head = std::max(1, llama_model_n_head(model));
    const int64_t head_dim = llama_model_n_embd(model) / n_head;
    const PagedAttnShape shape = {meta_int(model, "attention.key_length", head_dim),
                                  meta_int(model, "attention.value_length", head_dim),
                                  n_head,
                                  std::max(1, llama_model_n_head_kv(model)),
                                  config.block_size,
                                  GGML_TYPE_F16,
                                  paged_attn_kernel(config.paged_attention)};
    const std::string device =
        first_device_without_paged_attn(attention_devices(config.n_gpu_layers, offload_devices), shape);
    if (!device.empty()) {
        return "the paged attention op (GGML_OP_PAGED_ATTN) is not implemented on " + device +
               ", where n_gpu_layers=" + std::to_string(config.n_gpu_layers) + " puts attention layers";
    }
    return "";
}

}  // namespace

int env_int_in(const char * name, int lo, int hi, int fallback) {
    const char * v = std::getenv(name);
    if (v == nullptr || *v == '\0') {
        return fallback;
    }
    char * end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    // the number as written plainly: strtol also takes leading blanks, a sign and leading zeros (" 1", "+1", "01")
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi || std::to_string(x) != v) {
        const std::string kept = fallback < lo ? "the engine's own choice stays" :
                                 "the default, " + std::to_string(fallback) + ", stays";
        notice(std::string(name) + "=" + v + " is not a whole number from " + std::to_string(lo) + " to " +
               std::to_string(hi) + "; ignored (" + kept + ")");
        return fallback;
    }
    return (int) x;
}

void set_log_level(cf_log_level level) {
    g_log_level.store(level, std::memory_order_relaxed);
    llama_log_set(log_callback, nullptr);
}

std::unique_ptr<LlamaSession> LlamaSession::open(const EngineConfig & config) {
    set_log_level(config.log_level);
    init_backend_once();
    set_cuda_gemm_options();  // process-wide in ggml-cuda; read again by every engine (A/B runs in one process)
    std::unique_ptr<LlamaSession> session(new LlamaSession(config));
    session->load_model();
    session->resolve_kv_mode();
    session->resolve_kv_streaming();
    session->init_greedy_samplers();
    session->create_context();
    session->init_kv_stream_desc();
    if (session->kv_stream_cuda_) {
        session->warm_up_deferred_ = true;  // start_kv_stream reserves the staging pool first
    } else {
        session->warm_up_on_own_thread();
    }
    return session;
}

LlamaSession::~LlamaSession() {
    if (kv_stream_reserved_) {
        if (auto release = (cf_cuda_kv_stream_release_fn) cuda_proc_address("ggml_cuda_cf_kv_stream_release")) {
            llama_synchronize(ctx_);
            release(stream_desc_.get());
        }
    }
    if (ctx_ != nullptr) {
        llama_free(ctx_);
    }
    if (pinned_lists_ != nullptr) {
        ggml_backend_buffer_free(pinned_lists_);
    }
    free_samplers();  // after the context, which points at them
    if (model_ != nullptr) {
        llama_model_free(model_);
    }
}

void LlamaSession::load_model() {
    const std::string & path = config_.model_path;
    check_model_file(path);
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = config_.n_gpu_layers;
    const DevicePlacement placement = place_devices(config_);  // outlives the load: mp points into it
    offload_devices_ = placement.offload_devices();
    if (config_.n_gpu_layers > 0 && offload_devices_.empty()) {  // as llama-server warns for --gpu-layers
        notice("no GPU to offload to (no GPU backend in this build, or no device visible): n_gpu_layers=" +
               std::to_string(config_.n_gpu_layers) + " is ignored and every layer runs on the CPU");
    }
    mp.devices = const_cast<ggml_backend_dev_t *>(placement.devices.data());
    // place_devices already kept only the main device of split mode none: it is the list's first
    mp.split_mode = config_.split_mode == CF_SPLIT_MODE_NONE ? LLAMA_SPLIT_MODE_NONE : LLAMA_SPLIT_MODE_LAYER;
    mp.main_gpu = 0;
    mp.tensor_split = placement.tensor_split.empty() ? nullptr : placement.tensor_split.data();
    // The token embedding matrix on the one CUDA device, so each step's get_rows runs there and the step uploads
    // token ids ([n_tokens] I32) instead of running a CPU split and uploading its [n_embd, n_tokens] F32 rows.
    // llama.cpp keeps the input layer on the CPU (llama-model.cpp, dev_input); an override of the tensor's buffer type
    // is its own mechanism (-ot). Only for a model wholly on that device: with layers left on the CPU the rows would
    // travel back, and a tied output head, a duplicate of the same name, would move too. CUDA only: it runs get_rows
    // for every weight type. The default wherever that holds (the GGUF header's layer count against n_gpu_layers):
    // on an H100, 1B shape, 128/128, it took decode from 28.8k to 30.0k tok/s at B=64 and from 62.5k to 70.1k at
    // B=256, with the same greedy tokens (results/h200_gpu/stop40). CACHEFLOW_EMBD_ON_DEVICE=0 keeps llama.cpp's
    // placement; =1 asks for it and refuses a partial offload (checked after the load).
    const int embd_setting = env_int_in("CACHEFLOW_EMBD_ON_DEVICE", 0, 1, -1);  // -1: the rule above
    const bool embd_forced = embd_setting == 1;
    const bool embd_on_device = [&] {
        if (config_.n_gpu_layers == 0 || offload_devices_.size() != 1 ||
            std::strncmp(ggml_backend_dev_name(offload_devices_[0]), "CUDA", 4) != 0) {
            return false;
        }
        if (embd_setting >= 0) {
            return embd_forced;  // 0: llama.cpp's placement
        }
        if (config_.n_gpu_layers < 0) {
            return true;  // every layer
        }
        const int64_t n_layer = gguf_block_count(path);  // -1 when the header does not say
        return n_layer >= 0 && config_.n_gpu_layers > n_layer;
    }();
    const std::array<llama_model_tensor_buft_override, 2> embd_override = {{
        {"^token_embd\\.weight$", embd_on_device ? ggml_backend_dev_buffer_type(offload_devices_[0]) : nullptr},
        {nullptr, nullptr},
    }};
    if (embd_on_device) {
        mp.tensor_buft_overrides = embd_override.data();
    }
    embd_with_layers_ = config_.n_gpu_layers == 0 || offload_devices_.empty() || embd_on_device;
    embd_on_cuda_ = embd_on_device;
    ErrorCapture capture;
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (model_ == nullptr) {
        const std::string reason = capture.first_line();
        throw Error(CF_STATUS_MODEL_LOAD_FAILED, "failed to load model from " + path + " (corrupt or unsupported GGUF?)" +
                                                     (reason.empty() ? "" : ": llama.cpp: " + reason));
    }
    if (!llama_model_has_decoder(model_) || llama_model_has_encoder(model_)) {
        throw Error(CF_STATUS_UNSUPPORTED, "model " + path + " is not a decoder-only model; CacheFlow serves "
                                                           "decoder-only (causal LM) models");
    }
    // Q/K/V and gate/up weights lying back to back become one matrix each (patches/0019, views: no copy), so a step
    // runs two matmuls per layer fewer. The engine applies no LoRA adapters, which the fused matrices would skip.
    // CACHEFLOW_FUSE_PROJECTIONS=0 keeps llama.cpp's graph, for A/B runs.
    num_fused_projections_ =
        env_int_in("CACHEFLOW_FUSE_PROJECTIONS", 0, 1, 1) == 0 ? 0 : llama_model_fuse_projections(model_);
    if (embd_forced && embd_on_device && config_.n_gpu_layers >= 0 &&
        config_.n_gpu_layers <= llama_model_n_layer(model_)) {
        throw Error(CF_STATUS_INVALID_ARGUMENT,
                    "CACHEFLOW_EMBD_ON_DEVICE=1 needs the whole model on the device: n_gpu_layers=" +
                        std::to_string(config_.n_gpu_layers) + " leaves layers or the output head of this " +
                        std::to_string(llama_model_n_layer(model_)) + "-layer model on the CPU (use -1 or more)");
    }
    vocab_ = llama_model_get_vocab(model_);
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    for (llama_token t = 0; t < n_vocab_; ++t) {
        if (llama_vocab_is_eog(vocab_, t)) {
            eog_token_ids_.push_back(t);  // ascending
        }
    }
}

void LlamaSession::resolve_kv_mode() {
    const std::string why = paged_unsupported_reason(model_, config_, offload_devices_);
    if (config_.kv_mode == CF_KV_MODE_PAGED && !why.empty()) {
        throw Error(CF_STATUS_UNSUPPORTED, "kv_mode=paged does not cover this model: " + why + "; use kv_mode=stock");
    }
    if (config_.kv_mode == CF_KV_MODE_AUTO) {
        config_.kv_mode = why.empty() ? CF_KV_MODE_PAGED : CF_KV_MODE_STOCK;
        if (!why.empty() && config_.max_num_seqs > kLlamaMaxSeq) {
            throw Error(CF_STATUS_INVALID_ARGUMENT,
                        "max_num_seqs=" + std::to_string(config_.max_num_seqs) + " needs kv_mode=paged, but the paged "
                        "KV path does not cover this model (" + why + "); the stock KV cache holds at most " +
                        std::to_string(kLlamaMaxSeq) + " sequences (llama.cpp's LLAMA_MAX_SEQ)");
        }
        if (!why.empty() && config_.log_level != CF_LOG_LEVEL_NONE) {
            std::fprintf(stderr, "cacheflow: using the stock KV cache: the paged KV path does not cover this model (%s)\n",
                         why.c_str());
        }
    }
    // Stock: one llama.cpp slot per running sequence. Paged: slots are rows of one decode, and a
    // step with more sequences runs as several decodes (batch_builder.h).
    assert(llama_max_parallel_sequences() == (size_t) kLlamaMaxSeq);
    n_seq_max_ = config_.paged() ? std::min(config_.max_num_seqs, kLlamaMaxSeq) : config_.max_num_seqs;
}

// Why the context cannot be created, as an Error. Out of memory: the KV cache is the big buffer
// of the context (n_ctx rows), so the message gives its size and what to lower. Anything else is a
// setting llama.cpp refused (UNSUPPORTED; in paged mode an attention variant the paged path does not
// cover). `detail` says why (llama.cpp's last error line, or the memory the KV cache exceeds).
Error LlamaSession::context_error(uint32_t n_ctx, uint32_t n_seq_max, bool out_of_memory,
                                  const std::string & detail) const {
    const std::string settings = "n_ctx=" + std::to_string(n_ctx) + ", max_num_seqs=" + std::to_string(n_seq_max) +
                                 (config_.paged() ? ", kv_mode=paged" : "");
    const std::string why = detail.empty() ? "" : " (" + detail + ")";
    if (out_of_memory) {
        const int64_t kv_bytes = (int64_t) n_ctx * kv_bytes_per_token_;
        return Error(CF_STATUS_OUT_OF_MEMORY,
                     "out of memory creating the llama.cpp context (" + settings + "): the KV cache of " +
                         std::to_string(n_ctx) + " tokens alone needs " + format_bytes(kv_bytes) + " (" +
                         std::to_string(kv_bytes_per_token_) + " bytes per token)" + why +
                         "; lower n_ctx or kv_cache_bytes (or max_num_seqs when n_ctx is 0)");
    }
    return Error(CF_STATUS_UNSUPPORTED, "llama.cpp could not create the context (" + settings + ")" + why +
                                            (config_.paged() ? "; kv_mode=stock may work" : ""));
}

// KV rows that fit in config_.kv_cache_bytes (the rule of kv_budget.h).
int32_t LlamaSession::n_ctx_from_budget() const {
    const KvBudget b = kv_budget(config_.kv_cache_bytes, kv_bytes_per_token_, config_.kv_mode, config_.max_num_seqs);
    if (b.n_ctx == 0) {
        const bool split = config_.kv_mode == CF_KV_MODE_STOCK;
        throw Error(CF_STATUS_INVALID_ARGUMENT,
                    "kv_cache_bytes=" + std::to_string(config_.kv_cache_bytes) + " holds " + std::to_string(b.rows) +
                        " KV rows of " + std::to_string(kv_bytes_per_token_) + " bytes; " +
                        (split ? "stock split mode needs 256 rows per sequence (" + std::to_string(b.min_rows) +
                                     " for max_num_seqs=" + std::to_string(config_.max_num_seqs) + ")"
                               : "the cache needs at least " + std::to_string(b.min_rows)));
    }
    return (int32_t) std::min<int64_t>(b.n_ctx, INT32_MAX / 2);
}

void LlamaSession::create_context() {
    const int32_t n_ctx_train = llama_model_n_ctx_train(model_);
    const int64_t n_ctx_default = (int64_t) config_.max_num_seqs * std::min(n_ctx_train > 0 ? n_ctx_train : 2048, 2048);
    // K and V rows of every layer, f16 (llama.cpp's default cache type).
    const int64_t n_head = std::max(1, llama_model_n_head(model_));
    const int64_t head_dim = llama_model_n_embd(model_) / n_head;
    const int64_t head_k = meta_int(model_, "attention.key_length", head_dim);
    const int64_t head_v = meta_int(model_, "attention.value_length", head_dim);
    kv_bytes_per_token_ = (int64_t) llama_model_n_layer(model_) * llama_model_n_head_kv(model_) * (head_k + head_v) * 2;

    check_kv_stream_host_slots(kv_bytes_per_token_ * config_.block_size);  // before anything is allocated

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (config_.kv_cache_bytes > 0 ? n_ctx_from_budget()
                           : config_.n_ctx > 0        ? config_.n_ctx
                                                      : n_ctx_default);
    cp.n_batch = (uint32_t) config_.max_num_batched_tokens;
    cp.n_ubatch = (uint32_t) config_.max_num_batched_tokens;  // one ubatch per step where possible
    cp.n_seq_max = (uint32_t) n_seq_max_;
    cp.n_threads = config_.n_threads;
    cp.n_threads_batch = config_.n_threads;
    cp.flash_attn_type = flash_attn_type(config_.flash_attn);
    cp.kv_unified = config_.kv_unified();
    cp.no_perf = true;
    cp.greedy_argmax = backend_sampling_;  // chains are attached per slot later (set_seq_sampling)
    cp.top_k_candidates = backend_sampling_ ? kTopKCandidates : 0;  // built only while a slot samples from them
    // A decode's host inputs (token ids, positions, block tables, KV rows, context lengths) reach the device with
    // one wait in all, not a wait and a synchronous copy each (patch 0016); CACHEFLOW_BATCHED_INPUT_COPIES=0 keeps
    // stock's copies, for A/B runs. The CPU backend copies nothing either way.
    cp.batched_input_copies = env_int_in("CACHEFLOW_BATCHED_INPUT_COPIES", 0, 1, 1) == 1;
    // Async decode: a device token feed with a row per output of a decode (every sequence, plus step padding's at most
    // 15 rows). The feed lives on the token embedding's device and each graph writes its argmax there, so only where
    // the embedding is with the layers (the CPU alone, or a model wholly on one CUDA device, whose embedding the engine
    // moves there): with the embedding on the CPU and the layers on a GPU, ggml-cuda refuses to read the argmax back
    // asynchronously (seen on an H100, results/h200_gpu/stop42). On by default for a paged model wholly on one CUDA
    // device with in-graph sampling and no KV streaming: on an H100 at B=64 (1B shape, 128/128) it took decode from
    // 34.8k to 36.7k tok/s, same greedy tokens, and the GPU suite passed with it on but for one agreement threshold
    // that does not involve it (a layer split over an rpc-server, results/h200_gpu/stop46).
    // CACHEFLOW_ASYNC_DECODE=0 turns it off; =1 asks for it elsewhere too (the CPU alone: no overlap to gain there,
    // the decode runs inside llama_decode), and says on stderr why where it cannot run.
    const int async_setting = env_int_in("CACHEFLOW_ASYNC_DECODE", 0, 1, -1);  // -1: the default above
    const bool async_default = async_setting == -1 && embd_on_cuda_ && config_.paged() && backend_sampling_ &&
                               !kv_streaming();
    const bool async_asked = async_setting == 1;
    if (async_asked && !config_.paged()) {
        notice("CACHEFLOW_ASYNC_DECODE=1 ignored: async decode needs the paged KV cache (kv_mode paged), and this "
               "engine runs the stock one");
    } else if (async_asked && !backend_sampling_) {
        notice("CACHEFLOW_ASYNC_DECODE=1 ignored: async decode needs greedy sampling in the graph, and host sampling "
               "is on (CACHEFLOW_HOST_SAMPLING)");
    } else if (async_asked && !embd_with_layers_) {
        notice("CACHEFLOW_ASYNC_DECODE=1 ignored: async decode needs the token embedding on the device of the layers "
               "(a model wholly on one CUDA device, or the CPU alone)");
    } else if (async_asked && kv_streaming()) {
        notice("CACHEFLOW_ASYNC_DECODE=1 ignored: async decode does not run with KV streaming (kv_streaming on), "
               "whose steps move blocks between host and device");
    } else if (async_asked || async_default) {
        token_feed_rows_ = n_seq_max_ + 16;
        cp.token_feed = token_feed_rows_;
    }
    const bool padding_wanted = config_.paged() && step_padding_wanted(config_.n_gpu_layers, offload_devices_);
    if (config_.paged()) {
        // Step padding takes the pool's last block as its scratch block (below). A context asked for in
        // tokens keeps every one of them: where llama.cpp's rounding to 256 rows leaves no spare block,
        // one more block is asked for (a budget in bytes pays for the scratch block itself).
        const int64_t asked = cp.n_ctx;
        if (config_.kv_cache_bytes == 0 && padding_wanted &&
            (asked + 255) / 256 * 256 < asked + config_.block_size) {
            cp.n_ctx = (uint32_t) (asked + config_.block_size);
        }
        const int64_t kv_rows = ((int64_t) cp.n_ctx + 255) / 256 * 256;  // llama.cpp pads n_ctx to 256
        if ((int64_t) config_.block_size > kv_rows) {
            throw Error(CF_STATUS_INVALID_ARGUMENT,
                        "block_size (" + std::to_string(config_.block_size) + ") is larger than the KV cache (" +
                            std::to_string(kv_rows) + " tokens), which must hold at least one block; lower "
                            "block_size or raise n_ctx or kv_cache_bytes");
        }
        cp.kv_block_size = (uint32_t) config_.block_size;
        cp.paged_attn_kernel = paged_attn_kernel(config_.paged_attention);
        if (kv_streaming()) {
            stream_desc_ = std::make_unique<cf_kv_stream_desc>();
            std::memset(stream_desc_.get(), 0, sizeof(cf_kv_stream_desc));
            cp.paged_kv_stream = stream_desc_.get();
            if (!kv_stream_cuda_) {  // the staging rows are R more blocks of the pool, on top of what was asked
                cp.n_ctx = (uint32_t) ((int64_t) cp.n_ctx + (int64_t) config_.kv_stream_blocks * config_.block_size);
            }
        }
    }

    // A KV cache larger than the memory of all devices together cannot be allocated; saying so
    // here spares llama.cpp from touching gigabytes of per-row metadata before it finds out. Models
    // with sliding-window layers keep fewer rows than n_ctx there, so they are left to llama.cpp.
    const int64_t memory_bytes = total_device_memory_bytes(offload_devices_);
    if (llama_model_n_swa(model_) == 0 && memory_bytes > 0 && (int64_t) cp.n_ctx * kv_bytes_per_token_ > memory_bytes) {
        throw context_error(cp.n_ctx, (uint32_t) config_.max_num_seqs, true,
                            "more than the " + format_bytes(memory_bytes) + " of memory of all devices together");
    }
    ErrorCapture capture;
    ctx_ = llama_init_from_model(model_, cp);
    if (ctx_ == nullptr) {
        const bool out_of_memory = capture.contains("failed to allocate") || capture.contains("insufficient memory") ||
                                   capture.contains("bad_alloc");
        const std::string reason = capture.last_line();
        throw context_error(cp.n_ctx, (uint32_t) config_.max_num_seqs, out_of_memory, reason.empty() ? "" : "llama.cpp: " + reason);
    }
    // llama.cpp rounds n_ctx (and, in split mode, the per-sequence slice) up to multiples of 256.
    n_ctx_ = (int32_t) llama_n_ctx(ctx_);
    n_ctx_per_seq_ = (int32_t) llama_n_ctx_seq(ctx_);
    n_batch_ = (int32_t) llama_n_batch(ctx_);
    if (config_.paged()) {
        // no slices: one sequence may grow over the whole pool, up to the trained context
        num_blocks_ = llama_paged_n_blocks(ctx_);
        if (num_blocks_ >= 2 && padding_wanted) {
            scratch_block_ = --num_blocks_;  // where padding tokens write their KV rows
            max_padded_tokens_ = std::min(512, n_batch_);
        }
        int32_t max_seq_blocks = num_blocks_;
        if (kv_streaming()) {
            if (!kv_stream_cuda_) {
                num_blocks_ -= config_.kv_stream_blocks;  // blocks [num_blocks_, + R): the staging rows
                if (num_blocks_ < 1) {
                    throw Error(CF_STATUS_INVALID_ARGUMENT, "kv_stream_blocks (" + std::to_string(config_.kv_stream_blocks) +
                                                                ") leaves no block of the KV cache for sequences");
                }
            }
            max_seq_blocks = num_blocks_ + config_.kv_stream_blocks;  // a sequence's older blocks can stream
        }
        n_ctx_ = num_blocks_ * config_.block_size;
        const int32_t max_seq_tokens = max_seq_blocks * config_.block_size;
        n_ctx_per_seq_ = n_ctx_train > 0 ? std::min(n_ctx_train, max_seq_tokens) : max_seq_tokens;
    }
}

// kv_streaming AUTO: off, on the CPU and on CUDA alike, for now: the engine's CUDA path (op params, reserve,
// staged lists) has not run on a GPU yet (stop 29: only kernels/cuda's standalone test has), and with streaming
// on every paged op of a decode runs through the layer-ahead hooks. ON asks for it: on a CUDA device every layer
// must be there, on one device, with ggml-cuda's streaming entry points. ON where it cannot work fails with the
// reason. Needs R host slots of swap space (checked by the Engine).
void LlamaSession::resolve_kv_streaming() {
    const bool asked = config_.kv_streaming == CF_KV_STREAMING_ON;
    config_.kv_streaming = CF_KV_STREAMING_OFF;
    auto refuse = [&](const std::string & why) {
        if (asked) {
            throw Error(CF_STATUS_UNSUPPORTED, "kv_streaming=on: " + why);
        }
    };
    if (!config_.paged()) {
        return refuse("the model runs on the stock KV cache, not the paged one");
    }
    if (!config_.rpc_servers.empty()) {
        return refuse("not with rpc_servers (an rpc-server cannot read the engine's host memory)");
    }
    const int32_t n_layer = llama_model_n_layer(model_);
    const bool offloaded = config_.n_gpu_layers != 0 && !offload_devices_.empty();
    if (!offloaded) {
        config_.kv_streaming = asked ? CF_KV_STREAMING_ON : CF_KV_STREAMING_OFF;  // AUTO: off on the CPU
        return;
    }
    if (config_.n_gpu_layers > 0 && config_.n_gpu_layers < n_layer) {
        return refuse("the layers are split between the CPU and a device (set n_gpu_layers to all)");
    }
    if (offload_devices_.size() != 1 || std::strncmp(ggml_backend_dev_name(offload_devices_[0]), "CUDA", 4) != 0) {
        return refuse("the KV cache must be on one CUDA device");
    }
    if (cuda_proc_address("ggml_cuda_cf_kv_stream_reserve") == nullptr) {
        return refuse("this ggml-cuda has no KV streaming (ggml_cuda_cf_kv_stream_reserve)");
    }
    if (!asked) {
        return;  // AUTO: off (above)
    }
    kv_stream_cuda_ = true;
    kv_stream_alone_only_ = false;
    config_.kv_streaming = CF_KV_STREAMING_ON;
}

void LlamaSession::check_kv_stream_host_slots(int64_t block_bytes) const {
    if (!kv_streaming() || block_bytes <= 0) {
        return;
    }
    const int64_t num_slots = config_.swap_space_bytes / block_bytes;
    if (config_.kv_stream_blocks <= num_slots) {
        return;
    }
    throw Error(CF_STATUS_INVALID_ARGUMENT,
                "kv_stream_blocks=" + std::to_string(config_.kv_stream_blocks) + " needs as many host slots of the "
                "swap space, one KV block of " + std::to_string(block_bytes) + " bytes each (" +
                format_bytes((int64_t) config_.kv_stream_blocks * block_bytes) + "), but swap_space_bytes=" +
                std::to_string(config_.swap_space_bytes) + " holds " + std::to_string(num_slots) +
                "; raise swap_space_bytes or lower kv_stream_blocks");
}

void LlamaSession::init_kv_stream_desc() {
    if (!kv_streaming()) {
        return;
    }
    const std::vector<PoolTensors> pools = paged_pool_tensors();
    if (pools.empty()) {
        throw Error(CF_STATUS_INTERNAL, "KV streaming: the context has no KV pools");
    }
    const int64_t k_row = (int64_t) pools[0].k->nb[1];
    const int64_t v_row = (int64_t) pools[0].v->nb[1];
    for (const PoolTensors & p : pools) {
        const bool host = p.k->buffer != nullptr && ggml_backend_buffer_is_host(p.k->buffer);
        if ((int64_t) p.k->nb[1] != k_row || (int64_t) p.v->nb[1] != v_row || host == kv_stream_cuda_) {
            throw Error(CF_STATUS_UNSUPPORTED, "KV streaming needs every layer's K/V rows of one size on one device");
        }
    }
    const int32_t R = config_.kv_stream_blocks;
    cf_kv_stream_desc & d = *stream_desc_;
    d.n_layer = (int32_t) pools.size();
    d.block_size = config_.block_size;
    d.max_staged = R;
    d.depth = std::max(1, std::min(config_.kv_stream_depth, d.n_layer));
    d.k_row_bytes = k_row;
    d.v_row_bytes = v_row;
    d.host_block_bytes = (int64_t) d.n_layer * d.block_size * (k_row + v_row);
    if (d.host_block_bytes != paged_block_bytes()) {
        throw Error(CF_STATUS_INTERNAL, "KV streaming: host layout of " + std::to_string(d.host_block_bytes) +
                                            " bytes per block, llama_paged_block_bytes says " +
                                            std::to_string(paged_block_bytes()));
    }
    if (kv_stream_cuda_) {
        d.stage_base_block = llama_paged_n_blocks(ctx_);
        d.device = (int32_t) std::strtol(ggml_backend_dev_name(offload_devices_[0]) + 4, nullptr, 10);
        if (llama_paged_set_staged_ids(ctx_, R) != 0) {
            throw Error(CF_STATUS_INTERNAL, "llama_paged_set_staged_ids refused " + std::to_string(R));
        }
        ggml_backend_buffer_type_t host_type = ggml_backend_dev_host_buffer_type(offload_devices_[0]);
        pinned_lists_ = host_type ? ggml_backend_buft_alloc_buffer(host_type, (size_t) (R + 1) * sizeof(int32_t)) : nullptr;
        if (pinned_lists_ == nullptr) {
            throw Error(CF_STATUS_OUT_OF_MEMORY, "KV streaming: no pinned host memory for the staged list");
        }
        staged_slots_ = (int32_t *) ggml_backend_buffer_get_base(pinned_lists_);
    } else {
        d.stage_base_block = num_blocks_;  // create_context kept blocks [num_blocks_, + R) for staging
        d.device = -1;
        staged_list_.assign((size_t) R + 1, 0);
        staged_slots_ = staged_list_.data();
    }
    num_staged_ = staged_slots_ + R;
    std::fill(staged_slots_, staged_slots_ + R + 1, 0);
    d.staged_slots = staged_slots_;
    d.num_staged = num_staged_;
    d.host_base = nullptr;  // start_kv_stream
    // no hooks until a decode stages a block (stage_kv_plan turns them on): the warm-up decode and every decode
    // that stages nothing run the graph of a context without streaming (patches/0013)
    if (llama_paged_set_kv_stream_active(ctx_, false) != 0) {
        throw Error(CF_STATUS_INTERNAL, "llama_paged_set_kv_stream_active refused");
    }
    stream_hooks_on_ = false;
}

void LlamaSession::start_kv_stream(const uint8_t * host_base) {
    if (!kv_streaming() || host_base == nullptr) {
        throw Error(CF_STATUS_INTERNAL, "start_kv_stream without KV streaming or host memory");
    }
    stream_desc_->host_base = host_base;
    if (kv_stream_cuda_) {
        auto reserve = (cf_cuda_kv_stream_reserve_fn) cuda_proc_address("ggml_cuda_cf_kv_stream_reserve");
        const int rc = reserve != nullptr ? reserve(stream_desc_.get()) : -1;
        if (rc != 0) {
            throw Error(CF_STATUS_OUT_OF_MEMORY, "KV streaming: ggml_cuda_cf_kv_stream_reserve failed (" +
                                                     std::to_string(rc) + ") for " +
                                                     std::to_string(stream_desc_->max_staged) + " blocks x depth " +
                                                     std::to_string(stream_desc_->depth));
        }
        kv_stream_reserved_ = true;
    }
    if (warm_up_deferred_) {
        warm_up_deferred_ = false;
        warm_up_on_own_thread();
    }
}

// Host entries (block_manager.h: host_entry(slot) <= -2) of this decode's tables become staged ids
// stage_base_block + j, j in order of appearance, and staged_slots[j] their slots (kv_stream.h).
void LlamaSession::stage_kv_plan(llama_paged_plan & plan) {
    const int32_t bs = config_.block_size;
    int32_t n = 0;
    bool copied = false;
    for (int32_t s = 0; s < plan.n_seqs; ++s) {
        const int32_t used = (plan.seq_lens[s] + bs - 1) / bs;
        for (int32_t b = 0; b < used; ++b) {
            const size_t at = (size_t) s * (size_t) plan.max_blocks + (size_t) b;
            const int32_t entry = plan.block_tables[at];
            if (!is_host_entry(entry)) {
                continue;
            }
            if (!copied) {
                staged_tables_.assign(plan.block_tables, plan.block_tables + (size_t) plan.n_seqs * (size_t) plan.max_blocks);
                copied = true;
            }
            if (n == stream_desc_->max_staged) {
                throw Error(CF_STATUS_INTERNAL, "a decode with more than kv_stream_blocks=" +
                                                    std::to_string(stream_desc_->max_staged) + " host-resident blocks");
            }
            if (n == 0) {
                llama_synchronize(ctx_);  // the previous decode may still read the list
            }
            staged_slots_[n] = host_slot_of(entry);
            staged_tables_[at] = stream_desc_->stage_base_block + n;
            n += 1;
        }
    }
    if (n == 0 && *num_staged_ != 0) {
        llama_synchronize(ctx_);
    }
    *num_staged_ = n;
    // a decode that stages nothing runs a graph without the layer-ahead hooks (patches/0013): with them it cost
    // 5.6-5.8% of decode time on the H200 (results/h200_gpu/stop31); a change of setting rebuilds the graph once
    if ((n > 0) != stream_hooks_on_) {
        stream_hooks_on_ = n > 0;
        if (llama_paged_set_kv_stream_active(ctx_, stream_hooks_on_) != 0) {
            throw Error(CF_STATUS_INTERNAL, "llama_paged_set_kv_stream_active refused");
        }
    }
    if (copied) {
        plan.block_tables = staged_tables_.data();
        stream_counters_.num_staged_blocks += n;
        stream_counters_.num_staged_bytes += (int64_t) n * stream_desc_->host_block_bytes;
        stream_counters_.num_staging_decodes += 1;
    }
}

LlamaSession::KvStreamCounters LlamaSession::kv_stream_counters() const {
    KvStreamCounters out = stream_counters_;
    if (kv_stream_reserved_) {
        if (auto stats = (cf_cuda_kv_stream_stats_fn) cuda_proc_address("ggml_cuda_cf_kv_stream_stats")) {
            stats(stream_desc_.get(), out.cuda);
        }
    }
    return out;
}

// Greedy slots use the batched argmax of the context (greedy_argmax, patch 0005): no chain per
// slot, and the argmax node is part of every graph from the start (no re-reserve when sequences
// come and go).
void LlamaSession::init_greedy_samplers() {
    backend_sampling_ = !host_sampling_forced();
    if (!backend_sampling_) {
        return;
    }
    slot_chains_.resize((size_t) n_seq_max_);
}

void LlamaSession::free_samplers() {
    for (SlotChain & slot : slot_chains_) {
        if (slot.chain != nullptr) {
            llama_sampler_free(slot.chain);
        }
    }
    slot_chains_.clear();
    for (llama_sampler * chain : retired_chains_) {
        llama_sampler_free(chain);
    }
    retired_chains_.clear();
}

// One throwaway single-token decode, like llama-server and llama-bench do: the first real step
// then does not pay for first-touch of the weights and backend set-up (fairer TTFT).
// Runs warm_up() on a short-lived thread. With an OpenMP ggml, every thread that computes a graph
// keeps a pool of OpenMP workers until it exits, and libgomp counts all of them: once more
// workers exist than cores, every `omp barrier` (one per graph node) spins 100 iterations instead
// of 300,000 before it sleeps on a futex, so a decode step pays hundreds of futex sleeps and
// wake-ups. Warming up on the opening thread (Python's main thread) left its pool alive beside the
// step thread's: on a 2-core VM that cost a c=1 decode about a third of its speed.
void LlamaSession::warm_up_on_own_thread() {
    std::exception_ptr failure;
    std::thread warm([this, &failure] {
        try {
            warm_up();
        } catch (...) {
            failure = std::current_exception();
        }
    });
    warm.join();  // the thread's exit frees its OpenMP pool
    if (failure) {
        std::rethrow_exception(failure);
    }
}

void LlamaSession::warm_up() {
    llama_token token = llama_vocab_bos(vocab_);
    if (token == LLAMA_TOKEN_NULL) {
        token = 0;
    }
    llama_batch batch = llama_batch_get_one(&token, 1);
    if (config_.paged()) {
        const int32_t zero = 0;
        const int32_t one = 1;
        const llama_paged_plan plan = {&zero, &zero, &zero, &one, 1, 1, 1};  // position 0 in block 0
        llama_set_paged_plan(ctx_, &plan);
    }
    ++num_decodes_;
    llama_decode(ctx_, batch);  // a failure here shows up again, with a message, on the first step
    llama_memory_clear(llama_get_memory(ctx_), true);
    llama_synchronize(ctx_);
}

int32_t LlamaSession::decode(const llama_batch & batch) {
    ++num_decodes_;
    const int32_t rc = llama_decode(ctx_, batch);
    // The graph of this decode no longer references detached chains.
    for (llama_sampler * chain : retired_chains_) {
        llama_sampler_free(chain);
    }
    retired_chains_.clear();
    return rc;
}

int64_t LlamaSession::num_graphs_reused() const {
    return llama_perf_context(ctx_).n_reused;
}

void LlamaSession::cuda_graph_counts(int64_t out[3]) {
    out[0] = out[1] = out[2] = 0;
    if (const cuda_graph_counts_fn getter = cuda_graph_counts_getter()) {
        getter(out);
    }
}

void LlamaSession::synchronize() {
    llama_synchronize(ctx_);
}

int32_t LlamaSession::sampled_token(int32_t batch_index, int32_t seq_id) {
    if (!backend_sampling_ || seq_id < 0 || (size_t) seq_id >= slot_chains_.size()) {
        return CF_TOKEN_NONE;
    }
    const SlotChain & slot = slot_chains_[(size_t) seq_id];
    if (slot.argmax) {  // LLAMA_TOKEN_NULL == CF_TOKEN_NONE
        return slot.no_eog ? llama_get_argmax_no_eog_ith(ctx_, batch_index) : llama_get_argmax_ith(ctx_, batch_index);
    }
    if (slot.chain != nullptr) {
        return llama_get_sampled_token_ith(ctx_, batch_index);
    }
    return CF_TOKEN_NONE;
}

bool LlamaSession::slot_samples_argmax(int32_t seq_id) const {
    return backend_sampling_ && seq_id >= 0 && (size_t) seq_id < slot_chains_.size() &&
           slot_chains_[(size_t) seq_id].argmax;
}

int32_t LlamaSession::decode_fed(const llama_batch & batch, int32_t n_fed, const int32_t * rows) {
    feed_src_.assign((size_t) batch.n_tokens, -1);
    for (int32_t i = 0; i < n_fed; ++i) {
        const int32_t seq_id = batch.seq_id[i][0];
        const bool no_eog = seq_id >= 0 && (size_t) seq_id < slot_chains_.size() && slot_chains_[(size_t) seq_id].no_eog;
        feed_src_[(size_t) i] = (no_eog ? token_feed_rows_ : 0) + (rows != nullptr ? rows[i] : i);
    }
    if (!llama_set_token_feed_src(ctx_, feed_src_.data(), batch.n_tokens)) {
        throw Error(CF_STATUS_INTERNAL, "llama_set_token_feed_src refused the sources of a decode of " +
                                            std::to_string(batch.n_tokens) + " tokens");
    }
    return decode(batch);
}

int32_t LlamaSession::previous_sampled_token(int32_t row, int32_t seq_id) {
    if (!async_decode() || !slot_samples_argmax(seq_id)) {
        return CF_TOKEN_NONE;
    }
    return llama_get_argmax_row(ctx_, 1, row, slot_chains_[(size_t) seq_id].no_eog);
}

int32_t LlamaSession::top_k_candidates(int32_t batch_index, int32_t seq_id, const int32_t ** ids,
                                       const float ** logits) {
    if (!backend_sampling_ || seq_id < 0 || (size_t) seq_id >= slot_chains_.size() ||
        !slot_chains_[(size_t) seq_id].candidates) {
        return 0;
    }
    return llama_get_top_k_ith(ctx_, batch_index, ids, logits);
}

bool LlamaSession::SlotChain::serves(const SamplingParams & p) const {
    if (chain == nullptr || greedy != p.is_greedy() || logit_bias != p.logit_bias) {
        return false;
    }
    return greedy || (top_k == p.top_k && top_p == p.top_p && min_p == p.min_p && temperature == p.temperature);
}

void LlamaSession::set_seq_sampling(int32_t seq_id, const SamplingParams * params) {
    if (!backend_sampling_ || seq_id < 0 || (size_t) seq_id >= slot_chains_.size()) {
        return;
    }
    SlotChain & slot = slot_chains_[(size_t) seq_id];  // seq_id: a llama.cpp slot (batch_builder.h)
    // argmax: greedy without a logit bias, or with exactly the ban of every EOG token (the batched
    // argmax of patch 0005, plain or without EOG tokens: the same token as logit_bias -> greedy);
    // candidates: a stochastic row, any seed, top_k in [1, kTopKCandidates], or a greedy row with
    // another logit bias, whose picks the candidates cover (candidates_cover: no bias lifts a token
    // from outside them); chained: any other greedy row with a logit bias ([logit_bias ->] greedy)
    // or another stochastic row with a random seed.
    const bool in_graph = params != nullptr && !params->needs_host_samplers();
    const bool no_eog = in_graph && params->is_greedy() && bans_exactly_eog(*params);
    const bool argmax = in_graph && params->is_greedy() && (params->logit_bias.empty() || no_eog);
    const bool candidates = in_graph && !argmax && candidates_cover(*params);
    const bool chained =
        in_graph && !argmax && !candidates && (params->is_greedy() || params->seed == CF_SEED_RANDOM);
    if (candidates != slot.candidates) {
        llama_set_seq_top_k(ctx_, seq_id, candidates);  // its rows need no raw logits either
        slot.candidates = candidates;
    }
    if (argmax != slot.argmax || no_eog != slot.no_eog) {
        llama_set_seq_greedy(ctx_, seq_id, argmax, no_eog);  // the rows of a greedy slot need no raw logits
        slot.argmax = argmax;
        slot.no_eog = no_eog;
    }
    if (chained ? slot.serves(*params) : slot.chain == nullptr) {
        return;
    }
    if (slot.chain != nullptr) {
        llama_set_sampler(ctx_, seq_id, nullptr);
        retired_chains_.push_back(slot.chain);  // llama.cpp may still read it until the next decode
        slot.chain = nullptr;
    }
    if (chained) {
        attach(seq_id, params);
    }
}

bool LlamaSession::bans_exactly_eog(const SamplingParams & params) const {
    return !eog_token_ids_.empty() && params.banned_tokens == eog_token_ids_;
}

bool LlamaSession::candidates_cover(const SamplingParams & params) {
    const int32_t k = params.is_greedy() ? 1 : params.top_k;  // top_k 0 (off) keeps the whole row
    return k > 0 && k <= kTopKCandidates && params.num_lowered_tokens >= 0 &&
           k + params.num_lowered_tokens <= kTopKCandidates;
}

// A chain is initialised for the backend once, so every attach gets a new one.
void LlamaSession::attach(int32_t seq_id, const SamplingParams * params) {
    SlotChain & slot = slot_chains_[(size_t) seq_id];
    // [logit_bias ->] greedy, or [logit_bias ->] top_k -> top_p -> min_p -> temp -> dist
    llama_sampler * chain = make_sampler_chain(*params, vocab_);
    if (!llama_set_sampler(ctx_, seq_id, chain)) {
        llama_sampler_free(chain);  // not offloadable here: this slot samples on the CPU
        return;
    }
    slot.chain = chain;
    slot.greedy = params->is_greedy();
    slot.top_k = params->top_k;
    slot.top_p = params->top_p;
    slot.min_p = params->min_p;
    slot.temperature = params->temperature;
    slot.logit_bias = params->logit_bias;
}

const float * LlamaSession::logits(int32_t batch_index) {
    const float * row = llama_get_logits_ith(ctx_, batch_index);
    if (row == nullptr) {
        throw Error(CF_STATUS_INTERNAL, "llama_get_logits_ith returned NULL for batch index " + std::to_string(batch_index));
    }
    return row;
}

void LlamaSession::clear_seq(int32_t seq_id) {
    llama_memory_seq_rm(llama_get_memory(ctx_), seq_id, -1, -1);
}

void LlamaSession::set_kv_plan(const StepPlan & step, size_t begin, size_t end, int32_t first_token,
                               int32_t num_padding) {
    if (!config_.paged()) {
        return;  // llama.cpp places the rows itself
    }
    // Slots are rows of this decode (batch_builder.h): forget which positions the previous decode
    // stored under them, so that llama.cpp's batch validator sees fresh sequences. O(n_seq_max).
    llama_memory_seq_rm(llama_get_memory(ctx_), -1, -1, -1);
    const int32_t n_tokens = [&] {
        int32_t n = 0;
        for (size_t i = begin; i < end; ++i) {
            n += step.seqs[i].num_new_tokens;
        }
        return n;
    }();
    const int32_t * token_seq_idx = step.token_seq_idx.data() + first_token;
    if (begin > 0) {  // a later decode group: its rows count from 0
        group_seq_idx_.assign(token_seq_idx, token_seq_idx + n_tokens);
        for (int32_t & idx : group_seq_idx_) {
            idx -= (int32_t) begin;
        }
        token_seq_idx = group_seq_idx_.data();
    }
    llama_paged_plan plan{};
    plan.slot_mapping = step.slot_mapping.data() + first_token;
    plan.token_seq_idx = token_seq_idx;
    plan.block_tables = step.block_tables.data() + begin * (size_t) step.max_blocks;
    plan.seq_lens = step.context_lens.data() + begin;
    plan.n_tokens = n_tokens;
    plan.n_seqs = (int32_t) (end - begin);
    plan.max_blocks = step.max_blocks;
    if (kv_streaming()) {
        stage_kv_plan(plan);  // before padding, which copies the tables
    }
    if (num_padding > 0) {
        pad_kv_plan(plan, num_padding);
    }
    if (llama_set_paged_plan(ctx_, &plan) != 0) {
        throw Error(CF_STATUS_INTERNAL, "llama_set_paged_plan refused the plan of " + std::to_string(plan.n_tokens) +
                                            " tokens over " + std::to_string(plan.n_seqs) + " sequences");
    }
}

// The padding sequence (batch_builder.h) appended to a decode's plan: index plan.n_seqs, positions
// 0..num_padding-1, every block of its table the scratch block (so position p writes the scratch
// block's row p % block_size; rows written twice hold garbage no real sequence reads). Reuses the
// session's arrays; the table widens when the padding needs more blocks than the widest sequence.
void LlamaSession::pad_kv_plan(llama_paged_plan & plan, int32_t num_padding) {
    if (scratch_block_ < 0 || num_padding < 1) {
        throw Error(CF_STATUS_INTERNAL, "a padded decode without a scratch block");
    }
    const int32_t bs = config_.block_size;
    const int32_t width = std::max(plan.max_blocks, (num_padding + bs - 1) / bs);
    const int32_t * group_seq_idx = plan.token_seq_idx;
    padded_slot_mapping_.assign(plan.slot_mapping, plan.slot_mapping + plan.n_tokens);
    if (group_seq_idx != group_seq_idx_.data()) {
        group_seq_idx_.assign(group_seq_idx, group_seq_idx + plan.n_tokens);
    }
    for (int32_t p = 0; p < num_padding; ++p) {
        padded_slot_mapping_.push_back(scratch_block_ * bs + p % bs);
        group_seq_idx_.push_back(plan.n_seqs);
    }
    padded_block_tables_.assign((size_t) (plan.n_seqs + 1) * (size_t) width, scratch_block_);
    for (int32_t s = 0; s < plan.n_seqs; ++s) {
        std::copy_n(plan.block_tables + (size_t) s * (size_t) plan.max_blocks, plan.max_blocks,
                    padded_block_tables_.begin() + (std::ptrdiff_t) ((size_t) s * (size_t) width));
    }
    padded_seq_lens_.assign(plan.seq_lens, plan.seq_lens + plan.n_seqs);
    padded_seq_lens_.push_back(num_padding);
    plan.slot_mapping = padded_slot_mapping_.data();
    plan.token_seq_idx = group_seq_idx_.data();
    plan.block_tables = padded_block_tables_.data();
    plan.seq_lens = padded_seq_lens_.data();
    plan.n_tokens += num_padding;
    plan.n_seqs += 1;
    plan.max_blocks = width;
}

void LlamaSession::copy_blocks(const std::vector<BlockCopy> & copies) {
    copy_src_.clear();
    copy_dst_.clear();
    for (const BlockCopy & c : copies) {
        copy_src_.push_back(c.src_block_id);
        copy_dst_.push_back(c.dst_block_id);
    }
    if (llama_paged_copy_blocks(ctx_, copy_src_.data(), copy_dst_.data(), (int32_t) copies.size()) != 0) {
        throw Error(CF_STATUS_INTERNAL, "llama_paged_copy_blocks refused " + std::to_string(copies.size()) + " copies");
    }
}

void LlamaSession::swap_blocks(const std::vector<int32_t> & block_ids, const std::vector<void *> & bufs,
                               bool to_host) {
    assert(block_ids.size() == bufs.size());
    if (block_ids.empty()) {
        return;
    }
    if (llama_paged_swap_blocks(ctx_, block_ids.data(), (int32_t) block_ids.size(), bufs.data(), to_host) != 0) {
        throw Error(CF_STATUS_INTERNAL, std::string("llama_paged_swap_blocks refused ") +
                                            std::to_string(block_ids.size()) + " swaps " + (to_host ? "out" : "in"));
    }
}

int64_t LlamaSession::paged_block_bytes() const {
    return config_.paged() ? (int64_t) llama_paged_block_bytes(ctx_) : 0;
}

std::vector<LlamaSession::PoolTensors> LlamaSession::paged_pool_tensors() const {
    std::vector<PoolTensors> pools;
    if (!config_.paged()) {
        return pools;
    }
    const int32_t n = llama_paged_pool_tensors(ctx_, 0, nullptr, nullptr);
    for (int32_t i = 0; i < n; ++i) {
        PoolTensors p{nullptr, nullptr};
        llama_paged_pool_tensors(ctx_, i, &p.k, &p.v);
        pools.push_back(p);
    }
    return pools;
}

void * LlamaSession::cuda_proc(const char * name) {
    return cuda_proc_address(name);
}

void LlamaSession::fill_info(cf_model_info * info) const {
    std::memset(info, 0, sizeof(*info));
    info->n_vocab = n_vocab_;
    info->n_ctx_train = llama_model_n_ctx_train(model_);
    info->n_ctx = n_ctx_;
    info->n_ctx_per_seq = n_ctx_per_seq_;
    info->kv_bytes_per_token = kv_bytes_per_token_;
    info->max_num_seqs = config_.max_num_seqs;
    info->max_num_batched_tokens = n_batch_;
    info->n_layer = llama_model_n_layer(model_);
    info->n_embd = llama_model_n_embd(model_);
    info->n_head = llama_model_n_head(model_);
    info->n_head_kv = llama_model_n_head_kv(model_);
    info->kv_mode = config_.kv_mode;
    info->block_size = config_.paged() ? config_.block_size : 0;
    info->token_bos = llama_vocab_bos(vocab_);  // LLAMA_TOKEN_NULL == CF_TOKEN_NONE == -1
    info->token_eos = llama_vocab_eos(vocab_);
    info->add_bos = llama_vocab_get_add_bos(vocab_) ? 1 : 0;
    info->vocab_type = (int32_t) llama_vocab_type(vocab_);
    info->n_threads = config_.n_threads;
    info->model_size_bytes = (int64_t) llama_model_size(model_);
    info->n_params = (int64_t) llama_model_n_params(model_);
    char desc[sizeof(info->description)];
    llama_model_desc(model_, desc, sizeof(desc));
    copy_cstr(info->description, sizeof(info->description), desc);
    char arch[sizeof(info->arch)] = {0};
    if (llama_model_meta_val_str(model_, "general.architecture", arch, sizeof(arch)) < 0) {
        arch[0] = '\0';
    }
    copy_cstr(info->arch, sizeof(info->arch), arch);
    std::string kv_devices;
    for (const PoolTensors & pool : paged_pool_tensors()) {
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(pool.k->buffer));
        kv_devices += (kv_devices.empty() ? "" : ",") + std::string(dev != nullptr ? ggml_backend_dev_name(dev) : "CPU");
    }
    copy_cstr(info->kv_devices, sizeof(info->kv_devices), kv_devices.c_str());
    info->num_fused_projections = num_fused_projections_;
}

}  // namespace cf
