// test_fork_choices.cpp - choices of one prompt (cf_request.num_forks) in the scheduler without a
// model: in paged mode the parent's prefill stops one token short, the choices fork its blocks
// (copy-on-write for the shared partial block) and all compute the last prompt token together;
// a choice that does not fit then computes its prompt itself; the stock modes share nothing.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/scheduler.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdio>
#include <memory>
#include <vector>

using namespace cf;
using cf::test::make_seq;

namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kPrompt = 10;  // 2 full blocks + 1 block holding 1 token after the parent's prefill

Scheduler paged_scheduler(int32_t max_num_seqs, int32_t num_blocks) {
    SchedulerConfig c;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = 64;
    c.n_ctx_per_seq = 32;
    c.n_ctx = num_blocks * kBlockSize;
    return Scheduler(c, make_paged_kv(num_blocks, kBlockSize));
}

// Parent 1 with choices 2..num_choices (what Engine::add_requests marks for num_forks).
void add_choices(Scheduler & sched, int32_t num_choices) {
    for (int64_t id = 1; id <= num_choices; ++id) {
        std::unique_ptr<Sequence> seq = make_seq(id, kPrompt);
        seq->fork_pending = id == 1;
        seq->fork_parent_id = id == 1 ? 0 : 1;
        sched.add(std::move(seq));
    }
}

// Schedule, check, commit and sample token 7 where asked; returns the plan's (id, new tokens).
std::vector<std::pair<int64_t, int32_t>> step(Scheduler & sched, int32_t * num_copies = nullptr) {
    const StepPlan & plan = sched.schedule();
    std::vector<std::pair<int64_t, int32_t>> out;
    for (const ScheduledSeq & s : plan.seqs) {
        out.emplace_back(s.seq->request_id, s.num_new_tokens);
    }
    if (num_copies != nullptr) {
        *num_copies = (int32_t) plan.blocks_to_copy.size();
    }
    sched.commit_step(plan);
    for (const ScheduledSeq & s : plan.seqs) {
        if (s.needs_sample) {
            s.seq->append_token(7);
        }
    }
    sched.check_invariants();
    return out;
}

void test_choices_fork_the_parents_prompt() {
    Scheduler sched = paged_scheduler(4, 16);
    add_choices(sched, 3);
    using Plan = std::vector<std::pair<int64_t, int32_t>>;
    assert((step(sched) == Plan{{1, kPrompt - 1}}));  // the choices wait; nothing sampled yet
    assert(sched.num_waiting() == 2 && sched.kv().num_blocks_used() == 3);
    int32_t num_copies = 0;
    assert((step(sched, &num_copies) == Plan{{1, 1}, {2, 1}, {3, 1}}));  // the last prompt token, each
    // blocks 0 and 1 are shared by all three; the partial block was copied for two of them
    assert(num_copies == 2 && sched.kv().num_blocks_used() == 5);  // 9 without sharing
    const BlockManager & blocks = *sched.kv().block_manager();
    for (int64_t id = 1; id <= 3; ++id) {
        assert(blocks.find(id)->block_ids[0] == blocks.find(1)->block_ids[0]);
        assert(blocks.find(id)->block_ids[1] == blocks.find(1)->block_ids[1]);
        assert(blocks.find(id)->num_tokens == kPrompt);
    }
    assert(blocks.pool().ref_count(blocks.find(1)->block_ids[0]) == 3);
    for (const auto & seq : sched.running()) {
        assert(seq->num_output_tokens() == 1);  // each sampled its first token from its own logits
        assert(seq->num_cached_tokens == (seq->request_id == 1 ? 0 : kPrompt - 1));
    }
    assert((step(sched) == Plan{{1, 1}, {2, 1}, {3, 1}}));  // decoding on
}

void test_a_choice_that_does_not_fit_computes_its_prompt() {
    Scheduler sched = paged_scheduler(2, 16);  // room for the parent and one choice
    add_choices(sched, 3);
    using Plan = std::vector<std::pair<int64_t, int32_t>>;
    assert((step(sched) == Plan{{1, kPrompt - 1}}));
    assert((step(sched) == Plan{{1, 1}, {2, 1}}));
    assert(sched.num_waiting() == 1 && sched.running().size() == 2);
    while (sched.num_running() == 2) {  // finish the parent: choice 3 gets its slot
        step(sched);
        if (sched.running()[0]->num_output_tokens() >= 2) {
            sched.finish(sched.running()[0].get(), CF_FINISH_REASON_LENGTH);
        }
    }
    assert((step(sched) == Plan{{2, 1}, {3, kPrompt}}));  // the whole prompt: no parent to fork
}

void test_stock_kv_shares_nothing() {
    SchedulerConfig c;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 64;
    c.n_ctx_per_seq = 32;
    c.n_ctx = 128;
    Scheduler sched(c, make_stock_split_kv(32));
    add_choices(sched, 3);
    using Plan = std::vector<std::pair<int64_t, int32_t>>;
    assert((step(sched) == Plan{{1, kPrompt}, {2, kPrompt}, {3, kPrompt}}));
}

}  // namespace

int main() {
    test_choices_fork_the_parents_prompt();
    test_a_choice_that_does_not_fit_computes_its_prompt();
    test_stock_kv_shares_nothing();
    std::puts("test_fork_choices: ok");
    return 0;
}
