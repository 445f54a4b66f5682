// sampling.cpp - see sampling.h.
#include "engine/sampling.h"

#include "core/error.h"
#include "engine/reasoning_budget.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

namespace cf {

namespace {

void free_sampler(void * ptr) {
    llama_sampler_free(static_cast<llama_sampler *>(ptr));
}

uint32_t seed_of(int64_t seed) {
    // CF_SEED_RANDOM maps to llama.cpp's "random seed"; other seeds are taken modulo 2^32.
    return seed == CF_SEED_RANDOM ? LLAMA_DEFAULT_SEED : (uint32_t) (uint64_t) seed;
}

// Index of the top_k sampler in the chain make_sampler_chain builds for params (which it must
// mirror: [reasoning budget] [logit_bias] [penalties] [dry] [grammar] [top_n_sigma] top_k ...),
// or -1 when the chain has none. (Rows with DRY or top_n_sigma are sampled from the whole row,
// never from candidates: needs_host_samplers.)
int32_t top_k_position(const SamplingParams & params) {
    if (params.is_greedy() || params.top_k <= 0 || params.uses_mirostat()) {
        return -1;
    }
    return (int32_t) params.reasoning.enabled() + (int32_t) !params.logit_bias.empty() +
           (int32_t) params.has_penalties() + (int32_t) params.has_dry() + (int32_t) !params.grammar.empty() +
           (int32_t) params.has_top_n_sigma();
}

// llama-server's samplers between the grammar and the temperature, in its order (common_sampler_init):
// top_n_sigma -> top_k -> typical_p -> top_p -> min_p -> xtc, each one left out when it is off.
// min_keep: top_p and min_p get at least 1 (the 1 they always had here; 0 keeps the same).
void add_truncation_samplers(llama_sampler * chain, const SamplingParams & params) {
    const auto min_keep = (size_t) params.min_keep;
    if (params.has_top_n_sigma()) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_n_sigma(params.top_n_sigma));
    }
    if (params.top_k > 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_k(params.top_k));
    }
    if (params.has_typical()) {
        llama_sampler_chain_add(chain, llama_sampler_init_typical(params.typical_p, min_keep));
    }
    if (params.top_p < 1.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_p(params.top_p, std::max<size_t>(min_keep, 1)));
    }
    if (params.min_p > 0.0f) {
        llama_sampler_chain_add(chain, llama_sampler_init_min_p(params.min_p, std::max<size_t>(min_keep, 1)));
    }
    if (params.has_xtc()) {
        llama_sampler_chain_add(chain, llama_sampler_init_xtc(params.xtc_probability, params.xtc_threshold, min_keep,
                                                              seed_of(params.seed)));
    }
}

// llama.cpp's DRY sampler for params, fed the last dry_penalty_last_n prompt tokens (llama-server
// feeds the whole chain the prompt: init_sampler).
llama_sampler * make_dry_sampler(const SamplingParams & params, const llama_vocab * vocab, const int32_t * prompt,
                                 int32_t num_prompt_tokens) {
    std::vector<const char *> breakers;
    breakers.reserve(params.dry_sequence_breakers.size());
    for (const std::string & b : params.dry_sequence_breakers) {
        breakers.push_back(b.c_str());
    }
    llama_sampler * dry =
        llama_sampler_init_dry(vocab, params.dry_multiplier, params.dry_base, params.dry_allowed_length,
                               params.dry_penalty_last_n, breakers.data(), breakers.size());
    const int32_t window = params.dry_penalty_last_n;
    const int32_t first = window > 0 && window < num_prompt_tokens ? num_prompt_tokens - window : 0;
    for (int32_t i = first; prompt != nullptr && i < num_prompt_tokens; ++i) {
        llama_sampler_accept(dry, prompt[i]);
    }
    return dry;
}

// Equal logits by ascending token id: a total order (for logits that are not NaN).
struct RanksBefore {
    bool operator()(const llama_token_data & a, const llama_token_data & b) const {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    }
};

// The rank sort's size: LlamaSession::kTopKCandidates (64), the n of every candidate row.
constexpr int32_t kRankSortSize = 64;

// out [N] = the candidates ids [N] / logits [N] by descending logit, equal logits by ascending id
// (RanksBefore): each one's rank counted over all N with no branch (a vector loop, N^2 / lanes
// comparisons) and written to its place. For N = 64 about 7x faster than llama.cpp's partial sort
// of the same row on a Xeon with AVX-512. Compiled for AVX-512 and AVX2 too, picked at load time
// (exact comparisons and integer counts: the same result on every ISA). Logits must not be NaN and
// ids must be distinct (ggml_top_k's are), else two candidates could share a rank.
template <int32_t N>
// (Not under a sanitizer: its ifunc resolver would run instrumented before the runtime is up.)
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void rank_sort(const int32_t * ids, const float * logits, llama_token_data * out) {
    float l[N];
    int32_t d[N];
    int32_t rank[N] = {};
    for (int32_t i = 0; i < N; ++i) {
        l[i] = logits[i];
        d[i] = ids[i];
    }
    for (int32_t j = 0; j < N; ++j) {
        const float lj = l[j];
        const int32_t dj = d[j];
        for (int32_t i = 0; i < N; ++i) {
            rank[i] += (int32_t) ((lj > l[i]) | ((lj == l[i]) & (dj < d[i])));
        }
    }
    for (int32_t i = 0; i < N; ++i) {
        out[rank[i]] = llama_token_data{d[i], l[i], 0.0f};
    }
}

// out [n] = the n candidates sorted as rank_sort sorts them, for llama.cpp's top_k to find sorted:
// then it keeps the first k, the same k tokens in the same order as its own partial sort whenever
// the logits are distinct (that heap was most of a candidate row's sampling time), and the order
// of equal logits no longer depends on the order the candidates came in. Returns false (out
// untouched) when a logit is NaN: no order, the caller leaves the row to llama.cpp's top_k.
bool sort_candidates(const int32_t * ids, const float * logits, int32_t n, llama_token_data * out) {
    bool has_nan = false;
    for (int32_t i = 0; i < n; ++i) {
        has_nan |= logits[i] != logits[i];
    }
    if (has_nan) {
        return false;
    }
    if (n == kRankSortSize) {
        rank_sort<kRankSortSize>(ids, logits, out);
        return true;
    }
    for (int32_t i = 0; i < n; ++i) {
        out[i] = llama_token_data{ids[i], logits[i], 0.0f};
    }
    std::sort(out, out + n, RanksBefore());
    return true;
}

// sort_candidates over cur (unsorted, after the samplers before top_k, e.g. a logit bias), in
// place by way of scratch's ids and logits.
void sort_in_place(llama_token_data_array * cur, CandidateScratch & scratch) {
    const int32_t n = (int32_t) cur->size;
    for (int32_t i = 0; i < n; ++i) {
        scratch.ids[(size_t) i] = cur->data[i].id;
        scratch.logits[(size_t) i] = cur->data[i].logit;
    }
    cur->sorted = sort_candidates(scratch.ids.data(), scratch.logits.data(), n, cur->data);
}

// llama.cpp's grammar sampler inside a guard, in the chain's grammar position:
//  - with a reasoning budget (the sampler at chain position 0), the grammar constrains only tokens
//    outside reasoning blocks, as llama-server's common_sampler holds a grammar off while the budget
//    is active: the block's text is free, a forced end marker never fights the grammar, and the
//    grammar starts where the answer does (a JSON schema shapes the answer, not the thinking);
//  - a token the grammar does not allow (every allowed one was excluded by something else: a logit
//    bias, ignore_eos, a forced token) is refused with an Error for this request alone, where
//    llama.cpp's grammar would abort the process (an end-of-generation token before the grammar is
//    complete) or throw mid-chain.
struct GuardedGrammar {
    llama_sampler * grammar;          // owned
    const llama_sampler * reasoning;  // the chain's reasoning-budget sampler (not owned), or nullptr
    bool applied = false;             // the last apply() constrained the candidates
};

const char * guarded_grammar_name(const llama_sampler * /*smpl*/) {
    return "grammar";
}

void guarded_grammar_apply(llama_sampler * smpl, llama_token_data_array * cur) {
    auto * g = static_cast<GuardedGrammar *>(smpl->ctx);
    g->applied = g->reasoning == nullptr || !reasoning_block_open(g->reasoning);
    if (g->applied) {
        llama_sampler_apply(g->grammar, cur);
    }
}

void guarded_grammar_accept(llama_sampler * smpl, llama_token token) {
    auto * g = static_cast<GuardedGrammar *>(smpl->ctx);
    if (!g->applied) {
        return;  // a token of a reasoning block: not the grammar's
    }
    llama_token_data one = {token, 0.0f, 0.0f};
    llama_token_data_array single = {&one, 1, -1, false};
    llama_sampler_apply(g->grammar, &single);
    if (one.logit == -INFINITY) {
        throw Error(CF_STATUS_INVALID_ARGUMENT,
                    "grammar: no token the grammar allows was left to sample (token " + std::to_string(token) +
                        " was chosen; a logit bias, ignore_eos or a stop rule excluded every allowed one)");
    }
    llama_sampler_accept(g->grammar, token);
}

void guarded_grammar_reset(llama_sampler * smpl) {
    auto * g = static_cast<GuardedGrammar *>(smpl->ctx);
    llama_sampler_reset(g->grammar);
    g->applied = false;
}

void guarded_grammar_free(llama_sampler * smpl) {
    auto * g = static_cast<GuardedGrammar *>(smpl->ctx);
    llama_sampler_free(g->grammar);
    delete g;
}

llama_sampler_i kGuardedGrammarInterface = {  // llama_sampler_init takes it non-const
    /* .name              = */ guarded_grammar_name,
    /* .accept            = */ guarded_grammar_accept,
    /* .apply             = */ guarded_grammar_apply,
    /* .reset             = */ guarded_grammar_reset,
    /* .clone             = */ nullptr,
    /* .free              = */ guarded_grammar_free,
    /* .backend_init      = */ nullptr,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ nullptr,
    /* .backend_set_input = */ nullptr,
    /* .backend_reset     = */ nullptr,
    /* .copy_state        = */ nullptr,
};

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
        throw Error(CF_STATUS_INTERNAL, "logit bias, penalties, DRY, mirostat, grammars and reasoning budgets need the "
                                        "vocab");
    }
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    llama_sampler * chain = llama_sampler_chain_init(cp);
    const int32_t n_vocab = vocab != nullptr ? llama_vocab_n_tokens(vocab) : 0;
    if (params.reasoning.enabled()) {  // first, as llama-server's common_sampler applies it
        try {
            llama_sampler_chain_add(chain, make_reasoning_budget_sampler(vocab, params.reasoning));
        } catch (...) {
            llama_sampler_free(chain);
            throw;
        }
    }
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
    if (params.has_dry()) {  // after the penalties, as llama-server's default sampler order
        llama_sampler_chain_add(chain, make_dry_sampler(params, vocab, prompt, num_prompt_tokens));
    }
    if (!params.grammar.empty()) {
        llama_sampler * grammar = llama_sampler_init_grammar(vocab, params.grammar.c_str(), "root");
        if (grammar == nullptr) {
            llama_sampler_free(chain);
            throw Error(CF_STATUS_INVALID_ARGUMENT, "grammar: not a valid GBNF grammar with a 'root' rule");
        }
        const llama_sampler * reasoning = params.reasoning.enabled() ? llama_sampler_chain_get(chain, 0) : nullptr;
        llama_sampler_chain_add(chain, llama_sampler_init(&kGuardedGrammarInterface,
                                                          new GuardedGrammar{grammar, reasoning}));
    }
    if (params.is_greedy()) {
        // llama-server's temperature 0 keeps the argmax of what the samplers before it left: XTC and
        // typical_p may drop the most likely token, and see the row as top_k/top_p/min_p left it
        if (params.has_xtc() || params.has_typical()) {
            add_truncation_samplers(chain, params);
        }
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
        return chain;
    }
    if (params.uses_mirostat()) {  // llama-server: temperature -> mirostat, in place of its sampler list
        llama_sampler_chain_add(chain, llama_sampler_init_temp(params.temperature));
        llama_sampler_chain_add(chain, params.mirostat == 1
                                           ? llama_sampler_init_mirostat(n_vocab, seed_of(params.seed),
                                                                         params.mirostat_tau, params.mirostat_eta, 100)
                                           : llama_sampler_init_mirostat_v2(seed_of(params.seed), params.mirostat_tau,
                                                                            params.mirostat_eta));
        return chain;
    }
    add_truncation_samplers(chain, params);
    llama_sampler_chain_add(chain, params.has_dynatemp() ? llama_sampler_init_temp_ext(params.temperature,
                                                                                       params.dynatemp_range,
                                                                                       params.dynatemp_exponent)
                                                         : llama_sampler_init_temp(params.temperature));
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

CandidateScratch::CandidateScratch(int32_t max_candidates)
    : data((size_t) max_candidates), ids((size_t) max_candidates), logits((size_t) max_candidates) {}

int32_t sample_candidates(Sequence & seq, const int32_t * ids, const float * logits, int32_t n,
                          CandidateScratch & scratch) {
    if (seq.sampler == nullptr || n <= 0 || (size_t) n > scratch.data.size()) {
        throw Error(CF_STATUS_INTERNAL, "request " + std::to_string(seq.request_id) + " was given " +
                                            std::to_string(n) + " top-k candidates without a sampler chain or "
                                            "more than its scratch holds");
    }
    llama_token_data * data = scratch.data.data();
    auto * chain = static_cast<llama_sampler *>(seq.sampler.get());
    const int32_t top_k_at = top_k_position(seq.params);
    // A chain starting with top_k (no logit bias): sorted straight from the candidates.
    llama_token_data_array cur = {data, (size_t) n, -1, top_k_at == 0 && sort_candidates(ids, logits, n, data)};
    if (!cur.sorted) {
        for (int32_t i = 0; i < n; ++i) {
            data[i] = llama_token_data{ids[i], logits[i], 0.0f};
        }
    }
    if (top_k_at <= 0) {
        llama_sampler_apply(chain, &cur);  // no top_k (greedy with a bias), or sorted for it (or NaN)
        return accept_selected(seq, chain, cur);
    }
    // Samplers before top_k (a logit bias): the chain's samplers one by one, as
    // llama_sampler_chain_apply runs a CPU chain, sorted for top_k after those before it.
    const int32_t num_samplers = llama_sampler_chain_n(chain);
    for (int32_t i = 0; i < num_samplers; ++i) {
        llama_sampler * sampler = llama_sampler_chain_get(chain, i);
        if (i == top_k_at) {
            assert(std::strcmp(llama_sampler_name(sampler), "top-k") == 0);
            sort_in_place(&cur, scratch);
        }
        llama_sampler_apply(sampler, &cur);
    }
    return accept_selected(seq, chain, cur);
}

}  // namespace cf
