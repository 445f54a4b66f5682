// test_sampler_chain.cpp - make_sampler_chain (engine/sampling.h) against llama-server's own chain:
// common_sampler_init of the pinned llama.cpp (common/sampling.cpp) with the same settings, fed the
// same prompt and the same logits rows step after step, must pick the same token at every step:
// DRY (default and own sequence breakers), XTC, typical_p, top_n_sigma, the dynamic temperature,
// mirostat 1 and 2 (which drop the penalties in both), min_keep, greedy requests with DRY, XTC or
// typical_p, and all of them at once. Needs a model for its vocabulary (CACHEFLOW_TEST_MODEL, a
// GGUF; loaded vocab-only); without it the test prints "skipped" and passes.
#undef NDEBUG  // the checks must run in Release builds too
#include "engine/config.h"
#include "engine/sampling.h"
#include "sampling.h"  // llama.cpp's common/sampling.h: common_sampler_*

#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace cf;

namespace {

constexpr int32_t kSteps = 48;

struct Case {
    const char * name;
    cf_sampling_params params;
    std::vector<std::string> breakers;  // used when params.num_dry_sequence_breakers is -2 (a marker)
};

cf_sampling_params server_defaults(int64_t seed) {
    cf_sampling_params p = default_sampling_params();
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.seed = seed;
    return p;
}

// llama-server's settings for the same request (what server-schema.cpp reads into them).
common_params_sampling common_params_of(const cf_sampling_params & p, const std::vector<std::string> & breakers) {
    common_params_sampling s;
    s.no_perf = true;
    s.seed = (uint32_t) p.seed;
    s.temp = p.temperature;
    s.top_k = p.top_k;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    s.penalty_last_n = p.repeat_last_n;
    s.penalty_repeat = p.repeat_penalty;
    s.penalty_freq = p.frequency_penalty;
    s.penalty_present = p.presence_penalty;
    s.dry_multiplier = p.dry_multiplier;
    s.dry_base = p.dry_base;
    s.dry_allowed_length = p.dry_allowed_length;
    s.dry_penalty_last_n = p.dry_penalty_last_n;
    s.dry_sequence_breakers = breakers;
    s.xtc_probability = p.xtc_probability;
    s.xtc_threshold = p.xtc_threshold;
    s.typ_p = p.typical_p;
    s.mirostat = p.mirostat;
    s.mirostat_tau = p.mirostat_tau;
    s.mirostat_eta = p.mirostat_eta;
    s.dynatemp_range = p.dynatemp_range;
    s.dynatemp_exponent = p.dynatemp_exponent;
    s.top_n_sigma = p.top_n_sigma;
    s.min_keep = p.min_keep;
    return s;
}

// A logits row over the whole vocabulary: noise everywhere, and the prompt's tokens well ahead
// (so the output repeats them, which DRY and the penalties act on, and a few tokens share most of
// the probability, which XTC and typical_p act on).
void fill_row(std::mt19937 & rng, const std::vector<int32_t> & hot, std::vector<float> & row) {
    std::normal_distribution<float> noise(0.0f, 1.0f);
    for (float & l : row) {
        l = noise(rng);
    }
    for (int32_t t : hot) {
        row[(size_t) t] = 7.0f + 1.5f * noise(rng);
    }
}

int32_t pick(llama_sampler * chain, const std::vector<float> & row) {
    std::vector<llama_token_data> data(row.size());
    for (size_t i = 0; i < row.size(); ++i) {
        data[i] = llama_token_data{(llama_token) i, row[i], 0.0f};
    }
    llama_token_data_array cur = {data.data(), data.size(), -1, false};
    llama_sampler_apply(chain, &cur);
    assert(cur.selected >= 0 && (size_t) cur.selected < cur.size);
    return cur.data[cur.selected].id;
}

bool same_tokens_as_llama_server(const llama_model * model, const Case & c, const std::vector<int32_t> & prompt) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    cf_sampling_params p = c.params;
    std::vector<const char *> c_breakers;
    for (const std::string & b : c.breakers) {
        c_breakers.push_back(b.c_str());
    }
    std::vector<std::string> breakers = c.breakers;
    if (p.num_dry_sequence_breakers == -2) {
        p.dry_sequence_breakers = c_breakers.data();
        p.num_dry_sequence_breakers = (int32_t) c_breakers.size();
    } else {
        breakers.assign(p.dry_sequence_breakers, p.dry_sequence_breakers + p.num_dry_sequence_breakers);
    }
    const SamplingParams sp = SamplingParams::from_c(p, n_vocab);
    llama_sampler * ours = make_sampler_chain(sp, vocab, prompt.data(), (int32_t) prompt.size());
    common_params_sampling cs = common_params_of(p, breakers);
    common_sampler * theirs = common_sampler_init(model, cs);
    assert(theirs != nullptr);
    for (int32_t t : prompt) {
        common_sampler_accept(theirs, t, false);  // llama-server's init_sampler
    }
    std::mt19937 rng(1234);
    std::vector<float> row((size_t) n_vocab);
    std::vector<int32_t> tokens;
    bool ok = true;
    for (int32_t step = 0; step < kSteps && ok; ++step) {
        fill_row(rng, prompt, row);
        const int32_t mine = pick(ours, row);
        const int32_t reference = pick(common_sampler_get(theirs), row);
        if (mine != reference) {
            std::printf("FAIL %s: step %d: token %d, llama-server's chain %d\n", c.name, step, mine, reference);
            ok = false;
        }
        llama_sampler_accept(ours, reference);
        common_sampler_accept(theirs, reference, true);
        tokens.push_back(reference);
    }
    // the case must not be trivial: the output is not one token over and over
    int32_t changes = 0;
    for (size_t i = 1; i < tokens.size(); ++i) {
        changes += tokens[i] != tokens[i - 1];
    }
    std::printf("%-28s %s (%d token changes in %d steps)\n", c.name, ok ? "ok" : "FAILED", changes, kSteps);
    llama_sampler_free(ours);
    common_sampler_free(theirs);
    return ok;
}

std::vector<Case> cases() {
    std::vector<Case> out;
    auto add = [&](const char * name, cf_sampling_params p, std::vector<std::string> breakers = {}) {
        out.push_back(Case{name, p, std::move(breakers)});
    };
    cf_sampling_params p = server_defaults(1);
    p.dry_multiplier = 0.8f;
    add("dry", p);
    p = server_defaults(2);
    p.dry_multiplier = 1.5f;
    p.dry_base = 2.0f;
    p.dry_allowed_length = 1;
    p.dry_penalty_last_n = 16;
    p.num_dry_sequence_breakers = -2;
    add("dry own breakers", p, {",", " the"});
    p = server_defaults(3);
    p.xtc_probability = 0.5f;
    p.xtc_threshold = 0.1f;
    add("xtc", p);
    p = server_defaults(4);
    p.typical_p = 0.7f;
    add("typical_p", p);
    p = server_defaults(5);
    p.top_k = 0;
    p.top_n_sigma = 1.5f;
    p.temperature = 1.5f;
    add("top_n_sigma", p);
    p = server_defaults(6);
    p.temperature = 1.0f;
    p.dynatemp_range = 0.5f;
    p.dynatemp_exponent = 1.5f;
    add("dynatemp", p);
    p = server_defaults(7);
    p.mirostat = 1;
    p.repeat_penalty = 1.3f;  // dropped by mirostat, in both
    add("mirostat 1", p);
    p = server_defaults(8);
    p.temperature = 1.0f;
    p.mirostat = 2;
    p.mirostat_tau = 3.0f;
    p.mirostat_eta = 0.2f;
    add("mirostat 2", p);
    p = server_defaults(9);
    p.min_keep = 5;
    p.top_p = 0.5f;
    p.min_p = 0.3f;
    add("min_keep", p);
    p = server_defaults(10);
    p.temperature = 0.0f;
    p.dry_multiplier = 1.0f;
    p.repeat_penalty = 1.1f;
    add("greedy dry", p);
    p = server_defaults(11);
    p.temperature = 0.0f;
    p.xtc_probability = 1.0f;
    add("greedy xtc", p);
    p = server_defaults(12);
    p.temperature = 0.0f;
    p.typical_p = 0.5f;
    add("greedy typical_p", p);
    p = server_defaults(13);
    p.repeat_penalty = 1.2f;
    p.presence_penalty = 0.3f;
    p.dry_multiplier = 0.5f;
    p.top_n_sigma = 2.0f;
    p.typical_p = 0.9f;
    p.xtc_probability = 0.3f;
    p.dynatemp_range = 0.3f;
    p.min_keep = 2;
    add("all at once", p);
    return out;
}

}  // namespace

int main() {
    const char * path = std::getenv("CACHEFLOW_TEST_MODEL");
    if (path == nullptr || path[0] == '\0') {
        std::printf("test_sampler_chain: skipped (set CACHEFLOW_TEST_MODEL to a GGUF model)\n");
        return 0;
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(path, mp);
    assert(model != nullptr);
    int32_t n_suppress = 0;
    (void) llama_vocab_get_suppress_tokens(llama_model_get_vocab(model), &n_suppress);
    assert(n_suppress == 0);  // llama-server would add a logit bias for them; this model has none
    // a prompt that repeats itself, for DRY and the penalties to find repetitions in
    std::vector<int32_t> prompt;
    const int32_t pattern[6] = {198, 28, 253, 1234, 8, 562};
    for (int32_t r = 0; r < 5; ++r) {
        prompt.insert(prompt.end(), pattern, pattern + 6);
    }
    int failures = 0;
    for (const Case & c : cases()) {
        failures += !same_tokens_as_llama_server(model, c, prompt);
    }
    llama_model_free(model);
    llama_backend_free();
    if (failures > 0) {
        std::printf("test_sampler_chain: %d case(s) FAILED\n", failures);
        return 1;
    }
    std::printf("test_sampler_chain: ok\n");
    return 0;
}
