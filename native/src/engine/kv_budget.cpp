// kv_budget.cpp - see kv_budget.h.
#include "engine/kv_budget.h"

#include <algorithm>

namespace cf {

KvBudget kv_budget(int64_t kv_cache_bytes, int64_t kv_bytes_per_token, int32_t kv_mode, int32_t max_num_seqs) {
    constexpr int64_t kPad = 256;
    KvBudget b;
    const bool split = kv_mode == CF_KV_MODE_STOCK;
    const int64_t seqs = std::max<int32_t>(1, max_num_seqs);
    b.rows = kv_cache_bytes / std::max<int64_t>(1, kv_bytes_per_token);
    const int64_t per_stream = split ? b.rows / seqs : b.rows;
    const int64_t n_ctx = per_stream / kPad * kPad * (split ? seqs : 1);
    b.min_rows = split ? kPad * seqs : (std::max(kPad, seqs) + kPad - 1) / kPad * kPad;
    b.n_ctx = n_ctx >= b.min_rows ? n_ctx : 0;
    return b;
}

}  // namespace cf
