// scheduler_priority.cpp - the PRIORITY policy's parts of cf::Scheduler: effective priority with
// aging, the queues' order, preemption for a more urgent request and admission of swapped and
// waiting sequences in one policy order. The rules and their reasons are in scheduler.h
// ("Aging", "Priority preemption").
#include "core/scheduler.h"

#include <algorithm>
#include <cassert>

namespace cf {

int64_t Scheduler::effective_priority(const Sequence & seq) const {
    if (config_.priority_aging_ns <= 0) {
        return seq.priority;
    }
    int64_t wait_ns = seq.wait_ns;
    if (seq.status == SequenceStatus::WAITING || seq.status == SequenceStatus::SWAPPED) {
        // an arrival accepted after the step began has not waited yet
        wait_ns += std::max<int64_t>(0, now_ns_ - seq.queued_since_ns);
    }
    return (int64_t) seq.priority - wait_ns / config_.priority_aging_ns;
}

// seq leaves a queue (admitted, swapped in or forked): its queue time so far is kept for aging.
void Scheduler::end_wait(Sequence & seq) const {
    seq.wait_ns += std::max<int64_t>(0, now_ns_ - seq.queued_since_ns);
}

namespace {

// Stable insertion sort: the queues were in order at the previous step and aging moves few
// entries, so this is linear in the common case and never allocates.
template <typename Less>
void insertion_sort(std::deque<std::unique_ptr<Sequence>> & queue, Less less) {
    for (size_t i = 1; i < queue.size(); ++i) {
        for (size_t j = i; j > 0 && less(*queue[j], *queue[j - 1]); --j) {
            std::swap(queue[j], queue[j - 1]);
        }
    }
}

}  // namespace

// Call only at the start of a step, after now_ns_ moved: queue time changed effective priorities.
void Scheduler::sort_queues() {
    if (config_.priority_aging_ns <= 0) {
        return;  // static priorities: add() and preempt() keep both queues in order
    }
    auto less = [this](const Sequence & a, const Sequence & b) { return comes_before(a, b); };
    insertion_sort(waiting_, less);
    insertion_sort(swapped_, less);
}

// The queued sequence admission takes next: the fronts of the swapped and the waiting queue
// (choices waiting for their parent's fork, and sequences waiting for a shared prefix in flight, are
// passed over), whichever comes first; nullptr if none.
Sequence * Scheduler::first_queued() {
    Sequence * waiting = nullptr;
    for (const auto & seq : waiting_) {
        if (!passed_over(*seq)) {
            waiting = seq.get();
            break;
        }
    }
    Sequence * swapped = swapped_.empty() ? nullptr : swapped_.front().get();
    if (swapped != nullptr && (waiting == nullptr || comes_before(*swapped, *waiting))) {
        return swapped;
    }
    return waiting;
}

// Would `queued` (waiting or swapped) be let in right now: a free place in the running set and
// KV room for its prompt (waiting) or its blocks and next chunk (swapped), watermark included.
// with_deferred: counting the blocks this step's swap-outs free at the next step as free.
bool Scheduler::fits_now(const Sequence & queued, bool with_deferred) const {
    if (num_running() >= config_.max_num_seqs) {
        return false;
    }
    if (queued.status == SequenceStatus::SWAPPED) {
        return kv_->can_swap_in(queued, num_running(), chunk_size(queued, config_.max_num_batched_tokens),
                                with_deferred, blocks_reserved_before(queued));
    }
    return kv_->can_admit(queued, num_running(), with_deferred, blocks_reserved_before(queued));
}

// See "Priority preemption" in scheduler.h. Runs before any running sequence is scheduled in this
// step, so a victim has allocated nothing for it and leaves the plan cleanly.
void Scheduler::preempt_for_urgent() {
    Sequence * urgent = first_queued();
    if (urgent == nullptr) {
        return;
    }
    const int64_t urgency = effective_priority(*urgent);
    while (!fits_now(*urgent, /*with_deferred=*/false)) {
        if (fits_now(*urgent, /*with_deferred=*/true)) {
            return;  // it fits once the blocks of this step's swap-outs are back (next step)
        }
        // the running sequence that comes last in policy order among those strictly less urgent
        // than `urgent` by base and by effective priority (the newest among equals)
        Sequence * victim = nullptr;
        for (const auto & seq : running_) {
            if (seq->status != SequenceStatus::RUNNING || seq->priority <= urgent->priority ||
                effective_priority(*seq) <= urgency) {
                continue;  // never for an equally or less urgent request
            }
            if (victim == nullptr || comes_before(*victim, *seq)) {
                victim = seq.get();
            }
        }
        if (victim == nullptr) {
            return;
        }
        preempt(victim, /*for_priority=*/true);
    }
}

bool Scheduler::preempted_this_step(const Sequence & seq) const {
    for (const StepPlan::Preempted & p : out_.preempted) {
        if (p.seq == &seq) {
            return true;
        }
    }
    return false;
}

// Swapped and waiting sequences in one policy order while they fit; the first that does not fit,
// or that gave way in this very step, stops the rest (nothing overtakes it).
void Scheduler::admit_by_priority(int32_t * budget) {
    size_t w = 0;  // first waiting sequence not passed over (waiting for a fork or a shared prefix)
    while (*budget > 0) {
        while (w < waiting_.size() && passed_over(*waiting_[w])) {
            ++w;
        }
        const bool has_waiting = w < waiting_.size();
        const bool take_swapped =
            !swapped_.empty() && (!has_waiting || comes_before(*swapped_.front(), *waiting_[w]));
        if (!take_swapped && !has_waiting) {
            return;
        }
        const Sequence & next = take_swapped ? *swapped_.front() : *waiting_[w];
        if (preempted_this_step(next)) {
            return;
        }
        if (take_swapped) {
            if (!swap_in_front(budget)) {
                return;
            }
            continue;
        }
        if (!can_admit(next)) {
            return;
        }
        admit_at(w);
        push_scheduled(running_.back().get(), *budget, budget);
    }
}

}  // namespace cf
