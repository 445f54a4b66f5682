// llama_session.h - owns the llama.cpp model and context of one engine (stock KV modes).
//
// Thread-safety: decode/logits/clear_seq only from the stepping thread; the vocab and model are
// read-only after open() and may be used from any thread (tokenize, detokenize, info).
#pragma once

#include "cacheflow.h"
#include "engine/config.h"

#include <cstdint>
#include <memory>

struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_batch;

namespace cf {

// Route llama.cpp/ggml logs to stderr, filtered by level (process-wide: the last engine wins).
void set_log_level(cf_log_level level);

class LlamaSession {
  public:
    // Load the model and create the context. Throws cf::Error: MODEL_LOAD_FAILED ("model file not
    // found: PATH" or "failed to load model from PATH (corrupt or unsupported GGUF?)"),
    // UNSUPPORTED (no decoder / encoder-decoder), OUT_OF_MEMORY (context creation failed).
    static std::unique_ptr<LlamaSession> open(const EngineConfig & config);
    ~LlamaSession();
    LlamaSession(const LlamaSession &) = delete;
    LlamaSession & operator=(const LlamaSession &) = delete;

    // llama_decode: 0 on success, else llama.cpp's error code.
    int32_t decode(const llama_batch & batch);
    // Logits row [n_vocab] float of batch token `batch_index` (which must have requested logits).
    const float * logits(int32_t batch_index);
    // Drop every KV row of llama sequence slot seq_id.
    void clear_seq(int32_t seq_id);

    void fill_info(cf_model_info * info) const;

    const llama_model * model() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }
    int32_t n_vocab() const { return n_vocab_; }
    int32_t n_ctx() const { return n_ctx_; }                  // total KV rows
    int32_t n_ctx_per_seq() const { return n_ctx_per_seq_; }  // max tokens of one sequence
    int32_t n_batch() const { return n_batch_; }              // per-step token budget
    int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }
    const EngineConfig & config() const { return config_; }

  private:
    explicit LlamaSession(const EngineConfig & config) : config_(config) {}
    void load_model();
    void create_context();
    void warm_up();

    EngineConfig config_;
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    int32_t n_vocab_ = 0;
    int32_t n_ctx_ = 0;
    int32_t n_ctx_per_seq_ = 0;
    int32_t n_batch_ = 0;
    int64_t kv_bytes_per_token_ = 0;
};

}  // namespace cf
