// sampling.h - picks the next token of a sequence from its logits row.
//
// Greedy (temperature == 0): no sampler object. The engine normally takes the token chosen
// in-graph (LlamaSession::sampled_token); only when a row was not sampled in-graph does it come
// here: argmax over the row, ties to the lowest token id. Either way one engine always uses the
// same route, so a sequence gets the same tokens batched or alone whenever its logits agree.
// Otherwise: the sequence's own llama.cpp sampler chain top_k -> top_p -> min_p -> temp ->
// dist(seed), applied to a candidate buffer shared by all sequences (filled per call, never
// reallocated).
#pragma once

#include "core/sequence.h"
#include "llama.h"

#include <cstdint>
#include <vector>

namespace cf {

// Index of the largest of logits[0..n_vocab); the lowest index among equal maxima.
int32_t argmax_token(const float * logits, int32_t n_vocab);

// Sampler chain for a non-greedy sequence, or an empty handle for greedy ones.
OpaqueHandle make_sampler(const SamplingParams & params);

// New llama.cpp chain top_k -> top_p -> min_p -> temp -> dist(seed) of non-greedy params (the
// samplers that are disabled by their value are left out); the caller frees it.
llama_sampler * make_sampler_chain(const SamplingParams & params);

class TokenSampler {
  public:
    explicit TokenSampler(int32_t n_vocab);

    // Choose the next token of seq from logits [n_vocab] float. Only the stepping thread calls it.
    int32_t sample(Sequence & seq, const float * logits);

  private:
    int32_t n_vocab_;
    std::vector<llama_token_data> candidates_;  // [n_vocab]
};

}  // namespace cf
