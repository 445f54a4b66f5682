// logprobs.h - token probabilities of a sampled row (llama-server's n_probs, OpenAI's logprobs).
//
// Two kinds, as llama-server reports them (cf_sampling_params.post_sampling_probs):
//   raw (default):  softmax over the whole vocabulary of the row's logits as the model produced
//                   them (before logit bias, penalties, grammar, temperature), top n by logit;
//   post-sampling:  the candidates the request's sampler chain left, with the probabilities
//                   llama.cpp's dist sampler drew from (normalised over those candidates), top n
//                   by probability, tokens of probability 0 left out. A greedy row drew from
//                   nothing: its token has probability 1 and is the only one listed.
// Each call appends one entry for the sampled token, then up to top_n entries in decreasing
// probability (ties by logit order, then lower token id first for raw rows).
#pragma once

#include "cacheflow.h"
#include "llama.h"

#include <cstdint>
#include <vector>

namespace cf {

// Natural log of a probability in [0, 1]; 0 becomes -FLT_MAX (stays finite, as llama-server's).
float log_probability(float p);

class LogprobsCollector {
  public:
    // Raw probabilities of logits [n_vocab] float (the sampled token_id's and the top_n most
    // likely, capped at n_vocab), appended to out. Returns the entries appended (1 + top_n).
    // Only the stepping thread calls it (it reuses a scratch buffer).
    int32_t append_raw(const float * logits, int32_t n_vocab, int32_t token_id, int32_t top_n,
                       std::vector<cf_token_logprob> & out);

    // Post-sampling probabilities: cur holds the candidates after the chain with .p set by the
    // dist sampler (it may be reordered here), or is nullptr when the row was sampled greedily.
    // Returns the entries appended (1 + at most top_n).
    int32_t append_post_sampling(llama_token_data_array * cur, int32_t token_id, int32_t top_n,
                                 std::vector<cf_token_logprob> & out);

  private:
    std::vector<int32_t> order_;  // [n_vocab] scratch: token ids, partially sorted by logit
};

}  // namespace cf
