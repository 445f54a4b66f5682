// scheduler.cpp - continuous batching with chunked prefill; see scheduler.h for the contract.
#include "core/scheduler.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace cf {

void SchedulerOutput::clear() {
    seqs.clear();
    out_of_blocks.clear();
    preempted.clear();
    num_scheduled_tokens = 0;
    num_prefill_tokens = 0;
    num_decode_tokens = 0;
}

Scheduler::Scheduler(const SchedulerConfig & config) : config_(config) {
    assert(config.max_num_seqs >= 1 && config.max_num_batched_tokens >= 1);
    assert(config.n_ctx_per_seq >= 1 && config.n_ctx >= config.n_ctx_per_seq);
    slot_used_.assign((size_t) config.max_num_seqs, 0);
    scheduled_.assign((size_t) config.max_num_seqs, 0);
    order_.reserve((size_t) config.max_num_seqs);
    running_.reserve((size_t) config.max_num_seqs);
    out_.seqs.reserve((size_t) config.max_num_seqs);
    if (config.block_manager != nullptr) {
        watermark_blocks_ = std::max<int64_t>(1, config.block_manager->pool().num_blocks() / 100);
    }
}

// Waiting-queue order of the policy; ties (and FCFS) go by request id, which grows with arrival.
bool Scheduler::comes_before(const Sequence & a, const Sequence & b) const {
    switch (config_.policy) {
        case CF_SCHED_POLICY_SJF: {
            const int64_t work_a = (int64_t) a.num_prompt_tokens - a.num_computed_tokens + a.params.max_tokens;
            const int64_t work_b = (int64_t) b.num_prompt_tokens - b.num_computed_tokens + b.params.max_tokens;
            if (work_a != work_b) {
                return work_a < work_b;
            }
            break;
        }
        case CF_SCHED_POLICY_PRIORITY:
            if (a.priority != b.priority) {
                return a.priority < b.priority;
            }
            break;
        default:
            break;
    }
    return a.request_id < b.request_id;
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
    assert(seq && seq->status == SequenceStatus::WAITING && seq->seq_id == CF_SEQ_ID_NONE);
    assert(seq->num_prompt_tokens >= 1 && seq->num_prompt_tokens < config_.n_ctx_per_seq);
    auto pos = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                                [this](const std::unique_ptr<Sequence> & x, const std::unique_ptr<Sequence> & y) {
                                    return comes_before(*x, *y);
                                });
    waiting_.insert(pos, std::move(seq));
}

const SchedulerOutput & Scheduler::schedule() {
    out_.clear();
    std::fill(scheduled_.begin(), scheduled_.end(), 0);
    int32_t budget = config_.max_num_batched_tokens;
    schedule_running(/*decoding=*/true, &budget);
    schedule_running(/*decoding=*/false, &budget);
    if (out_.preempted.empty()) {  // blocks are short: let the preempted go first when they free up
        admit_waiting(&budget);
    }
    std::sort(out_.seqs.begin(), out_.seqs.end(),
              [](const ScheduledSeq & a, const ScheduledSeq & b) { return a.seq->seq_id < b.seq->seq_id; });
    return out_;
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
    while (*budget > 0 && !waiting_.empty() && can_admit(*waiting_.front())) {
        admit_front();
        push_scheduled(running_.back().get(), *budget, budget);
    }
}

void Scheduler::push_scheduled(Sequence * seq, int32_t budget_left, int32_t * budget) {
    assert(seq->num_uncomputed_tokens() >= 1 && budget_left >= 1);
    const int32_t n = std::min(seq->num_uncomputed_tokens(), budget_left);
    if (config_.block_manager != nullptr && !allocate_or_preempt(seq, n)) {
        return;  // preempted or out of blocks
    }
    const int32_t end = seq->num_computed_tokens + n;
    const bool needs_sample = end == seq->num_tokens();
    // The decode token is the last sampled one; everything else (the prompt, and after a
    // preemption the output computed again) is prefill.
    const int32_t n_decode = needs_sample && seq->num_output_tokens() > 0 ? 1 : 0;
    out_.seqs.push_back({seq, n, needs_sample});
    out_.num_scheduled_tokens += n;
    out_.num_prefill_tokens += n - n_decode;
    out_.num_decode_tokens += n_decode;
    scheduled_[(size_t) seq->seq_id] = 1;
    *budget -= n;
}

// Append seq's next num_new_tokens slots, preempting others while blocks are short. False when seq
// itself was preempted or, alone, ends out of blocks (its blocks are free either way).
bool Scheduler::allocate_or_preempt(Sequence * seq, int32_t num_new_tokens) {
    BlockManager & blocks = *config_.block_manager;
    for (;;) {
        slots_.clear();
        if (blocks.append_slots(seq->request_id, num_new_tokens, &slots_)) {
            return true;
        }
        Sequence * victim = preemption_victim(*seq);
        if (victim == nullptr) {
            break;
        }
        preempt(victim);
    }
    if (num_running() > 1) {
        preempt(seq);  // the others are scheduled already; seq resumes once they free blocks
        return false;
    }
    if (blocks.find(seq->request_id) != nullptr) {  // alone and the pool is not enough: it ends
        blocks.free(seq->request_id);
    }
    out_.out_of_blocks.push_back(seq);
    return false;
}

// The running sequence, other than needy and not scheduled this step, that comes last in policy
// order; nullptr if there is none or it comes before needy (then needy gives way itself).
Sequence * Scheduler::preemption_victim(const Sequence & needy) const {
    Sequence * victim = nullptr;
    for (const auto & seq : running_) {
        if (seq.get() == &needy || scheduled_[(size_t) seq->seq_id]) {
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

void Scheduler::preempt(Sequence * seq) {
    size_t index = 0;
    while (running_[index].get() != seq) {
        ++index;
    }
    std::unique_ptr<Sequence> owned = std::move(running_[index]);
    running_.erase(running_.begin() + (std::ptrdiff_t) index);
    const int32_t former_seq_id = owned->seq_id;
    slot_used_[(size_t) former_seq_id] = 0;
    kv_reserved_unified_ -= owned->max_kv_tokens(config_.n_ctx_per_seq);
    if (config_.block_manager->find(owned->request_id) != nullptr) {
        config_.block_manager->free(owned->request_id);
    }
    owned->seq_id = CF_SEQ_ID_NONE;
    owned->status = SequenceStatus::WAITING;
    owned->num_computed_tokens = 0;
    owned->num_preemptions += 1;
    num_preemptions_ += 1;
    out_.preempted.push_back({owned.get(), former_seq_id});
    add(std::move(owned));
}

bool Scheduler::can_admit(const Sequence & seq) const {
    if (num_running() >= config_.max_num_seqs) {
        return false;
    }
    if (config_.block_manager != nullptr) {
        // The watermark leaves running sequences room to grow: 1% of the pool, and at least one block
        // per running sequence, so that admitting a prompt does not force a preemption (and its
        // recompute) on the very next decode. Alone, a sequence may take the whole pool.
        const BlockManager & blocks = *config_.block_manager;
        const int64_t watermark = running_.empty() ? 0 : std::max<int64_t>(watermark_blocks_, num_running());
        return blocks.num_blocks_needed(seq.request_id, seq.num_uncomputed_tokens()) + watermark <=
               blocks.num_free_blocks();
    }
    if (!config_.kv_unified) {
        return true;  // a free slot is a whole stream of n_ctx_per_seq rows
    }
    return kv_reserved_unified_ + seq.max_kv_tokens(config_.n_ctx_per_seq) <= config_.n_ctx;
}

void Scheduler::admit_front() {
    std::unique_ptr<Sequence> seq = std::move(waiting_.front());
    waiting_.pop_front();
    seq->seq_id = lowest_free_slot();
    seq->status = SequenceStatus::RUNNING;
    slot_used_[(size_t) seq->seq_id] = 1;
    kv_reserved_unified_ += seq->max_kv_tokens(config_.n_ctx_per_seq);
    running_.push_back(std::move(seq));
}

int32_t Scheduler::lowest_free_slot() const {
    for (size_t i = 0; i < slot_used_.size(); ++i) {
        if (!slot_used_[i]) {
            return (int32_t) i;
        }
    }
    assert(false && "lowest_free_slot: no free slot; call only after can_admit");
    return CF_SEQ_ID_NONE;
}

void Scheduler::commit_step(const SchedulerOutput & out) {
    for (const ScheduledSeq & s : out.seqs) {
        assert(s.seq->status == SequenceStatus::RUNNING);
        s.seq->num_computed_tokens += s.num_new_tokens;
        assert(s.seq->num_computed_tokens <= s.seq->num_tokens());
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
    return nullptr;
}

// The returned sequence keeps its seq_id so that the caller can clear that slot's KV.
std::unique_ptr<Sequence> Scheduler::release(size_t running_index, cf_finish_reason reason) {
    std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
    running_.erase(running_.begin() + (std::ptrdiff_t) running_index);
    slot_used_[(size_t) seq->seq_id] = 0;
    kv_reserved_unified_ -= seq->max_kv_tokens(config_.n_ctx_per_seq);
    if (config_.block_manager != nullptr && config_.block_manager->find(seq->request_id) != nullptr) {
        config_.block_manager->free(seq->request_id);
    }
    seq->status = SequenceStatus::FINISHED;
    seq->finish_reason = reason;
    return seq;
}

int64_t Scheduler::kv_tokens_reserved() const {
    if (config_.block_manager != nullptr) {
        const BlockPool & pool = config_.block_manager->pool();
        return (int64_t) pool.num_used() * pool.block_size();
    }
    if (config_.kv_unified) {
        return kv_reserved_unified_;
    }
    return (int64_t) num_running() * config_.n_ctx_per_seq;
}

int64_t Scheduler::kv_tokens_used() const {
    int64_t used = 0;
    for (const auto & seq : running_) {
        used += seq->num_computed_tokens;
    }
    return used;
}

std::vector<int64_t> Scheduler::request_ids() const {
    std::vector<int64_t> ids;
    ids.reserve(running_.size() + waiting_.size());
    for (const auto & seq : running_) {
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
    std::vector<uint8_t> seen(slot_used_.size(), 0);
    int64_t reserved = 0;
    for (const auto & seq : running_) {
        const bool in_range = seq->seq_id >= 0 && seq->seq_id < config_.max_num_seqs;
        check(in_range && slot_used_[(size_t) seq->seq_id] && !seen[(size_t) seq->seq_id],
              "each running sequence owns one distinct used slot");
        seen[(size_t) seq->seq_id] = 1;
        check(seq->status == SequenceStatus::RUNNING, "running sequences have status RUNNING");
        check(seq->num_uncomputed_tokens() >= 1, "a running sequence has a token to compute");
        check(seq->num_tokens() <= config_.n_ctx_per_seq, "a sequence fits n_ctx_per_seq");
        reserved += seq->max_kv_tokens(config_.n_ctx_per_seq);
    }
    check(seen == slot_used_, "used slots are exactly those of running sequences");
    if (config_.block_manager != nullptr) {
        const BlockManager & blocks = *config_.block_manager;
        check(blocks.check_invariants().empty(), "block manager invariants hold");
        check(blocks.num_seqs() <= num_running(), "only running sequences hold blocks");
        for (const auto & seq : running_) {
            const BlockTable * table = blocks.find(seq->request_id);
            check(table == nullptr || table->num_tokens >= seq->num_computed_tokens,
                  "every computed token of a running sequence has a slot");
        }
    }
    check(reserved == kv_reserved_unified_, "reservation counter matches running sequences");
    check(!config_.kv_unified || reserved <= config_.n_ctx, "unified reservations fit n_ctx");
    for (size_t i = 0; i < waiting_.size(); ++i) {
        check(waiting_[i]->status == SequenceStatus::WAITING && waiting_[i]->seq_id == CF_SEQ_ID_NONE,
              "waiting sequences hold no slot");
        check(i == 0 || !comes_before(*waiting_[i], *waiting_[i - 1]), "waiting queue is in policy order");
    }
}

std::string Scheduler::dump() const {
    std::ostringstream os;
    os << "Scheduler(policy=" << config_.policy << ", unified=" << config_.kv_unified
       << ", running=" << running_.size() << "/" << config_.max_num_seqs << ", waiting=" << waiting_.size()
       << ", kv_reserved=" << kv_tokens_reserved() << "/" << config_.n_ctx << ")\n";
    for (const auto & seq : running_) {
        os << "  running req=" << seq->request_id << " seq_id=" << seq->seq_id << " prompt=" << seq->num_prompt_tokens
           << " computed=" << seq->num_computed_tokens << " tokens=" << seq->num_tokens() << "\n";
    }
    for (const auto & seq : waiting_) {
        os << "  waiting req=" << seq->request_id << " prompt=" << seq->num_prompt_tokens
           << " priority=" << seq->priority << "\n";
    }
    return os.str();
}

}  // namespace cf
