// scheduler.h - continuous batching over requests, without llama.cpp.
//
// Identities: the request id keys the scheduler (and the KV cache manager below it); llama.cpp's
// sequence slots belong to the llama.cpp adapter (engine/batch_builder.h) and are not seen here.
//
// The scheduler decides which sequences compute how many tokens in the next step and returns it
// as one StepPlan (core/step_plan.h), built once per step: sequences and new-token counts, the
// KV part filled by the KV cache manager (slot mapping, block tables, context lengths, block
// copies), preempted and out-of-blocks sequences. The engine executes the plan, samples, and
// reports back through commit_step() and finish(). Each step mixes, under max_num_batched_tokens:
//   1. one decode token for every running sequence whose prompt is computed,
//   2. the next prompt chunk of running sequences still prefilling (chunked prefill; a chunk is at most
//      KvCacheManager::max_chunk_tokens, which only KV streaming limits),
//   3. prompt chunks of newly admitted waiting sequences, in policy order.
// Admission needs room in the running set (max_num_seqs) and KV capacity, which the KV cache manager
// decides (kv/kv_cache_manager.h: stock split, stock unified or paged); every scheduled token gets
// its KV row from the manager's allocate() when it is scheduled. The scheduler has no KV-mode
// branch: only the paged manager ever answers allocate() with false, so only paged runs preempt.
//
// Preemption by recompute (vLLM's RECOMPUTE mode, Kwon et al., "Efficient Memory Management
// for Large Language Model Serving with PagedAttention", SOSP 2023, section 4.5): when a running
// sequence needs a block and none is free, the scheduler preempts the running sequence that comes
// last in policy order among those not yet scheduled this step (for FCFS: the newest), frees its
// blocks and returns it to the waiting queue with its output kept; re-admitted, it prefills prompt
// and output again and goes on where it stopped. A sequence holding no device block is never the
// victim (it would free nothing), and one that has computed nothing since its admission goes back to
// the queue unstarted, counted as no preemption (nothing is recomputed or swapped). If no other
// sequence can give way, the sequence that needs the block is preempted itself; if no other holds a
// block it is alone in the pool, cannot grow at all and ends
// (out_of_blocks, with the KV manager's reason when it streams). With KV streaming, middle blocks move
// to the host (KvCacheManager::demote) before anyone is preempted, and a sequence alone gives way
// (preempts itself) while swapped sequences wait, since they may hold the host slots it would stream
// into. No admission happens in a step that preempted.
//
// Preemption by swap (vLLM's SWAP mode, same section): the victim's blocks are copied to host
// slots (StepPlan::blocks_to_swap_out) and it waits, SWAPPED, in its own queue (policy order).
// Its device blocks become free only at the next step (deferred free, so that the copy reading
// them overlaps the step's compute): a sequence that needs blocks the swap-outs of this step free
// waits one step (StepPlan::deferred) instead of preempting more.
// In a step without preemption swapped sequences come back first (blocks_to_swap_in, into fresh
// device blocks, when their blocks, their next chunk and the watermark fit), one step ahead: at
// step t they take their blocks and their copies are issued (SWAPPING_IN, StepPlan::swapped_in),
// at step t + 1 they are RUNNING again (StepPlan::resumed) and go on exactly where they stopped;
// new requests are admitted only once no sequence is swapped out.
// preemption_mode picks per victim: RECOMPUTE always drops, SWAP swaps while host slots last,
// AUTO swaps when moving its bytes out and back costs less than computing its tokens again
// (set_preemption_costs: the engine's measured rates). Only the paged KV manager can swap.
//
// Policies (SchedulerConfig::policy; the order of the waiting and swapped queues, and of victims:
// the running sequence that comes last is preempted first). Ties always go by request id, which
// grows with arrival, so every policy is FCFS among equals.
//   FCFS:     arrival order.
//   SJF:      shortest predicted remaining work first (the classic shortest-job-first rule; the
//             prediction is the request's own max_tokens, no learned output-length model):
//             work = num_uncomputed_tokens() + params.max_tokens - num_output_tokens(), tokens
//             (the prompt left, or prompt and output again after a recompute, + tokens to go).
//   PRIORITY: the more urgent first. Urgency is the request's priority value, and a SMALLER value
//             is MORE urgent (as in vLLM's priority scheduling; cf_request.priority, default 0).
//
// Aging (PRIORITY only; starvation freedom): a queued sequence's effective priority improves by
// one level per SchedulerConfig::priority_aging_ns it has waited in a queue:
//   effective_priority = priority - floor(wait / priority_aging_ns)   (0 = aging off)
// where wait counts the time spent WAITING or SWAPPED since arrival (Sequence::wait_ns plus the
// current stay), never the time spent running. Aging orders the queues: of two requests queued
// since they arrived, one of priority p comes before one of priority q that arrived at least
// (p - q) * priority_aging_ns after it (ties go to the older), so behind a stream of priority-q
// arrivals it gets the first place that frees up once it has waited about that long (it does
// not preempt for it; see below). Time is the step's clock (schedule(now_ns)):
// effective priorities do not change within a step. SchedulerConfig default: 1 s per level
// (cf_engine_config.priority_aging_ms = 1000).
//
// Priority preemption (PRIORITY only; the idea of vLLM v0's priority policy, where waiting
// requests of higher priority preempt running ones of lower priority): before running sequences are
// scheduled, the first queued sequence U (waiting or swapped, policy order) that cannot be
// admitted now (max_num_seqs or KV) preempts running sequences V, the one that comes last in
// policy order first, until it fits. V qualifies only when U is STRICTLY more urgent both ways:
//   U.priority < V.priority  and  effective_priority(U) < effective_priority(V).
// The victim is swapped or recomputed as preemption_mode decides (PreemptionStats::num_priority
// counts these). So an equally or less urgent request never preempts, and there is no thrash: V
// can never preempt U back (that would need V.priority < U.priority), equal priorities never
// preempt each other however long they wait, and a low-priority request that aged its way in keeps
// its (frozen: it is not waiting now) effective priority while it runs, so fresh arrivals of the
// priorities it overtook cannot push it out again. Effective priorities do not change within a step, and a sequence
// preempted in a step is not admitted again in that step. One queued sequence gets this help per
// step; preemption frees blocks and slots, not the step's token budget (a running prompt's chunk
// can still delay an urgent admission by a step).
// Under PRIORITY admission takes swapped and waiting sequences together in policy order (under
// FCFS and SJF every swapped sequence comes back before any waiting one is admitted).
//
// Long prefills (SchedulerConfig::long_prefill_token_threshold = T > 0; the rule of vLLM's
// long_prefill_token_threshold with max_long_partial_prefills = 1): a sequence with more than T tokens
// left to compute (prompt, or prompt and output again after a recompute) is a long prefill. In the first
// pass of a step (running sequences, then admission, in the usual order) the first long prefill gets at
// most T tokens and every other long one none; the budget left goes to the shorter ones. Then, while
// budget is left, the first long prefill's chunk grows up to what the budget and the KV cache allow, and
// the skipped long ones get chunks in their order (no preemption for these). So a short prompt that
// arrives behind a long one is computed in the next step instead of waiting for the whole long prompt
// (head-of-line blocking), a long prefill alone still gets the whole budget, and long prefills among
// themselves keep their order (one at a time, not shared round-robin, which would delay every one of
// them). Admission order does not change: a skipped long sequence is admitted (it holds its slot and
// its cached prefix) and computes nothing in that step. In the paged mode a passed-over sequence keeps
// the blocks of the rest of what it computes reserved (KvCacheManager::num_blocks_to_reserve): admitting
// or swapping in a sequence that comes after it in policy order counts them as taken, else admission
// would let in more than the pool holds and the extra ones would go back unstarted. A more urgent one
// (PRIORITY) is not held back by them. The chunks change, the tokens do not: the paged attention is
// chunk-invariant.
//
// Shared prefixes in flight (SchedulerConfig::min_pending_shared_prefix = S > 0; the idea of SGLang's
// in-batch prefix caching): a waiting sequence W is passed over while some running sequence R has yet to
// compute at least S tokens of full blocks that W's prompt shares with R's
// (KvCacheManager::pending_shared_prefix_tokens: 0 without a prefix cache, or when W or R does not use it).
// Once R's step commits them to the prefix cache, W is admitted on them and computes only the rest, so
// requests that arrive together with a common uncached prefix (a burst on a cold server, a new system
// prompt) compute it once instead of once each. Others behind W may be admitted meanwhile (as with choices
// waiting for their fork). W waits only while R runs and has shared blocks left to compute: R is scheduled
// before any admission, so that is a step or a few of R's chunks; if R leaves the running set (finished,
// preempted) W goes on by itself. The tokens do not change: a cached prefix gives the same KV as
// computing it (the paged attention is chunk-invariant).
//
// Choices of one prompt (cf_request.num_forks; paged mode only): the parent's prefill stops one
// token short of its prompt while its choices wait; at the start of the next step each choice
// forks the parent's blocks (KvCacheManager::fork) and then parent and choices each compute that
// last prompt token, getting logits of their own:
//
//   parent:  | prompt [0, P-1): computed, blocks shared by fork | P-1 | output ...
//   choice:  | (the parent's blocks, copy-on-write)             | P-1 | output ...
//
// A choice that does not fit then (max_num_seqs, free blocks) computes its prompt itself later.
//
// Thread-safety: none; the engine calls it from the stepping thread only.
#pragma once

#include "core/sequence.h"
#include "core/step_plan.h"
#include "kv/kv_cache_manager.h"

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
    int32_t n_ctx_per_seq = 0;             // max tokens (prompt + output) of one sequence; <= n_ctx
                                           // unless the KV manager streams (then up to pool + R blocks)
    cf_sched_policy policy = CF_SCHED_POLICY_FCFS;
    cf_preemption_mode preemption_mode = CF_PREEMPTION_MODE_AUTO;
    // AUTO's cost model (set_preemption_costs updates it): ns per byte copied one way, ns per
    // token computed again.
    double swap_ns_per_byte = 0.2;
    double recompute_ns_per_token = 1e5;
    // PRIORITY aging (see above): ns of queue time per level of effective priority; 0 = off.
    int64_t priority_aging_ns = 1'000'000'000;
    // Long prefills (see above): a sequence with more than this many tokens left to compute is a long
    // prefill; at most one gets budget before shorter ones; 0 = off (every chunk as large as the
    // budget allows, in order).
    int32_t long_prefill_token_threshold = 0;
    // Shared prefixes in flight (see above): the least pending shared tokens that make a waiting sequence
    // wait for a running one to compute them; 0 = off.
    int32_t min_pending_shared_prefix = 0;
};

// Preemption counters since construction.
struct PreemptionStats {
    int64_t num_swap = 0;
    int64_t num_recompute = 0;
    int64_t num_recomputed_tokens = 0;  // computed tokens whose KV a recompute preemption dropped
    int64_t num_priority = 0;  // of num_swap + num_recompute, those made for a more urgent request
};

class Scheduler {
  public:
    // The scheduler owns the KV cache manager and talks to it only through its interface.
    Scheduler(const SchedulerConfig & config, std::unique_ptr<KvCacheManager> kv);

    const SchedulerConfig & config() const { return config_; }
    const KvCacheManager & kv() const { return *kv_; }
    KvCacheManager & kv() { return *kv_; }

    // Queue a new sequence (status WAITING, holding no KV). Call only with a validated sequence whose
    // prompt fits n_ctx_per_seq.
    void add(std::unique_ptr<Sequence> seq);

    // Plan the next step. now_ns: the step's time, on the clock of Sequence::arrival_ns
    // (cf_clock_ns in the engine); only the PRIORITY policy's aging reads it, and it must not go
    // back. The returned reference stays valid until the next schedule() call; its arrays are
    // refilled in place (no allocation once they have grown to the largest step).
    const StepPlan & schedule(int64_t now_ns = 0);

    // The next schedule() continues the running sequences only: it admits no waiting sequence, swaps none in and
    // preempts none for priority (each waits one step). The engine calls it when it launched the next step's decode
    // ahead for exactly the running sequences (engine_step.cpp, "Lookahead"), so that the plan stays that decode. One
    // call holds one schedule().
    void hold_admissions() { hold_admissions_ = true; }

    // The engine computed every token of `out`: advance num_computed_tokens.
    void commit_step(const StepPlan & out);

    // Remove a running sequence (finished, aborted or failed) and free its KV (the KV cache
    // manager's rows; the engine clears llama.cpp's slot). Call only with a running sequence.
    // Returns the sequence, status FINISHED.
    std::unique_ptr<Sequence> finish(Sequence * seq, cf_finish_reason reason);

    // Remove a waiting or running sequence by request id (abort). Returns nullptr if unknown.
    std::unique_ptr<Sequence> remove(int64_t request_id, cf_finish_reason reason);

    bool has_work() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }
    int32_t num_swapped() const { return (int32_t) swapped_.size(); }
    const PreemptionStats & preemption_stats() const { return preemption_stats_; }
    // AUTO mode's cost model (see SchedulerConfig); values <= 0 are ignored.
    void set_preemption_costs(double swap_ns_per_byte, double recompute_ns_per_token);
    int32_t num_running() const { return (int32_t) running_.size(); }
    int32_t num_waiting() const { return (int32_t) waiting_.size(); }
    int32_t num_free_slots() const { return config_.max_num_seqs - num_running(); }
    int64_t num_preemptions() const { return num_preemptions_; }  // since construction
    // KV rows set aside for running sequences (see KvCacheManager::kv_tokens_reserved).
    int64_t kv_tokens_reserved() const { return kv_->kv_tokens_reserved(); }
    // KV rows holding tokens of running sequences (KvCacheManager::kv_tokens_used: shared rows once).
    int64_t kv_tokens_used() const;
    // Computed tokens of running sequences, a shared row once per holder: the KV rows their
    // attention reads.
    int64_t kv_tokens_attended() const;
    const std::vector<std::unique_ptr<Sequence>> & running() const { return running_; }
    // Ids of every running, swapped and waiting sequence (in that order); allocates, not for the hot path.
    std::vector<int64_t> request_ids() const;

    // priority - floor(queue time / priority_aging_ns) as of the current step (see above);
    // seq.priority when aging is off. Smaller is more urgent.
    int64_t effective_priority(const Sequence & seq) const;

    // Aborts with a message naming the broken invariant (debug aid; tests call it every op).
    void check_invariants() const;
    std::string dump() const;

  private:
    bool comes_before(const Sequence & a, const Sequence & b) const;
    bool can_admit(const Sequence & seq) const;
    int64_t blocks_reserved_before(const Sequence & queued) const;
    bool others_hold_blocks(const Sequence & seq) const;
    void requeue(std::unique_ptr<Sequence> owned, bool for_priority, bool unstarted);
    void admit_at(size_t waiting_index);
    void fork_choices();
    bool waits_for_fork(Sequence & seq) const;
    bool waits_for_shared_prefix(const Sequence & seq) const;
    bool passed_over(Sequence & seq) const { return waits_for_fork(seq) || waits_for_shared_prefix(seq); }
    void push_scheduled(Sequence * seq, int32_t budget_left, int32_t * budget);
    bool is_long_prefill(const Sequence & seq) const;
    void top_up_long_prefills(int32_t * budget);
    void grow_entry(ScheduledSeq & entry, int32_t n, int32_t * budget);
    bool allocate_or_preempt(Sequence * seq, int32_t num_new_tokens);
    Sequence * preemption_victim(const Sequence & needy) const;
    void preempt(Sequence * seq, bool for_priority = false);
    // scheduler_priority.cpp: the PRIORITY policy's queue order, preemption and admission.
    void sort_queues();
    Sequence * first_queued();
    bool fits_now(const Sequence & queued, bool with_deferred) const;
    bool waits_for_deferred_blocks(Sequence & seq, int32_t num_new_tokens);
    void preempt_for_urgent();
    void admit_by_priority(int32_t * budget);
    bool swap_in_front(int32_t * budget);
    bool preempted_this_step(const Sequence & seq) const;
    void end_wait(Sequence & seq) const;
    bool should_swap(const Sequence & victim) const;
    int32_t chunk_size(const Sequence & seq, int32_t budget_left) const;
    void swap_in_swapped(int32_t * budget);
    void free_kv(Sequence * seq);  // once per stay in the running set (Sequence::holds_kv)
    void schedule_running(bool decoding, int32_t * budget);
    void admit_waiting(int32_t * budget);
    std::unique_ptr<Sequence> release(size_t running_index, cf_finish_reason reason);

    SchedulerConfig config_;
    std::deque<std::unique_ptr<Sequence>> waiting_;    // policy order, front runs first
    std::vector<std::unique_ptr<Sequence>> running_;   // admission order
    std::deque<std::unique_ptr<Sequence>> swapped_;    // policy order, front swaps in first
    std::unique_ptr<KvCacheManager> kv_;
    std::vector<Sequence *> order_;                    // scratch: running_ at the start of a pass
    int64_t now_ns_ = 0;                               // the step being planned (schedule)
    int64_t num_blocks_promised_ = 0;                  // deferred blocks counted for StepPlan::deferred
    int32_t long_entry_ = -1;                          // out_.seqs index of this step's capped long prefill
    std::vector<Sequence *> long_skipped_;             // long prefills passed over in the first pass
    int64_t num_preemptions_ = 0;
    bool hold_admissions_ = false;                     // hold_admissions() for the next schedule()
    PreemptionStats preemption_stats_;
    StepPlan out_;
};

}  // namespace cf
