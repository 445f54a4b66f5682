// test_scheduler_stream.cpp - KV streaming (issue 16) in cf::Scheduler over the paged KV manager, without a
// model: a prompt longer than the device pool runs alone in capped chunks (never out of blocks, every token
// computed once), a sequence that really runs out ends with the manager's reason, swap preemption of
// sequences holding host-resident blocks resumes them exactly and returns every host slot, and a prompt that
// must stream gives up the fork of its choices (they compute it themselves), and a sequence left alone gives
// way to swapped ones that hold the host slots it would stream into. Invariants every step.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/scheduler.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace cf;
using cf::test::make_seq;
using cf::test::sample_rows;

namespace {

constexpr int32_t kToken = 7;  // token appended by the fake sampler
constexpr int32_t kBlockSize = 4;

// num_blocks device blocks of 4 tokens, R = max_staged, sink 1 and window 2 (the engine's policy).
std::unique_ptr<KvCacheManager> streaming_kv(int32_t num_blocks, int32_t max_staged, int32_t num_host_blocks,
                                             bool prefix_caching = false) {
    KvStreamPolicy policy;
    policy.enabled = true;
    policy.max_staged = max_staged;
    return make_paged_kv(num_blocks, kBlockSize, prefix_caching, num_host_blocks, 100, policy);
}

SchedulerConfig stream_config(int32_t n_ctx_per_seq, int32_t n_ctx, cf_preemption_mode mode) {
    SchedulerConfig c;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 64;
    c.n_ctx_per_seq = n_ctx_per_seq;
    c.n_ctx = n_ctx;
    c.preemption_mode = mode;
    return c;
}

struct StepLog {
    std::map<int64_t, int32_t> num_computed;  // request id -> tokens it computed in all steps
    std::vector<int64_t> finished;
    std::vector<Sequence *> out_of_blocks;  // with their error_message, before finish()
    std::map<int64_t, std::string> errors;
    int32_t num_swapped_with_host_entries = 0;  // swap-outs of sequences that held host-resident blocks
};

int32_t num_host_entries(const Scheduler & sched, int64_t request_id) {
    const BlockTable * table = sched.kv().block_manager()->find(request_id);
    int32_t n = 0;
    for (int32_t entry : table == nullptr ? std::vector<int32_t>() : table->block_ids) {
        n += is_host_entry(entry) ? 1 : 0;
    }
    return n;
}

// One engine-like step (test_scheduler_swap.cpp's run_step): sequences out of blocks end with their reason,
// the plan is computed, kToken sampled where asked, sequences finish at max_tokens or n_ctx_per_seq.
const StepPlan & run_step(Scheduler & sched, StepLog & log) {
    std::map<int64_t, int32_t> host_before;
    for (const auto & seq : sched.running()) {
        host_before[seq->request_id] = num_host_entries(sched, seq->request_id);
    }
    const StepPlan & out = sched.schedule();
    for (Sequence * seq : out.out_of_blocks) {
        log.errors[seq->request_id] = seq->error_message;
        log.finished.push_back(sched.finish(seq, CF_FINISH_REASON_ERROR)->request_id);
    }
    for (const StepPlan::Preempted & p : out.preempted) {
        log.num_swapped_with_host_entries += p.swapped && host_before[p.seq->request_id] > 0 ? 1 : 0;
    }
    for (const ScheduledSeq & s : out.seqs) {
        log.num_computed[s.seq->request_id] += s.num_new_tokens;
    }
    sched.commit_step(out);
    for (Sequence * seq : sample_rows(out, kToken, sched.config().n_ctx_per_seq)) {
        log.finished.push_back(sched.finish(seq, CF_FINISH_REASON_LENGTH)->request_id);
    }
    sched.check_invariants();
    return out;
}

// Steps until nothing is left, then one empty step: the device blocks of the last step's demotions are
// free only from the next step on (deferred, like a swap-out's).
void run_all(Scheduler & sched, StepLog & log) {
    for (int32_t steps = 0; sched.has_work(); ++steps) {
        run_step(sched, log);
        assert(steps < 10000);
    }
    assert(run_step(sched, log).seqs.empty());
}

// An 80-token prompt in an 8-block (32-token) pool with R = 16: the 64-token budget would ask for 16 new
// blocks at once, more than the pool has; capped at 8 - 1 - 2 = 5 new blocks (20 tokens) per chunk, it
// streams its older blocks out as it goes and generates every token (80 + 15 = 95 < 96 = (8 + 16) * 4).
void test_long_prompt_alone_in_capped_chunks() {
    Scheduler sched(stream_config(96, 32, CF_PREEMPTION_MODE_SWAP), streaming_kv(8, 16, 32));
    StepLog log;
    sched.add(make_seq(1, 80, 15));
    int32_t max_chunk = 0;
    for (int32_t steps = 0; sched.has_work(); ++steps) {
        const StepPlan & out = run_step(sched, log);
        for (const ScheduledSeq & s : out.seqs) {
            max_chunk = std::max(max_chunk, s.num_new_tokens);
        }
        assert(steps < 1000);
    }
    assert(log.errors.empty() && log.finished.size() == 1 && max_chunk == 20);
    assert(log.num_computed[1] == 80 + 14);  // each prompt and fed-back output token once
    assert(sched.kv().kv_stream_stats().num_demotions >= 16 && sched.num_preemptions() == 0);
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
}

// R = 4 caps a lone sequence at 8 + 4 blocks, below what n_ctx_per_seq lets it grow to here (the engine's
// n_ctx_per_seq is the pool plus R): it ends out of blocks, and the reason names the limit.
void test_really_out_of_blocks_says_why() {
    Scheduler sched(stream_config(200, 32, CF_PREEMPTION_MODE_SWAP), streaming_kv(8, 4, 32));
    StepLog log;
    sched.add(make_seq(1, 80, 15));
    run_all(sched, log);
    assert(log.finished.size() == 1 && log.errors.count(1) == 1);
    const std::string & why = log.errors[1];
    assert(why.find("out of KV blocks with KV streaming on: request 1 holds 10 blocks (6 of the device pool's 8, "
                     "4 host-resident) and its next 20 tokens need 5 more") != std::string::npos);
    assert(why.find("kv_stream_blocks=4 host-resident blocks already") != std::string::npos);
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
}

// Four sequences of 8 blocks each in an 8-block pool with R = 3: streaming takes the newest sequence's middle
// blocks first, and once R is reached the newest is swapped out, host-resident blocks and all. Swapped
// sequences resume where they stopped: every token is computed once, and every host slot comes back.
void test_swap_out_of_streamed_sequences() {
    for (const bool prefix_caching : { false, true }) {
        Scheduler sched(stream_config(64, 32, CF_PREEMPTION_MODE_SWAP), streaming_kv(8, 3, 64, prefix_caching));
        StepLog log;
        for (int64_t id = 1; id <= 4; ++id) {
            sched.add(make_seq(id, 10 + (int32_t) id, 20));
        }
        run_all(sched, log);
        assert(log.errors.empty() && log.finished.size() == 4);
        assert(log.num_swapped_with_host_entries >= 1 && sched.preemption_stats().num_recompute == 0);
        for (int64_t id = 1; id <= 4; ++id) {
            const int32_t once = 10 + (int32_t) id + 19;
            assert(prefix_caching ? log.num_computed[id] <= once : log.num_computed[id] == once);
        }
        assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
    }
}

// Swapped sequences hold host slots that the sequence left running would stream into: it gives way
// (recompute: the host is full) instead of ending out of blocks, the swapped one comes back and finishes,
// then it does. 8 blocks, R = 4, 8 host slots; two sequences growing to the 48 tokens of n_ctx_per_seq.
void test_lone_sequence_gives_way_to_swapped() {
    Scheduler sched(stream_config(48, 32, CF_PREEMPTION_MODE_SWAP), streaming_kv(8, 4, 8));
    StepLog log;
    for (int64_t id = 1; id <= 2; ++id) {
        sched.add(make_seq(id, 4, 43));
    }
    run_all(sched, log);
    assert(log.errors.empty() && log.finished.size() == 2);
    assert(sched.preemption_stats().num_swap >= 1 && sched.preemption_stats().num_recompute >= 1);
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
}

// A parent whose 40-token prompt (10 blocks) exceeds the 8-block pool would have to stream, and a sequence
// whose choices wait to fork never streams: the fork is given up, and parent and choice each compute the
// prompt (streaming it) and finish.
void test_fork_given_up_for_a_streamed_prompt() {
    Scheduler sched(stream_config(96, 32, CF_PREEMPTION_MODE_SWAP), streaming_kv(8, 16, 64));
    StepLog log;
    auto parent = make_seq(1, 40, 6);
    parent->fork_pending = true;
    sched.add(std::move(parent));
    auto child = make_seq(2, 40, 6);
    child->fork_parent_id = 1;
    sched.add(std::move(child));
    run_all(sched, log);
    assert(log.errors.empty() && log.finished.size() == 2);
    assert(log.num_computed[1] == 40 + 5 && log.num_computed[2] == 40 + 5);
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
}

}  // namespace

int main() {
    test_long_prompt_alone_in_capped_chunks();
    test_really_out_of_blocks_says_why();
    test_swap_out_of_streamed_sequences();
    test_fork_given_up_for_a_streamed_prompt();
    test_lone_sequence_gives_way_to_swapped();
    std::printf("test_scheduler_stream: ok\n");
    return 0;
}
