// paged_kv.cpp - see paged_kv.h.
#include "kv/paged_kv.h"

#include <algorithm>
#include <cassert>

namespace cf {

PagedKv::PagedKv(int32_t num_blocks, int32_t block_size, bool prefix_caching, int32_t num_host_blocks,
                 int64_t block_bytes)
    : blocks_(num_blocks, block_size, prefix_caching),
      host_(num_host_blocks),
      block_bytes_(block_bytes),
      watermark_blocks_(std::max<int64_t>(1, num_blocks / 100)) {}

PrefixMatch PagedKv::match(const Sequence & seq) const {
    PrefixMatch m = blocks_.match_prefix(seq.tokens.data(), seq.num_tokens() - 1);
    if (m.copy_src_free && blocks_.num_blocks_needed(m, seq.num_tokens()) > num_blocks_total()) {
        // A sequence that fills the pool alone cannot also pin a free copy source: it would never
        // be admitted. It computes those few rows itself.
        m.copy_src_block_id = CF_BLOCK_ID_NONE;
        m.num_copy_tokens = 0;
        m.copy_src_free = false;
    }
    return m;
}

int64_t PagedKv::num_blocks_to_admit(const Sequence & seq) const {
    if (!uses_cache(seq)) {
        return blocks_.num_blocks_needed(seq.request_id, seq.num_uncomputed_tokens());
    }
    return blocks_.num_blocks_needed(match(seq), seq.num_tokens());
}

bool PagedKv::can_admit(const Sequence & seq, int32_t num_running, bool with_deferred) const {
    const int64_t watermark = num_running == 0 ? 0 : std::max<int64_t>(watermark_blocks_, num_running);
    return num_blocks_to_admit(seq) + watermark <= num_free_blocks(with_deferred);
}

int32_t PagedKv::admit(const Sequence & seq) {
    assert(blocks_.find(seq.request_id) == nullptr && seq.num_computed_tokens == 0);
    if (!uses_cache(seq)) {
        return 0;  // blocks come with allocate()
    }
    const PrefixMatch m = match(seq);
    blocks_.allocate_prefix(seq.request_id, m, seq.num_tokens());
    return m.num_tokens();
}

void PagedKv::commit(const Sequence & seq) {
    if (uses_cache(seq)) {
        blocks_.commit(seq.request_id, seq.tokens.data(), seq.num_computed_tokens);
    }
}

bool PagedKv::allocate(const Sequence & seq, int32_t num_new_tokens) {
    assert(num_new_tokens >= 1);
    return blocks_.append_slots(seq.request_id, num_new_tokens, nullptr);
}

void PagedKv::free(const Sequence & seq) {
    if (blocks_.find(seq.request_id) != nullptr) {  // none if it never got a block
        blocks_.free(seq.request_id);
    }
}

void PagedKv::fork(const Sequence & parent, const Sequence & child) {
    blocks_.fork(parent.request_id, child.request_id);
}

bool PagedKv::can_swap_out(const Sequence & seq) const {
    const BlockTable * table = blocks_.find(seq.request_id);
    return table != nullptr && table->num_tokens > 0 && table->num_blocks() <= host_.num_free();
}

int64_t PagedKv::swap_bytes(const Sequence & seq) const {
    const BlockTable * table = blocks_.find(seq.request_id);
    return table == nullptr ? 0 : (int64_t) table->num_blocks() * block_bytes_;
}

// Every block is copied out, shared or not: a shared block's other holders keep it on the device
// (its ref count drops by one), and seq comes back in private blocks.
void PagedKv::swap_out(const Sequence & seq, std::vector<BlockSwap> * out) {
    assert(can_swap_out(seq) && swapped_.count(seq.request_id) == 0);
    const BlockTable & table = *blocks_.find(seq.request_id);
    SwappedTable & swapped = swapped_[seq.request_id];
    swapped.num_tokens = table.num_tokens;
    const bool ok = host_.allocate(table.num_blocks(), &swapped.host_slots);
    assert(ok);
    (void) ok;
    for (size_t i = 0; i < table.block_ids.size(); ++i) {
        out->push_back({ table.block_ids[i], swapped.host_slots[i] });
    }
    blocks_.free_deferred(seq.request_id);  // the swap-out copy reads them during this step
}

bool PagedKv::can_swap_in(const Sequence & seq, int32_t num_running, int32_t num_new_tokens,
                          bool with_deferred) const {
    auto it = swapped_.find(seq.request_id);
    assert(it != swapped_.end() && num_new_tokens >= 0);
    const int32_t bs = blocks_.block_size();
    const int64_t total = (int64_t) it->second.num_tokens + num_new_tokens;
    const int64_t needed = (total + bs - 1) / bs;  // its blocks and those of the next tokens
    const int64_t watermark = num_running == 0 ? 0 : std::max<int64_t>(watermark_blocks_, num_running);
    return needed + watermark <= num_free_blocks(with_deferred);
}

void PagedKv::swap_in(const Sequence & seq, std::vector<BlockSwap> * out) {
    auto it = swapped_.find(seq.request_id);
    assert(it != swapped_.end() && blocks_.find(seq.request_id) == nullptr);
    const BlockTable & table = blocks_.allocate_table(seq.request_id, it->second.num_tokens);
    for (size_t i = 0; i < table.block_ids.size(); ++i) {
        out->push_back({ it->second.host_slots[i], table.block_ids[i] });
        host_.free(it->second.host_slots[i]);
    }
    swapped_.erase(it);
}

void PagedKv::free_swapped(const Sequence & seq) {
    auto it = swapped_.find(seq.request_id);
    assert(it != swapped_.end());
    for (int32_t h : it->second.host_slots) {
        host_.free(h);
    }
    swapped_.erase(it);
}

std::string PagedKv::check_swapped(const std::vector<const Sequence *> & swapped) const {
    if (swapped.size() != swapped_.size()) {
        return "paged: " + std::to_string(swapped_.size()) + " swapped tables but " +
               std::to_string(swapped.size()) + " swapped sequences";
    }
    std::vector<int32_t> held;
    const int32_t bs = blocks_.block_size();
    for (const Sequence * seq : swapped) {
        auto it = swapped_.find(seq->request_id);
        if (it == swapped_.end() || blocks_.find(seq->request_id) != nullptr) {
            return "paged: swapped request " + std::to_string(seq->request_id) +
                   " has no host table or still holds device blocks";
        }
        const SwappedTable & t = it->second;
        if ((int32_t) t.host_slots.size() != (t.num_tokens + bs - 1) / bs || t.num_tokens != seq->num_computed_tokens) {
            return "paged: swapped request " + std::to_string(seq->request_id) + " holds " +
                   std::to_string(t.host_slots.size()) + " host slots for " + std::to_string(t.num_tokens) +
                   " tokens (" + std::to_string(seq->num_computed_tokens) + " computed)";
        }
        held.insert(held.end(), t.host_slots.begin(), t.host_slots.end());
    }
    const std::string error = host_.check_invariants(held);
    return error.empty() ? "" : "paged: " + error;
}

int64_t PagedKv::kv_tokens_reserved() const {
    return (int64_t) blocks_.pool().num_used() * blocks_.block_size();
}

std::string PagedKv::check_invariants(const std::vector<std::unique_ptr<Sequence>> & running) const {
    std::string error = blocks_.check_invariants();
    if (!error.empty()) {
        return "paged: " + error;
    }
    if (blocks_.num_seqs() > (int32_t) running.size()) {
        return "paged: " + std::to_string(blocks_.num_seqs()) + " block tables but only " +
               std::to_string(running.size()) + " sequences running (only running sequences hold blocks)";
    }
    for (const auto & seq : running) {
        const BlockTable * table = blocks_.find(seq->request_id);
        if (table != nullptr && table->num_tokens < seq->num_computed_tokens) {
            return "paged: request " + std::to_string(seq->request_id) + " has " +
                   std::to_string(seq->num_computed_tokens) + " computed tokens but " +
                   std::to_string(table->num_tokens) + " slots";
        }
    }
    return "";
}

std::string PagedKv::dump() const {
    std::string res = "PagedKv(watermark=" + std::to_string(watermark_blocks_) + ", host slots " +
                      std::to_string(host_.num_used()) + "/" + std::to_string(host_.num_slots()) + " used)\n";
    for (const auto & kv : swapped_) {
        res += "  swapped req=" + std::to_string(kv.first) + " tokens=" + std::to_string(kv.second.num_tokens) +
               " host slots=" + std::to_string(kv.second.host_slots.size()) + "\n";
    }
    return res + blocks_.dump();
}

// The one place where slots are computed: token pos of a sequence goes to row
// block_ids[pos / block_size] * block_size + pos % block_size (BlockManager's layout).
void PagedKv::fill_plan(StepPlan * plan) {
    const int32_t bs = blocks_.block_size();
    const size_t n_seqs = plan->seqs.size();
    int32_t max_blocks = 1;
    for (const ScheduledSeq & s : plan->seqs) {
        const BlockTable * table = blocks_.find(s.seq->request_id);
        // Call only after allocate() for every scheduled sequence (the scheduler does).
        assert(table != nullptr && table->num_tokens == s.seq->num_computed_tokens + s.num_new_tokens);
        max_blocks = std::max(max_blocks, table->num_blocks());
    }
    plan->max_blocks = max_blocks;
    plan->slot_mapping.clear();
    plan->context_lens.clear();
    plan->block_tables.assign(n_seqs * (size_t) max_blocks, CF_BLOCK_ID_NONE);
    for (size_t i = 0; i < n_seqs; ++i) {
        const ScheduledSeq & s = plan->seqs[i];
        const BlockTable & table = *blocks_.find(s.seq->request_id);
        const int32_t start = s.seq->num_computed_tokens;
        for (int32_t pos = start; pos < start + s.num_new_tokens; ++pos) {
            plan->slot_mapping.push_back(table.block_ids[(size_t) (pos / bs)] * bs + pos % bs);
        }
        plan->context_lens.push_back(table.num_tokens);
        std::copy(table.block_ids.begin(), table.block_ids.end(), plan->block_tables.begin() + (std::ptrdiff_t) (i * (size_t) max_blocks));
    }
    blocks_.take_copies(&plan->blocks_to_copy);
}

std::unique_ptr<KvCacheManager> make_paged_kv(int32_t num_blocks, int32_t block_size, bool prefix_caching,
                                              int32_t num_host_blocks, int64_t block_bytes) {
    return std::make_unique<PagedKv>(num_blocks, block_size, prefix_caching, num_host_blocks, block_bytes);
}

}  // namespace cf
