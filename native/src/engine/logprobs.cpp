// logprobs.cpp - see logprobs.h.
#include "engine/logprobs.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>

namespace cf {

float log_probability(float p) {
    return p > 0.0f ? std::log(p) : -FLT_MAX;
}

int32_t LogprobsCollector::append_raw(const float * logits, int32_t n_vocab, int32_t token_id, int32_t top_n,
                                      std::vector<cf_token_logprob> & out) {
    // log p_i = logit_i - (max + log sum_j exp(logit_j - max)): one pass for the max, one for the
    // sum, in double so that a 50k-token vocabulary does not lose the small terms.
    const float max_logit = *std::max_element(logits, logits + n_vocab);
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += std::exp((double) logits[i] - max_logit);
    }
    const double log_norm = (double) max_logit + std::log(sum);
    auto logprob = [&](int32_t id) { return log_probability((float) std::exp((double) logits[id] - log_norm)); };
    out.push_back(cf_token_logprob{token_id, logprob(token_id)});
    const int32_t n = std::min(top_n, n_vocab);
    if (n <= 0) {
        return 1;
    }
    order_.resize((size_t) n_vocab);
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), [logits](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) {
        out.push_back(cf_token_logprob{order_[(size_t) i], logprob(order_[(size_t) i])});
    }
    return 1 + n;
}

int32_t LogprobsCollector::append_post_sampling(llama_token_data_array * cur, int32_t token_id, int32_t top_n,
                                                std::vector<cf_token_logprob> & out) {
    if (cur == nullptr) {  // greedy: the token was certain
        out.push_back(cf_token_logprob{token_id, 0.0f});
        if (top_n > 0) {
            out.push_back(cf_token_logprob{token_id, 0.0f});
            return 2;
        }
        return 1;
    }
    float sampled_p = 0.0f;
    for (size_t i = 0; i < cur->size; ++i) {
        if (cur->data[i].id == token_id) {
            sampled_p = cur->data[i].p;
            break;
        }
    }
    out.push_back(cf_token_logprob{token_id, log_probability(sampled_p)});
    const size_t n = std::min((size_t) std::max(top_n, 0), cur->size);
    std::partial_sort(cur->data, cur->data + n, cur->data + cur->size,
                      [](const llama_token_data & a, const llama_token_data & b) { return a.p > b.p; });
    int32_t appended = 1;
    for (size_t i = 0; i < n && cur->data[i].p > 0.0f; ++i) {
        out.push_back(cf_token_logprob{cur->data[i].id, log_probability(cur->data[i].p)});
        ++appended;
    }
    return appended;
}

}  // namespace cf
