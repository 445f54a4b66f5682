// sampling.h - picks the next token of a sequence from its logits row.
//
// Greedy (temperature == 0): no sampler object. The engine normally takes the token chosen
// in-graph (LlamaSession::sampled_token); only when a row was not sampled in-graph does it come
// here: argmax over the row, ties to the lowest token id. Either way one engine always uses the
// same route, so a sequence gets the same tokens batched or alone whenever its logits agree.
// Otherwise: the sequence's own llama.cpp sampler chain top_k -> top_p -> min_p -> temp ->
// dist(seed), applied to a candidate buffer (TokenSampler's, shared by the rows it samples one after
// the other; or, for top-k candidate rows, one scratch buffer per thread of SamplingPool, filled per
// call, never reallocated). Penalties and a logit bias (llama.cpp's penalties and logit_bias samplers) come
// first in the chain; a greedy sequence that has them gets a chain ending in greedy (argmax on
// the CPU). Rows with penalties, a grammar or token probabilities (logprobs.h: they need the
// logits row or this sampler's candidates) leave the in-graph argmax; a logit bias alone runs
// in-graph too (LlamaSession), so its CPU chain here only serves rows not sampled in-graph.
// llama-server's other samplers take their places in its order (DRY after the penalties;
// top_n_sigma, top_k, typical_p, top_p, min_p, XTC, then the temperature, dynamic with a
// dynatemp_range; mirostat: temperature -> mirostat instead); rows with them are sampled here
// from the whole row (SamplingParams::needs_host_samplers), a greedy row with DRY, XTC or
// typical_p too (its chain ends in greedy).
#pragma once

#include "core/sequence.h"
#include "llama.h"

#include <cstdint>
#include <vector>

namespace cf {

// Index of the largest of logits[0..n_vocab); the lowest index among equal maxima.
int32_t argmax_token(const float * logits, int32_t n_vocab);

// Sampler chain for a sequence, or an empty handle for plain greedy ones (no penalty, bias or
// grammar). prompt: [num_prompt_tokens] token ids, fed to the penalties only (llama-server's
// rule: prompt tokens count as seen). Throws Error(INVALID_ARGUMENT) for a grammar llama.cpp
// cannot parse.
OpaqueHandle make_sampler(const SamplingParams & params, const llama_vocab * vocab, const int32_t * prompt = nullptr,
                          int32_t num_prompt_tokens = 0);

// New llama.cpp chain [reasoning budget ->] [logit_bias ->] [penalties ->] [dry ->] [grammar ->]
// then [top_n_sigma ->] top_k -> [typical_p ->] top_p -> min_p -> [xtc ->] temp (temp_ext with a
// dynatemp_range) -> dist(seed); greedy params: greedy after the grammar (after the truncation
// samplers when XTC or typical_p is on); mirostat: temp -> mirostat (1 or 2) after the grammar,
// no penalties or DRY. Samplers disabled by their value are left out. A logit bias, penalties,
// DRY, mirostat or a grammar need the vocab. prompt feeds the penalties and DRY (their window's
// last tokens). The caller frees it.
llama_sampler * make_sampler_chain(const SamplingParams & params, const llama_vocab * vocab = nullptr,
                                   const int32_t * prompt = nullptr, int32_t num_prompt_tokens = 0);

// Working memory of sample_candidates for rows of up to max_candidates candidates, sized once.
struct CandidateScratch {
    explicit CandidateScratch(int32_t max_candidates);
    std::vector<llama_token_data> data;  // [max_candidates] the chain's candidates
    std::vector<int32_t> ids;            // [max_candidates] a biased row's candidates, to sort them
    std::vector<float> logits;           // [max_candidates]
};

// seq's chain over n candidates (ids [n], logits [n], any order: LlamaSession::top_k_candidates):
// the chosen token, accepted by the chain. The same token as TokenSampler::sample() over the whole
// row when the chain starts with top_k(k), k <= n, and the candidates are the row's n largest
// logits (top_k keeps the same k tokens from either; ties at the k-th logit aside). The candidates
// reach top_k sorted (descending logits, equal logits by ascending token id), which spares it its
// partial sort: the same k tokens in the same order for distinct logits, and an order of equal
// logits that does not depend on the candidates' order. seq must have a chain (a stochastic
// sequence, or a greedy one with a logit bias) and n <= scratch's size; throws Error(INTERNAL)
// otherwise. Touches only seq (its chain and generator) and scratch: rows of distinct sequences
// may be sampled on distinct threads at once (SamplingPool), each sequence's tokens the same as
// sampled one row after the other.
int32_t sample_candidates(Sequence & seq, const int32_t * ids, const float * logits, int32_t n,
                          CandidateScratch & scratch);

class TokenSampler {
  public:
    explicit TokenSampler(int32_t n_vocab);

    // Choose the next token of seq from logits [n_vocab] float. Only the stepping thread calls it.
    int32_t sample(Sequence & seq, const float * logits);

    // The candidates the last sample() call drew from, after its chain, with the probabilities of
    // llama.cpp's dist sampler (logprobs.h post-sampling); nullptr when that call sampled greedily
    // (argmax or a chain ending in greedy: no probabilities). Valid until the next sample().
    llama_token_data_array * last_candidates() { return last_drawn_ ? &last_ : nullptr; }

  private:
    int32_t n_vocab_;
    std::vector<llama_token_data> candidates_;  // [n_vocab]
    llama_token_data_array last_{};             // the last chain's candidates (views candidates_)
    bool last_drawn_ = false;                   // last_ holds a stochastic draw
};

}  // namespace cf
