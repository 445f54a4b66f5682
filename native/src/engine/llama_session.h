// llama_session.h - owns the llama.cpp model and context of one engine (stock and paged KV modes).
//
// kv_mode AUTO resolves here, once the model is loaded: PAGED where the paged KV path covers the
// model (plain full-attention layers, CPU), else STOCK with a one-line notice on stderr.
//
// Sampling runs in-graph where it can: greedy rows without a logit bias are sampled by one
// batched argmax over all output rows of a decode (patch 0005: one ggml_argmax node, one copy of
// [n_outputs] token ids, instead of one single-row argmax node and one 4-byte copy per sequence).
// A slot whose sequence samples with temperature > 0 and a random seed gets llama.cpp's backend
// sampler chain top_k -> top_p -> min_p -> temp -> dist of its parameters, and a greedy slot with
// a logit bias (llama-server's ignore_eos is one: -inf on every EOG token) the chain
// logit_bias -> greedy; a logit bias leads a stochastic chain too. Penalties and grammars keep a
// row on the CPU. A step whose sampled rows are all argmax or chained copies back token ids
// instead of [n_vocab] logits per row, and no sequence is sampled on the CPU one after the other.
// A stochastic row whose chain starts with top_k of at most kTopKCandidates (llama-server's default
// top_k is 40) and has no penalty or grammar, and no logit bias other than lowering ones (see
// candidates_cover; llama-server's ignore_eos is one) takes neither: the graph computes the
// kTopKCandidates largest logits of every output row in one top-k node (patch 0006; on CUDA one
// launch for all rows, native/src/kernels/cuda/top_k_rows.cu) and copies their ids and logits back,
// and the engine runs the sequence's own llama.cpp chain over those candidates on the CPU
// (sample_candidates, on SamplingPool's threads): the same token as the chain over the full row,
// for any seed, at [kTopKCandidates] floats per row instead of [n_vocab], and no sampler kernels
// per row.
// Other seeded sequences sample on the CPU with their own chain (the same tokens for a seed whatever
// the slot's history), so their slot's chain is detached and llama.cpp copies the logits of the
// ubatch as before. Attaching or detaching a chain makes llama.cpp re-reserve its graph on the
// next decode, so a slot keeps its chain while the next sequence in it wants the same kind and
// parameters (a random-seed chain's generator simply goes on). CACHEFLOW_HOST_SAMPLING=1 in the
// environment turns in-graph sampling off (for A/B runs). Slots (batch_builder.h) are stable per
// request in the stock modes and rows of one decode in paged mode: there a row's chain serves
// whichever sequence sits in the row, so greedy rows (and rows of equal stochastic parameters)
// never re-attach, while a mix of kinds re-attaches where rows shift as sequences come and go.
//
// Thread-safety: decode/logits/clear_seq only from the stepping thread; the vocab and model are
// read-only after open() and may be used from any thread (tokenize, detokenize, info).
#pragma once

#include "cacheflow.h"
#include "core/block_manager.h"
#include "core/error.h"
#include "core/sequence.h"
#include "core/step_plan.h"
#include "engine/config.h"
#include "ggml-backend.h"
#include "kernels/kv_stream.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_batch;
struct llama_sampler;
struct llama_paged_plan;
struct ggml_tensor;

namespace cf {

// The environment variable `name` as a whole number in [lo, hi]: `fallback` when unset or empty, and also for any
// other value, which a notice on stderr names with the range (a typo must not silently change an A/B run). A
// fallback below lo stands for "the engine decides" and is named so.
int env_int_in(const char * name, int lo, int hi, int fallback);

// Route llama.cpp/ggml logs to stderr, filtered by level (process-wide: the last engine wins).
void set_log_level(cf_log_level level);

class LlamaSession {
  public:
    // Load the model and create the context. Throws cf::Error: MODEL_LOAD_FAILED ("model file not
    // found: PATH" or "failed to load model from PATH (corrupt or unsupported GGUF?)"),
    // UNSUPPORTED (no decoder / encoder-decoder; kv_mode=paged on a model it does not cover;
    // llama.cpp refused the context settings), OUT_OF_MEMORY (the context, whose largest buffer is
    // the KV cache, could not be allocated; the message gives the KV size and what to lower).
    // With KV streaming on a CUDA device the warm-up decode waits for start_kv_stream() (the staging pool is
    // reserved first).
    static std::unique_ptr<LlamaSession> open(const EngineConfig & config);
    ~LlamaSession();
    LlamaSession(const LlamaSession &) = delete;
    LlamaSession & operator=(const LlamaSession &) = delete;

    // llama_decode: 0 on success, else llama.cpp's error code.
    int32_t decode(const llama_batch & batch);
    // Wait for the last decode's device work and copies (llama_synchronize).
    void synchronize();
    // Logits row [n_vocab] float of batch token `batch_index` (which must have requested logits
    // and belong to a slot without an in-graph sampler, else the row holds stale data).
    const float * logits(int32_t batch_index);
    // Token chosen in-graph for batch token `batch_index` of llama.cpp slot seq_id, or CF_TOKEN_NONE
    // when that row was not sampled in-graph (its slot is neither greedy nor chained, or in-graph
    // sampling is off). Greedy ties between
    // equal maxima are broken by the backend's argmax kernel.
    int32_t sampled_token(int32_t batch_index, int32_t seq_id);

    // Async decode (paged mode with in-graph sampling; the default on one CUDA device, CACHEFLOW_ASYNC_DECODE=0|1): the
    // context has a device token feed (patches 0017, 0018) and the engine may launch a step's decode before it reads
    // the last step's tokens.
    bool async_decode() const { return token_feed_rows_ > 0; }
    // Whether slot seq_id's rows are sampled by the batched argmax (plain or without EOG tokens).
    bool slot_samples_argmax(int32_t seq_id) const;
    // llama_decode of `batch` whose first n_fed tokens take their ids on the device from the last decode's output row
    // of the same index, or row rows[i] for token i where rows is given ([n_fed]; the argmax its slot reads: without
    // EOG tokens for such slots); the rest from the batch. Needs async_decode(); every one of those rows must have
    // been an output row of the last decode.
    int32_t decode_fed(const llama_batch & batch, int32_t n_fed, const int32_t * rows = nullptr);
    // As sampled_token, for output row `row` of the decode before the last (an argmax slot only; async_decode()).
    int32_t previous_sampled_token(int32_t row, int32_t seq_id);
    // The top-k candidates of batch token `batch_index` of slot seq_id when that slot samples from
    // them (see the file comment): *ids [n] token ids and *logits [n] their logits, in no particular
    // order, valid until the next decode; returns n (kTopKCandidates), or 0 when the row was not
    // reduced to candidates.
    int32_t top_k_candidates(int32_t batch_index, int32_t seq_id, const int32_t ** ids, const float ** logits);
    // Candidates per row of the batched top-k (patch 0006); rows whose top_k is larger or 0 (off)
    // keep their own chain.
    static constexpr int32_t kTopKCandidates = 64;
    // Call before decode for each scheduled sequence: give llama.cpp slot seq_id the in-graph chain for
    // `params` (greedy, or stochastic with a random seed), or none (params == nullptr, or seeded:
    // the engine samples on the CPU). No-op when the slot already has what it needs.
    void set_seq_sampling(int32_t seq_id, const SamplingParams * params);
    // Drop every KV row of llama sequence slot seq_id (paged mode: only llama.cpp's position record
    // of the slot; the blocks belong to the block manager).
    void clear_seq(int32_t seq_id);

    // The KV part of the step plan for the next decode (paged mode: slot mapping, block tables,
    // context lengths; stock modes: nothing to do), and block copies (copy-on-write) to perform
    // before it. Both throw INTERNAL when llama.cpp refuses them (a bug: the message is in
    // llama.cpp's log).
    // One decode group of the plan: seqs [begin, end), whose tokens start at first_token, then
    // num_padding padding tokens (batch_builder.h) of one more sequence, at positions
    // 0..num_padding-1, all in the scratch block.
    void set_kv_plan(const StepPlan & plan, size_t begin, size_t end, int32_t first_token, int32_t num_padding = 0);
    // Step padding (batch_builder.h): decodes of at most this many tokens are padded, 0 for none.
    // On in paged mode when layers are offloaded to a CUDA device that may use CUDA graphs;
    // CACHEFLOW_STEP_PADDING=0 / 1 turns it off / on (on: any backend, for tests and A/B runs).
    int32_t max_padded_tokens() const { return max_padded_tokens_; }
    void copy_blocks(const std::vector<BlockCopy> & copies);
    // Swap whole blocks (patches/0007): to_host copies block block_ids[i] into bufs[i], else bufs[i]
    // into block block_ids[i]; each buffer holds paged_block_bytes(). Throws INTERNAL if refused.
    void swap_blocks(const std::vector<int32_t> & block_ids, const std::vector<void *> & bufs, bool to_host);
    // Paged mode: bytes of one block over all layers, K and V; 0 in the stock modes.
    int64_t paged_block_bytes() const;
    // Paged mode: each layer's K and V pool tensors (patches/0011), in paged_block_bytes' layout order:
    // [n_embd_k_gqa, kv_size] / [n_embd_v_gqa, kv_size], row = KV slot; owned by the context. Empty in the
    // stock modes.
    struct PoolTensors {
        ggml_tensor * k;
        ggml_tensor * v;
    };
    std::vector<PoolTensors> paged_pool_tensors() const;
    // A CacheFlow function of ggml-cuda's registry (patches 0008-0011) by name; nullptr without the CUDA
    // backend or without that function.
    static void * cuda_proc(const char * name);

    void fill_info(cf_model_info * info) const;

    // ---- KV streaming (kernels/kv_stream.h; config().kv_streaming resolved to ON or OFF at open)
    //
    // The session owns the descriptor (its address is llama_context_params.paged_kv_stream, so every paged
    // attention node carries it), its staged_slots [max_staged] / num_staged [1] lists (pinned on CUDA) and,
    // on the CPU, the staging rows: max_staged more pool blocks from stage_base_block on, never handed to the
    // block manager (num_blocks() leaves them out, like the scratch block of step padding). On CUDA
    // stage_base_block = llama_paged_n_blocks (the whole pool) and the rows are ggml-cuda's staging pool.
    bool kv_streaming() const { return config_.kv_streaming == CF_KV_STREAMING_ON; }
    // Streaming only for a sequence that runs alone (kv_streaming AUTO resolved to ON on CUDA).
    bool kv_stream_alone_only() const { return kv_stream_alone_only_; }
    bool kv_stream_on_cuda() const { return kv_stream_cuda_; }
    int32_t kv_stream_blocks() const { return kv_streaming() ? config_.kv_stream_blocks : 0; }
    // R = kv_stream_blocks host-resident blocks need R host slots of the swap space, one KV block of
    // block_bytes bytes each (all layers' K and V): throws INVALID_ARGUMENT naming kv_stream_blocks and
    // swap_space_bytes when swap_space_bytes / block_bytes is fewer. The session checks it with the model's
    // block bytes before it allocates the KV cache (a large R would allocate R staging blocks first on the
    // CPU); the Engine again with the context's. No-op when streaming is off.
    void check_kv_stream_host_slots(int64_t block_bytes) const;
    // The host tier is ready (the Swapper's buffer, host_block_bytes == paged_block_bytes() per slot, pinned on
    // CUDA): set host_base, on CUDA reserve the staging pool (ggml_cuda_cf_kv_stream_reserve) and run the
    // warm-up decode. Call once, before the first decode, when kv_streaming(). Throws UNSUPPORTED / INTERNAL.
    void start_kv_stream(const uint8_t * host_base);
    // Counters of staging since open: blocks staged (sum over decodes of *num_staged), their bytes (all layers),
    // decodes that staged; on CUDA also ggml-cuda's stats (out[4] of cf_cuda_kv_stream_stats_fn, else -1s).
    struct KvStreamCounters {
        int64_t num_staged_blocks = 0;
        int64_t num_staged_bytes = 0;
        int64_t num_staging_decodes = 0;
        int64_t cuda[4] = {-1, -1, -1, -1};
    };
    KvStreamCounters kv_stream_counters() const;

    const llama_model * model() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }
    int32_t n_vocab() const { return n_vocab_; }
    int32_t n_ctx() const { return n_ctx_; }                  // total KV rows
    int32_t n_ctx_per_seq() const { return n_ctx_per_seq_; }  // max tokens of one sequence
    int32_t n_batch() const { return n_batch_; }              // per-step token budget
    int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }
    // ggml-cuda's graph evaluations of this process since start (patch 0009): out = {captured into a CUDA
    // graph, replayed from one, launched directly}; all 0 without the CUDA backend.
    static void cuda_graph_counts(int64_t out[3]);
    // llama_decode calls of this session (warm-up included), and the ubatches among them whose
    // ggml graph reused the previous one instead of being built again (llama_perf_context).
    int64_t num_decodes() const { return num_decodes_; }
    int64_t num_graphs_reused() const;
    // paged mode: blocks in the pool the block manager owns (without the scratch block of step
    // padding), else 0
    int32_t num_blocks() const { return num_blocks_; }
    // llama.cpp's n_seq_max: the most sequences of one decode (stock: max_num_seqs; paged:
    // min(max_num_seqs, 256), larger steps run as several decodes).
    int32_t n_seq_max() const { return n_seq_max_; }
    const EngineConfig & config() const { return config_; }

  private:
    explicit LlamaSession(const EngineConfig & config) : config_(config) {}
    void pad_kv_plan(llama_paged_plan & plan, int32_t num_padding);
    void load_model();
    void resolve_kv_mode();
    void create_context();
    int32_t n_ctx_from_budget() const;
    Error context_error(uint32_t n_ctx, uint32_t n_seq_max, bool out_of_memory, const std::string & detail) const;
    void warm_up();
    void warm_up_on_own_thread();
    void init_greedy_samplers();
    void free_samplers();

    EngineConfig config_;
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    int32_t n_vocab_ = 0;
    int32_t num_fused_projections_ = 0;  // llama_model_fuse_projections at load (patches/0019)
    bool embd_with_layers_ = true;  // the token embedding is on the device of the layers (all on the CPU, or on CUDA)
    bool embd_on_cuda_ = false;     // ... and that device is the one CUDA device holding the whole model
    int32_t n_ctx_ = 0;
    int32_t n_ctx_per_seq_ = 0;
    int32_t n_batch_ = 0;
    int64_t kv_bytes_per_token_ = 0;
    // The devices the offloaded layers (and their KV caches) go to, in layer order (devices.h); the
    // CPU holds the rest. Fixed at load_model.
    std::vector<ggml_backend_dev_t> offload_devices_;
    // What an in-graph chain samples with; a slot keeps its chain while this stays the same.
    struct SlotChain {
        llama_sampler * chain = nullptr;  // in-graph chain ([logit_bias ->] greedy or stochastic), or nullptr
        bool argmax = false;              // greedy, no logit bias: the batched argmax (patch 0005); no chain then
        bool no_eog = false;              // argmax with every EOG token banned (llama-server's ignore_eos)
        bool greedy = false;              // the chain ends in greedy
        bool candidates = false;          // sampled on the CPU from the batched top-k candidates (patch 0006)
        // none of chain, argmax, candidates: the slot samples on the CPU from its logits row
        int32_t top_k = 0;
        float top_p = 1.0f;
        float min_p = 0.0f;
        float temperature = 0.0f;
        std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias): ignore_eos bans EOG
        bool serves(const SamplingParams & p) const;
    };
    void attach(int32_t seq_id, const SamplingParams * params);
    // True if logit_bias is -INFINITY on every EOG token of the vocab and nothing else (ignore_eos).
    bool bans_exactly_eog(const SamplingParams & params) const;
    // True if the kTopKCandidates largest raw logits of a row hold every token the row's chain
    // ([logit_bias ->] top_k(k) -> ... or [logit_bias ->] greedy, k = 1) can pick: no bias is positive
    // and k + (number of biased tokens) <= kTopKCandidates. Why: a bias b <= 0 only moves a token
    // down, so a token t in the top k after the bias has at most k - 1 tokens above it that are also
    // in that top k, and any other token above t in the raw order must have been lowered below t,
    // so t ranks at most k + n_biased in the raw logits. The chain then runs over the candidates
    // (logit_bias applied to those present) and picks what it picks over the whole row.
    static bool candidates_cover(const SamplingParams & params);
    std::vector<int32_t> eog_token_ids_;            // sorted; filled at open()

    bool backend_sampling_ = false;                 // in-graph sampling is on
    int32_t token_feed_rows_ = 0;                   // rows M of the device token feed (async_decode), 0 = none
    std::vector<int32_t> feed_src_;                 // decode_fed's sources, reused
    std::vector<SlotChain> slot_chains_;            // [n_seq_max]
    std::vector<llama_sampler *> retired_chains_;   // detached; freed after the next decode
    int64_t num_decodes_ = 0;
    int32_t num_blocks_ = 0;
    int32_t n_seq_max_ = 0;
    int32_t max_padded_tokens_ = 0;
    int32_t scratch_block_ = -1;  // step padding: the pool's last block, never given to the block manager
    std::vector<int32_t> group_seq_idx_;  // set_kv_plan scratch: token_seq_idx of a later decode group
    // set_kv_plan scratch of a padded decode: the plan's arrays with the padding sequence appended
    std::vector<int32_t> padded_slot_mapping_, padded_block_tables_, padded_seq_lens_;
    std::vector<int32_t> copy_src_;  // copy_blocks scratch
    std::vector<int32_t> copy_dst_;

    // KV streaming
    void resolve_kv_streaming();
    void init_kv_stream_desc();  // after the context exists
    // Rewrite the host entries (<= -2) of plan's block tables into staged ids and fill the staged list.
    void stage_kv_plan(llama_paged_plan & plan);
    bool kv_stream_alone_only_ = false;
    bool kv_stream_cuda_ = false;
    bool warm_up_deferred_ = false;
    bool kv_stream_reserved_ = false;
    std::unique_ptr<cf_kv_stream_desc> stream_desc_;
    int32_t * staged_slots_ = nullptr;  // [max_staged], then num_staged: in staged_list_ (CPU) or pinned_lists_
    int32_t * num_staged_ = nullptr;
    bool stream_hooks_on_ = false;      // the graphs carry the descriptor (llama_paged_set_kv_stream_active)
    std::vector<int32_t> staged_list_;
    ggml_backend_buffer * pinned_lists_ = nullptr;
    std::vector<int32_t> staged_tables_;  // stage_kv_plan scratch
    KvStreamCounters stream_counters_;
};

}  // namespace cf
