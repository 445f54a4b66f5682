// paged_plan.h - the llama_paged_plan of one step (paged KV mode): where each batch token's K/V row
// goes and which blocks each scheduled sequence attends over, read from the block manager.
//
// Batch order is BatchBuilder's: out.seqs in order, each sequence's tokens
// [num_computed_tokens, + num_new_tokens) in position order. Scheduler::schedule() has already given
// every scheduled token a slot (BlockManager::append_slots), so the sequence's table covers them:
// the token at position pos goes to slot block_ids[pos / block_size] * block_size + pos % block_size
// and attends to positions [0, pos] (llama.cpp checks the slot against the table).
//
// The arrays are reused between steps: no allocation once they have grown to the largest step.
#pragma once

#include "core/block_manager.h"
#include "core/scheduler.h"
#include "llama.h"

#include <cstdint>
#include <vector>

namespace cf {

class PagedPlanBuilder {
  public:
    // Fill the plan of `out`. The returned plan points into this builder and stays valid until the
    // next build(). Call only with a non-empty `out` whose sequences all hold a block table.
    const llama_paged_plan & build(const SchedulerOutput & out, const BlockManager & blocks);

  private:
    std::vector<int32_t> slot_mapping_;   // [n_tokens]
    std::vector<int32_t> token_seq_idx_;  // [n_tokens] index into out.seqs
    std::vector<int32_t> block_tables_;   // [n_seqs][max_blocks], padded with CF_BLOCK_ID_NONE
    std::vector<int32_t> seq_lens_;       // [n_seqs] tokens with a slot after this step
    llama_paged_plan plan_{};
};

}  // namespace cf
