// test_step_plan.cpp - the contents of Scheduler::schedule()'s StepPlan on small paged pools:
// per-token arrays, block-table rows, context lengths, copy-on-write and preemption lists, and
// that the arrays are reused between steps.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/scheduler.h"
#include "kv/paged_kv.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

using namespace cf;
using cf::test::make_seq;

namespace {


SchedulerConfig make_config(int32_t n_ctx_per_seq) {
    SchedulerConfig c;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 64;
    c.n_ctx_per_seq = n_ctx_per_seq;
    c.n_ctx = n_ctx_per_seq * 4;
    return c;
}

// The engine's side of a step without a model: compute, append token 7 where sampled, finish at
// max_tokens or out of blocks.
void finish_step(Scheduler & sched, const StepPlan & plan) {
    for (Sequence * seq : plan.out_of_blocks) {
        sched.finish(seq, CF_FINISH_REASON_LENGTH);
    }
    sched.commit_step(plan);
    std::vector<Sequence *> done;
    for (const ScheduledSeq & s : plan.seqs) {
        if (s.needs_sample) {
            s.seq->append_token(7);
            if (s.seq->num_output_tokens() >= s.seq->params.max_tokens) {
                done.push_back(s.seq);
            }
        }
    }
    for (Sequence * seq : done) {
        sched.finish(seq, CF_FINISH_REASON_LENGTH);
    }
    sched.check_invariants();
}

// Every per-token and per-sequence array agrees with the block tables (computed independently).
void check_plan_matches_tables(const StepPlan & plan, const BlockManager & blocks) {
    const int32_t bs = blocks.block_size();
    assert((int32_t) plan.token_seq_idx.size() == plan.num_scheduled_tokens);
    assert((int32_t) plan.slot_mapping.size() == plan.num_scheduled_tokens);
    assert(plan.context_lens.size() == plan.seqs.size());
    assert(plan.block_tables.size() == plan.seqs.size() * (size_t) plan.max_blocks);
    size_t t = 0;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
        const ScheduledSeq & s = plan.seqs[i];
        const BlockTable & table = *blocks.find(s.seq->request_id);
        assert(plan.context_lens[i] == s.seq->num_computed_tokens + s.num_new_tokens);
        assert(plan.context_lens[i] == table.num_tokens);
        for (int32_t b = 0; b < plan.max_blocks; ++b) {
            const int32_t want = b < table.num_blocks() ? table.block_ids[(size_t) b] : CF_BLOCK_ID_NONE;
            assert(plan.block_tables[i * (size_t) plan.max_blocks + (size_t) b] == want);
        }
        for (int32_t pos = s.seq->num_computed_tokens; pos < plan.context_lens[i]; ++pos, ++t) {
            assert(plan.token_seq_idx[t] == (int32_t) i);
            assert(plan.slot_mapping[t] == table.block_ids[(size_t) (pos / bs)] * bs + pos % bs);
        }
    }
    assert(t == plan.slot_mapping.size());
    assert(plan.blocks_to_swap_out.empty() && plan.blocks_to_swap_in.empty());  // no swapper yet
}

// 8 blocks of 4 tokens, prompts of 6 and 3 tokens: the exact plan of the prefill and the decode.
void test_prefill_then_decode_plan() {
    Scheduler sched(make_config(32), make_paged_kv(8, 4));
    sched.add(make_seq(1, 6, 4));
    sched.add(make_seq(2, 3, 4));
    const StepPlan & plan = sched.schedule();
    assert(plan.seqs.size() == 2 && plan.seqs[0].seq->request_id == 1 && plan.seqs[1].seq->request_id == 2);
    assert((plan.token_seq_idx == std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 1, 1}));
    assert((plan.slot_mapping == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 8, 9, 10}));  // blocks 0, 1 | 2
    assert(plan.max_blocks == 2);
    assert((plan.block_tables == std::vector<int32_t>{0, 1, 2, CF_BLOCK_ID_NONE}));
    assert((plan.context_lens == std::vector<int32_t>{6, 3}));
    assert(plan.blocks_to_copy.empty() && plan.preempted.empty() && plan.out_of_blocks.empty());
    check_plan_matches_tables(plan, *sched.kv().block_manager());
    finish_step(sched, plan);

    const StepPlan & decode = sched.schedule();
    assert((decode.token_seq_idx == std::vector<int32_t>{0, 1}));
    assert((decode.slot_mapping == std::vector<int32_t>{6, 11}));  // block 1 row 2, block 2 row 3
    assert((decode.context_lens == std::vector<int32_t>{7, 4}));
    assert(decode.num_decode_tokens == 2 && decode.num_prefill_tokens == 0);
    // Steady state: the next step refills the same arrays (no allocation).
    const int32_t * slots = decode.slot_mapping.data();
    const int32_t * seq_idx = decode.token_seq_idx.data();
    const int32_t * lens = decode.context_lens.data();
    finish_step(sched, decode);
    const StepPlan & again = sched.schedule();
    assert(&again == &decode && again.num_scheduled_tokens == 2);
    assert(again.slot_mapping.data() == slots && again.token_seq_idx.data() == seq_idx && again.context_lens.data() == lens);
    check_plan_matches_tables(again, *sched.kv().block_manager());
    finish_step(sched, again);
}

// The preemption step: the plan lists the preempted sequence, which holds no blocks any more, and
// its arrays cover only the sequence that stays.
void test_preemption_plan() {
    Scheduler sched(make_config(16), make_paged_kv(4, 4));
    sched.add(make_seq(1, 4, 10));
    sched.add(make_seq(2, 4, 10));
    for (int step = 0; step < 20; ++step) {
        const StepPlan & plan = sched.schedule();
        check_plan_matches_tables(plan, *sched.kv().block_manager());
        if (!plan.preempted.empty()) {
            assert(plan.preempted.size() == 1 && plan.preempted[0].seq->request_id == 2);
            assert(plan.seqs.size() == 1 && plan.seqs[0].seq->request_id == 1);
            assert(sched.kv().block_manager()->find(2) == nullptr);
            assert(plan.context_lens[0] == 9 && plan.max_blocks == 3);
            return;
        }
        finish_step(sched, plan);
    }
    assert(false && "no preemption happened");
}

// Copy-on-write: a child sharing a partially filled last block gets a fresh block and the plan
// carries the copy (src, dst) before its new token's slot, which lies in the fresh block.
void test_copy_on_write_plan() {
    PagedKv kv(8, 4);
    std::unique_ptr<Sequence> parent = make_seq(1, 6, 4);
    std::unique_ptr<Sequence> child = make_seq(2, 6, 4);
    kv.admit(*parent);
    assert(kv.allocate(*parent, 6));  // blocks 0, 1 (rows 0-1 of block 1 filled)
    parent->num_computed_tokens = 6;
    kv.admit(*child);
    kv.fork(*parent, *child);
    child->num_computed_tokens = 6;
    child->append_token(7);
    assert(kv.allocate(*child, 1));
    StepPlan plan;
    plan.seqs.push_back({child.get(), 1, true});
    plan.num_scheduled_tokens = 1;
    plan.token_seq_idx.push_back(0);
    kv.fill_plan(&plan);
    assert(plan.blocks_to_copy.size() == 1);
    assert(plan.blocks_to_copy[0].src_block_id == 1 && plan.blocks_to_copy[0].dst_block_id == 2);
    assert((plan.slot_mapping == std::vector<int32_t>{2 * 4 + 2}));
    assert((plan.block_tables == std::vector<int32_t>{0, 2}) && plan.max_blocks == 2);
    assert((plan.context_lens == std::vector<int32_t>{7}));
    check_plan_matches_tables(plan, *kv.block_manager());
    std::vector<std::unique_ptr<Sequence>> running;
    running.push_back(std::move(parent));
    running.push_back(std::move(child));
    assert(kv.check_invariants(running).empty());
    StepPlan next;
    kv.fill_plan(&next);
    assert(next.blocks_to_copy.empty());  // taken once
}

}  // namespace

int main() {
    test_prefill_then_decode_plan();
    test_preemption_plan();
    test_copy_on_write_plan();
    std::printf("test_step_plan: ok\n");
    return 0;
}
