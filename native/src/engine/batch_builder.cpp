// batch_builder.cpp - see batch_builder.h.
#include "engine/batch_builder.h"

#include "core/error.h"

#include <cassert>

namespace cf {

BatchBuilder::BatchBuilder(int32_t n_batch) : batch_(llama_batch_init(n_batch, 0, 1)), capacity_(n_batch) {
    sample_index_.reserve(256);
}

BatchBuilder::~BatchBuilder() {
    llama_batch_free(batch_);
}

const llama_batch & BatchBuilder::build(const SchedulerOutput & out) {
    if (out.num_scheduled_tokens > capacity_) {
        throw Error(CF_STATUS_INTERNAL, "BatchBuilder::build: " + std::to_string(out.num_scheduled_tokens) +
                                            " scheduled tokens exceed n_batch " + std::to_string(capacity_));
    }
    sample_index_.clear();
    int32_t n = 0;
    for (const ScheduledSeq & s : out.seqs) {
        const Sequence & seq = *s.seq;
        const int32_t start = seq.num_computed_tokens;
        for (int32_t pos = start; pos < start + s.num_new_tokens; ++pos) {
            batch_.token[n] = seq.tokens[(size_t) pos];
            batch_.pos[n] = pos;
            batch_.n_seq_id[n] = 1;
            batch_.seq_id[n][0] = seq.seq_id;
            batch_.logits[n] = 0;
            ++n;
        }
        if (s.needs_sample) {
            batch_.logits[n - 1] = 1;
        }
        sample_index_.push_back(s.needs_sample ? n - 1 : CF_BATCH_INDEX_NONE);
    }
    assert(n == out.num_scheduled_tokens);
    batch_.n_tokens = n;
    return batch_;
}

}  // namespace cf
