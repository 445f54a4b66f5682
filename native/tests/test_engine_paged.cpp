// test_engine_paged.cpp - the engine in paged KV mode through the C ABI, on a real GGUF model.
//
// Needs CACHEFLOW_TEST_MODEL=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf (or any small llama-family
// GGUF); without it the test prints "skipped" and passes. Pools are tiny on purpose (16 blocks of 16
// tokens, llama.cpp's smallest n_ctx of 256) so that admission waits and growth failures happen:
//   - 64 sequences of mixed lengths share one pool that stock split mode could not even admit them to;
//   - a request whose prompt does not fit the free blocks waits, then runs (admission by free blocks);
//   - a sequence that cannot grow preempts a newer one, which later resumes (recompute) with the
//     same greedy output; alone, a sequence that outgrows the pool ends with CF_FINISH_REASON_LENGTH;
//   - block and byte statistics: used blocks back to 0, utilization of allocated blocks;
//   - prompt progress events (return_progress) per prompt chunk, cache hits counted as cached.
#undef NDEBUG  // the checks must run in Release builds too
#include "cacheflow.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

namespace {

const char * g_model = nullptr;

cf_engine_t make_engine(int32_t n_ctx, int32_t max_num_seqs, int32_t budget) {
    cf_engine_config c = cf_engine_default_config();
    c.model_path = g_model;
    c.kv_mode = CF_KV_MODE_PAGED;
    c.block_size = 16;
    c.n_ctx = n_ctx;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = budget;
    c.n_threads = 2;
    c.log_level = CF_LOG_LEVEL_NONE;
    cf_engine_t engine = nullptr;
    const cf_status rc = cf_engine_init(&c, &engine);
    if (rc != CF_STATUS_OK) {
        std::fprintf(stderr, "cf_engine_init: %d %s\n", rc, cf_last_error());
    }
    assert(rc == CF_STATUS_OK && engine != nullptr);
    return engine;
}

// n token ids starting at `start` (ordinary vocabulary entries, no special tokens).
std::vector<int32_t> tokens(int32_t n, int32_t start) {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < n; ++i) {
        out.push_back(1000 + (start + i * 7) % 5000);
    }
    return out;
}

int64_t add(cf_engine_t engine, const std::vector<int32_t> & prompt, int32_t max_tokens) {
    cf_sampling_params p = cf_sampling_params_default();
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    int64_t id = 0;
    const cf_status rc = cf_engine_add_request(engine, prompt.data(), (int32_t) prompt.size(), &p, 0, &id);
    assert(rc == CF_STATUS_OK && id > 0);
    return id;
}

struct Result {
    int32_t num_tokens = 0;
    int32_t finish_reason = CF_FINISH_REASON_NONE;
    int32_t num_preemptions = 0;
    std::vector<int32_t> token_ids;
};

struct Peak {
    int32_t num_running = 0;
    int32_t blocks_used = 0;
    double utilization = 1.0;  // lowest tokens stored / rows of allocated blocks, while >= 8 blocks used
};

cf_engine_stats stats_of(cf_engine_t engine) {
    cf_engine_stats s;
    assert(cf_engine_get_stats(engine, &s) == CF_STATUS_OK);
    return s;
}

// Step until no work is left; per-request results and peak statistics.
std::map<int64_t, Result> run_to_completion(cf_engine_t engine, Peak * peak) {
    std::map<int64_t, Result> results;
    cf_output_event events[256];
    while (cf_engine_has_work(engine)) {
        int32_t n_sched = 0;
        assert(cf_engine_step(engine, &n_sched) == CF_STATUS_OK);
        const cf_engine_stats s = stats_of(engine);
        assert(s.kv_blocks_total > 0 && s.kv_blocks_used <= s.kv_blocks_total);
        assert(s.kv_bytes_used <= s.kv_bytes_reserved);
        peak->num_running = std::max(peak->num_running, s.num_running);
        peak->blocks_used = std::max(peak->blocks_used, s.kv_blocks_used);
        if (s.kv_blocks_used >= 8) {
            peak->utilization = std::min(peak->utilization, (double) s.kv_bytes_used / (double) s.kv_bytes_reserved);
        }
        int32_t n = 0;
        do {
            assert(cf_engine_drain(engine, events, 256, 0, &n) == CF_STATUS_OK);
            for (int32_t i = 0; i < n; ++i) {
                Result & r = results[events[i].request_id];
                assert(r.finish_reason == CF_FINISH_REASON_NONE);
                if (events[i].token_id != CF_TOKEN_NONE) {
                    r.num_tokens += 1;
                    r.token_ids.push_back(events[i].token_id);
                }
                r.finish_reason = events[i].finish_reason;
                r.num_preemptions = events[i].num_preemptions;
            }
        } while (n > 0);
    }
    return results;
}

void expect_pool_empty(cf_engine_t engine) {
    const cf_engine_stats s = stats_of(engine);
    assert(s.num_running == 0 && s.num_waiting == 0 && s.kv_blocks_used == 0 && s.kv_bytes_reserved == 0);
}

void test_info() {
    cf_engine_t engine = make_engine(256, 4, 64);
    cf_model_info info;
    assert(cf_engine_get_info(engine, &info) == CF_STATUS_OK);
    assert(info.kv_mode == CF_KV_MODE_PAGED && info.block_size == 16 && info.n_ctx == 256);
    assert(info.n_ctx_per_seq == 256);  // no per-sequence slice: one sequence may take the whole pool
    const cf_engine_stats s = stats_of(engine);
    assert(s.kv_blocks_total == 16 && s.kv_blocks_used == 0 && s.kv_tokens_capacity == 256);
    cf_engine_free(engine);
}

// 64 sequences, prompts of 3..60 tokens (about 2,000 prompt tokens in all) over a pool of 512
// tokens: stock split mode would cut it into 64 slices of 8 rows and could admit none of these
// prompts but the shortest; here they all run, many at once, with little of the allocated blocks
// left idle.
void test_many_sequences_share_one_pool() {
    cf_engine_t engine = make_engine(512, 64, 256);
    std::vector<int64_t> ids;
    for (int32_t i = 0; i < 64; ++i) {
        ids.push_back(add(engine, tokens(3 + (i * 37) % 58, i), 8));
    }
    Peak peak;
    const std::map<int64_t, Result> results = run_to_completion(engine, &peak);
    for (int64_t id : ids) {
        assert(results.at(id).finish_reason == CF_FINISH_REASON_LENGTH && results.at(id).num_tokens == 8);
    }
    std::printf("  64 sequences of 3..60 tokens over 32 blocks: up to %d running at once, %d blocks used at peak, "
                "lowest KV utilization of allocated blocks %.0f%%\n",
                peak.num_running, peak.blocks_used, 100.0 * peak.utilization);
    assert(peak.num_running >= 8 && peak.utilization >= 0.6);  // short prompts: last blocks half empty
    expect_pool_empty(engine);
    cf_engine_free(engine);
}

// A prompt of 200 tokens takes 13 of the 16 blocks; a second of 100 tokens (7 blocks) waits for it.
void test_admission_waits_for_free_blocks() {
    cf_engine_t engine = make_engine(256, 4, 512);
    const int64_t big = add(engine, tokens(200, 0), 8);
    const int64_t small = add(engine, tokens(100, 1), 8);
    int32_t n_sched = 0;
    assert(cf_engine_step(engine, &n_sched) == CF_STATUS_OK && n_sched == 200);
    cf_engine_stats s = stats_of(engine);
    assert(s.num_running == 1 && s.num_waiting == 1 && s.kv_blocks_used == 13);
    Peak peak;
    const std::map<int64_t, Result> results = run_to_completion(engine, &peak);
    assert(results.at(big).num_tokens == 8 && results.at(big).finish_reason == CF_FINISH_REASON_LENGTH);
    assert(results.at(small).num_tokens == 8 && results.at(small).finish_reason == CF_FINISH_REASON_LENGTH);
    assert(peak.num_running == 1);
    expect_pool_empty(engine);
    cf_engine_free(engine);
}

// Two sequences of 100-token prompts that want 200 tokens each, in a pool of 256: they fill it;
// the newer one is preempted (blocks freed, back to waiting) and the older grows alone until it
// holds the whole pool (256 tokens: 156 generated) and ends with LENGTH. Then the preempted one
// computes its prompt and output again and goes on to 156 tokens too: greedy, its tokens equal
// those of the same request run alone.
void test_preempted_sequence_resumes_with_the_same_output() {
    cf_engine_t engine = make_engine(256, 4, 512);
    const std::vector<int32_t> prompt_a = tokens(100, 0);
    const std::vector<int32_t> prompt_b = tokens(100, 1);
    const int64_t a = add(engine, prompt_a, 200);
    const int64_t b = add(engine, prompt_b, 200);
    Peak peak;
    std::map<int64_t, Result> results = run_to_completion(engine, &peak);
    const Result ra = results.at(a);
    const Result rb = results.at(b);
    assert(ra.finish_reason == CF_FINISH_REASON_LENGTH && rb.finish_reason == CF_FINISH_REASON_LENGTH);
    assert(ra.num_tokens == 156 && rb.num_tokens == 156);
    assert(ra.num_preemptions == 0 && rb.num_preemptions >= 1);
    assert(stats_of(engine).num_preemptions == rb.num_preemptions);
    assert(peak.blocks_used == 16);
    expect_pool_empty(engine);

    const int64_t b_alone = add(engine, prompt_b, 200);
    results = run_to_completion(engine, &peak);
    const Result & rb_alone = results.at(b_alone);
    assert(rb_alone.num_preemptions == 0);
    int32_t same = 0;
    while (same < rb.num_tokens && rb.token_ids[(size_t) same] == rb_alone.token_ids[(size_t) same]) {
        same += 1;
    }
    std::printf("  pool of 16 blocks, two sequences wanting 300 tokens each: both got 156 tokens; the newer was "
                "preempted %d time(s) and matches its run alone on %d/%d tokens\n",
                rb.num_preemptions, same, rb.num_tokens);
    assert(same == rb.num_tokens);
    expect_pool_empty(engine);
    cf_engine_free(engine);
}

// return_progress: a 40-token prompt under a 16-token budget reports processed 0 (before any
// token is computed), 8, 23, 39, 40 (the default long-prefill rule, half the budget: in the first
// step the 8-token request beside it takes the other 8, in the second its decode token one), each
// ahead of the request's first token; the request beside it, which did not ask, gets none; the
// repeat of the prompt counts its prefix cache hits as cached.
void test_prompt_progress_events() {
    cf_engine_t engine = make_engine(256, 2, 16);
    const std::vector<int32_t> prompt = tokens(40, 3);
    auto run = [&](bool with_plain) {
        cf_sampling_params p = cf_sampling_params_default();
        p.max_tokens = 2;
        p.ignore_eos = 1;
        p.return_progress = 1;
        int64_t id = 0;
        assert(cf_engine_add_request(engine, prompt.data(), (int32_t) prompt.size(), &p, 0, &id) == CF_STATUS_OK);
        const int64_t plain = with_plain ? add(engine, tokens(8, 900), 2) : -1;
        std::vector<cf_output_event> progress;
        int32_t num_tokens = 0;
        cf_output_event events[64];
        while (cf_engine_has_work(engine)) {
            int32_t n_sched = 0;
            assert(cf_engine_step(engine, &n_sched) == CF_STATUS_OK);
            int32_t n = 0;
            assert(cf_engine_drain(engine, events, 64, 0, &n) == CF_STATUS_OK);
            for (int32_t i = 0; i < n; ++i) {
                const cf_output_event & ev = events[i];
                if (ev.request_id == plain) {
                    assert(ev.prompt_progress == 0 && ev.num_prompt_processed == 0);
                    continue;
                }
                assert(ev.request_id == id);
                if (ev.prompt_progress) {
                    assert(num_tokens == 0);  // every report comes before the first token
                    assert(ev.token_id == CF_TOKEN_NONE && ev.finish_reason == CF_FINISH_REASON_NONE);
                    assert(ev.text_len == 0 && ev.num_logprobs == 0 && ev.num_prompt_tokens == 40);
                    progress.push_back(ev);
                } else if (ev.token_id != CF_TOKEN_NONE) {
                    num_tokens += 1;
                }
            }
        }
        assert(num_tokens == 2);
        for (size_t i = 0; i < progress.size(); ++i) {
            assert(progress[i].num_cached_tokens == progress[0].num_cached_tokens);
            assert(progress[i].first_scheduled_ns == progress[0].time_ns);  // the first: when it was scheduled
            assert(i == 0 || progress[i].time_ns > progress[i - 1].time_ns);
        }
        return progress;
    };
    std::vector<cf_output_event> cold = run(true);
    assert(cold.size() == 5 && cold[0].num_cached_tokens == 0);
    const int32_t expected[] = {0, 8, 23, 39, 40};
    for (size_t i = 0; i < cold.size(); ++i) {
        assert(cold[i].num_prompt_processed == expected[i]);
    }
    // the prompt's blocks stay cached; a fully cached prompt still computes its last token
    std::vector<cf_output_event> warm = run(false);
    assert(warm.size() == 2 && warm[0].num_cached_tokens == 39);
    assert(warm[0].num_prompt_processed == 39 && warm[1].num_prompt_processed == 40);
    expect_pool_empty(engine);
    cf_engine_free(engine);
}

}  // namespace

int main() {
    g_model = std::getenv("CACHEFLOW_TEST_MODEL");
    if (g_model == nullptr || g_model[0] == '\0') {
        std::printf("test_engine_paged: skipped (set CACHEFLOW_TEST_MODEL to a small llama-family GGUF)\n");
        return 0;
    }
    test_info();
    test_many_sequences_share_one_pool();
    test_admission_waits_for_free_blocks();
    test_preempted_sequence_resumes_with_the_same_output();
    test_prompt_progress_events();
    std::printf("test_engine_paged: ok\n");
    return 0;
}
