// scheduler.h - continuous batching over llama.cpp sequence slots, without llama.cpp.
//
// The scheduler decides which sequences compute how many tokens in the next step; the engine
// bridge executes that plan with one llama_decode, samples, and reports back through
// commit_step() and finish(). Each step mixes, under max_num_batched_tokens:
//   1. one decode token for every running sequence whose prompt is computed,
//   2. the next prompt chunk of running sequences still prefilling (chunked prefill),
//   3. prompt chunks of newly admitted waiting sequences, in policy order.
// Admission needs a free sequence slot (max_num_seqs) and KV capacity: in split mode each slot
// is its own stream of n_ctx_per_seq tokens; in unified mode the sum over running sequences of
// min(prompt + max_tokens, n_ctx_per_seq) must stay <= n_ctx; in paged mode the block manager
// must have free blocks for the rest of the prompt plus a watermark (1% of the pool, at least one
// block per running sequence) while other sequences run, and nothing is reserved: each scheduled
// token gets its slot when it is scheduled.
//
// Paged preemption by recompute (vLLM's RECOMPUTE mode, Kwon et al., "Efficient Memory Management
// for Large Language Model Serving with PagedAttention", SOSP 2023, section 4.5): when a running
// sequence needs a block and none is free, the scheduler preempts the running sequence that comes
// last in policy order among those not yet scheduled this step (for FCFS: the newest), frees its
// blocks and returns it to the waiting queue with its output kept; re-admitted, it prefills prompt
// and output again and goes on where it stopped. If no other sequence can give way, the sequence
// that needs the block is preempted itself; alone in the pool it cannot grow at all and ends
// (out_of_blocks). No admission happens in a step that preempted.
//
// Thread-safety: none; the engine calls it from the stepping thread only.
#pragma once

#include "core/block_manager.h"
#include "core/sequence.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace cf {

struct SchedulerConfig {
    int32_t max_num_seqs = 16;
    int32_t max_num_batched_tokens = 512;  // token budget per step
    int32_t n_ctx = 0;                     // total KV rows, tokens
    int32_t n_ctx_per_seq = 0;             // max tokens (prompt + output) of one sequence
    bool kv_unified = false;
    cf_sched_policy policy = CF_SCHED_POLICY_FCFS;
    // Paged KV mode: the engine's block manager (nullptr in the stock modes), keyed by request id.
    // The scheduler appends the slots of every token it schedules and frees a sequence's blocks when
    // it leaves the running set.
    BlockManager * block_manager = nullptr;
};

// One sequence's share of a step: compute tokens [seq->num_computed_tokens,
// seq->num_computed_tokens + num_new_tokens).
struct ScheduledSeq {
    Sequence * seq;
    int32_t num_new_tokens;
    // True when the chunk ends at the last known token, so the step samples a new token.
    bool needs_sample;
};

struct SchedulerOutput {
    std::vector<ScheduledSeq> seqs;  // ascending seq_id (split_equal wants consecutive ids)
    int32_t num_scheduled_tokens = 0;
    int32_t num_prefill_tokens = 0;  // tokens inside prompts
    int32_t num_decode_tokens = 0;   // tokens after the prompt (one per decoding sequence)
    // Paged mode: sequences that hold the whole pool alone and still need a block. They are not in
    // `seqs`, their blocks are already free, and the engine finishes them (CF_FINISH_REASON_LENGTH).
    std::vector<Sequence *> out_of_blocks;
    // Paged mode: sequences preempted this step, now waiting (seq_id NONE, blocks freed). The
    // engine clears llama.cpp's record of their former slots before the step's decode.
    struct Preempted {
        Sequence * seq;
        int32_t former_seq_id;
    };
    std::vector<Preempted> preempted;

    void clear();
};

class Scheduler {
  public:
    explicit Scheduler(const SchedulerConfig & config);

    const SchedulerConfig & config() const { return config_; }

    // Queue a new sequence (status WAITING, no slot). Call only with a validated sequence whose
    // prompt fits n_ctx_per_seq.
    void add(std::unique_ptr<Sequence> seq);

    // Plan the next step. The returned reference stays valid until the next schedule() call.
    const SchedulerOutput & schedule();

    // The engine computed every token of `out`: advance num_computed_tokens.
    void commit_step(const SchedulerOutput & out);

    // Remove a running sequence (finished, aborted or failed) and free its slot; the engine frees
    // its KV. Call only with a running sequence. Returns the sequence, status FINISHED.
    std::unique_ptr<Sequence> finish(Sequence * seq, cf_finish_reason reason);

    // Remove a waiting or running sequence by request id (abort). Returns nullptr if unknown.
    std::unique_ptr<Sequence> remove(int64_t request_id, cf_finish_reason reason);

    bool has_work() const { return !running_.empty() || !waiting_.empty(); }
    int32_t num_running() const { return (int32_t) running_.size(); }
    int32_t num_waiting() const { return (int32_t) waiting_.size(); }
    int32_t num_free_slots() const { return config_.max_num_seqs - num_running(); }
    int64_t num_preemptions() const { return num_preemptions_; }  // since construction
    // KV rows set aside for running sequences (unified: sum of reservations; split: whole slots).
    int64_t kv_tokens_reserved() const;
    // KV rows holding computed tokens of running sequences.
    int64_t kv_tokens_used() const;
    const std::vector<std::unique_ptr<Sequence>> & running() const { return running_; }
    // Ids of every running and waiting sequence (running first); allocates, not for the hot path.
    std::vector<int64_t> request_ids() const;

    // Aborts with a message naming the broken invariant (debug aid; tests call it every op).
    void check_invariants() const;
    std::string dump() const;

  private:
    bool comes_before(const Sequence & a, const Sequence & b) const;
    bool can_admit(const Sequence & seq) const;
    void admit_front();
    int32_t lowest_free_slot() const;
    void push_scheduled(Sequence * seq, int32_t budget_left, int32_t * budget);
    bool allocate_or_preempt(Sequence * seq, int32_t num_new_tokens);
    Sequence * preemption_victim(const Sequence & needy) const;
    void preempt(Sequence * seq);
    void schedule_running(bool decoding, int32_t * budget);
    void admit_waiting(int32_t * budget);
    std::unique_ptr<Sequence> release(size_t running_index, cf_finish_reason reason);

    SchedulerConfig config_;
    std::deque<std::unique_ptr<Sequence>> waiting_;    // policy order, front runs first
    std::vector<std::unique_ptr<Sequence>> running_;   // admission order
    std::vector<uint8_t> slot_used_;                   // [max_num_seqs], 1 if the slot is taken
    int64_t kv_reserved_unified_ = 0;                  // sum of max_kv_tokens over running
    int64_t watermark_blocks_ = 0;                     // paged: free blocks kept for running sequences
    std::vector<int32_t> slots_;                       // paged: scratch for append_slots
    std::vector<Sequence *> order_;                    // scratch: running_ at the start of a pass
    std::vector<uint8_t> scheduled_;                   // [max_num_seqs]: slot scheduled this step
    int64_t num_preemptions_ = 0;
    SchedulerOutput out_;
};

}  // namespace cf
