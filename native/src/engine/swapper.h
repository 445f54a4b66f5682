// swapper.h - the host memory of swap preemption and the copies of a plan's block swaps.
//
// Host slot h (kv/host_block_pool.h: the paged KV manager hands out slot ids) is bytes
// [h * block_bytes, (h + 1) * block_bytes) of one buffer allocated at engine creation with
// calloc (the OS backs its pages only once a swap-out writes them). A block's bytes are every
// layer's K and V rows of block_size tokens, as llama_paged_block_bytes() lays them out
// (patches/0007). The copies go through llama.cpp (ggml_backend_tensor_get/set), so the pool
// may live on any backend; on a GPU the buffer should become pinned memory (not done yet: the
// GPU half of issue 13).
//
// Thread-safety: none; the stepping thread only.
#pragma once

#include "core/step_plan.h"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace cf {

class LlamaSession;

struct SwapStats {
    int64_t num_out_bytes = 0;
    int64_t num_in_bytes = 0;
    int64_t out_ns = 0;
    int64_t in_ns = 0;
};

class Swapper {
  public:
    // num_slots >= 0 host slots of block_bytes >= 0 bytes; throws OUT_OF_MEMORY when the buffer
    // cannot be reserved.
    Swapper(int32_t num_slots, int64_t block_bytes);

    int32_t num_slots() const { return num_slots_; }
    int64_t block_bytes() const { return block_bytes_; }
    const SwapStats & stats() const { return stats_; }

    // Steps 1 and 2 of a plan: every swap-out (device block -> host slot), then every swap-in
    // (host slot -> device block). Throws INTERNAL when llama.cpp refuses (a bug). Call only
    // with slot ids below num_slots().
    void swap_out(LlamaSession & session, const std::vector<BlockSwap> & swaps);
    void swap_in(LlamaSession & session, const std::vector<BlockSwap> & swaps);

  private:
    void run(LlamaSession & session, const std::vector<BlockSwap> & swaps, bool to_host);

    int32_t num_slots_;
    int64_t block_bytes_;
    std::unique_ptr<uint8_t, decltype(&std::free)> host_{nullptr, &std::free};
    std::vector<int32_t> block_ids_;  // scratch
    std::vector<void *> bufs_;        // scratch
    SwapStats stats_;
};

}  // namespace cf
