// test_scheduler_swap.cpp - swap preemption in cf::Scheduler over the paged KV manager, without a
// model: exact swap lists on a 4-block pool, SWAPPED state transitions, exact resume (no token
// computed twice), fallback to recompute when host slots are short, AUTO's cost choice, aborts of
// swapped sequences, and forked choices under memory pressure. Invariants are checked every step.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/scheduler.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

using namespace cf;
using cf::test::make_seq;
using cf::test::sample_rows;

namespace {

constexpr int32_t kToken = 7;  // token appended by the fake sampler

SchedulerConfig swap_config(cf_preemption_mode mode, int32_t n_ctx_per_seq = 16, int32_t n_ctx = 16) {
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
    int32_t num_swap_out_steps = 0;
    int32_t num_swap_in_steps = 0;
};

// One engine-like step (see test_scheduler.cpp's run_step): finish sequences out of blocks,
// compute, sample kToken where asked, finish at max_tokens; checks invariants and plan shape.
const StepPlan & run_step(Scheduler & sched, StepLog & log) {
    const StepPlan & out = sched.schedule();
    for (Sequence * seq : out.out_of_blocks) {
        log.finished.push_back(sched.finish(seq, CF_FINISH_REASON_LENGTH)->request_id);
    }
    for (const StepPlan::Preempted & p : out.preempted) {
        assert(p.swapped == (p.seq->status == SequenceStatus::SWAPPED));
    }
    log.num_swap_out_steps += out.blocks_to_swap_out.empty() ? 0 : 1;
    log.num_swap_in_steps += out.blocks_to_swap_in.empty() ? 0 : 1;
    for (const ScheduledSeq & s : out.seqs) {
        log.num_computed[s.seq->request_id] += s.num_new_tokens;
    }
    sched.commit_step(out);
    const std::vector<Sequence *> done = sample_rows(out, kToken, sched.config().n_ctx_per_seq);
    for (Sequence * seq : done) {
        log.finished.push_back(sched.finish(seq, CF_FINISH_REASON_LENGTH)->request_id);
    }
    sched.check_invariants();
    return out;
}

const StepPlan & run_until_preemption(Scheduler & sched, StepLog & log) {
    for (int32_t i = 0; i < 100; ++i) {
        const StepPlan & out = run_step(sched, log);
        if (!out.preempted.empty()) {
            return out;
        }
    }
    assert(false && "no preemption happened");
    std::abort();
}

// test_scheduler.cpp's recompute scenario in SWAP mode: two 4-token prompts wanting 14 tokens each
// in 4 blocks of 4. At the older one's token 8 the newer one (8 computed, in blocks 1 and 3) is
// swapped out to host slots 0 and 1; once the older one ends it is swapped back into fresh blocks
// and decodes on: it computes each of its tokens exactly once.
void test_swap_out_and_in_exact_lists() {
    Scheduler sched(swap_config(CF_PREEMPTION_MODE_SWAP), make_paged_kv(4, 4, false, /*num_host_blocks=*/8, 100));
    const BlockManager & blocks = *sched.kv().block_manager();
    StepLog log;
    sched.add(make_seq(1, 4, 10));
    sched.add(make_seq(2, 4, 10));
    const StepPlan & out = run_until_preemption(sched, log);
    assert(out.preempted.size() == 1 && out.preempted[0].seq->request_id == 2 && out.preempted[0].swapped);
    const Sequence & swapped = *out.preempted[0].seq;
    assert(swapped.status == SequenceStatus::SWAPPED && !swapped.holds_kv && swapped.num_computed_tokens == 8);
    assert(out.blocks_to_swap_out.size() == 2);
    assert(out.blocks_to_swap_out[0].src_block_id == 1 && out.blocks_to_swap_out[0].dst_block_id == 0);
    assert(out.blocks_to_swap_out[1].src_block_id == 3 && out.blocks_to_swap_out[1].dst_block_id == 1);
    assert(out.blocks_to_swap_in.empty() && out.seqs.size() == 1 && out.seqs[0].seq->request_id == 1);
    assert(sched.num_running() == 1 && sched.num_swapped() == 1 && sched.num_waiting() == 0);
    assert(blocks.find(2) == nullptr && sched.kv().num_host_blocks_used() == 2);

    bool swapped_in = false;
    while (sched.has_work()) {
        const StepPlan & step = run_step(sched, log);
        if (!step.blocks_to_swap_in.empty()) {
            assert(!swapped_in && step.swapped_in.size() == 1 && step.swapped_in[0]->request_id == 2);
            assert(step.blocks_to_swap_in.size() == 2);
            assert(step.blocks_to_swap_in[0].src_block_id == 0 && step.blocks_to_swap_in[1].src_block_id == 1);
            assert(step.seqs.size() == 1 && step.seqs[0].num_new_tokens == 1 && step.num_prefill_tokens == 0);
            swapped_in = true;
        }
    }
    assert(swapped_in && log.finished.size() == 2);
    // 4 prompt + 9 fed-back output tokens each: nothing computed twice
    assert(log.num_computed[1] == 13 && log.num_computed[2] == 13);
    const PreemptionStats & st = sched.preemption_stats();
    assert(st.num_swap == 1 && st.num_recompute == 0 && st.num_recomputed_tokens == 0);
    assert(blocks.num_free_blocks() == 4 && sched.kv().num_host_blocks_used() == 0);
}

// SWAP mode with one host slot: the victim's 2 blocks do not fit, so it is recomputed.
void test_swap_falls_back_to_recompute() {
    Scheduler sched(swap_config(CF_PREEMPTION_MODE_SWAP), make_paged_kv(4, 4, false, /*num_host_blocks=*/1, 100));
    StepLog log;
    sched.add(make_seq(1, 4, 10));
    sched.add(make_seq(2, 4, 10));
    const StepPlan & out = run_until_preemption(sched, log);
    assert(!out.preempted[0].swapped && out.blocks_to_swap_out.empty() && sched.num_waiting() == 1);
    while (sched.has_work()) {
        run_step(sched, log);
    }
    const PreemptionStats & st = sched.preemption_stats();
    assert(st.num_swap == 0 && st.num_recompute == 1 && st.num_recomputed_tokens == 8);
    assert(log.num_computed[2] == 13 + 8 && log.num_swap_in_steps == 0);
}

// RECOMPUTE never swaps, even with host slots; AUTO swaps when 2 * bytes * ns/byte is at most
// computed tokens * ns/token.
void test_modes_choose_per_victim() {
    struct Case {
        cf_preemption_mode mode;
        int64_t block_bytes;
        bool swaps;
    };
    // AUTO with 1 ns/byte and 1 ns/token: 2 blocks of 1 byte cost 4 <= 8 tokens (swap); of 100
    // bytes cost 400 > 8 (recompute)
    for (const Case c : { Case{ CF_PREEMPTION_MODE_RECOMPUTE, 1, false }, Case{ CF_PREEMPTION_MODE_AUTO, 1, true },
                          Case{ CF_PREEMPTION_MODE_AUTO, 100, false } }) {
        Scheduler sched(swap_config(c.mode), make_paged_kv(4, 4, false, 8, c.block_bytes));
        sched.set_preemption_costs(1.0, 1.0);
        StepLog log;
        sched.add(make_seq(1, 4, 10));
        sched.add(make_seq(2, 4, 10));
        const StepPlan & out = run_until_preemption(sched, log);
        assert(out.preempted[0].swapped == c.swaps);
        while (sched.has_work()) {
            run_step(sched, log);
        }
        assert(log.finished.size() == 2 && (sched.preemption_stats().num_swap == 1) == c.swaps);
    }
}

// Aborting a swapped sequence gives its host slots back (from the next step on) and loses nobody.
void test_abort_swapped() {
    Scheduler sched(swap_config(CF_PREEMPTION_MODE_SWAP), make_paged_kv(4, 4, false, 8, 100));
    StepLog log;
    sched.add(make_seq(1, 4, 10));
    sched.add(make_seq(2, 4, 10));
    run_until_preemption(sched, log);
    std::unique_ptr<Sequence> gone = sched.remove(2, CF_FINISH_REASON_ABORT);
    assert(gone && gone->status == SequenceStatus::FINISHED && sched.num_swapped() == 0);
    assert(sched.request_ids().size() == 1);
    while (sched.has_work()) {
        run_step(sched, log);
    }
    assert(log.finished.size() == 1 && sched.kv().num_host_blocks_used() == 0);
}

// Many sequences on a tiny pool: repeated swaps, every one finishes with full length exactly once
// and computes each token at most once (exactly once without the prefix cache; with it, shared
// prompt prefixes are computed by one of them, and blocks of swapped holders stay cached).
void test_many_sequences_repeated_swaps() {
    for (const bool prefix_caching : { false, true }) {
        Scheduler sched(swap_config(CF_PREEMPTION_MODE_SWAP, 32, 32), make_paged_kv(8, 4, prefix_caching, 64, 100));
        StepLog log;
        for (int64_t id = 1; id <= 12; ++id) {
            sched.add(make_seq(id, 3 + (int32_t) id % 5, 12));
        }
        int32_t steps = 0;
        while (sched.has_work()) {
            run_step(sched, log);
            assert(++steps < 10000);
        }
        assert(log.finished.size() == 12 && sched.preemption_stats().num_swap >= 2);
        assert(sched.preemption_stats().num_recompute == 0);
        for (int64_t id = 1; id <= 12; ++id) {
            const int32_t once = 3 + (int32_t) id % 5 + 11;  // prompt + fed-back outputs
            assert(prefix_caching ? log.num_computed[id] <= once : log.num_computed[id] == once);
        }
        assert(sched.kv().num_host_blocks_used() == 0);
    }
}

// Choices of one prompt (fork, copy-on-write sharing) under memory pressure, one choice ending
// early: shared blocks stay valid for the others while a holder is swapped out.
void test_forked_choices_swap() {
    Scheduler sched(swap_config(CF_PREEMPTION_MODE_SWAP, 32, 32), make_paged_kv(7, 4, false, 32, 100));
    StepLog log;
    auto parent = make_seq(1, 6, 12);
    parent->fork_pending = true;
    sched.add(std::move(parent));
    for (int64_t id = 2; id <= 4; ++id) {
        auto child = make_seq(id, 6, id == 3 ? 2 : 12);
        child->fork_parent_id = 1;
        sched.add(std::move(child));
    }
    int32_t steps = 0;
    while (sched.has_work()) {
        run_step(sched, log);
        assert(++steps < 10000);
    }
    assert(log.finished.size() == 4 && sched.preemption_stats().num_swap >= 1);
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
}

}  // namespace

int main() {
    test_swap_out_and_in_exact_lists();
    test_swap_falls_back_to_recompute();
    test_modes_choose_per_victim();
    test_abort_swapped();
    test_many_sequences_repeated_swaps();
    test_forked_choices_swap();
    std::printf("test_scheduler_swap: ok\n");
    return 0;
}
