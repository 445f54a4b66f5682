// test_scheduler_priority.cpp - the PRIORITY policy of cf::Scheduler without a model (scheduler.h,
// "Aging" and "Priority preemption"), and SJF's queue order: exact admission and preemption
// decisions on tiny pools, FCFS within one priority, aging past a stream of urgent arrivals, and
// a storm of urgent arrivals on a full pool in every preemption mode. Invariants every step.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/scheduler.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

using namespace cf;
using cf::test::make_seq;
using cf::test::sample_rows;

namespace {

constexpr int32_t kToken = 7;         // token appended by the fake sampler
constexpr int64_t kStepNs = 10;       // the fake clock advances this much per step
constexpr int64_t kNoAging = 0;

SchedulerConfig prio_config(int32_t max_num_seqs, int32_t n_ctx_per_seq, int32_t n_ctx, int64_t aging_ns,
                            cf_preemption_mode mode = CF_PREEMPTION_MODE_SWAP,
                            cf_sched_policy policy = CF_SCHED_POLICY_PRIORITY) {
    SchedulerConfig c;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = 64;
    c.n_ctx_per_seq = n_ctx_per_seq;
    c.n_ctx = n_ctx;
    c.policy = policy;
    c.preemption_mode = mode;
    c.priority_aging_ns = aging_ns;
    return c;
}

// A request of `priority` that arrives at arrival_ns (the fake clock).
std::unique_ptr<Sequence> make_request(int64_t id, int32_t prompt_len, int32_t max_tokens, int32_t priority,
                                       int64_t arrival_ns = 0) {
    std::unique_ptr<Sequence> seq = make_seq(id, prompt_len, max_tokens, priority);
    seq->arrival_ns = arrival_ns;
    seq->queued_since_ns = arrival_ns;
    return seq;
}

struct Log {
    std::map<int64_t, int32_t> num_output;    // request id -> output tokens when it finished
    std::map<int64_t, int32_t> priority;      // request id -> priority, for every request added
    std::map<int64_t, int64_t> first_ns;      // request id -> time of its first scheduled step
    std::vector<int64_t> finished;            // in finish order
    std::vector<int64_t> admitted;            // in the order of their first scheduled step
    int32_t num_priority_preemptions = 0;
    int32_t num_out_of_blocks = 0;
};

void add(Scheduler & sched, Log & log, std::unique_ptr<Sequence> seq) {
    log.priority[seq->request_id] = seq->priority;
    sched.add(std::move(seq));
}

// One engine-like step at now_ns: finish sequences out of blocks, compute, sample kToken where
// asked, finish at max_tokens. Checks that a priority preemption only ever made room for a
// strictly more urgent queued request, then the scheduler's invariants.
const StepPlan & run_step(Scheduler & sched, Log & log, int64_t now_ns) {
    std::set<int64_t> running_before;
    for (const auto & seq : sched.running()) {
        running_before.insert(seq->request_id);
    }
    const StepPlan & out = sched.schedule(now_ns);
    for (const StepPlan::Preempted & p : out.preempted) {
        if (!p.for_priority) {
            continue;
        }
        log.num_priority_preemptions += 1;
        bool more_urgent_queued = false;
        for (const int64_t id : sched.request_ids()) {
            more_urgent_queued |= running_before.count(id) == 0 && log.priority[id] < p.seq->priority;
        }
        assert(more_urgent_queued);
    }
    for (Sequence * seq : out.out_of_blocks) {
        log.num_out_of_blocks += 1;
        log.finished.push_back(sched.finish(seq, CF_FINISH_REASON_LENGTH)->request_id);
    }
    for (const ScheduledSeq & s : out.seqs) {
        if (log.first_ns.emplace(s.seq->request_id, now_ns).second) {
            log.admitted.push_back(s.seq->request_id);
        }
    }
    sched.commit_step(out);
    const std::vector<Sequence *> done = sample_rows(out, kToken, sched.config().n_ctx_per_seq);
    for (Sequence * seq : done) {
        assert(log.num_output.count(seq->request_id) == 0);  // finishes exactly once
        log.num_output[seq->request_id] = seq->num_output_tokens();
        log.finished.push_back(sched.finish(seq, CF_FINISH_REASON_LENGTH)->request_id);
    }
    sched.check_invariants();
    return out;
}

// Runs until nothing is left; returns the clock after the last step.
int64_t run_all(Scheduler & sched, Log & log, int64_t now_ns) {
    for (int32_t steps = 0; sched.has_work(); ++steps) {
        assert(steps < 10000);
        run_step(sched, log, now_ns);
        now_ns += kStepNs;
    }
    return now_ns;
}

bool is_preempted(const StepPlan & out, int64_t request_id) {
    for (const StepPlan::Preempted & p : out.preempted) {
        if (p.seq->request_id == request_id) {
            return true;
        }
    }
    return false;
}

bool is_scheduled(const StepPlan & out, int64_t request_id) {
    for (const ScheduledSeq & s : out.seqs) {
        if (s.seq->request_id == request_id) {
            return true;
        }
    }
    return false;
}

// No room in the running set (max_num_seqs 2, blocks plenty): an arrival of priority 1 preempts
// the least urgent running request (priority 5), not the priority-3 one, is admitted in that very
// step, and the victim (swapped) resumes where it stopped once a place frees up.
void test_urgent_arrival_preempts_least_urgent_for_a_place() {
    Scheduler sched(prio_config(2, 32, 64, kNoAging), make_paged_kv(16, 4, false, 32, 100));
    Log log;
    add(sched, log, make_request(1, 4, 10, /*priority=*/5));
    add(sched, log, make_request(2, 4, 10, /*priority=*/3));
    run_step(sched, log, 0);
    add(sched, log, make_request(3, 4, 2, /*priority=*/1));
    const StepPlan & out = run_step(sched, log, kStepNs);
    assert(out.preempted.size() == 1 && out.preempted[0].seq->request_id == 1);
    assert(out.preempted[0].for_priority && out.preempted[0].swapped && !out.blocks_to_swap_out.empty());
    assert(is_scheduled(out, 2) && is_scheduled(out, 3) && !is_scheduled(out, 1));
    assert(sched.num_swapped() == 1 && sched.preemption_stats().num_priority == 1);
    run_all(sched, log, 2 * kStepNs);
    assert((log.finished == std::vector<int64_t>{3, 2, 1}));
    assert(log.num_output[1] == 10 && log.num_output[2] == 10 && log.num_output[3] == 2);
    assert(sched.preemption_stats().num_swap == 1 && sched.preemption_stats().num_recompute == 0);
    assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
}

// No free blocks (4 blocks of 4): 1 (priority 5) holds 2 blocks, 2 (priority 3) 1 block, 1 free.
// An arrival of priority 1 needs 1 block + 2 of watermark: preempting 1 (2 blocks back, one
// running sequence left: 1 + 1 needed of 3 free) is enough, so 2 keeps running.
void test_urgent_arrival_preempts_least_urgent_for_blocks() {
    Scheduler sched(prio_config(4, 16, 16, kNoAging, CF_PREEMPTION_MODE_RECOMPUTE), make_paged_kv(4, 4));
    Log log;
    add(sched, log, make_request(1, 7, 4, /*priority=*/5));
    add(sched, log, make_request(2, 3, 4, /*priority=*/3));
    run_step(sched, log, 0);
    assert(sched.num_running() == 2 && sched.kv().num_blocks_free() == 1);
    add(sched, log, make_request(3, 4, 2, /*priority=*/1));
    const StepPlan & out = run_step(sched, log, kStepNs);
    assert(out.preempted.size() == 1 && out.preempted[0].seq->request_id == 1);
    assert(out.preempted[0].for_priority && !out.preempted[0].swapped);
    assert(is_scheduled(out, 2) && is_scheduled(out, 3) && sched.num_waiting() == 1);
    run_all(sched, log, 2 * kStepNs);
    assert(log.finished.size() == 3 && log.num_output[1] == 4 && log.num_output[3] == 2);
    assert(sched.preemption_stats().num_priority == 1 && sched.kv().num_blocks_used() == 0);
}

// An arrival as urgent as the running ones, or less, never preempts: not even after waiting ten
// aging intervals (equal base priorities never preempt each other, whatever aging says).
void test_equal_or_less_urgent_arrival_does_not_preempt() {
    for (const int64_t aging_ns : { kNoAging, (int64_t) 1 }) {
        Scheduler sched(prio_config(2, 32, 64, aging_ns), make_paged_kv(16, 4, false, 32, 100));
        Log log;
        add(sched, log, make_request(1, 4, 6, /*priority=*/2));
        add(sched, log, make_request(2, 4, 6, /*priority=*/2));
        run_step(sched, log, 0);
        add(sched, log, make_request(3, 4, 6, /*priority=*/2, kStepNs));
        add(sched, log, make_request(4, 4, 6, /*priority=*/7, kStepNs));
        run_all(sched, log, kStepNs);
        assert(sched.num_preemptions() == 0 && log.num_priority_preemptions == 0);
        assert((log.admitted == std::vector<int64_t>{1, 2, 3, 4}));
        assert(log.first_ns[3] > log.first_ns[2]);  // it waited for a place
    }
}

// FCFS within one priority: priorities 2 1 2 1 1 (ids 1..5, one place) run 2 4 5 1 3; with
// aging on and arrivals spaced one step apart, the same order (each waited as long as the ones
// after it, or longer).
void test_fcfs_within_priority() {
    for (const int64_t aging_ns : { kNoAging, (int64_t) 1000 }) {
        Scheduler sched(prio_config(1, 32, 32, aging_ns), make_stock_split_kv(32));
        Log log;
        const int32_t priorities[] = { 2, 1, 2, 1, 1 };
        for (int64_t id = 1; id <= 5; ++id) {
            add(sched, log, make_request(id, 3, 2, priorities[id - 1], 0));
        }
        run_all(sched, log, 0);
        assert((log.admitted == std::vector<int64_t>{2, 4, 5, 1, 3}));
    }
}

// SJF orders by predicted remaining work: uncomputed tokens + max_tokens - generated. Work
// 24, 15, 12, 12 runs 3, 4 (tie: arrival), 2, 1.
void test_sjf_order() {
    Scheduler sched(prio_config(1, 32, 32, kNoAging, CF_PREEMPTION_MODE_AUTO, CF_SCHED_POLICY_SJF),
                    make_stock_split_kv(32));
    Log log;
    add(sched, log, make_request(1, 20, 4, 0));
    add(sched, log, make_request(2, 5, 10, 0));
    add(sched, log, make_request(3, 10, 2, 0));
    add(sched, log, make_request(4, 3, 9, 0));
    run_all(sched, log, 0);
    assert((log.admitted == std::vector<int64_t>{3, 4, 2, 1}));
}

// One place; a priority-0 request arrives every 3 steps (each runs 3 steps), so without aging a
// priority-3 request waits until the stream ends. With 100 ns per level it is the first queued
// request once its effective priority 3 - floor(wait / 100) reaches the stream's (0, ties go to
// the older arrival): from wait 300 on, and it takes the place that frees next (<= 3 steps).
void test_aging_lets_a_starving_request_in() {
    constexpr int64_t kAgingNs = 100;
    constexpr int32_t kStreamSteps = 120;  // 1,200 ns of urgent arrivals
    for (const int64_t aging_ns : { kNoAging, kAgingNs }) {
        Scheduler sched(prio_config(1, 32, 32, aging_ns), make_stock_split_kv(32));
        Log log;
        int64_t next_id = 1;
        add(sched, log, make_request(next_id++, 2, 3, /*priority=*/0, 0));
        const int64_t low_id = next_id++;
        add(sched, log, make_request(low_id, 2, 3, /*priority=*/3, 0));
        int64_t now_ns = 0;
        for (int32_t step = 0; step < kStreamSteps; ++step) {
            if (step % 3 == 2) {
                add(sched, log, make_request(next_id++, 2, 3, /*priority=*/0, now_ns));
            }
            run_step(sched, log, now_ns);
            now_ns += kStepNs;
        }
        if (aging_ns == kNoAging) {
            assert(log.first_ns.count(low_id) == 0);  // starving
        } else {
            assert(log.first_ns.count(low_id) == 1 && log.num_output[low_id] == 3);
            const int64_t waited = log.first_ns[low_id];
            assert(waited >= 3 * kAgingNs && waited <= 3 * kAgingNs + 3 * kStepNs);
        }
        run_all(sched, log, now_ns);
        assert(log.num_output[low_id] == 3 && sched.num_preemptions() == 0);
    }
}

// A low-priority request that aged its way in keeps its effective priority while it runs: fresh
// urgent arrivals do not push it out, older queued urgent ones (more urgent than its frozen
// value) may. Here: 1 (priority 2) waited 250 ns (effective 0) for a place; a fresh priority-1
// arrival (effective 1) must not preempt it, one that waited 300 ns (effective -2) does.
void test_aged_runner_is_not_preempted_by_fresh_arrivals() {
    Scheduler sched(prio_config(1, 32, 32, 100), make_paged_kv(8, 4, false, 16, 100));
    Log log;
    add(sched, log, make_request(1, 3, 8, /*priority=*/2, 0));
    run_step(sched, log, 250);  // 1 is admitted after 250 ns in the queue: effective 2 - 2 = 0
    assert(sched.effective_priority(*sched.running()[0]) == 0);
    add(sched, log, make_request(2, 3, 2, /*priority=*/1, 250));
    const StepPlan & fresh = run_step(sched, log, 260);
    assert(fresh.preempted.empty() && is_scheduled(fresh, 1) && sched.num_waiting() == 1);
    const StepPlan & aged = run_step(sched, log, 250 + 300);  // 2: effective 1 - 3 = -2 < 0
    assert(is_preempted(aged, 1) && aged.preempted[0].for_priority && is_scheduled(aged, 2));
    run_all(sched, log, 560);
    assert(log.num_output[1] == 8 && log.num_output[2] == 2);
}

// A storm: 4 long priority-5 requests fill an 8-block pool, then urgent requests (priority 0 or
// 1, short) arrive two per step for 30 steps, with aging on. Every preemption mode: no crash,
// every request finishes exactly once with its full length, none runs out of blocks, urgent
// requests preempt (swap, recompute or both), and invariants hold after every step.
void test_storm_of_urgent_arrivals() {
    for (const cf_preemption_mode mode :
         { CF_PREEMPTION_MODE_SWAP, CF_PREEMPTION_MODE_RECOMPUTE, CF_PREEMPTION_MODE_AUTO }) {
        Scheduler sched(prio_config(4, 32, 32, /*aging_ns=*/50, mode), make_paged_kv(8, 4, false, 64, 100));
        sched.set_preemption_costs(1.0, 10.0);  // AUTO: 2 * 100 bytes per block vs 10 per token
        Log log;
        std::map<int64_t, int32_t> max_tokens;
        int64_t next_id = 1;
        for (int32_t i = 0; i < 4; ++i) {
            max_tokens[next_id] = 14;
            add(sched, log, make_request(next_id++, 6, 14, /*priority=*/5, 0));
        }
        int64_t now_ns = 0;
        for (int32_t step = 0; step < 30; ++step) {
            for (int32_t k = 0; k < 2 && step >= 2; ++k) {
                const int32_t max = 2 + (int32_t) (next_id % 5);
                max_tokens[next_id] = max;
                const int32_t prompt_len = 3 + (int32_t) (next_id % 3);
                add(sched, log, make_request(next_id, prompt_len, max, (int32_t) (next_id % 2), now_ns));
                ++next_id;
            }
            run_step(sched, log, now_ns);
            now_ns += kStepNs;
        }
        run_all(sched, log, now_ns);
        assert(log.finished.size() == max_tokens.size() && log.num_output.size() == max_tokens.size());
        for (const auto & [id, max] : max_tokens) {
            assert(log.num_output[id] == max);
        }
        assert(log.num_out_of_blocks == 0 && log.num_priority_preemptions > 0);
        assert(sched.preemption_stats().num_priority == log.num_priority_preemptions);
        assert(sched.kv().num_blocks_used() == 0 && sched.kv().num_host_blocks_used() == 0);
    }
}

}  // namespace

// Long prefills passed over keep their blocks reserved only against what comes after them: budget 8,
// T = 4, 16 blocks of 4. Step 0 runs 1 (20 tokens, priority 5) and admits 2 and 3 (same) unstarted, on
// 10 reserved blocks. An urgent 20-token arrival (priority 0) comes before them, so their reservation does
// not hold it back: it is admitted at the next step, as priority preemption's own check (which runs
// before anything is passed over) says it fits. Every request then completes.
void test_reservations_do_not_hold_back_an_urgent_arrival() {
    SchedulerConfig c = prio_config(8, 64, 64, kNoAging);
    c.max_num_batched_tokens = 8;
    c.long_prefill_token_threshold = 4;
    Scheduler sched(c, make_paged_kv(16, 4));
    Log log;
    for (int64_t id = 1; id <= 3; ++id) {
        add(sched, log, make_request(id, 20, 2, /*priority=*/5));
    }
    run_step(sched, log, 0);
    assert(sched.num_running() == 3 && sched.num_waiting() == 0 && sched.kv().num_blocks_used() == 2);
    add(sched, log, make_request(4, 20, 2, /*priority=*/0, kStepNs));
    const StepPlan & out = run_step(sched, log, kStepNs);
    assert(out.preempted.empty() && sched.num_running() == 4 && sched.num_waiting() == 0);
    run_all(sched, log, 2 * kStepNs);
    assert(log.finished.size() == 4 && log.num_output[4] == 2 && sched.kv().num_blocks_used() == 0);
}

int main() {
    test_urgent_arrival_preempts_least_urgent_for_a_place();
    test_urgent_arrival_preempts_least_urgent_for_blocks();
    test_equal_or_less_urgent_arrival_does_not_preempt();
    test_fcfs_within_priority();
    test_sjf_order();
    test_aging_lets_a_starving_request_in();
    test_aged_runner_is_not_preempted_by_fresh_arrivals();
    test_storm_of_urgent_arrivals();
    test_reservations_do_not_hold_back_an_urgent_arrival();
    std::printf("test_scheduler_priority: ok\n");
    return 0;
}
