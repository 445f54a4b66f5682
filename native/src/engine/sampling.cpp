// sampling.cpp - see sampling.h.
#include "engine/sampling.h"

#include "core/error.h"


namespace cf {

namespace {

void free_sampler(void * ptr) {
    llama_sampler_free(static_cast<llama_sampler *>(ptr));
}

uint32_t seed_of(int64_t seed) {
    // CF_SEED_RANDOM maps to llama.cpp's "random seed"; other seeds are taken modulo 2^32.
    return seed == CF_SEED_RANDOM ? LLAMA_DEFAULT_SEED : (uint32_t) (uint64_t) seed;
}

// cur->selected of a chain that has been applied: the token, accepted by the chain.
int32_t accept_selected(Sequence & seq, llama_sampler * chain, const llama_token_data_array & cur) {
    if (cur.selected < 0 || (size_t) cur.selected >= cur.size) {
        throw Error(CF_STATUS_INTERNAL, "sampler chain selected no token for request " + std::to_string(seq.request_id));
    }
    const int32_t token = cur.data[cur.selected].id;
    llama_sampler_accept(chain, token);
    return token;
}

// seq's chain over cur: the chosen token, accepted by the chain (cur keeps the chain's candidates).
int32_t apply_chain(Sequence & seq, llama_token_data_array * cur) {
    auto * chain = static_cast<llama_sampler *>(seq.sampler.get());
    llama_sampler_apply(chain, cur);
    return accept_selected(seq, chain, *cur);
}

}  // namespace

int32_t argmax_token(const float * logits, int32_t n_vocab) {
    int32_t best = 0;
    float best_logit = logits[0];
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > best_logit) {
            best_logit = logits[i];
            best = i;
        }
    }
    return best;
}

OpaqueHandle make_sampler(const SamplingParams & params, const llama_vocab * vocab, const int32_t * prompt,
                          int32_t num_prompt_tokens) {
    if (params.is_greedy() && !params.needs_cpu_samplers()) {
        return OpaqueHandle(nullptr, opaque_handle_no_free);
    }
    return OpaqueHandle(make_sampler_chain(params, vocab, prompt, num_prompt_tokens), free_sampler);
}

llama_sampler * make_sampler_chain(const SamplingParams & params, const llama_vocab * vocab, const int32_t * prompt,
                                   int32_t num_prompt_tokens) {
    if (params.needs_cpu_samplers() && vocab == nullptr) {
        throw Error(CF_STATUS_INTERNAL, "logit bias, penalties and grammars need the vocab");
    }
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    llama_sampler * chain = llama_sampler_chain_init(cp);
    const int32_t n_vocab = vocab != nullptr ? llama_vocab_n_tokens(vocab) : 0;
    if (!params.logit_bias.empty()) {
        std::vector<llama_logit_bias> biases;
        for (const auto & [token, bias] : params.logit_bias) {
            biases.push_back(llama_logit_bias{token, bias});
        }
        llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(n_vocab, (int32_t) biases.size(), biases.data()));
    }
    if (params.has_penalties()) {
        llama_sampler * penalties = llama_sampler_init_penalties(n_vocab, params.repeat_last_n, params.repeat_penalty,
                                                                 params.frequency_penalty, params.presence_penalty);
        // only the last repeat_last_n prompt tokens matter to the penalties' window
        const int32_t window = params.repeat_last_n;
        const int32_t first = window > 0 && window < num_prompt_tokens ? num_prompt_tokens - window : 0;
        for (int32_t i = first; prompt != nullptr && i < num_prompt_tokens; ++i) {
            llama_sampler_accept(penalties, prompt[i]);
        }
        llama_sampler_chain_add(chain, penalties);
    }
    if (!params.grammar.empty()) {
        llama_sampler * grammar = llama_sampler_init_grammar(vocab, params.grammar.c_str(), "root");
        if (grammar == nullptr) {
            llama_sampler_free(chain);
            throw Error(CF_STATUS_INVALID_ARGUMENT, "grammar: not a valid GBNF grammar with a 'root' rule");
        }
        llama_sampler_chain_add(chain, grammar);
    }
    if (params.is_greedy()) {
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
        return chain;
    }
    if (params.top_k > 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_k(params.top_k));
    }
    if (params.top_p < 1.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_p(params.top_p, 1));
    }
    if (params.min_p > 0.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_min_p(params.min_p, 1));
    }
    llama_sampler_chain_add(chain, llama_sampler_init_temp(params.temperature));
    llama_sampler_chain_add(chain, llama_sampler_init_dist(seed_of(params.seed)));
    return chain;
}

TokenSampler::TokenSampler(int32_t n_vocab) : n_vocab_(n_vocab), candidates_((size_t) n_vocab) {}

int32_t TokenSampler::sample(Sequence & seq, const float * logits) {
    last_drawn_ = false;
    if (seq.sampler == nullptr) {
        return argmax_token(logits, n_vocab_);
    }
    for (int32_t i = 0; i < n_vocab_; ++i) {
        candidates_[(size_t) i] = llama_token_data{i, logits[i], 0.0f};
    }
    last_ = {candidates_.data(), candidates_.size(), -1, false};
    const int32_t token = apply_chain(seq, &last_);
    last_drawn_ = !seq.params.is_greedy();
    return token;
}

CandidateScratch::CandidateScratch(int32_t max_candidates) : data((size_t) max_candidates) {}

int32_t sample_candidates(Sequence & seq, const int32_t * ids, const float * logits, int32_t n,
                          CandidateScratch & scratch) {
    if (seq.sampler == nullptr || n <= 0 || (size_t) n > scratch.data.size()) {
        throw Error(CF_STATUS_INTERNAL, "request " + std::to_string(seq.request_id) + " was given " +
                                            std::to_string(n) + " top-k candidates without a sampler chain or "
                                            "more than its scratch holds");
    }
    llama_token_data * data = scratch.data.data();
    for (int32_t i = 0; i < n; ++i) {
        data[i] = llama_token_data{ids[i], logits[i], 0.0f};
    }
    llama_token_data_array cur = {data, (size_t) n, -1, false};
    return apply_chain(seq, &cur);
}

}  // namespace cf
