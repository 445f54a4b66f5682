// paged_plan.cpp - see paged_plan.h.
#include "engine/paged_plan.h"

#include "core/error.h"

#include <algorithm>

namespace cf {

const llama_paged_plan & PagedPlanBuilder::build(const SchedulerOutput & out, const BlockManager & blocks) {
    const int32_t block_size = blocks.block_size();
    const int32_t n_seqs = (int32_t) out.seqs.size();
    int32_t max_blocks = 1;
    for (const ScheduledSeq & s : out.seqs) {
        const BlockTable * table = blocks.find(s.seq->request_id);
        if (table == nullptr || table->num_tokens != s.seq->num_computed_tokens + s.num_new_tokens) {
            throw Error(CF_STATUS_INTERNAL, "paged plan: request " + std::to_string(s.seq->request_id) +
                                                " has no slots for its scheduled tokens");
        }
        max_blocks = std::max(max_blocks, table->num_blocks());
    }

    slot_mapping_.clear();
    token_seq_idx_.clear();
    seq_lens_.clear();
    block_tables_.assign((size_t) n_seqs * (size_t) max_blocks, CF_BLOCK_ID_NONE);
    for (int32_t i = 0; i < n_seqs; ++i) {
        const ScheduledSeq & s = out.seqs[(size_t) i];
        const BlockTable & table = *blocks.find(s.seq->request_id);
        const int32_t start = s.seq->num_computed_tokens;
        for (int32_t pos = start; pos < start + s.num_new_tokens; ++pos) {
            slot_mapping_.push_back(table.block_ids[(size_t) (pos / block_size)] * block_size + pos % block_size);
            token_seq_idx_.push_back(i);
        }
        seq_lens_.push_back(table.num_tokens);
        blocks.write_block_table(s.seq->request_id, block_tables_.data() + (size_t) i * (size_t) max_blocks,
                                 max_blocks);
    }

    plan_.slot_mapping = slot_mapping_.data();
    plan_.token_seq_idx = token_seq_idx_.data();
    plan_.block_tables = block_tables_.data();
    plan_.seq_lens = seq_lens_.data();
    plan_.n_tokens = (int32_t) slot_mapping_.size();
    plan_.n_seqs = n_seqs;
    plan_.max_blocks = max_blocks;
    return plan_;
}

}  // namespace cf
