// stock_kv.cpp - the two stock KV cache managers (llama.cpp places the rows; this side only counts).
#include "kv/kv_cache_manager.h"

#include <cassert>
#include <sstream>

namespace cf {

namespace {

// Split mode: a running sequence owns one whole stream of n_ctx_per_seq rows, so admission needs
// nothing but a free running slot (the scheduler's max_num_seqs) and allocation never fails.
class StockSplitKv final : public KvCacheManager {
  public:
    explicit StockSplitKv(int32_t n_ctx_per_seq) : n_ctx_per_seq_(n_ctx_per_seq) { assert(n_ctx_per_seq >= 1); }

    const char * name() const override { return "stock split"; }
    bool can_admit(const Sequence & /*seq*/, int32_t /*num_running*/, bool /*with_deferred*/,
                   int64_t /*num_reserved_blocks*/) const override {
        return true;
    }
    int32_t admit(const Sequence & /*seq*/) override {
        num_streams_ += 1;
        return 0;
    }
    bool allocate(const Sequence & /*seq*/, int32_t num_new_tokens) override {
        assert(num_new_tokens >= 1);
        (void) num_new_tokens;
        return true;
    }
    void free(const Sequence & /*seq*/) override {
        assert(num_streams_ >= 1);
        num_streams_ -= 1;
    }
    void fill_plan(StepPlan * /*plan*/) override {}
    int64_t kv_tokens_reserved() const override { return (int64_t) num_streams_ * n_ctx_per_seq_; }

    std::string check_invariants(const std::vector<std::unique_ptr<Sequence>> & running) const override {
        if (num_streams_ != (int64_t) running.size()) {
            return "stock split: " + std::to_string(num_streams_) + " streams held but " +
                   std::to_string(running.size()) + " sequences running";
        }
        return "";
    }

    std::string dump() const override {
        return "StockSplitKv(streams=" + std::to_string(num_streams_) + ", n_ctx_per_seq=" +
               std::to_string(n_ctx_per_seq_) + ")\n";
    }

  private:
    int32_t n_ctx_per_seq_;
    int64_t num_streams_ = 0;  // running sequences
};

// Unified mode: one pool of n_ctx rows. llama.cpp finds rows for each token itself and has no
// preemption, so a sequence reserves the most it may ever hold, min(prompt + max_tokens,
// n_ctx_per_seq), at admission; allocation then never fails.
class StockUnifiedKv final : public KvCacheManager {
  public:
    StockUnifiedKv(int32_t n_ctx, int32_t n_ctx_per_seq) : n_ctx_(n_ctx), n_ctx_per_seq_(n_ctx_per_seq) {
        assert(n_ctx_per_seq >= 1 && n_ctx >= n_ctx_per_seq);
    }

    const char * name() const override { return "stock unified"; }
    bool can_admit(const Sequence & seq, int32_t /*num_running*/, bool /*with_deferred*/,
                   int64_t /*num_reserved_blocks*/) const override {
        return reserved_ + seq.max_kv_tokens(n_ctx_per_seq_) <= n_ctx_;
    }
    int32_t admit(const Sequence & seq) override {
        reserved_ += seq.max_kv_tokens(n_ctx_per_seq_);
        return 0;
    }
    bool allocate(const Sequence & /*seq*/, int32_t num_new_tokens) override {
        assert(num_new_tokens >= 1);
        (void) num_new_tokens;
        return true;
    }
    void free(const Sequence & seq) override {
        reserved_ -= seq.max_kv_tokens(n_ctx_per_seq_);
        assert(reserved_ >= 0);
    }
    void fill_plan(StepPlan * /*plan*/) override {}
    int64_t kv_tokens_reserved() const override { return reserved_; }

    std::string check_invariants(const std::vector<std::unique_ptr<Sequence>> & running) const override {
        int64_t reserved = 0;
        for (const auto & seq : running) {
            reserved += seq->max_kv_tokens(n_ctx_per_seq_);
        }
        if (reserved != reserved_) {
            return "stock unified: reservation counter " + std::to_string(reserved_) +
                   " does not match the running sequences' " + std::to_string(reserved);
        }
        if (reserved_ > n_ctx_) {
            return "stock unified: reservations " + std::to_string(reserved_) + " exceed n_ctx " + std::to_string(n_ctx_);
        }
        return "";
    }

    std::string dump() const override {
        std::ostringstream os;
        os << "StockUnifiedKv(reserved=" << reserved_ << "/" << n_ctx_ << ", n_ctx_per_seq=" << n_ctx_per_seq_ << ")\n";
        return os.str();
    }

  private:
    int32_t n_ctx_;
    int32_t n_ctx_per_seq_;
    int64_t reserved_ = 0;  // sum of max_kv_tokens over running sequences
};

}  // namespace

std::unique_ptr<KvCacheManager> make_stock_split_kv(int32_t n_ctx_per_seq) {
    return std::make_unique<StockSplitKv>(n_ctx_per_seq);
}

std::unique_ptr<KvCacheManager> make_stock_unified_kv(int32_t n_ctx, int32_t n_ctx_per_seq) {
    return std::make_unique<StockUnifiedKv>(n_ctx, n_ctx_per_seq);
}

}  // namespace cf
