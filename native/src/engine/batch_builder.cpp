// batch_builder.cpp - see batch_builder.h.
#include "engine/batch_builder.h"

#include "core/error.h"

#include <algorithm>
#include <cassert>

namespace cf {

BatchBuilder::BatchBuilder(int32_t n_batch, SlotMode mode, int32_t num_slots)
    : batch_(llama_batch_init(n_batch, 0, 1)), capacity_(n_batch), mode_(mode), num_slots_(num_slots) {
    assert(n_batch >= 1 && num_slots >= 1);
    slot_used_.assign(mode == SlotMode::STABLE ? (size_t) num_slots : 0, 0);
    slots_.reserve(256);
    sample_index_.reserve(256);
    order_.reserve(256);
}

BatchBuilder::~BatchBuilder() {
    llama_batch_free(batch_);
}

int32_t padded_step_tokens(int32_t n) {
    if (n <= 8) {
        int32_t b = 1;
        while (b < n) {
            b *= 2;
        }
        return b;
    }
    if (n <= 256) {
        return (n + 7) / 8 * 8;
    }
    if (n <= 512) {
        return (n + 15) / 16 * 16;
    }
    return n;
}

void BatchBuilder::set_padding(int32_t max_padded_tokens) {
    assert(max_padded_tokens >= 0);
    max_padded_tokens_ = mode_ == SlotMode::PER_DECODE ? std::min(max_padded_tokens, capacity_) : 0;
}

int32_t BatchBuilder::num_groups(const StepPlan & plan) const {
    return (int32_t) ((plan.seqs.size() + (size_t) num_slots_ - 1) / (size_t) num_slots_);
}

size_t BatchBuilder::group_begin(const StepPlan & plan, int32_t g) const {
    return std::min(plan.seqs.size(), (size_t) g * (size_t) num_slots_);
}

int32_t BatchBuilder::acquire(int64_t request_id) {
    auto it = stable_.find(request_id);
    if (it != stable_.end()) {
        return it->second;
    }
    for (size_t s = 0; s < slot_used_.size(); ++s) {
        if (!slot_used_[s]) {
            slot_used_[s] = 1;
            stable_.emplace(request_id, (int32_t) s);
            return (int32_t) s;
        }
    }
    throw Error(CF_STATUS_INTERNAL, "no free llama.cpp sequence slot for request " + std::to_string(request_id) +
                                        " (all " + std::to_string(num_slots_) + " are taken)");
}

int32_t BatchBuilder::release(int64_t request_id) {
    auto it = stable_.find(request_id);
    if (it == stable_.end()) {
        return CF_SLOT_NONE;
    }
    const int32_t slot = it->second;
    slot_used_[(size_t) slot] = 0;
    stable_.erase(it);
    return slot;
}

const llama_batch & BatchBuilder::build(const StepPlan & plan, size_t begin, size_t end) {
    assert(begin < end && end <= plan.seqs.size());
    if (end - begin > (size_t) num_slots_) {
        throw Error(CF_STATUS_INTERNAL, "BatchBuilder::build: " + std::to_string(end - begin) +
                                            " sequences in one decode exceed the " + std::to_string(num_slots_) +
                                            " llama.cpp slots");
    }
    slots_.resize(plan.seqs.size());
    sample_index_.assign(plan.seqs.size(), CF_BATCH_INDEX_NONE);
    order_.clear();
    int32_t num_tokens = 0;
    for (size_t i = begin; i < end; ++i) {
        slots_[i] = mode_ == SlotMode::STABLE ? acquire(plan.seqs[i].seq->request_id) : (int32_t) (i - begin);
        order_.push_back(i);
        num_tokens += plan.seqs[i].num_new_tokens;
    }
    if (num_tokens > capacity_) {
        throw Error(CF_STATUS_INTERNAL, "BatchBuilder::build: " + std::to_string(num_tokens) +
                                            " scheduled tokens exceed n_batch " + std::to_string(capacity_));
    }
    if (mode_ == SlotMode::STABLE) {
        std::sort(order_.begin(), order_.end(), [this](size_t a, size_t b) { return slots_[a] < slots_[b]; });
    }
    int32_t n = 0;
    int32_t n_outputs = 0;
    for (const size_t i : order_) {
        const ScheduledSeq & s = plan.seqs[i];
        const Sequence & seq = *s.seq;
        const int32_t start = seq.num_computed_tokens;
        for (int32_t pos = start; pos < start + s.num_new_tokens; ++pos) {
            batch_.token[n] = seq.tokens[(size_t) pos];
            batch_.pos[n] = pos;
            batch_.n_seq_id[n] = 1;
            batch_.seq_id[n][0] = slots_[i];
            batch_.logits[n] = 0;
            ++n;
        }
        if (s.needs_sample) {
            batch_.logits[n - 1] = 1;
            sample_index_[i] = n - 1;
            ++n_outputs;
        }
    }
    pad(n, n_outputs, (int32_t) (end - begin));
    return batch_;
}

void BatchBuilder::pad(int32_t n, int32_t n_outputs, int32_t slot) {
    num_padding_ = 0;
    padding_slot_ = CF_SLOT_NONE;
    const int32_t padded = n <= max_padded_tokens_ ? padded_step_tokens(n) : n;
    if (padded > n && padded <= max_padded_tokens_ && slot < num_slots_) {
        num_padding_ = padded - n;
        padding_slot_ = slot;
        const int32_t padding_outputs = std::min(num_padding_, padded_step_tokens(n_outputs) - n_outputs);
        for (int32_t p = 0; p < num_padding_; ++p) {
            batch_.token[n] = 0;
            batch_.pos[n] = p;
            batch_.n_seq_id[n] = 1;
            batch_.seq_id[n][0] = padding_slot_;
            batch_.logits[n] = p < padding_outputs ? 1 : 0;
            ++n;
        }
    }
    batch_.n_tokens = n;
}

const llama_batch & BatchBuilder::advance_one_position(int32_t n_real) {
    assert(n_real + num_padding_ == batch_.n_tokens);
    for (int32_t i = 0; i < n_real; ++i) {
        batch_.token[i] = 0;
        batch_.pos[i] += 1;
    }
    return batch_;
}

void BatchBuilder::select_rows(const std::vector<int32_t> & rows) {
    assert(mode_ == SlotMode::PER_DECODE && rows.size() <= slots_.size());
    for (size_t i = 0; i < rows.size(); ++i) {  // rows[i] >= i: entry rows[i] is read before anything overwrites it
        assert(rows[i] >= (int32_t) i && (size_t) rows[i] < slots_.size() && (i == 0 || rows[i] > rows[i - 1]));
        slots_[i] = slots_[(size_t) rows[i]];
        sample_index_[i] = sample_index_[(size_t) rows[i]];
    }
    slots_.resize(rows.size());
    sample_index_.resize(rows.size());
}

void BatchBuilder::compact_rows(const std::vector<int32_t> & rows) {
    assert(mode_ == SlotMode::PER_DECODE && rows.size() == slots_.size());
    const int32_t n = (int32_t) rows.size();
    const int32_t n_real = batch_.n_tokens - num_padding_;
    for (int32_t i = 0; i < n; ++i) {  // rows ascend and rows[i] >= i: a row moves down over rows already moved
        const int32_t r = rows[(size_t) i];
        assert(r >= i && r < n_real && batch_.logits[r] && batch_.seq_id[r][0] == slots_[(size_t) i]);
        batch_.token[i] = 0;
        batch_.pos[i] = batch_.pos[r];
        batch_.n_seq_id[i] = 1;
        batch_.seq_id[i][0] = batch_.seq_id[r][0];
        batch_.logits[i] = 1;
    }
    (void) n_real;
    // the padding keeps its slot; without one, it takes the lowest slot none of these rows holds (their slots ascend
    // in PER_DECODE mode), such as an ended request's
    int32_t slot = padding_slot_;
    if (slot == CF_SLOT_NONE) {
        slot = 0;
        while (slot < n && slots_[(size_t) slot] == slot) {
            ++slot;
        }
    }
    pad(n, n, slot);
}

void BatchBuilder::reset_sample_rows() {
    for (size_t i = 0; i < sample_index_.size(); ++i) {
        sample_index_[i] = (int32_t) i;
    }
}

}  // namespace cf
