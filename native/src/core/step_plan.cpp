// step_plan.cpp - see step_plan.h.
#include "core/step_plan.h"

namespace cf {

void StepPlan::clear() {
    seqs.clear();
    num_scheduled_tokens = 0;
    num_prefill_tokens = 0;
    num_decode_tokens = 0;
    token_seq_idx.clear();
    slot_mapping.clear();
    block_tables.clear();
    max_blocks = 0;
    context_lens.clear();
    blocks_to_swap_out.clear();
    blocks_to_swap_in.clear();
    blocks_to_copy.clear();
    preempted.clear();
    swapped_in.clear();
    resumed.clear();
    deferred.clear();
    out_of_blocks.clear();
    streamed_blocks.clear();
}

}  // namespace cf
