// reasoning_budget.cpp - see reasoning_budget.h.
#include "engine/reasoning_budget.h"

#include "core/error.h"
#include "reasoning-budget.h"  // llama.cpp's common/

namespace cf {

llama_sampler * make_reasoning_budget_sampler(const llama_vocab * vocab, const ReasoningBudget & budget) {
    const llama_tokens start(budget.start.begin(), budget.start.end());
    const llama_tokens end(budget.end.begin(), budget.end.end());
    const llama_tokens forced(budget.forced.begin(), budget.forced.end());
    llama_sampler * sampler = common_reasoning_budget_init(vocab, {start}, {end}, forced, budget.tokens);
    if (sampler == nullptr) {
        throw Error(CF_STATUS_INTERNAL, "llama.cpp made no reasoning-budget sampler");
    }
    for (const int32_t token : budget.prefill) {
        llama_sampler_accept(sampler, token);
    }
    return sampler;
}

bool reasoning_block_open(const llama_sampler * sampler) {
    const common_reasoning_budget_state state = common_reasoning_budget_get_state(sampler);
    return state != REASONING_BUDGET_IDLE && state != REASONING_BUDGET_DONE;
}

}  // namespace cf
