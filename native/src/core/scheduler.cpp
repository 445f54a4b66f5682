// scheduler.cpp - continuous batching with chunked prefill; see scheduler.h for the contract.
#include "core/scheduler.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_set>

namespace cf {

Scheduler::Scheduler(const SchedulerConfig & config, std::unique_ptr<KvCacheManager> kv)
    : config_(config), kv_(std::move(kv)) {
    assert(kv_ != nullptr);
    assert(config.max_num_seqs >= 1 && config.max_num_batched_tokens >= 1);
    // with KV streaming a sequence may outgrow the device pool (n_ctx) by its host-resident blocks
    assert(config.n_ctx_per_seq >= 1 && (config.n_ctx >= config.n_ctx_per_seq || kv_->streams()));
    order_.reserve((size_t) config.max_num_seqs);
    running_.reserve((size_t) config.max_num_seqs);
    out_.seqs.reserve((size_t) config.max_num_seqs);
}

// Waiting-queue order of the policy; ties (and FCFS) go by request id, which grows with arrival.
bool Scheduler::comes_before(const Sequence & a, const Sequence & b) const {
    switch (config_.policy) {
        case CF_SCHED_POLICY_SJF: {
            // predicted remaining work, tokens: what is left to compute + what is left to generate
            const int64_t work_a = (int64_t) a.num_uncomputed_tokens() + a.params.max_tokens - a.num_output_tokens();
            const int64_t work_b = (int64_t) b.num_uncomputed_tokens() + b.params.max_tokens - b.num_output_tokens();
            if (work_a != work_b) {
                return work_a < work_b;
            }
            break;
        }
        case CF_SCHED_POLICY_PRIORITY: {
            const int64_t urgency_a = effective_priority(a);
            const int64_t urgency_b = effective_priority(b);
            if (urgency_a != urgency_b) {
                return urgency_a < urgency_b;
            }
            break;
        }
        default:
            break;
    }
    return a.request_id < b.request_id;
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
    assert(seq && seq->status == SequenceStatus::WAITING && !seq->holds_kv);
    assert(seq->num_prompt_tokens >= 1 && seq->num_prompt_tokens < config_.n_ctx_per_seq);
    if (!kv_->supports_fork()) {  // choices compute their prompts like any request
        seq->fork_pending = false;
        seq->fork_parent_id = 0;
    } else if (seq->fork_pending && !kv_->fork_fits(*seq)) {
        seq->fork_pending = false;  // its prompt must stream: its choices give up the fork and compute it too
    }
    auto pos = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                                [this](const std::unique_ptr<Sequence> & x, const std::unique_ptr<Sequence> & y) {
                                    return comes_before(*x, *y);
                                });
    waiting_.insert(pos, std::move(seq));
}

const StepPlan & Scheduler::schedule(int64_t now_ns) {
    assert(now_ns >= now_ns_);
    out_.clear();
    now_ns_ = now_ns;
    num_blocks_promised_ = 0;
    long_entry_ = -1;
    long_skipped_.clear();
    kv_->begin_step();  // the previous step's swap-outs give their device blocks back now
    for (const auto & seq : running_) {
        seq->scheduled = false;
        if (seq->status == SequenceStatus::SWAPPING_IN) {  // its copies ran with the previous step
            seq->status = SequenceStatus::RUNNING;
            out_.resumed.push_back(seq.get());
        }
    }
    const bool by_priority = config_.policy == CF_SCHED_POLICY_PRIORITY;
    const bool hold = hold_admissions_;
    hold_admissions_ = false;
    if (by_priority) {
        sort_queues();  // aging moved effective priorities since the last step
    }
    fork_choices();
    if (by_priority && !hold) {
        preempt_for_urgent();
    }
    const size_t num_preempted_for_priority = out_.preempted.size();
    int32_t budget = config_.max_num_batched_tokens;
    schedule_running(/*decoding=*/true, &budget);
    schedule_running(/*decoding=*/false, &budget);
    if (!hold && out_.preempted.size() == num_preempted_for_priority) {  // blocks are short: no admission
        if (by_priority) {
            admit_by_priority(&budget);
        } else {
            swap_in_swapped(&budget);
            if (swapped_.empty()) {
                admit_waiting(&budget);
            }
        }
    }
    top_up_long_prefills(&budget);
    std::sort(out_.seqs.begin(), out_.seqs.end(),
              [](const ScheduledSeq & a, const ScheduledSeq & b) { return a.seq->request_id < b.seq->request_id; });
    // The sequences are final: lay out the per-token arrays in batch order, then the KV part.
    for (size_t i = 0; i < out_.seqs.size(); ++i) {
        out_.token_seq_idx.insert(out_.token_seq_idx.end(), (size_t) out_.seqs[i].num_new_tokens, (int32_t) i);
    }
    kv_->fill_plan(&out_);
    kv_->end_step();
    return out_;
}

// Swapped sequences come back in policy order while their blocks and next chunk fit; the first
// that does not fit stops the rest (they keep their order, nothing overtakes it).
void Scheduler::swap_in_swapped(int32_t * budget) {
    while (*budget > 0 && !swapped_.empty() && swap_in_front(budget)) {
    }
}

// Swap in the front of the swapped queue if it fits now; false (nothing changed) if not. It is
// SWAPPING_IN for this step (its copies run beside this step's compute) and joins the batch at the
// next one; its next chunk's blocks were counted free (can_swap_in) but are taken only then.
bool Scheduler::swap_in_front(int32_t * budget) {
    Sequence * seq = swapped_.front().get();
    if (num_running() >= config_.max_num_seqs ||
        !kv_->can_swap_in(*seq, num_running(), chunk_size(*seq, *budget), /*with_deferred=*/false,
                          blocks_reserved_before(*seq))) {
        return false;
    }
    std::unique_ptr<Sequence> owned = std::move(swapped_.front());
    swapped_.pop_front();
    kv_->swap_in(*owned, &out_.blocks_to_swap_in);
    owned->status = SequenceStatus::SWAPPING_IN;
    owned->scheduled = false;
    owned->num_tokens_at_admission = -1;  // its KV came back: giving way again is a preemption
    owned->holds_kv = true;
    end_wait(*owned);
    out_.swapped_in.push_back(seq);
    running_.push_back(std::move(owned));
    return true;
}

void Scheduler::set_preemption_costs(double swap_ns_per_byte, double recompute_ns_per_token) {
    if (swap_ns_per_byte > 0.0) {
        config_.swap_ns_per_byte = swap_ns_per_byte;
    }
    if (recompute_ns_per_token > 0.0) {
        config_.recompute_ns_per_token = recompute_ns_per_token;
    }
}

void Scheduler::schedule_running(bool decoding, int32_t * budget) {
    order_.clear();  // preemption removes sequences from running_ while this loop walks it
    for (const auto & seq : running_) {
        order_.push_back(seq.get());
    }
    for (Sequence * seq : order_) {
        if (*budget == 0) {
            return;
        }
        if (seq->status == SequenceStatus::RUNNING && seq->is_prefilled() == decoding) {
            push_scheduled(seq, *budget, budget);
        }
    }
}

void Scheduler::admit_waiting(int32_t * budget) {
    size_t i = 0;  // choices waiting for their parent's fork are passed over, not admitted
    while (*budget > 0 && i < waiting_.size()) {
        if (passed_over(*waiting_[i])) {
            ++i;
            continue;
        }
        if (!can_admit(*waiting_[i])) {
            return;
        }
        admit_at(i);
        push_scheduled(running_.back().get(), *budget, budget);
    }
}

// True while a running sequence has yet to compute at least min_pending_shared_prefix tokens that seq
// could then take from the prefix cache (see "Shared prefixes in flight" in scheduler.h). Only running
// sequences with that many tokens left to compute can qualify, so decoding ones cost one comparison.
bool Scheduler::waits_for_shared_prefix(const Sequence & seq) const {
    const int32_t min_tokens = config_.min_pending_shared_prefix;
    if (min_tokens <= 0) {
        return false;
    }
    for (const auto & other : running_) {
        if (other->num_uncomputed_tokens() >= min_tokens &&
            kv_->pending_shared_prefix_tokens(seq, *other) >= min_tokens) {
            return true;
        }
    }
    return false;
}

// True while seq is a choice whose parent (running or waiting) still computes the prompt they
// share; once the parent is gone or has forked, seq gives up on the fork (a plain request).
bool Scheduler::waits_for_fork(Sequence & seq) const {
    if (seq.fork_parent_id == 0) {
        return false;
    }
    for (const auto & other : running_) {
        if (other->request_id == seq.fork_parent_id && other->fork_pending) {
            return true;
        }
    }
    for (const auto & other : waiting_) {
        if (other->request_id == seq.fork_parent_id && other->fork_pending) {
            return true;
        }
    }
    seq.fork_parent_id = 0;
    return false;
}

// See the diagram in scheduler.h. Runs first in a step, so a parent at num_prompt_tokens - 1
// has allocated nothing for the token its choices compute with it.
void Scheduler::fork_choices() {
    for (size_t r = 0; r < running_.size(); ++r) {  // forked choices are appended, never parents
        Sequence * parent = running_[r].get();
        if (!parent->fork_pending || parent->num_computed_tokens != parent->num_prompt_tokens - 1) {
            continue;
        }
        parent->fork_pending = false;
        int32_t num_forked = 0;
        for (size_t i = 0; i < waiting_.size();) {
            Sequence & child = *waiting_[i];
            if (child.fork_parent_id != parent->request_id) {
                ++i;
                continue;
            }
            child.fork_parent_id = 0;
            // each of parent and choices may need one block for the shared token (copy-on-write)
            if (num_running() >= config_.max_num_seqs || kv_->num_blocks_free() < num_forked + 2) {
                ++i;
                continue;
            }
            std::unique_ptr<Sequence> owned = std::move(waiting_[i]);
            waiting_.erase(waiting_.begin() + (std::ptrdiff_t) i);
            owned->status = SequenceStatus::RUNNING;
            owned->scheduled = false;
            end_wait(*owned);
            kv_->fork(*parent, *owned);
            owned->holds_kv = true;
            owned->num_tokens_at_admission = -1;  // its KV is forked, not computed by itself
            owned->num_computed_tokens = parent->num_computed_tokens;
            owned->num_cached_tokens = parent->num_computed_tokens;  // reused, not computed
            running_.push_back(std::move(owned));
            ++num_forked;
        }
    }
}

// Tokens seq computes next under budget_left: the rest of it, stopping where its choices fork, and no
// more than the KV cache manager can ever allocate it in one step (KV streaming's chunk cap).
int32_t Scheduler::chunk_size(const Sequence & seq, int32_t budget_left) const {
    int32_t n = std::min({seq.num_uncomputed_tokens(), budget_left, kv_->max_chunk_tokens(seq)});
    if (seq.fork_pending && seq.num_computed_tokens < seq.num_prompt_tokens - 1) {
        n = std::min(n, seq.num_prompt_tokens - 1 - seq.num_computed_tokens);  // choices fork there
    }
    return n;
}

bool Scheduler::is_long_prefill(const Sequence & seq) const {
    return config_.long_prefill_token_threshold > 0 && seq.num_uncomputed_tokens() > config_.long_prefill_token_threshold;
}

void Scheduler::push_scheduled(Sequence * seq, int32_t budget_left, int32_t * budget) {
    assert(seq->num_uncomputed_tokens() >= 1 && budget_left >= 1);
    if (is_long_prefill(*seq)) {  // scheduler.h, "Long prefills": one gets T tokens now, the others wait
        if (long_entry_ >= 0 || !long_skipped_.empty()) {
            long_skipped_.push_back(seq);  // the blocks of its rest stay reserved (blocks_reserved_before)
            return;
        }
        budget_left = std::min(budget_left, config_.long_prefill_token_threshold);
    }
    const int32_t n = chunk_size(*seq, budget_left);
    if (!allocate_or_preempt(seq, n)) {
        return;  // preempted or out of blocks
    }
    if (is_long_prefill(*seq)) {
        long_entry_ = (int32_t) out_.seqs.size();
    }
    out_.seqs.push_back({seq, 0, false});
    seq->scheduled = true;
    grow_entry(out_.seqs.back(), n, budget);
}

// entry's chunk grows by n tokens (KV rows allocated by the caller): its sample flag, the plan's
// token counts and the budget follow.
void Scheduler::grow_entry(ScheduledSeq & entry, int32_t n, int32_t * budget) {
    const Sequence & seq = *entry.seq;
    // The decode token is the last sampled one; everything else (the prompt, and after a
    // preemption the output computed again) is prefill.
    const int32_t was_decode = entry.needs_sample && seq.num_output_tokens() > 0 ? 1 : 0;
    entry.num_new_tokens += n;
    entry.needs_sample = seq.num_computed_tokens + entry.num_new_tokens == seq.num_tokens();
    const int32_t n_decode = (entry.needs_sample && seq.num_output_tokens() > 0 ? 1 : 0) - was_decode;
    out_.num_scheduled_tokens += n;
    out_.num_prefill_tokens += n - n_decode;
    out_.num_decode_tokens += n_decode;
    *budget -= n;
}

// The second pass of "Long prefills" (scheduler.h): the budget the first pass left grows the capped long
// prefill's chunk, then gives chunks to the skipped long prefills in order; KV rows only from free blocks
// (a sequence that would need a preemption for them just computes less, or nothing, in this step).
void Scheduler::top_up_long_prefills(int32_t * budget) {
    if (long_entry_ >= 0 && *budget > 0) {
        ScheduledSeq & entry = out_.seqs[(size_t) long_entry_];
        Sequence * seq = entry.seq;
        const int32_t extra = chunk_size(*seq, entry.num_new_tokens + *budget) - entry.num_new_tokens;
        if (extra > 0 && kv_->allocate(*seq, extra)) {
            grow_entry(entry, extra, budget);
        }
    }
    for (Sequence * seq : long_skipped_) {
        if (*budget == 0) {
            return;
        }
        // a skipped sequence may have been preempted since (a victim is one not scheduled yet)
        if (seq->status != SequenceStatus::RUNNING || seq->scheduled) {
            continue;
        }
        const int32_t n = chunk_size(*seq, *budget);
        if (n < 1 || !kv_->allocate(*seq, n)) {
            continue;
        }
        out_.seqs.push_back({seq, 0, false});
        seq->scheduled = true;
        grow_entry(out_.seqs.back(), n, budget);
    }
}

// Give seq's next num_new_tokens tokens KV rows, preempting others while KV is short. False when
// seq itself was preempted (its KV is free), or waits a step for the blocks this step's swap-outs
// free at the next one (StepPlan::deferred; it stays RUNNING), or, alone, ends out of blocks (the
// engine finishes it).
bool Scheduler::allocate_or_preempt(Sequence * seq, int32_t num_new_tokens) {
    for (;;) {
        if (kv_->allocate(*seq, num_new_tokens)) {
            return true;
        }
        if (kv_->streams()) {
            // KV streaming: move middle blocks to the host before preempting anyone (PagedKv's rule); their
            // device blocks are free at the next step, and seq waits for them there
            const int64_t short_by = kv_->num_blocks_to_allocate(*seq, num_new_tokens) + num_blocks_promised_ -
                                     ((int64_t) kv_->num_blocks_free() + kv_->num_blocks_freed_next_step());
            if (short_by > 0) {
                kv_->demote(*seq, short_by, running_, &out_.blocks_to_swap_out);
            }
        }
        if (waits_for_deferred_blocks(*seq, num_new_tokens)) {
            return false;
        }
        Sequence * victim = preemption_victim(*seq);
        if (victim == nullptr) {
            break;
        }
        preempt(victim);
    }
    // The others are scheduled already: seq resumes once they free blocks. With streaming, a sequence
    // alone also gives way to swapped ones: they may hold the host slots it would stream into, and they
    // come back (swap_in_swapped) once it is out.
    if (others_hold_blocks(*seq) || (kv_->streams() && !swapped_.empty())) {
        preempt(seq);
        return false;
    }
    // alone and the pool is not enough: it ends, and gives its blocks back now; with streaming the
    // manager says why (the engine ends it with that error; without, the context is full: length)
    seq->error_message = kv_->out_of_blocks_reason(*seq, num_new_tokens);
    free_kv(seq);
    out_.out_of_blocks.push_back(seq);
    return false;
}

// True (and seq is recorded in StepPlan::deferred) if the blocks that this step's swap-outs free at
// the next step cover seq's need, after those promised to sequences deferred before it: preempting
// more would not help sooner, since a swapped victim's blocks are not free in the step that swaps it.
bool Scheduler::waits_for_deferred_blocks(Sequence & seq, int32_t num_new_tokens) {
    const int64_t freed_next = kv_->num_blocks_freed_next_step();
    if (freed_next == 0) {
        return false;
    }
    const int64_t needed = kv_->num_blocks_to_allocate(seq, num_new_tokens);
    if (needed + num_blocks_promised_ > (int64_t) kv_->num_blocks_free() + freed_next) {
        return false;
    }
    num_blocks_promised_ += needed;
    out_.deferred.push_back(&seq);
    return true;
}

// The running sequence, other than needy and not scheduled this step, that comes last in policy
// order among those holding device blocks; nullptr if there is none or it comes before needy (then
// needy gives way itself). One holding no block (a long prefill passed over before its first chunk)
// would free nothing: preempting it would only count a preemption and send it back to the queue.
Sequence * Scheduler::preemption_victim(const Sequence & needy) const {
    Sequence * victim = nullptr;
    for (const auto & seq : running_) {
        if (seq.get() == &needy || seq->scheduled || !seq->holds_kv || seq->status != SequenceStatus::RUNNING ||
            !kv_->holds_device_blocks(*seq)) {
            continue;
        }
        if (victim == nullptr || comes_before(*victim, *seq)) {
            victim = seq.get();
        }
    }
    if (victim != nullptr && comes_before(*victim, needy)) {
        return nullptr;
    }
    return victim;
}

// AUTO: swap when copying its blocks out and back is cheaper than computing its tokens again.
// A sequence swapped in by this very plan is never a victim of it (SWAPPING_IN; its blocks are
// not back yet); the check below stays as a guard.
bool Scheduler::should_swap(const Sequence & victim) const {
    if (config_.preemption_mode == CF_PREEMPTION_MODE_RECOMPUTE || !kv_->can_swap_out(victim) ||
        std::find(out_.swapped_in.begin(), out_.swapped_in.end(), &victim) != out_.swapped_in.end()) {
        return false;
    }
    if (config_.preemption_mode == CF_PREEMPTION_MODE_SWAP) {
        return true;
    }
    const double swap_ns = 2.0 * (double) kv_->swap_bytes(victim) * config_.swap_ns_per_byte;
    const double recompute_ns = (double) victim.num_computed_tokens * config_.recompute_ns_per_token;
    return swap_ns <= recompute_ns;
}

void Scheduler::preempt(Sequence * seq, bool for_priority) {
    size_t index = 0;
    while (running_[index].get() != seq) {
        ++index;
    }
    std::unique_ptr<Sequence> owned = std::move(running_[index]);
    running_.erase(running_.begin() + (std::ptrdiff_t) index);
    owned->queued_since_ns = now_ns_;  // its effective priority stays what it was while running
    if (owned->num_tokens_at_admission == owned->num_computed_tokens) {
        // Nothing computed in this stay (a long prefill passed over, or one whose first chunk found no
        // blocks): it goes back to the queue as it came, losing nothing; no preemption is counted.
        requeue(std::move(owned), for_priority, /*unstarted=*/true);
        return;
    }
    owned->num_preemptions += 1;
    num_preemptions_ += 1;
    preemption_stats_.num_priority += for_priority ? 1 : 0;
    if (should_swap(*owned)) {
        // Its KV moves to host slots; num_computed_tokens stays: it resumes where it stopped.
        kv_->swap_out(*owned, &out_.blocks_to_swap_out);
        owned->holds_kv = false;
        owned->status = SequenceStatus::SWAPPED;
        preemption_stats_.num_swap += 1;
        out_.preempted.push_back({owned.get(), /*swapped=*/true, for_priority});
        auto pos = std::upper_bound(swapped_.begin(), swapped_.end(), owned,
                                    [this](const std::unique_ptr<Sequence> & x, const std::unique_ptr<Sequence> & y) {
                                        return comes_before(*x, *y);
                                    });
        swapped_.insert(pos, std::move(owned));
        return;
    }
    preemption_stats_.num_recompute += 1;
    preemption_stats_.num_recomputed_tokens += owned->num_computed_tokens;
    requeue(std::move(owned), for_priority, /*unstarted=*/false);
}

// A sequence taken out of the running set goes back to the waiting queue without KV, its output kept.
void Scheduler::requeue(std::unique_ptr<Sequence> owned, bool for_priority, bool unstarted) {
    free_kv(owned.get());
    owned->status = SequenceStatus::WAITING;
    owned->num_computed_tokens = 0;
    out_.preempted.push_back({owned.get(), /*swapped=*/false, for_priority, unstarted});
    add(std::move(owned));
}

void Scheduler::free_kv(Sequence * seq) {
    if (seq->holds_kv) {
        kv_->free(*seq);
        seq->holds_kv = false;
    }
}

bool Scheduler::can_admit(const Sequence & seq) const {
    return num_running() < config_.max_num_seqs &&
           kv_->can_admit(seq, num_running(), /*with_deferred=*/false, blocks_reserved_before(seq));
}

// Blocks reserved for the long prefills passed over in this step that come before `queued` (waiting or
// swapped) in policy order: see "Long prefills" in scheduler.h. One preempted since is no longer counted.
int64_t Scheduler::blocks_reserved_before(const Sequence & queued) const {
    int64_t n = 0;
    for (const Sequence * seq : long_skipped_) {
        if (seq->status == SequenceStatus::RUNNING && !seq->scheduled && comes_before(*seq, queued)) {
            n += kv_->num_blocks_to_reserve(*seq);
        }
    }
    return n;
}

// True if a running sequence other than seq holds a device block: one that could free blocks for seq.
bool Scheduler::others_hold_blocks(const Sequence & seq) const {
    for (const auto & other : running_) {
        if (other.get() != &seq && other->holds_kv && kv_->holds_device_blocks(*other)) {
            return true;
        }
    }
    return false;
}

void Scheduler::admit_at(size_t waiting_index) {
    std::unique_ptr<Sequence> seq = std::move(waiting_[waiting_index]);
    waiting_.erase(waiting_.begin() + (std::ptrdiff_t) waiting_index);
    seq->status = SequenceStatus::RUNNING;
    seq->scheduled = false;
    end_wait(*seq);
    // A prefix-cache hit: computing starts after the cached tokens (never all of them).
    seq->num_computed_tokens = kv_->admit(*seq);
    assert(seq->num_uncomputed_tokens() >= 1);
    if (seq->num_preemptions == 0) {
        seq->num_cached_tokens = seq->num_computed_tokens;  // a first admission: prompt tokens only
    }
    seq->num_tokens_at_admission = seq->num_computed_tokens;
    seq->holds_kv = true;
    running_.push_back(std::move(seq));
}

void Scheduler::commit_step(const StepPlan & out) {
    for (const ScheduledSeq & s : out.seqs) {
        assert(s.seq->status == SequenceStatus::RUNNING);
        s.seq->num_computed_tokens += s.num_new_tokens;
        assert(s.seq->num_computed_tokens <= s.seq->num_tokens());
        kv_->commit(*s.seq);
    }
}

std::unique_ptr<Sequence> Scheduler::finish(Sequence * seq, cf_finish_reason reason) {
    for (size_t i = 0; i < running_.size(); ++i) {
        if (running_[i].get() == seq) {
            return release(i, reason);
        }
    }
    assert(false && "finish: call only with a running sequence");
    return nullptr;
}

std::unique_ptr<Sequence> Scheduler::remove(int64_t request_id, cf_finish_reason reason) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
        if ((*it)->request_id == request_id) {
            std::unique_ptr<Sequence> seq = std::move(*it);
            waiting_.erase(it);
            seq->status = SequenceStatus::FINISHED;
            seq->finish_reason = reason;
            return seq;
        }
    }
    for (size_t i = 0; i < running_.size(); ++i) {
        if (running_[i]->request_id == request_id) {
            return release(i, reason);
        }
    }
    for (auto it = swapped_.begin(); it != swapped_.end(); ++it) {
        if ((*it)->request_id == request_id) {
            std::unique_ptr<Sequence> seq = std::move(*it);
            swapped_.erase(it);
            kv_->free_swapped(*seq);
            seq->status = SequenceStatus::FINISHED;
            seq->finish_reason = reason;
            return seq;
        }
    }
    return nullptr;
}

std::unique_ptr<Sequence> Scheduler::release(size_t running_index, cf_finish_reason reason) {
    std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
    running_.erase(running_.begin() + (std::ptrdiff_t) running_index);
    free_kv(seq.get());
    seq->status = SequenceStatus::FINISHED;
    seq->finish_reason = reason;
    return seq;
}

int64_t Scheduler::kv_tokens_used() const {
    return kv_->kv_tokens_used(running_);
}

int64_t Scheduler::kv_tokens_attended() const {
    return total_computed_tokens(running_);
}

std::vector<int64_t> Scheduler::request_ids() const {
    std::vector<int64_t> ids;
    ids.reserve(running_.size() + swapped_.size() + waiting_.size());
    for (const auto & seq : running_) {
        ids.push_back(seq->request_id);
    }
    for (const auto & seq : swapped_) {
        ids.push_back(seq->request_id);
    }
    for (const auto & seq : waiting_) {
        ids.push_back(seq->request_id);
    }
    return ids;
}

void Scheduler::check_invariants() const {
    auto check = [this](bool ok, const char * what) {
        if (!ok) {
            std::fprintf(stderr, "cacheflow: scheduler invariant broken: %s\n%s", what, dump().c_str());
            std::abort();
        }
    };
    check(num_running() <= config_.max_num_seqs, "num_running <= max_num_seqs");
    std::unordered_set<int64_t> ids;
    for (const auto & seq : running_) {
        check(ids.insert(seq->request_id).second, "request ids are unique");
        check(seq->holds_kv, "running sequences were admitted by the KV cache manager");
        check(seq->status == SequenceStatus::RUNNING || seq->status == SequenceStatus::SWAPPING_IN,
              "running sequences have status RUNNING or SWAPPING_IN");
        check(seq->status == SequenceStatus::RUNNING || !seq->scheduled, "a sequence swapping in is not scheduled");
        check(seq->num_uncomputed_tokens() >= 1, "a running sequence has a token to compute");
        check(seq->num_tokens() <= config_.n_ctx_per_seq, "a sequence fits n_ctx_per_seq");
    }
    const std::string kv_error = kv_->check_invariants(running_);
    check(kv_error.empty(), kv_error.c_str());
    std::vector<const Sequence *> swapped;
    for (size_t i = 0; i < swapped_.size(); ++i) {
        const Sequence & seq = *swapped_[i];
        check(seq.status == SequenceStatus::SWAPPED && !seq.holds_kv, "swapped sequences hold no device KV");
        check(seq.num_uncomputed_tokens() >= 1, "a swapped sequence has a token to compute");
        check(ids.insert(seq.request_id).second, "request ids are unique");
        check(i == 0 || !comes_before(seq, *swapped_[i - 1]), "swapped queue is in policy order");
        swapped.push_back(&seq);
    }
    const std::string swap_error = kv_->check_swapped(swapped);
    check(swap_error.empty(), swap_error.c_str());
    for (size_t i = 0; i < waiting_.size(); ++i) {
        check(waiting_[i]->status == SequenceStatus::WAITING && !waiting_[i]->holds_kv,
              "waiting sequences hold no KV");
        check(ids.insert(waiting_[i]->request_id).second, "request ids are unique");
        check(i == 0 || !comes_before(*waiting_[i], *waiting_[i - 1]), "waiting queue is in policy order");
    }
}

std::string Scheduler::dump() const {
    std::ostringstream os;
    os << "Scheduler(policy=" << config_.policy << ", kv=" << kv_->name()
       << ", running=" << running_.size() << "/" << config_.max_num_seqs << ", swapped=" << swapped_.size()
       << ", waiting=" << waiting_.size()
       << ", kv_reserved=" << kv_tokens_reserved() << "/" << config_.n_ctx << ")\n";
    for (const auto & seq : running_) {
        os << (seq->status == SequenceStatus::SWAPPING_IN ? "  swapping-in req=" : "  running req=")
           << seq->request_id << " prompt=" << seq->num_prompt_tokens
           << " computed=" << seq->num_computed_tokens << " tokens=" << seq->num_tokens() << "\n";
    }
    for (const auto & seq : swapped_) {
        os << "  swapped req=" << seq->request_id << " computed=" << seq->num_computed_tokens << "\n";
    }
    for (const auto & seq : waiting_) {
        os << "  waiting req=" << seq->request_id << " prompt=" << seq->num_prompt_tokens
           << " priority=" << seq->priority << " effective=" << effective_priority(*seq) << "\n";
    }
    os << kv_->dump();
    return os.str();
}

}  // namespace cf
