// test_logprobs.cpp - LogprobsCollector (engine/logprobs.h) against a direct softmax: raw
// probabilities over the whole row, sorted, capped; post-sampling probabilities from a real
// llama.cpp chain (top_k -> temp -> dist) and the greedy case; and the EventQueue carrying
// them with events (packed per drain, kept for the next drain when the buffer is short).
#undef NDEBUG  // the checks must run in Release builds too
#include "engine/event_queue.h"
#include "engine/logprobs.h"

#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <vector>

using namespace cf;

namespace {

bool near(double a, double b, double tol = 1e-5) {
    return std::fabs(a - b) <= tol;
}

void test_raw_probabilities_are_the_softmax_of_the_row_top_first() {
    const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    double sum = 0.0;
    for (float l : logits) {
        sum += std::exp((double) l);
    }
    LogprobsCollector collector;
    std::vector<cf_token_logprob> out;
    assert(collector.append_raw(logits.data(), 5, 4, 3, out) == 4);
    assert(out[0].token_id == 4 && near(out[0].logprob, 0.5 - std::log(sum)));
    // top 3 by logit; the tie between tokens 1 and 3 goes to the lower id first
    assert(out[1].token_id == 1 && out[2].token_id == 3 && out[3].token_id == 0);
    assert(near(out[1].logprob, 3.0 - std::log(sum)) && out[1].logprob == out[2].logprob);
    assert(out[3].logprob < out[2].logprob && out[3].logprob <= 0.0f);
}

void test_raw_top_n_is_capped_at_the_vocabulary_and_sums_to_one() {
    const std::vector<float> logits = {0.0f, -1.0f, 2.0f};
    LogprobsCollector collector;
    std::vector<cf_token_logprob> out;
    assert(collector.append_raw(logits.data(), 3, 2, 10, out) == 4);
    double total = 0.0;
    for (size_t i = 1; i < out.size(); ++i) {
        total += std::exp((double) out[i].logprob);
    }
    assert(near(total, 1.0));
    out.clear();
    assert(collector.append_raw(logits.data(), 3, 0, 0, out) == 1);  // the sampled token only
}

void test_post_sampling_reads_the_chains_candidates() {
    const int32_t n_vocab = 6;
    std::vector<llama_token_data> data;
    for (int32_t i = 0; i < n_vocab; ++i) {
        data.push_back(llama_token_data{i, (float) i, 0.0f});
    }
    llama_token_data_array cur = {data.data(), data.size(), -1, false};
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(chain, llama_sampler_init_top_k(3));
    llama_sampler_chain_add(chain, llama_sampler_init_temp(1.0f));
    llama_sampler_chain_add(chain, llama_sampler_init_dist(42));
    llama_sampler_apply(chain, &cur);
    const int32_t token = cur.data[cur.selected].id;
    llama_sampler_free(chain);
    assert(cur.size == 3 && token >= 3);

    LogprobsCollector collector;
    std::vector<cf_token_logprob> out;
    assert(collector.append_post_sampling(&cur, token, 10, out) == 4);  // 3 candidates left
    const double norm = std::exp(5.0) + std::exp(4.0) + std::exp(3.0);
    assert(out[0].token_id == token && near(out[0].logprob, token - std::log(norm)));
    assert(out[1].token_id == 5 && out[2].token_id == 4 && out[3].token_id == 3);
    assert(near(out[1].logprob, 5.0 - std::log(norm)));
}

void test_post_sampling_greedy_is_certain() {
    LogprobsCollector collector;
    std::vector<cf_token_logprob> out;
    assert(collector.append_post_sampling(nullptr, 7, 5, out) == 2);
    assert(out[0].token_id == 7 && out[0].logprob == 0.0f && out[1].token_id == 7 && out[1].logprob == 0.0f);
    assert(log_probability(0.0f) == -FLT_MAX);
}

cf_output_event event(int64_t request_id, int32_t num_logprobs, int64_t logprobs_offset) {
    cf_output_event ev{};
    ev.request_id = request_id;
    ev.num_logprobs = num_logprobs;
    ev.logprobs_offset = logprobs_offset;
    return ev;
}

void test_event_queue_packs_probabilities_per_drain() {
    EventQueue queue;
    // step 1: request 1 with two entries, request 2 without; step 2: request 1 with three
    queue.push({event(1, 2, 0), event(2, 0, 0)}, "", {{10, -0.1f}, {11, -0.2f}});
    queue.push({event(1, 3, 0)}, "", {{20, -1.0f}, {21, -2.0f}, {22, -3.0f}});
    cf_output_event out[4];
    cf_token_logprob logprobs[4];
    int32_t text_len = 0;
    int32_t num_logprobs = 0;
    char text[1];
    DrainBuffers buffers{text, 0, &text_len, logprobs, 4, &num_logprobs};
    assert(queue.drain(out, 4, 0, buffers) == 2);  // the third event's entries do not fit
    assert(num_logprobs == 2 && out[0].logprobs_offset == 0 && out[1].num_logprobs == 0);
    assert(logprobs[1].token_id == 11);
    buffers.logprobs_capacity = 2;
    assert(queue.drain(out, 4, 0, buffers) == 0 && num_logprobs == 3);  // the oldest needs 3
    buffers.logprobs_capacity = 4;
    assert(queue.drain(out, 4, 0, buffers) == 1 && num_logprobs == 3);
    assert(out[0].logprobs_offset == 0 && logprobs[2].token_id == 22 && logprobs[2].logprob == -3.0f);
}

}  // namespace

int main() {
    test_raw_probabilities_are_the_softmax_of_the_row_top_first();
    test_raw_top_n_is_capped_at_the_vocabulary_and_sums_to_one();
    test_post_sampling_reads_the_chains_candidates();
    test_post_sampling_greedy_is_certain();
    test_event_queue_packs_probabilities_per_drain();
    std::printf("test_logprobs: OK\n");
    return 0;
}
