// batch_builder.h - turns a SchedulerOutput into the llama_batch of one step.
//
// The llama_batch is allocated once (n_batch tokens, one seq id per token) and refilled every
// step: no allocation in the step loop. Tokens are laid out sequence by sequence in the
// scheduler's ascending seq_id order, and only the last token of a chunk that ends at the
// sequence's last known token asks for logits.
#pragma once

#include "core/scheduler.h"
#include "llama.h"

#include <cstdint>
#include <vector>

namespace cf {

// Batch index meaning "this scheduled sequence samples nothing this step".
constexpr int32_t CF_BATCH_INDEX_NONE = -1;

class BatchBuilder {
  public:
    explicit BatchBuilder(int32_t n_batch);
    ~BatchBuilder();
    BatchBuilder(const BatchBuilder &) = delete;
    BatchBuilder & operator=(const BatchBuilder &) = delete;

    // Fill the batch with tokens [num_computed_tokens, + num_new_tokens) of each scheduled
    // sequence. Call only with out.num_scheduled_tokens <= n_batch.
    const llama_batch & build(const SchedulerOutput & out);

    // Batch index whose logits sample out.seqs[i], or CF_BATCH_INDEX_NONE.
    int32_t sample_index(size_t i) const { return sample_index_[i]; }

  private:
    llama_batch batch_;
    int32_t capacity_;
    std::vector<int32_t> sample_index_;  // [num scheduled seqs]
};

}  // namespace cf
