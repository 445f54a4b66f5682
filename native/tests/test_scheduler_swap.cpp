// test_scheduler_swap.cpp - swap preemption in cf::Scheduler over the paged KV manager, without a
// model: exact swap lists on a 4-block pool, SWAPPED state transitions, exact resume (no token
// computed twice), fallback to recompute when host slots are short, AUTO's cost choice, aborts of
// swapped sequences, and forked choices under memory pressure. Invariants are checked every step,
// and so is what lets the engine run a step's swaps beside its compute (check_overlap_safe): swap-in
// one step ahead (SWAPPING_IN, StepPlan::swapped_in then resumed) and the deferred free of a
// swap-out's blocks.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/scheduler.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <memory>
#include <set>
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
    int32_t num_resumed = 0;
    int32_t num_deferred = 0;
    std::set<int64_t> swapping_in;  // request ids swapped in by the previous plan
};

// What the engine relies on to run a plan's swaps beside its graph (step_plan.h): no block a swap
// touches is in a block table of the step or is a copy-on-write destination, sequences swapped in
// join the batch only at the next step (and then do: resumed == the previous plan's swapped_in),
// and a deferred sequence is neither scheduled nor preempted.
void check_overlap_safe(const Scheduler & sched, const StepPlan & out, StepLog & log) {
    // a swap-out only reads its blocks: another holder of a shared one may read it in the step too,
    // but nothing writes it; a swap-in writes its blocks: nothing else touches them
    std::set<int32_t> read_blocks;
    std::set<int32_t> written_blocks;
    for (const BlockSwap & s : out.blocks_to_swap_out) {
        read_blocks.insert(s.src_block_id);
    }
    for (const BlockSwap & s : out.blocks_to_swap_in) {
        assert(read_blocks.count(s.dst_block_id) == 0 && written_blocks.insert(s.dst_block_id).second);
    }
    const int32_t bs = sched.kv().block_manager()->block_size();
    for (int32_t slot : out.slot_mapping) {  // rows the step's graph writes
        assert(read_blocks.count(slot / bs) == 0 && written_blocks.count(slot / bs) == 0);
    }
    for (int32_t block_id : out.block_tables) {  // blocks the step's graph reads
        assert(block_id == CF_BLOCK_ID_NONE || written_blocks.count(block_id) == 0);
    }
    for (const BlockCopy & c : out.blocks_to_copy) {
        assert(read_blocks.count(c.dst_block_id) == 0 && written_blocks.count(c.dst_block_id) == 0);
        assert(written_blocks.count(c.src_block_id) == 0);
    }
    std::set<int64_t> resumed;
    for (const Sequence * seq : out.resumed) {
        assert(seq->status == SequenceStatus::RUNNING);
        resumed.insert(seq->request_id);
    }
    assert(resumed == log.swapping_in);  // nothing in the tests aborts a sequence swapping in
    log.swapping_in.clear();
    for (const Sequence * seq : out.swapped_in) {
        assert(seq->status == SequenceStatus::SWAPPING_IN && seq->holds_kv && !seq->scheduled);
        log.swapping_in.insert(seq->request_id);
    }
    for (const ScheduledSeq & s : out.seqs) {
        assert(log.swapping_in.count(s.seq->request_id) == 0 && s.seq->status == SequenceStatus::RUNNING);
    }
    for (const Sequence * seq : out.deferred) {
        assert(seq->status == SequenceStatus::RUNNING && !seq->scheduled);
        assert(!out.blocks_to_swap_out.empty());  // only this step's swap-outs defer anyone
    }
    log.num_resumed += (int32_t) out.resumed.size();
    log.num_deferred += (int32_t) out.deferred.size();
}

// One engine-like step (see test_scheduler.cpp's run_step): finish sequences out of blocks,
// compute, sample kToken where asked, finish at max_tokens; checks invariants and plan shape.
const StepPlan & run_step(Scheduler & sched, StepLog & log) {
    const StepPlan & out = sched.schedule();
    check_overlap_safe(sched, out, log);
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
// and decodes on: it computes each of its tokens exactly once. The older one waits one step for
// the victim's blocks (deferred free: the swap-out copy reads them in that step), and the swapped
// sequence joins the batch one step after its swap-in (its copies run beside that step).
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
    // the older one needs block 4's worth of rows, which only the victim's blocks can give: it sits
    // this step out instead of running while the copy still reads them
    assert(out.blocks_to_swap_in.empty() && out.seqs.empty());
    assert(out.deferred.size() == 1 && out.deferred[0]->request_id == 1);
    assert(sched.num_running() == 1 && sched.num_swapped() == 1 && sched.num_waiting() == 0);
    assert(blocks.find(2) == nullptr && sched.kv().num_host_blocks_used() == 2);
    assert(blocks.num_deferred_blocks() == 2 && blocks.num_free_blocks() == 0);
    const StepPlan & next = run_step(sched, log);  // the blocks are back: the older one takes one
    assert(next.seqs.size() == 1 && next.seqs[0].seq->request_id == 1 && next.deferred.empty());
    assert(blocks.num_deferred_blocks() == 0 && blocks.find(1)->block_ids.back() == 3);

    int32_t swap_in_step = -1;
    for (int32_t i = 0; sched.has_work(); ++i) {
        const StepPlan & step = run_step(sched, log);
        if (!step.blocks_to_swap_in.empty()) {
            assert(swap_in_step < 0 && step.swapped_in.size() == 1 && step.swapped_in[0]->request_id == 2);
            assert(step.blocks_to_swap_in.size() == 2);
            assert(step.blocks_to_swap_in[0].src_block_id == 0 && step.blocks_to_swap_in[1].src_block_id == 1);
            assert(step.seqs.empty() && step.swapped_in[0]->status == SequenceStatus::SWAPPING_IN);
            assert(sched.num_running() == 1 && sched.num_swapped() == 0);
            swap_in_step = i;
        } else if (swap_in_step >= 0 && i == swap_in_step + 1) {  // one step later it decodes on
            assert(step.resumed.size() == 1 && step.resumed[0]->request_id == 2);
            assert(step.seqs.size() == 1 && step.seqs[0].num_new_tokens == 1 && step.num_prefill_tokens == 0);
        }
    }
    assert(swap_in_step >= 0 && log.finished.size() == 2 && log.num_resumed == 1 && log.num_deferred == 1);
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

// Aborting a sequence while it swaps in (between the step that issued its copies and the one it would
// join) frees its fresh blocks at once (the next step's graph waits for those copies) and loses nobody.
void test_abort_swapping_in() {
    Scheduler sched(swap_config(CF_PREEMPTION_MODE_SWAP), make_paged_kv(4, 4, false, 8, 100));
    StepLog log;
    sched.add(make_seq(1, 4, 10));
    sched.add(make_seq(2, 4, 10));
    run_until_preemption(sched, log);
    for (int32_t i = 0; i < 100 && log.swapping_in.empty(); ++i) {
        run_step(sched, log);
    }
    assert(log.swapping_in.count(2) == 1 && sched.num_running() == 1 && sched.num_swapped() == 0);
    std::unique_ptr<Sequence> gone = sched.remove(2, CF_FINISH_REASON_ABORT);
    assert(gone && gone->status == SequenceStatus::FINISHED && sched.num_running() == 0);
    log.swapping_in.clear();
    sched.check_invariants();
    assert(sched.kv().num_blocks_used() == 0 && !sched.has_work());
    assert(log.finished.size() == 1);
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

// A sequence swapping in does not stop the others: while its copies run, the running sequences
// decode in that step, it is no preemption victim, and it then runs with them. Greedy streams
// compared to an unpressured run: every sequence computes each token exactly once and ends at
// the same length.
void test_swap_in_ahead_beside_running() {
    Scheduler sched(swap_config(CF_PREEMPTION_MODE_SWAP, 32, 64), make_paged_kv(10, 4, false, 32, 100));
    StepLog log;
    for (int64_t id = 1; id <= 4; ++id) {
        sched.add(make_seq(id, 5, 14));
    }
    int32_t steps = 0;
    int32_t swap_in_with_others = 0;
    while (sched.has_work()) {
        const StepPlan & out = run_step(sched, log);
        swap_in_with_others += !out.swapped_in.empty() && !out.seqs.empty() ? 1 : 0;
        assert(++steps < 10000);
    }
    assert(log.finished.size() == 4 && sched.preemption_stats().num_swap >= 1);
    assert(swap_in_with_others >= 1 && log.num_resumed == sched.preemption_stats().num_swap);
    for (int64_t id = 1; id <= 4; ++id) {
        assert(log.num_computed[id] == 5 + 13);
    }
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
}

// PRIORITY: an urgent arrival preempts by swap; the victim's blocks are free only at the next step,
// so exactly one victim is preempted (not every running sequence), and the urgent one is admitted
// once they are back.
void test_priority_preemption_with_deferred_free() {
    SchedulerConfig c = swap_config(CF_PREEMPTION_MODE_SWAP, 32, 64);
    c.policy = CF_SCHED_POLICY_PRIORITY;
    c.priority_aging_ns = 0;
    Scheduler sched(c, make_paged_kv(10, 4, false, 32, 100));
    StepLog log;
    for (int64_t id = 1; id <= 2; ++id) {
        auto seq = make_seq(id, 12, 12);  // 3 blocks each, then a 4th: 2 of 10 left
        seq->priority = 5;
        sched.add(std::move(seq));
    }
    for (int i = 0; i < 2; ++i) {
        run_step(sched, log);
    }
    // 3 blocks + a watermark of 2: it needs one victim's blocks, which are back only at the next
    // step; preempting until it fits now would have taken both
    auto urgent = make_seq(3, 11, 4);
    urgent->priority = 0;
    sched.add(std::move(urgent));
    const StepPlan & out = run_step(sched, log);
    assert(out.preempted.size() == 1 && out.preempted[0].swapped && out.preempted[0].for_priority);
    int32_t steps = 0;
    bool urgent_ran = false;
    while (sched.has_work()) {
        const StepPlan & step = run_step(sched, log);
        for (const ScheduledSeq & s : step.seqs) {
            urgent_ran = urgent_ran || s.seq->request_id == 3;
        }
        assert(++steps < 1000);
    }
    assert(urgent_ran && log.finished.size() == 3 && sched.preemption_stats().num_priority == 1);
    assert(log.num_computed[1] == 12 + 11 && log.num_computed[2] == 12 + 11 && log.num_computed[3] == 11 + 3);
}

int main() {
    test_swap_out_and_in_exact_lists();
    test_swap_in_ahead_beside_running();
    test_priority_preemption_with_deferred_free();
    test_swap_falls_back_to_recompute();
    test_modes_choose_per_victim();
    test_abort_swapped();
    test_abort_swapping_in();
    test_many_sequences_repeated_swaps();
    test_forked_choices_swap();
    std::printf("test_scheduler_swap: ok\n");
    return 0;
}
