// kv_budget.h - how many KV rows (llama.cpp's n_ctx) a KV cache budget in bytes holds: the one rule behind
// cf_engine_config.kv_cache_bytes (LlamaSession) and cf_kv_cache_rows_for_budget (cacheflow.h), which
// `cacheflow bench` calls to refuse a too-small --kv-cache-memory before it measures anything.
#pragma once

#include "cacheflow.h"

#include <cstdint>

namespace cf {

struct KvBudget {
    int64_t rows = 0;      // whole KV rows the bytes hold: kv_cache_bytes / kv_bytes_per_token
    int64_t n_ctx = 0;     // rows the cache gets (llama.cpp's n_ctx); 0 if below min_rows
    int64_t min_rows = 0;  // the fewest rows a cache for max_num_seqs sequences may have
};

// llama.cpp pads n_ctx (and, in stock split mode, each sequence's slice) up to multiples of 256 rows
// (llama-context.cpp), so a budget is rounded down to whole multiples, per sequence in split mode
// (CF_KV_MODE_STOCK): at least 256 rows per sequence. Any other mode (the paged pool, the unified
// stock stream) needs at least 256 rows and one per sequence. kv_bytes_per_token >= 1, max_num_seqs >= 1.
KvBudget kv_budget(int64_t kv_cache_bytes, int64_t kv_bytes_per_token, int32_t kv_mode, int32_t max_num_seqs);

}  // namespace cf
