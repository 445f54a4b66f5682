// batch_builder.h - the llama.cpp side of a step: llama.cpp sequence slots and the llama_batch of
// each decode. The one place where a request id meets a llama.cpp seq id ("slot").
//
// Slots. llama.cpp keys its per-sequence state (stock KV streams and cells, position records,
// backend samplers) by a seq id below n_seq_max <= LLAMA_MAX_SEQ = 256. How a request gets one:
//   - stock modes (SlotMode::STABLE): llama.cpp's KV cache holds the request's rows under its slot,
//     so a running request keeps one slot, the lowest free, from its first step until release();
//     the engine then clears that slot's KV. max_num_seqs <= 256 (checked at engine creation).
//   - paged mode (SlotMode::PER_DECODE): the rows belong to the block manager and llama.cpp only
//     needs distinct seq ids within one decode, so a sequence's slot is its row in the decode:
//     slot = plan index - first index of the decode. Nothing persists between decodes, and a step
//     with more than 256 sequences runs as several decodes of at most 256 (decode groups). This is
//     why paged mode has no 256-sequence cap.
//
//   plan.seqs:   | r17 | r18 | r20 | r21 | ... | r300 | r301 | ...
//   paged slot:  |  0  |  1  |  2  |  3  | ... |  255 |   0  | ...    (group 0 | group 1)
//   stock slot:  |  4  |  0  |  1  |  7  | ...                         (stable, lowest free first)
//
// Batch. Tokens go sequence by sequence in ascending slot order (stock split mode's split_equal
// wants consecutive seq ids; in paged mode that is plan order, so the batch matches the plan's
// per-token arrays), each sequence's tokens in position order; only the last token of a chunk
// that ends at the sequence's last known token asks for logits. The llama_batch is allocated once
// (n_batch tokens) and refilled: no allocation in the step loop.
//
// Step padding (paged mode, set_padding). A CUDA graph replays only a step of the shape it was
// captured for, and a continuous batcher's token count changes whenever a request arrives or
// ends. With padding on, a decode of n <= max_padded_tokens tokens is filled up to
// padded_step_tokens(n) with padding tokens: one extra sequence in the next free slot (which must
// exist) at positions 0, 1, ..., whose outputs also pad the number of logit rows to its own
// bucket where they can. Their KV rows go to a scratch block the block manager never hands out
// (LlamaSession::set_kv_plan) and their outputs are never read. A real row's arithmetic changes
// with padding only as with any other change of the step's token count: not at all where matmuls
// are row-invariant (the CPU's quantized matmuls with the invariant paged kernel; tested), within
// the GEMM's rounding where a library picks its kernel by shape (cuBLAS). The buckets (after vLLM's CUDA graph capture sizes): 1, 2, 4, 8, then
// multiples of 8 up to 256 and of 16 up to 512: at most 7 (15 past 256) padding tokens.
#pragma once

#include "core/step_plan.h"
#include "llama.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace cf {

// Batch index meaning "this scheduled sequence samples nothing this step".
constexpr int32_t CF_BATCH_INDEX_NONE = -1;
// Slot of a request that holds none.
constexpr int32_t CF_SLOT_NONE = -1;

enum class SlotMode { STABLE, PER_DECODE };

// The token count a decode of n tokens is padded to (see above); n itself past 512.
int32_t padded_step_tokens(int32_t n);

class BatchBuilder {
  public:
    // n_batch: most tokens of one decode; num_slots: llama.cpp's n_seq_max (<= 256), the most
    // sequences of one decode.
    BatchBuilder(int32_t n_batch, SlotMode mode, int32_t num_slots);
    ~BatchBuilder();
    BatchBuilder(const BatchBuilder &) = delete;
    BatchBuilder & operator=(const BatchBuilder &) = delete;

    int32_t num_slots() const { return num_slots_; }

    // Decode groups of a plan: seqs [group_begin(g), group_begin(g + 1)) run in decode g.
    int32_t num_groups(const StepPlan & plan) const;
    size_t group_begin(const StepPlan & plan, int32_t g) const;

    // Give plan.seqs[begin, end) their slots (slot(i) afterwards) and fill the batch with their new
    // tokens. Throws INTERNAL if they exceed n_batch tokens or the slots. Call only with one group.
    const llama_batch & build(const StepPlan & plan, size_t begin, size_t end);

    // Async decode: turn the last build(), a decode of n_real tokens that are each a sequence's one new token (then
    // its padding), into the next step's decode of the same sequences: each real token one position on, its id a
    // placeholder (0) that the device token feed replaces (LlamaSession::decode_fed); slots, sample indices and
    // padding unchanged.
    const llama_batch & advance_one_position(int32_t n_real);

    // Async decode, a decode launched ahead adopted by a plan of fewer sequences (the others ended after the step
    // before): plan index i of that plan is index rows[i] of the last build() (rows ascending, PER_DECODE mode), so
    // slot(i) and sample_index(i) answer for it afterwards. The batch is unchanged: the rows left out are never read.
    void select_rows(const std::vector<int32_t> & rows);

    // Async decode, after select_rows(rows): the batch of that decode reduced to its rows rows[i], moved to rows i with
    // their slots and positions (each an output row), then padded again for the smaller count as build() pads (the
    // padding sequence in padding_slot(): the one it had, else the lowest slot none of those rows holds).
    // advance_one_position() then gives the next
    // step's decode of just these sequences. sample_index() still answers for the decode adopted, whose tokens are
    // read after this, until reset_sample_rows().
    void compact_rows(const std::vector<int32_t> & rows);
    // After compact_rows() and the adopted decode's reads: sample_index(i) = i, the rows of the compacted batch.
    void reset_sample_rows();

    // Slot of plan.seqs[i] in the last build(); batch index whose logits sample it, or
    // CF_BATCH_INDEX_NONE.
    int32_t slot(size_t i) const { return slots_[i]; }
    int32_t sample_index(size_t i) const { return sample_index_[i]; }

    // Pad decodes of at most max_padded_tokens tokens (0: never, the default). PER_DECODE only.
    void set_padding(int32_t max_padded_tokens);
    // Padding tokens of the last build() (0 if it was not padded) and the slot holding them.
    int32_t num_padding_tokens() const { return num_padding_; }
    int32_t padding_slot() const { return padding_slot_; }

    // The request left the running set: its stable slot (whose KV the caller clears) is free
    // again; CF_SLOT_NONE if it held none (paged mode, or never scheduled).
    int32_t release(int64_t request_id);

  private:
    int32_t acquire(int64_t request_id);
    // Pad a batch of n tokens (n_outputs of them output rows) with one padding sequence in slot, where set_padding
    // allows it and slot < num_slots; sets num_padding_, padding_slot_ and batch_.n_tokens.
    void pad(int32_t n, int32_t n_outputs, int32_t slot);

    llama_batch batch_;
    int32_t capacity_;
    SlotMode mode_;
    int32_t num_slots_;
    int32_t max_padded_tokens_ = 0;
    int32_t num_padding_ = 0;
    int32_t padding_slot_ = CF_SLOT_NONE;
    std::vector<int32_t> slots_;         // [plan.seqs.size()] slot of each scheduled sequence
    std::vector<int32_t> sample_index_;  // [plan.seqs.size()]
    std::vector<size_t> order_;          // plan indices of the group by ascending slot
    std::unordered_map<int64_t, int32_t> stable_;  // STABLE: request id -> slot
    std::vector<uint8_t> slot_used_;               // STABLE: [num_slots]
};

}  // namespace cf
