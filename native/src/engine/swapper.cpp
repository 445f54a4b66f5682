// swapper.cpp - see swapper.h.
#include "engine/swapper.h"

#include "core/error.h"
#include "engine/engine.h"
#include "engine/llama_session.h"

#include <cassert>

namespace cf {

Swapper::Swapper(int32_t num_slots, int64_t block_bytes) : num_slots_(num_slots), block_bytes_(block_bytes) {
    assert(num_slots >= 0 && block_bytes >= 0);
    const size_t n_bytes = (size_t) num_slots * (size_t) block_bytes;
    if (n_bytes > 0) {
        host_.reset((uint8_t *) std::calloc(n_bytes, 1));
        if (!host_) {
            throw Error(CF_STATUS_OUT_OF_MEMORY, "cannot reserve " + std::to_string(n_bytes) +
                                                     " bytes of swap space (lower swap_space_bytes)");
        }
    }
}

void Swapper::swap_out(LlamaSession & session, const std::vector<BlockSwap> & swaps) {
    const int64_t t0 = clock_ns();
    run(session, swaps, /*to_host=*/true);
    stats_.out_ns += clock_ns() - t0;
    stats_.num_out_bytes += (int64_t) swaps.size() * block_bytes_;
}

void Swapper::swap_in(LlamaSession & session, const std::vector<BlockSwap> & swaps) {
    const int64_t t0 = clock_ns();
    run(session, swaps, /*to_host=*/false);
    stats_.in_ns += clock_ns() - t0;
    stats_.num_in_bytes += (int64_t) swaps.size() * block_bytes_;
}

void Swapper::run(LlamaSession & session, const std::vector<BlockSwap> & swaps, bool to_host) {
    block_ids_.clear();
    bufs_.clear();
    for (const BlockSwap & s : swaps) {
        const int32_t slot = to_host ? s.dst_block_id : s.src_block_id;
        if (slot < 0 || slot >= num_slots_) {
            throw Error(CF_STATUS_INTERNAL, "swap: host slot " + std::to_string(slot) + " outside [0, " +
                                                std::to_string(num_slots_) + ")");
        }
        block_ids_.push_back(to_host ? s.src_block_id : s.dst_block_id);
        bufs_.push_back(host_.get() + (size_t) slot * (size_t) block_bytes_);
    }
    session.swap_blocks(block_ids_, bufs_, to_host);
}

}  // namespace cf
