// test_scheduler.cpp - unit tests of cf::Scheduler without a model: chunked prefill, decode
// priority, max_num_seqs, KV admission (split, unified and paged), paged preemption by recompute,
// policies, aborts.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/scheduler.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

using namespace cf;
using cf::test::make_seq;
using cf::test::sample_rows;
using cf::test::tokens;

namespace {

constexpr int32_t kToken = 7;  // token appended by the fake sampler



SchedulerConfig make_config(int32_t max_num_seqs, int32_t budget, int32_t n_ctx_per_seq = 64, int32_t n_ctx = 0,
                            cf_sched_policy policy = CF_SCHED_POLICY_FCFS) {
    SchedulerConfig c;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = budget;
    c.n_ctx_per_seq = n_ctx_per_seq;
    c.n_ctx = n_ctx > 0 ? n_ctx : n_ctx_per_seq * max_num_seqs;
    c.policy = policy;
    return c;
}

// A scheduler over a stock KV cache manager (split, or unified when `unified`).
Scheduler stock_scheduler(int32_t max_num_seqs, int32_t budget, int32_t n_ctx_per_seq = 64, bool unified = false,
                          int32_t n_ctx = 0, cf_sched_policy policy = CF_SCHED_POLICY_FCFS) {
    const SchedulerConfig c = make_config(max_num_seqs, budget, n_ctx_per_seq, n_ctx, policy);
    return Scheduler(c, unified ? make_stock_unified_kv(c.n_ctx, c.n_ctx_per_seq) : make_stock_split_kv(c.n_ctx_per_seq));
}

// Run one step the way the engine does: finish sequences out of KV blocks (paged), compute, sample
// kToken where asked, finish at max_tokens. Returns the ids of the requests that finished (their
// Sequence objects are gone, so *out_plan must not be dereferenced for them). *first_ids gets
// requests computing their first chunk; *num_out_of_blocks counts the sequences out of blocks.
std::vector<int64_t> run_step(Scheduler & sched, const StepPlan ** out_plan = nullptr,
                              std::vector<int64_t> * first_ids = nullptr, int32_t * num_out_of_blocks = nullptr) {
    const StepPlan & out = sched.schedule();
    std::vector<int64_t> ids;
    if (num_out_of_blocks) {
        *num_out_of_blocks += (int32_t) out.out_of_blocks.size();
    }
    for (Sequence * seq : out.out_of_blocks) {
        ids.push_back(sched.finish(seq, CF_FINISH_REASON_LENGTH)->request_id);
    }
    for (const ScheduledSeq & s : out.seqs) {
        if (first_ids && s.seq->num_computed_tokens == 0) {
            first_ids->push_back(s.seq->request_id);
        }
    }
    if (out_plan) {
        *out_plan = &out;
    }
    assert(out.num_scheduled_tokens <= sched.config().max_num_batched_tokens);
    for (size_t i = 1; i < out.seqs.size(); ++i) {
        assert(out.seqs[i - 1].seq->request_id < out.seqs[i].seq->request_id);  // batch order
    }
    sched.commit_step(out);
    const std::vector<Sequence *> done = sample_rows(out, kToken, sched.config().n_ctx_per_seq);
    for (Sequence * seq : done) {
        ids.push_back(sched.finish(seq, CF_FINISH_REASON_LENGTH)->request_id);
    }
    sched.check_invariants();
    return ids;
}

void test_chunked_prefill() {
    Scheduler sched = stock_scheduler(2, 8);
    sched.add(make_seq(1, 20, 2));
    const StepPlan * out = nullptr;
    run_step(sched, &out);
    assert(out->seqs.size() == 1 && out->seqs[0].num_new_tokens == 8 && !out->seqs[0].needs_sample);
    assert(out->num_prefill_tokens == 8 && out->num_decode_tokens == 0);
    run_step(sched, &out);
    assert(out->seqs[0].num_new_tokens == 8 && !out->seqs[0].needs_sample);
    run_step(sched, &out);
    assert(out->seqs[0].num_new_tokens == 4 && out->seqs[0].needs_sample);
    const std::vector<int64_t> done = run_step(sched, &out);  // decode of the first output token
    assert(out->seqs[0].num_new_tokens == 1 && out->num_decode_tokens == 1);
    assert(done.size() == 1 && done[0] == 1 && !sched.has_work());
}

// (llama.cpp slots are the adapter's: test_batch_builder.cpp checks their assignment and reuse.)
void test_decodes_first_then_prefill_in_request_order() {
    Scheduler sched = stock_scheduler(4, 8);
    sched.add(make_seq(1, 3, 10));
    run_step(sched);  // request 1 prefilled, now decoding
    sched.add(make_seq(2, 30, 10));
    const StepPlan * out = nullptr;
    run_step(sched, &out);
    assert(out->seqs.size() == 2);
    assert(out->seqs[0].seq->request_id == 1 && out->seqs[0].num_new_tokens == 1);
    assert(out->seqs[1].seq->request_id == 2 && out->seqs[1].num_new_tokens == 7);
    assert(out->num_decode_tokens == 1 && out->num_prefill_tokens == 7);
}

void test_max_num_seqs_and_reuse() {
    Scheduler sched = stock_scheduler(3, 64);
    sched.add(make_seq(1, 4, 5));
    sched.add(make_seq(2, 4, 1));  // finishes after its first token
    sched.add(make_seq(3, 4, 5));
    sched.add(make_seq(4, 4, 5));
    const std::vector<int64_t> done = run_step(sched);
    assert(done.size() == 1 && done[0] == 2);
    assert(sched.num_running() == 2 && sched.num_waiting() == 1);
    const StepPlan * out = nullptr;
    run_step(sched, &out);  // request 4 takes the place of request 2
    assert(sched.num_running() == 3 && sched.num_waiting() == 0);
    assert(out->seqs.size() == 3 && out->seqs[2].seq->request_id == 4 && out->seqs[2].seq->num_computed_tokens == 4);
}

// Scheduler::hold_admissions (the engine's decode launched ahead): the next schedule() continues the running
// sequences only, and the one after admits as before.
void test_hold_admissions_holds_one_step() {
    Scheduler sched = stock_scheduler(3, 64);
    sched.add(make_seq(1, 4, 8));
    sched.add(make_seq(2, 4, 1));  // finishes after its first token, freeing a slot
    run_step(sched);
    assert(sched.num_running() == 1);
    sched.add(make_seq(3, 4, 8));
    sched.hold_admissions();
    const StepPlan * out = nullptr;
    run_step(sched, &out);  // request 3 waits: only request 1 decodes
    assert(out->seqs.size() == 1 && out->seqs[0].seq->request_id == 1 && out->num_prefill_tokens == 0);
    assert(sched.num_running() == 1 && sched.num_waiting() == 1);
    run_step(sched, &out);  // the hold was for one step
    assert(out->seqs.size() == 2 && out->seqs[1].seq->request_id == 3 && out->num_prefill_tokens == 4);
    assert(sched.num_running() == 2 && sched.num_waiting() == 0);
}

void test_unified_kv_admission() {
    // n_ctx 100: each request reserves prompt 10 + max_tokens 50 = 60 rows, so only one fits.
    Scheduler sched = stock_scheduler(4, 64, 100, /*unified=*/true, /*n_ctx=*/100);
    sched.add(make_seq(1, 10, 50));
    sched.add(make_seq(2, 10, 50));
    run_step(sched);
    assert(sched.num_running() == 1 && sched.num_waiting() == 1 && sched.kv_tokens_reserved() == 60);
    int steps = 0;
    while (sched.num_waiting() == 1) {
        run_step(sched);
        ++steps;
    }
    assert(steps == 50 && sched.num_running() == 1);  // admitted in the step after 1 finished
    // Reservation is capped by n_ctx_per_seq: a huge max_tokens still fits alone.
    Scheduler capped = stock_scheduler(2, 64, 100, true, 100);
    capped.add(make_seq(3, 10, 1000));
    run_step(capped);
    assert(capped.num_running() == 1 && capped.kv_tokens_reserved() == 100);
}

void test_split_mode_admits_by_slots() {
    Scheduler sched = stock_scheduler(2, 64, 64);
    sched.add(make_seq(1, 10, 50));
    sched.add(make_seq(2, 10, 50));
    run_step(sched);
    assert(sched.num_running() == 2 && sched.kv_tokens_reserved() == 128);
    assert(sched.kv_tokens_used() == 20);
}

std::vector<int64_t> admission_order(cf_sched_policy policy) {
    Scheduler sched = stock_scheduler(1, 64, 64, false, 0, policy);
    sched.add(make_seq(1, 20, 4, /*priority=*/5));
    sched.add(make_seq(2, 5, 4, /*priority=*/1));
    sched.add(make_seq(3, 10, 1, /*priority=*/1));
    std::vector<int64_t> order;
    while (sched.has_work()) {
        run_step(sched, nullptr, &order);
    }
    return order;
}

void test_policies() {
    assert((admission_order(CF_SCHED_POLICY_FCFS) == std::vector<int64_t>{1, 2, 3}));
    assert((admission_order(CF_SCHED_POLICY_SJF) == std::vector<int64_t>{2, 3, 1}));       // work 9, 11, 24
    assert((admission_order(CF_SCHED_POLICY_PRIORITY) == std::vector<int64_t>{2, 3, 1}));  // ties by arrival
}

void test_remove() {
    Scheduler sched = stock_scheduler(1, 64);
    sched.add(make_seq(1, 4, 8));
    sched.add(make_seq(2, 4, 8));
    run_step(sched);
    std::unique_ptr<Sequence> waiting = sched.remove(2, CF_FINISH_REASON_ABORT);
    assert(waiting && !waiting->holds_kv && waiting->finish_reason == CF_FINISH_REASON_ABORT);
    std::unique_ptr<Sequence> running = sched.remove(1, CF_FINISH_REASON_ABORT);
    assert(running && !running->holds_kv && running->is_finished());  // its KV is back
    assert(!sched.remove(1, CF_FINISH_REASON_ABORT) && !sched.remove(99, CF_FINISH_REASON_ABORT));
    assert(!sched.has_work() && sched.num_free_slots() == 1);
    sched.check_invariants();
}

void test_budget_smaller_than_decodes() {
    Scheduler sched = stock_scheduler(4, 2);
    for (int64_t id = 1; id <= 4; ++id) {
        sched.add(make_seq(id, 1, 3));
    }
    int steps = 0;
    while (sched.has_work()) {
        run_step(sched);  // asserts the budget every step
        ++steps;
        assert(steps < 100);
    }
}

// Paged mode over 8 blocks of 4 tokens: admission by free blocks for the whole prompt plus a
// watermark (one block per running sequence), a slot for every scheduled token, nothing reserved;
// when blocks run out a newer sequence is preempted instead of any ending early; every block
// returns when its sequence ends.
void test_paged_kv_admission() {
    Scheduler sched(make_config(4, 64, 32, 32), make_paged_kv(8, 4));
    const BlockManager & blocks = *sched.kv().block_manager();
    sched.add(make_seq(1, 10, 20));  // 3 blocks; alone, no watermark
    sched.add(make_seq(2, 12, 20));  // 3 blocks + 1 (one running) <= 5 free
    sched.add(make_seq(3, 5, 20));   // 2 blocks + 2 (two running) > 2 free: waits
    run_step(sched);
    assert(sched.num_running() == 2 && sched.num_waiting() == 1);
    assert(blocks.num_free_blocks() == 2 && sched.kv_tokens_reserved() == 6 * 4);
    assert(blocks.find(1)->num_tokens == 10 && blocks.find(2)->num_tokens == 12);

    // 30 + 32 + 25 tokens wanted, 32 rows: preemption instead of sequences ending early
    int32_t num_out_of_blocks = 0;
    int32_t num_done = 0;
    while (sched.has_work()) {
        num_done += (int32_t) run_step(sched, nullptr, nullptr, &num_out_of_blocks).size();
        assert(blocks.num_seqs() == sched.num_running());
    }
    assert(num_done == 3 && num_out_of_blocks == 0 && sched.num_preemptions() >= 1);
    assert(blocks.num_free_blocks() == 8 && blocks.num_seqs() == 0 && sched.kv_tokens_reserved() == 0);
}

// Runs steps until one preempts; returns that step's plan (valid until the next schedule()).
const StepPlan & run_until_preemption(Scheduler & sched) {
    for (int32_t i = 0; i < 100; ++i) {
        const StepPlan * out = nullptr;
        run_step(sched, &out);
        if (!out->preempted.empty()) {
            return *out;
        }
    }
    assert(false && "no preemption happened");
    std::abort();
}

// Two sequences of 4-token prompts that want 14 tokens each in 4 blocks of 4: at token 8 the
// older one needs a third block, so the newer one (not yet scheduled in that step) is preempted:
// its blocks come back, it waits with its 5 output tokens and, once the older
// one ends, computes prompt + output again (8 prefill tokens and the last sampled one as decode)
// and goes on to its 10 tokens.
void test_preemption_by_recompute() {
    Scheduler sched(make_config(4, 64, 16, 16), make_paged_kv(4, 4));
    const BlockManager & blocks = *sched.kv().block_manager();
    sched.add(make_seq(1, 4, 10));
    sched.add(make_seq(2, 4, 10));
    const StepPlan & out = run_until_preemption(sched);
    assert(out.preempted.size() == 1 && out.preempted[0].seq->request_id == 2);
    assert(!out.preempted[0].seq->holds_kv && out.out_of_blocks.empty());
    assert(out.seqs.size() == 1 && out.seqs[0].seq->request_id == 1);
    assert(sched.num_running() == 1 && sched.num_waiting() == 1 && sched.num_preemptions() == 1);
    assert(blocks.find(2) == nullptr && blocks.num_free_blocks() == 1);
    const Sequence & waiting = *out.preempted[0].seq;
    assert(waiting.num_computed_tokens == 0 && waiting.num_tokens() == 9 && waiting.num_preemptions == 1);

    bool recomputed = false;
    std::vector<int64_t> done;
    while (sched.has_work()) {
        const StepPlan * step = nullptr;
        const std::vector<int64_t> ids = run_step(sched, &step);
        for (const ScheduledSeq & s : step->seqs) {
            if (s.seq->request_id == 2 && s.num_new_tokens > 1) {
                assert(s.num_new_tokens == 9 && s.needs_sample);
                assert(step->num_prefill_tokens == 8 && step->num_decode_tokens == 1);
                recomputed = true;
            }
        }
        done.insert(done.end(), ids.begin(), ids.end());
    }
    assert(recomputed && done.size() == 2 && sched.num_preemptions() == 1);
    assert(blocks.num_free_blocks() == 4);
}

// Priority policy: the older sequence needs a block, but the only other one has a higher priority
// (smaller value), so the older one gives way itself.
void test_preemption_respects_priority() {
    Scheduler sched(make_config(4, 64, 16, 16, CF_SCHED_POLICY_PRIORITY), make_paged_kv(4, 4));
    const BlockManager & blocks = *sched.kv().block_manager();
    sched.add(make_seq(1, 4, 10, /*priority=*/5));
    run_step(sched);  // 1 runs alone first
    sched.add(make_seq(2, 4, 10, /*priority=*/0));
    const StepPlan & out = run_until_preemption(sched);
    assert(out.preempted.size() == 1 && out.preempted[0].seq->request_id == 1);
    assert(out.seqs.size() == 1 && out.seqs[0].seq->request_id == 2);
    while (sched.has_work()) {
        run_step(sched);
    }
    assert(blocks.num_free_blocks() == 4);
}

// Alone in a pool too small for it, a sequence cannot be helped by preemption: it is reported in
// out_of_blocks with its blocks already back.
void test_alone_out_of_blocks() {
    Scheduler sched(make_config(2, 64, 16, 16), make_paged_kv(2, 4));
    const BlockManager & blocks = *sched.kv().block_manager();
    sched.add(make_seq(1, 4, 10));
    int32_t num_out_of_blocks = 0;
    std::vector<int64_t> done;
    while (sched.has_work()) {
        const std::vector<int64_t> ids = run_step(sched, nullptr, nullptr, &num_out_of_blocks);
        done.insert(done.end(), ids.begin(), ids.end());
    }
    assert(num_out_of_blocks == 1 && done.size() == 1 && sched.num_preemptions() == 0);
    assert(blocks.num_free_blocks() == 2);
}

void test_context_full_is_respected() {
    Scheduler sched = stock_scheduler(1, 64, 16);
    sched.add(make_seq(1, 15, 100));  // the largest prompt that fits; 1 token then the context is full
    const std::vector<int64_t> done = run_step(sched);
    assert(done.size() == 1 && !sched.has_work());
}

}  // namespace

// The prefix cache through the scheduler: a repeated prompt starts after its cached tokens (all
// but the last), counts them as num_cached_tokens, and its step computes only the rest.
void test_prefix_cache_admission() {
    const SchedulerConfig c = make_config(2, 64, 64, 64);
    Scheduler sched(c, make_paged_kv(16, 4, /*prefix_caching=*/true));
    sched.add(make_seq(1, 10, 2));
    while (sched.has_work()) {
        run_step(sched);
    }
    sched.add(make_seq(2, 10, 2));  // the same prompt tokens (make_seq: 0, 1, ..., 9)
    const StepPlan * plan = nullptr;
    run_step(sched, &plan);
    assert(plan->seqs.size() == 1 && plan->seqs[0].num_new_tokens == 1 && plan->num_prefill_tokens == 1);
    assert(plan->seqs[0].seq->num_cached_tokens == 9 && plan->seqs[0].needs_sample);
    assert(sched.kv().prefix_cache_stats().num_hit_tokens == 9);
    while (sched.has_work()) {
        run_step(sched);
    }
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().prefix_cache_stats().num_cached_blocks > 0);
}

// A sequence of prompt tokens `prompt` (make_seq's other fields).
std::unique_ptr<Sequence> make_seq_of(int64_t request_id, const std::vector<int32_t> & prompt, int32_t max_tokens = 2) {
    SamplingParams p;
    p.max_tokens = max_tokens;
    const int32_t n = (int32_t) prompt.size();
    return std::make_unique<Sequence>(request_id, prompt.data(), n, p, 0, 0, n + max_tokens);
}

// Shared prefixes in flight (scheduler.h), S = 8 tokens, blocks of 4: requests 1 and 2 arrive together
// with the same 30-token prompt, request 3 behind them with another one. Request 2 waits while request 1
// computes the 28 tokens (7 full blocks) they share; request 3 is admitted past it. At the next step
// request 2 is admitted on request 1's committed blocks and computes its last token only. With S = 0
// both compute the whole prompt in the first step.
void test_shared_prefix_in_flight_is_computed_once() {
    for (const int32_t min_shared : {8, 0}) {
        SchedulerConfig c = make_config(4, 128, 64, 128);
        c.min_pending_shared_prefix = min_shared;
        Scheduler sched(c, make_paged_kv(32, 4, /*prefix_caching=*/true));
        sched.add(make_seq(1, 30, 2));
        sched.add(make_seq(2, 30, 2));
        sched.add(make_seq_of(3, tokens(10, 100)));
        const StepPlan * plan = nullptr;
        run_step(sched, &plan);
        std::vector<int64_t> first;
        for (const ScheduledSeq & s : plan->seqs) {
            first.push_back(s.seq->request_id);
        }
        if (min_shared == 0) {
            assert((first == std::vector<int64_t>{1, 2, 3}) && plan->num_prefill_tokens == 70);
            continue;
        }
        assert((first == std::vector<int64_t>{1, 3}) && plan->num_prefill_tokens == 40);
        assert(sched.num_waiting() == 1);
        run_step(sched, &plan);
        const ScheduledSeq * two = nullptr;
        for (const ScheduledSeq & s : plan->seqs) {
            two = s.seq->request_id == 2 ? &s : two;
        }
        // 7 shared blocks and the first row of request 1's partial eighth block (copied): only the last
        // prompt token is computed
        assert(two != nullptr && two->num_new_tokens == 1 && two->seq->num_cached_tokens == 29);
        assert(sched.kv().prefix_cache_stats().num_hit_tokens == 29);
        while (sched.has_work()) {
            run_step(sched);
        }
    }
}

// The wait ends when the computing sequence leaves: request 2 shares request 1's 30-token prompt, request
// 1 is aborted after two steps of a 4-token budget (it computed two blocks), and request 2 then computes
// the rest on its own (on the two cached blocks). Only a shared part of at least S tokens makes it wait:
// request 3 shares only the first block with request 4 and is admitted in the same step.
void test_shared_prefix_wait_ends_with_the_computing_sequence() {
    SchedulerConfig c = make_config(4, 4, 64, 128);
    c.min_pending_shared_prefix = 8;
    Scheduler sched(c, make_paged_kv(32, 4, /*prefix_caching=*/true));
    sched.add(make_seq(1, 30, 2));
    sched.add(make_seq(2, 30, 2));
    const StepPlan * plan = nullptr;
    run_step(sched, &plan);
    assert(plan->seqs.size() == 1 && plan->seqs[0].seq->request_id == 1 && sched.num_waiting() == 1);
    run_step(sched, &plan);  // request 1 has 28 - 4 = 24 shared tokens left: request 2 still waits
    assert(sched.num_waiting() == 1);
    assert(sched.remove(1, CF_FINISH_REASON_ABORT) != nullptr);
    run_step(sched, &plan);
    assert(plan->seqs.size() == 1 && plan->seqs[0].seq->request_id == 2);
    assert(plan->seqs[0].seq->num_cached_tokens == 8);  // the two blocks request 1 committed
    sched.remove(2, CF_FINISH_REASON_ABORT);

    SchedulerConfig roomy = make_config(4, 128, 64, 128);
    roomy.min_pending_shared_prefix = 8;
    Scheduler sched2(roomy, make_paged_kv(32, 4, /*prefix_caching=*/true));
    std::vector<int32_t> other = tokens(30);
    std::iota(other.begin() + 4, other.end(), 500);  // the same first block only
    sched2.add(make_seq(4, 30, 2));
    sched2.add(make_seq_of(3, other));
    run_step(sched2, &plan);
    assert(plan->seqs.size() == 2 && sched2.num_waiting() == 0);
}

// Long prefills (scheduler.h): with T = 8 and a budget of 16, a 40-token prompt running its prefill
// gets at most 8 tokens before a short prompt that arrived after it; the budget the short one leaves
// goes back to the long one, which alone gets the whole budget.
void test_long_prefill_lets_a_short_prompt_in() {
    SchedulerConfig c = make_config(4, 16, 64);
    c.long_prefill_token_threshold = 8;
    Scheduler sched(c, make_stock_split_kv(c.n_ctx_per_seq));
    sched.add(make_seq(1, 40, 2));
    const StepPlan * out = nullptr;
    run_step(sched, &out);  // alone: the whole budget
    assert(out->seqs.size() == 1 && out->seqs[0].num_new_tokens == 16 && out->num_prefill_tokens == 16);
    sched.add(make_seq(2, 5, 2));
    run_step(sched, &out);  // the long one's 8, the short one's 5, then the long one's chunk grows by 3
    assert(out->seqs.size() == 2 && out->num_scheduled_tokens == 16);
    assert(out->seqs[0].seq->request_id == 1 && out->seqs[0].num_new_tokens == 11 && !out->seqs[0].needs_sample);
    assert(out->seqs[1].seq->request_id == 2 && out->seqs[1].num_new_tokens == 5 && out->seqs[1].needs_sample);
    assert(out->num_prefill_tokens == 16 && out->num_decode_tokens == 0);
    while (sched.has_work()) {
        run_step(sched);
    }
    // without the rule the short prompt waits for the long one's 40 tokens
    Scheduler plain = stock_scheduler(4, 16, 64);
    plain.add(make_seq(1, 40, 2));
    run_step(plain);
    plain.add(make_seq(2, 5, 2));
    run_step(plain, &out);
    assert(out->seqs.size() == 1 && out->seqs[0].seq->request_id == 1 && out->seqs[0].num_new_tokens == 16);
}

// Long prefills keep their order: the first gets the budget (8, then what is left), the second only
// what the first leaves, in the same step; the rule never shares the budget round-robin.
void test_long_prefills_one_at_a_time() {
    SchedulerConfig c = make_config(4, 16, 64);
    c.long_prefill_token_threshold = 8;
    Scheduler sched(c, make_stock_split_kv(c.n_ctx_per_seq));
    sched.add(make_seq(1, 20, 2));
    sched.add(make_seq(2, 20, 2));
    sched.add(make_seq(3, 3, 2));
    const StepPlan * out = nullptr;
    run_step(sched, &out);  // 1: 8, 2: skipped, 3: 3 (short), then 1: +5
    assert(out->seqs.size() == 2 && out->num_scheduled_tokens == 16);
    assert(out->seqs[0].seq->request_id == 1 && out->seqs[0].num_new_tokens == 13);
    assert(out->seqs[1].seq->request_id == 3 && out->seqs[1].num_new_tokens == 3);
    assert(sched.num_running() == 3);  // 2 was admitted (in order); it computes nothing yet
    const std::vector<int64_t> done = run_step(sched, &out);  // 3: its decode; 1: its last 7; 2: the 8 left
    assert(done.size() == 1 && done[0] == 3);  // its Sequence is gone: seqs[2] is not dereferenced
    assert(out->seqs.size() == 3 && out->num_scheduled_tokens == 16);
    assert(out->seqs[0].seq->request_id == 1 && out->seqs[0].num_new_tokens == 7 && out->seqs[0].needs_sample);
    assert(out->seqs[1].seq->request_id == 2 && out->seqs[1].num_new_tokens == 8);
    assert(out->seqs[2].num_new_tokens == 1 && out->num_decode_tokens == 1);
    while (sched.has_work()) {
        run_step(sched);
    }
}

// Paged: the second pass takes free blocks only. Here the long prefill alone grows to its whole prompt
// and nothing is preempted; every block returns.
void test_long_prefill_top_up_in_a_paged_pool() {
    SchedulerConfig c = make_config(4, 64, 32, 32);
    c.long_prefill_token_threshold = 8;
    Scheduler sched(c, make_paged_kv(8, 4));  // 8 blocks of 4 tokens
    const BlockManager & blocks = *sched.kv().block_manager();
    sched.add(make_seq(1, 30, 2));
    const StepPlan * out = nullptr;
    run_step(sched, &out);
    assert(out->seqs.size() == 1 && out->seqs[0].num_new_tokens == 30 && blocks.find(1)->num_tokens == 30);
    int32_t num_done = 0;
    while (sched.has_work()) {
        num_done += (int32_t) run_step(sched).size();
    }
    assert(num_done == 1 && sched.num_preemptions() == 0 && blocks.num_free_blocks() == 8);
}

// Paged: a long prefill passed over at admission holds no block yet, so its prompt's blocks stay
// reserved: later prompts are admitted only beside them (here 3 of 4 prompts of 5 blocks in a pool of
// 16), and none of the admitted ones is preempted for want of blocks it was promised.
void test_passed_over_long_prefills_reserve_their_blocks() {
    SchedulerConfig c = make_config(8, 16, 32, 64);
    c.long_prefill_token_threshold = 8;
    Scheduler sched(c, make_paged_kv(16, 4));  // 16 blocks of 4 tokens
    const BlockManager & blocks = *sched.kv().block_manager();
    for (int64_t id = 1; id <= 4; ++id) {
        sched.add(make_seq(id, 20, 1));
    }
    const StepPlan * out = nullptr;
    run_step(sched, &out);  // 1: 8 tokens then the top-up; 2 and 3 admitted on reserved blocks; 4 waits
    assert(sched.num_running() == 3 && sched.num_waiting() == 1);
    assert(out->seqs.size() == 1 && out->seqs[0].seq->request_id == 1 && out->seqs[0].num_new_tokens == 16);
    int32_t num_done = 0;
    while (sched.has_work()) {
        num_done += (int32_t) run_step(sched).size();
    }
    assert(num_done == 4 && sched.num_preemptions() == 0 && blocks.num_free_blocks() == 16);
}

int main() {
    test_chunked_prefill();
    test_decodes_first_then_prefill_in_request_order();
    test_max_num_seqs_and_reuse();
    test_hold_admissions_holds_one_step();
    test_unified_kv_admission();
    test_split_mode_admits_by_slots();
    test_policies();
    test_remove();
    test_budget_smaller_than_decodes();
    test_context_full_is_respected();
    test_prefix_cache_admission();
    test_paged_kv_admission();
    test_preemption_by_recompute();
    test_preemption_respects_priority();
    test_alone_out_of_blocks();
    test_long_prefill_lets_a_short_prompt_in();
    test_long_prefills_one_at_a_time();
    test_long_prefill_top_up_in_a_paged_pool();
    test_passed_over_long_prefills_reserve_their_blocks();
    test_shared_prefix_in_flight_is_computed_once();
    test_shared_prefix_wait_ends_with_the_computing_sequence();
    std::printf("test_scheduler: ok\n");
    return 0;
}
