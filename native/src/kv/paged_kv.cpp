// paged_kv.cpp - see paged_kv.h.
#include "kv/paged_kv.h"

#include <algorithm>
#include <cassert>

namespace cf {

PagedKv::PagedKv(int32_t num_blocks, int32_t block_size, bool prefix_caching)
    : blocks_(num_blocks, block_size, prefix_caching), watermark_blocks_(std::max<int64_t>(1, num_blocks / 100)) {}

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

bool PagedKv::can_admit(const Sequence & seq, int32_t num_running) const {
    const int64_t watermark = num_running == 0 ? 0 : std::max<int64_t>(watermark_blocks_, num_running);
    return num_blocks_to_admit(seq) + watermark <= blocks_.num_free_blocks();
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
    return "PagedKv(watermark=" + std::to_string(watermark_blocks_) + ")\n" + blocks_.dump();
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

std::unique_ptr<KvCacheManager> make_paged_kv(int32_t num_blocks, int32_t block_size, bool prefix_caching) {
    return std::make_unique<PagedKv>(num_blocks, block_size, prefix_caching);
}

}  // namespace cf
