// reasoning_budget.h - llama.cpp's reasoning-budget sampler (common/reasoning-budget.h of the
// pinned tree, the one llama-server puts in front of its sampler chain for --reasoning-budget)
// made from a request's ReasoningBudget. Kept apart from sampling.cpp so that only this unit
// sees common/'s headers.
#pragma once

#include "core/sequence.h"

struct llama_sampler;
struct llama_vocab;

namespace cf {

// A new sampler (owned by the caller; llama_sampler_free) limiting the tokens of a reasoning
// block to budget.tokens, with budget.prefill accepted already (llama-server's order: the
// generation prompt's tokens before the first sampled one). budget must be enabled(); vocab
// (not owned, may be nullptr) tells the sampler where UTF-8 characters end. Throws
// Error(INTERNAL) if llama.cpp returns no sampler.
llama_sampler * make_reasoning_budget_sampler(const llama_vocab * vocab, const ReasoningBudget & budget);

// True while the reasoning block of sampler (one make_reasoning_budget_sampler made) is open: its
// tokens are being counted, or its end is being forced.
bool reasoning_block_open(const llama_sampler * sampler);

}  // namespace cf
