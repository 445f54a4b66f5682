// test_sampling_pool.cpp - sample_candidates (engine/sampling.h) against the sequence's llama.cpp
// chain applied to the same unsorted candidates (llama.cpp's own top_k sort), with and without a
// logit bias; equal logits whatever the candidates' order; and SamplingPool (engine/sampling_pool.h):
// the same tokens on 1 and on 4 threads, a failing row reported once every thread let go.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/error.h"
#include "engine/config.h"
#include "engine/sampling.h"
#include "engine/sampling_pool.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace cf;

namespace {

constexpr int32_t kN = 64;  // LlamaSession::kTopKCandidates
constexpr int32_t kVocab = 49152;

struct Row {
    std::vector<int32_t> ids;
    std::vector<float> logits;
};

// kN distinct token ids and distinct logits with a model-like spread, in random order.
Row make_row(std::mt19937 & rng) {
    Row r;
    std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
    std::normal_distribution<float> noise(0.0f, 0.5f);
    while ((int32_t) r.ids.size() < kN) {
        const int32_t id = token(rng);
        if (std::find(r.ids.begin(), r.ids.end(), id) == r.ids.end()) {
            r.ids.push_back(id);
            r.logits.push_back(12.0f - 3.0f * std::log(1.0f + (float) r.ids.size()) + noise(rng));
        }
    }
    std::vector<size_t> order((size_t) kN);
    for (size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
    }
    std::shuffle(order.begin(), order.end(), rng);
    Row shuffled;
    for (size_t i : order) {
        shuffled.ids.push_back(r.ids[i]);
        shuffled.logits.push_back(r.logits[i]);
    }
    return shuffled;
}

SamplingParams llama_server_defaults(int64_t seed) {
    cf_sampling_params p = default_sampling_params();
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.seed = seed;
    return SamplingParams::from_c(p, 0);
}

// The chain make_sampler_chain builds, which needs a vocab only for the logit bias's n_vocab.
llama_sampler * chain_for(const SamplingParams & p) {
    if (p.logit_bias.empty()) {
        return make_sampler_chain(p);
    }
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    llama_sampler * chain = llama_sampler_chain_init(cp);
    std::vector<llama_logit_bias> biases;
    for (const auto & [token, bias] : p.logit_bias) {
        biases.push_back(llama_logit_bias{token, bias});
    }
    llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(kVocab, (int32_t) biases.size(), biases.data()));
    if (p.is_greedy()) {
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
        return chain;
    }
    llama_sampler_chain_add(chain, llama_sampler_init_top_k(p.top_k));
    llama_sampler_chain_add(chain, llama_sampler_init_top_p(p.top_p, 1));
    llama_sampler_chain_add(chain, llama_sampler_init_min_p(p.min_p, 1));
    llama_sampler_chain_add(chain, llama_sampler_init_temp(p.temperature));
    llama_sampler_chain_add(chain, llama_sampler_init_dist((uint32_t) p.seed));
    return chain;
}

void free_chain(void * ptr) {
    llama_sampler_free(static_cast<llama_sampler *>(ptr));
}

std::unique_ptr<Sequence> make_seq(const SamplingParams & p, int64_t request_id = 1) {
    const int32_t prompt[1] = {1};
    auto seq = std::make_unique<Sequence>(request_id, prompt, 1, p, 0, 0, 16);
    seq->sampler = OpaqueHandle(chain_for(p), free_chain);
    return seq;
}

// The reference: seq's whole chain over the unsorted candidates, as before sample_candidates sorted.
int32_t llama_chain_token(Sequence & seq, const Row & r) {
    std::vector<llama_token_data> data;
    for (int32_t i = 0; i < kN; ++i) {
        data.push_back(llama_token_data{r.ids[(size_t) i], r.logits[(size_t) i], 0.0f});
    }
    llama_token_data_array cur = {data.data(), data.size(), -1, false};
    auto * chain = static_cast<llama_sampler *>(seq.sampler.get());
    llama_sampler_apply(chain, &cur);
    const int32_t token = cur.data[cur.selected].id;
    llama_sampler_accept(chain, token);
    return token;
}

// Both routes, one sequence each with the same parameters, over the same rows, step after step.
void check_same_tokens_as_the_llama_chain(const SamplingParams & p, uint32_t data_seed) {
    std::mt19937 rng(data_seed);
    auto ours = make_seq(p);
    auto theirs = make_seq(p);
    CandidateScratch scratch(kN);
    for (int32_t step = 0; step < 200; ++step) {
        Row r = make_row(rng);
        for (const auto & [token, bias] : p.logit_bias) {  // the biased tokens among the candidates
            r.ids[(size_t) (token % kN)] = token;
        }
        const int32_t expected = llama_chain_token(*theirs, r);
        assert(sample_candidates(*ours, r.ids.data(), r.logits.data(), kN, scratch) == expected);
    }
}

void test_candidates_sample_what_the_llama_chain_samples() {
    for (int64_t seed : {1, 42, 1234567}) {
        check_same_tokens_as_the_llama_chain(llama_server_defaults(seed), (uint32_t) seed);
    }
}

void test_a_lowering_logit_bias_is_applied_before_the_sort() {
    SamplingParams p = llama_server_defaults(7);
    p.logit_bias = {{5, -INFINITY}, {70001 % kVocab, -INFINITY}, {130, -3.0f}, {131, -0.5f}};
    check_same_tokens_as_the_llama_chain(p, 7);
    SamplingParams greedy = p;  // greedy with a bias: [logit_bias ->] greedy, no top_k
    greedy.temperature = 0.0f;
    check_same_tokens_as_the_llama_chain(greedy, 8);
}

// Equal logits are ranked by token id, so the candidates' order does not change the token.
void test_equal_logits_do_not_depend_on_the_candidates_order() {
    std::mt19937 rng(3);
    Row r = make_row(rng);
    for (size_t i = 0; i < r.logits.size(); i += 2) {
        r.logits[i + 1] = r.logits[i];  // pairs of equal logits
    }
    CandidateScratch scratch(kN);
    for (int32_t round = 0; round < 20; ++round) {
        const SamplingParams p = llama_server_defaults(100 + round);
        auto a = make_seq(p);
        auto b = make_seq(p);
        Row shuffled = r;
        std::vector<size_t> order((size_t) kN);
        for (size_t i = 0; i < order.size(); ++i) {
            order[i] = i;
        }
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t i = 0; i < order.size(); ++i) {
            shuffled.ids[i] = r.ids[order[i]];
            shuffled.logits[i] = r.logits[order[i]];
        }
        assert(sample_candidates(*a, r.ids.data(), r.logits.data(), kN, scratch) ==
               sample_candidates(*b, shuffled.ids.data(), shuffled.logits.data(), kN, scratch));
    }
}

void test_nan_logits_leave_the_row_to_llama_cpp() {
    std::mt19937 rng(5);
    Row r = make_row(rng);
    r.logits[10] = NAN;
    auto ours = make_seq(llama_server_defaults(9));
    auto theirs = make_seq(llama_server_defaults(9));
    CandidateScratch scratch(kN);
    assert(sample_candidates(*ours, r.ids.data(), r.logits.data(), kN, scratch) == llama_chain_token(*theirs, r));
}

// Rows of a fixed set of sequences over several steps: every token, in row order.
std::vector<int32_t> pool_tokens(int32_t num_threads, int32_t num_rows, int32_t num_steps) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int32_t i = 0; i < num_rows; ++i) {
        seqs.push_back(make_seq(llama_server_defaults(1000 + i), i + 1));
    }
    SamplingPool pool(num_threads, kN);
    assert(pool.num_threads() == num_threads);
    std::mt19937 rng(11);
    std::vector<Row> data;
    std::vector<CandidateRow> rows((size_t) num_rows);
    std::vector<int32_t> tokens;
    for (int32_t step = 0; step < num_steps; ++step) {
        data.clear();
        for (int32_t i = 0; i < num_rows; ++i) {
            data.push_back(make_row(rng));
        }
        for (int32_t i = 0; i < num_rows; ++i) {
            rows[(size_t) i] = CandidateRow{seqs[(size_t) i].get(), data[(size_t) i].ids.data(),
                                            data[(size_t) i].logits.data(), kN, (size_t) i, CF_TOKEN_NONE};
        }
        pool.sample(rows.data(), rows.size());
        for (const CandidateRow & row : rows) {
            assert(row.token != CF_TOKEN_NONE);
            tokens.push_back(row.token);
        }
    }
    return tokens;
}

void test_threads_give_the_serial_tokens() {
    for (int32_t num_rows : {3, (int32_t) SamplingPool::kMinParallelRows, 100}) {
        const std::vector<int32_t> serial = pool_tokens(1, num_rows, 30);
        assert(pool_tokens(2, num_rows, 30) == serial);
        assert(pool_tokens(4, num_rows, 30) == serial);
    }
}

void test_a_failing_row_is_reported_and_the_pool_goes_on() {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int32_t i = 0; i < 40; ++i) {
        seqs.push_back(make_seq(llama_server_defaults(i), i + 1));
    }
    seqs[17]->sampler.reset();  // no chain: sample_candidates throws for it
    std::mt19937 rng(13);
    const Row r = make_row(rng);
    std::vector<CandidateRow> rows;
    for (size_t i = 0; i < seqs.size(); ++i) {
        rows.push_back(CandidateRow{seqs[i].get(), r.ids.data(), r.logits.data(), kN, i, CF_TOKEN_NONE});
    }
    SamplingPool pool(4, kN);
    bool thrown = false;
    try {
        pool.sample(rows.data(), rows.size());
    } catch (const Error & e) {
        thrown = std::string(e.what()).find("request 18") != std::string::npos;
    }
    assert(thrown);
    rows.erase(rows.begin() + 17);
    pool.sample(rows.data(), rows.size());  // every worker let go of the failed job
    for (const CandidateRow & row : rows) {
        assert(row.token != CF_TOKEN_NONE);
    }
    rows[0].n = kN + 1;  // more than the scratch holds: refused before any row is sampled
    thrown = false;
    try {
        pool.sample(rows.data(), rows.size());
    } catch (const Error &) {
        thrown = true;
    }
    assert(thrown);
}

}  // namespace

int main() {
    test_candidates_sample_what_the_llama_chain_samples();
    test_a_lowering_logit_bias_is_applied_before_the_sort();
    test_equal_logits_do_not_depend_on_the_candidates_order();
    test_nan_logits_leave_the_row_to_llama_cpp();
    test_threads_give_the_serial_tokens();
    test_a_failing_row_is_reported_and_the_pool_goes_on();
    std::printf("test_sampling_pool: ok\n");
    return 0;
}
