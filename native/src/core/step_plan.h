// step_plan.h - everything one engine step must do, built once per step by Scheduler::schedule().
//
// What a plan asks of the executor (engine):
//   1. blocks_to_swap_out   device block -> host slot copies (swap preemption, paged mode)
//   2. blocks_to_swap_in    host slot -> device block copies (swapped sequences resuming)
//   3. blocks_to_copy       copy-on-write block copies, in order
//   4. the KV plan          slot_mapping, block_tables, context_lens, token_seq_idx (paged mode)
//   5. decode               seqs' new tokens in batch order, then sampling where needs_sample
// Lists 1-3 touch disjoint device blocks and host slots (a swap-out's blocks are freed only at the
// next step, a swap-in's host slots are reused only from the next step, every copy-on-write
// destination is a fresh block), so their copies may run in any order relative to each other (the
// engine issues 3, then 1, then 2). Steps 4-5 must see every copy of list 3 done, and none of
// lists 1-2 need be: no sequence of `seqs` writes a block they touch, nor reads one a swap-in
// writes (the swapped-in sequences join the batch at the next step, `resumed`), so on a CUDA copy
// stream they overlap this step's compute and the next step's compute waits for them
// (engine/swapper.h). Every copy of the previous plan comes before any of this one's.
//
// One step ahead, swap-in (S = a swapped sequence, t = the step):
//   plan t:    S in swapped_in, its copies in blocks_to_swap_in; S is SWAPPING_IN, not in seqs
//   plan t+1:  S in resumed, RUNNING, in seqs if it fits the budget
// preempted and out_of_blocks say which sequences left the running set while scheduling.
//
// Batch order: seqs in order (ascending request id); each sequence's new tokens
// [num_computed_tokens, + num_new_tokens) in position order. The per-token arrays follow it:
//
//   seqs:           | s0 (3 new)  | s1 (1) | s2 (2)  |
//   token_seq_idx:  | 0   0   0   | 1      | 2   2   |    [num_scheduled_tokens]
//   slot_mapping:   | KV row of each token (paged) |    [num_scheduled_tokens]
//   block_tables:   row i = s_i's block ids, padded to max_blocks with CF_BLOCK_ID_NONE
//   context_lens:   [seqs.size()] tokens of s_i with a KV row once this step ran
//
// The slot mapping is computed once, from the block tables, after the plan's sequences are final
// (KvCacheManager::fill_plan); llama.cpp only checks it. In the stock modes slot_mapping,
// block_tables and context_lens stay empty (llama.cpp places the rows itself).
//
// One StepPlan lives in the scheduler and is refilled every step: its arrays keep their capacity,
// so steady-state steps allocate nothing.
#pragma once

#include "core/block_manager.h"
#include "core/sequence.h"

#include <cstdint>
#include <vector>

namespace cf {

// One sequence's share of a step: compute tokens [seq->num_computed_tokens,
// seq->num_computed_tokens + num_new_tokens).
struct ScheduledSeq {
    Sequence * seq;
    int32_t num_new_tokens;
    // True when the chunk ends at the last known token, so the step samples a new token.
    bool needs_sample;
};

// One block moved between device and host memory (swap preemption). Swap-out: src is a device
// block id, dst a host slot id (kv/host_block_pool.h); swap-in: src a host slot, dst a device block.
struct BlockSwap {
    int32_t src_block_id;
    int32_t dst_block_id;
};

struct StepPlan {
    std::vector<ScheduledSeq> seqs;  // batch order: ascending request id (the scheduler's key)
    int32_t num_scheduled_tokens = 0;
    int32_t num_prefill_tokens = 0;  // tokens inside prompts (and recomputed output after a preemption)
    int32_t num_decode_tokens = 0;   // tokens after the prompt (one per decoding sequence)

    // Per token, batch order.
    std::vector<int32_t> token_seq_idx;  // [num_scheduled_tokens] index into seqs
    std::vector<int32_t> slot_mapping;   // [num_scheduled_tokens] paged: block_id * block_size + pos % block_size

    // Per sequence, paged mode.
    std::vector<int32_t> block_tables;  // [seqs.size() * max_blocks] int32, row-major
    int32_t max_blocks = 0;             // widest table this step (>= 1 when seqs is not empty)
    std::vector<int32_t> context_lens;  // [seqs.size()] tokens with a KV row after this step

    // Block operations before the decode, in this order.
    std::vector<BlockSwap> blocks_to_swap_out;
    std::vector<BlockSwap> blocks_to_swap_in;
    std::vector<BlockCopy> blocks_to_copy;

    // Sequences preempted this step: by recompute (now WAITING, KV freed; their output is kept
    // and computed again once they are admitted again) or by swap (now SWAPPED, their blocks in
    // blocks_to_swap_out; swapped in later without recompute).
    struct Preempted {
        Sequence * seq;
        bool swapped;
        // The reason: true = it made room for a more urgent request (PRIORITY policy, before the
        // step's sequences were scheduled); false = a running sequence needed a block.
        bool for_priority = false;
        // It had computed nothing since its admission (Sequence::num_tokens_at_admission): it went back
        // to the waiting queue unstarted, counted in no preemption statistic.
        bool unstarted = false;
    };
    // Sequences swapped in this step (their blocks in blocks_to_swap_in), now SWAPPING_IN: they
    // join the batch at the next step.
    std::vector<Sequence *> swapped_in;
    // Sequences swapped in by the previous plan, RUNNING from this step on (in seqs when scheduled).
    std::vector<Sequence *> resumed;
    // Running sequences left out of this step because the blocks they need come back only at the
    // next step (this step's swap-outs release them then); they run on at the next step.
    std::vector<Sequence *> deferred;
    std::vector<Preempted> preempted;
    // Sequences that hold the whole KV pool alone and still need a row (only the paged manager runs
    // out). They are not in `seqs`, their KV is already free, and the engine finishes them:
    // CF_FINISH_REASON_LENGTH, or CF_FINISH_REASON_ERROR with Sequence::error_message when the KV
    // manager gave a reason (KV streaming's limits, KvCacheManager::out_of_blocks_reason).
    std::vector<Sequence *> out_of_blocks;
    // KV streaming's moves in this plan, one per block (KvCacheManager::fill_plan): demotions, whose
    // copies are in blocks_to_swap_out, then promotions, whose copies are in blocks_to_swap_in (both
    // lists also carry swap preemption's copies). For stats and the profiler; the executor needs
    // nothing from it.
    struct StreamedBlock {
        int64_t request_id;
        bool to_host;  // true: demoted (device -> host), false: promoted (host -> device)
    };
    std::vector<StreamedBlock> streamed_blocks;

    // Empty every list, keeping capacity.
    void clear();
};

}  // namespace cf
