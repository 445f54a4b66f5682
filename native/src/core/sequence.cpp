// sequence.cpp - validation of requests and sequence helpers.
#include "core/sequence.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cf {

namespace {

std::string format_float(float value) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%g", (double) value);
    return buf;
}

// n_vocab 0: the vocabulary is not known yet (cf_sampling_params_check), only the sign is checked.
// "<label> = <token> must be >= 0" or "... is out of range [0, n_vocab)" (not checked against n_vocab when it is 0).
void check_token(const std::string & label, int32_t token, int32_t n_vocab) {
    const std::string where = label + " = " + std::to_string(token);
    if (token < 0) {
        fail_invalid(where + " must be >= 0");
    }
    if (n_vocab > 0 && token >= n_vocab) {
        fail_invalid(where + " is out of range [0, " + std::to_string(n_vocab) + ")");
    }
}

void check_token_id(const char * array, size_t index, int32_t token, int32_t n_vocab) {
    check_token(std::string(array) + "[" + std::to_string(index) + "]", token, n_vocab);
}

void validate_numbers(const cf_sampling_params & p) {
    if (p.max_tokens < 1) {
        fail_invalid("max_tokens must be >= 1, got " + std::to_string(p.max_tokens));
    }
    if (!(p.temperature >= 0.0f && std::isfinite(p.temperature))) {  // also rejects NaN
        fail_invalid("temperature must be finite and >= 0, got " + format_float(p.temperature));
    }
    if (p.top_k < 0) {
        fail_invalid("top_k must be >= 0, got " + std::to_string(p.top_k));
    }
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
        fail_invalid("top_p must be in (0, 1], got " + format_float(p.top_p));
    }
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
        fail_invalid("min_p must be in [0, 1], got " + format_float(p.min_p));
    }
    if (p.seed < 0 && p.seed != CF_SEED_RANDOM) {
        fail_invalid("seed must be >= 0 or CF_SEED_RANDOM (-1), got " + std::to_string(p.seed));
    }
}

std::vector<int32_t> copy_stop_token_ids(const cf_sampling_params & p, int32_t n_vocab) {
    if (p.num_stop_token_ids < 0 || (p.num_stop_token_ids > 0 && p.stop_token_ids == nullptr)) {
        fail_invalid("num_stop_token_ids must be >= 0 with stop_token_ids non-NULL, got " +
                     std::to_string(p.num_stop_token_ids));
    }
    std::vector<int32_t> ids(p.stop_token_ids, p.stop_token_ids + p.num_stop_token_ids);
    for (size_t i = 0; i < ids.size(); ++i) {
        check_token_id("stop_token_ids", i, ids[i], n_vocab);
    }
    return ids;
}

// One token array of the reasoning budget: [num] ids in [0, n_vocab) (not checked when
// n_vocab is 0), non-empty when required.
std::vector<int32_t> copy_reasoning_tokens(const char * name, const int32_t * ids, int32_t num, bool required,
                                           int32_t n_vocab) {
    const std::string field = std::string("reasoning_") + name + "_tokens";
    if (num < 0 || (num > 0 && ids == nullptr)) {
        fail_invalid("num_" + field + " must be >= 0 with " + field + " non-NULL, got " + std::to_string(num));
    }
    if (required && num == 0) {
        fail_invalid(field + " must not be empty with a reasoning_budget");
    }
    std::vector<int32_t> out(ids, ids + num);
    for (size_t i = 0; i < out.size(); ++i) {
        check_token_id(field.c_str(), i, out[i], n_vocab);
    }
    return out;
}

ReasoningBudget copy_reasoning_budget(const cf_sampling_params & p, int32_t n_vocab) {
    ReasoningBudget out;
    if (p.reasoning_budget < -1) {
        fail_invalid("reasoning_budget must be >= -1 (-1 = none), got " + std::to_string(p.reasoning_budget));
    }
    if (p.reasoning_budget == -1) {
        return out;
    }
    out.tokens = p.reasoning_budget;
    out.start = copy_reasoning_tokens("start", p.reasoning_start_tokens, p.num_reasoning_start_tokens, true, n_vocab);
    out.end = copy_reasoning_tokens("end", p.reasoning_end_tokens, p.num_reasoning_end_tokens, true, n_vocab);
    out.forced = copy_reasoning_tokens("forced", p.reasoning_forced_tokens, p.num_reasoning_forced_tokens, true,
                                       n_vocab);
    out.prefill = copy_reasoning_tokens("prefill", p.reasoning_prefill_tokens, p.num_reasoning_prefill_tokens, false,
                                        n_vocab);
    return out;
}

std::vector<std::string> copy_stop_strings(const cf_sampling_params & p) {
    if (p.num_stop_strings < 0 || (p.num_stop_strings > 0 && p.stop_strings == nullptr)) {
        fail_invalid("num_stop_strings must be >= 0 with stop_strings non-NULL, got " +
                     std::to_string(p.num_stop_strings));
    }
    std::vector<std::string> strings;
    strings.reserve(p.num_stop_strings);
    for (int32_t i = 0; i < p.num_stop_strings; ++i) {
        const char * s = p.stop_strings[i];
        if (s == nullptr || s[0] == '\0') {
            fail_invalid("stop_strings[" + std::to_string(i) + "] must be a non-empty string");
        }
        strings.emplace_back(s);
    }
    return strings;
}

void copy_penalties_and_bias(const cf_sampling_params & p, int32_t n_vocab, SamplingParams & out) {
    if (!(p.repeat_penalty > 0.0f && std::isfinite(p.repeat_penalty))) {
        fail_invalid("repeat_penalty must be > 0, got " + format_float(p.repeat_penalty));
    }
    if (p.repeat_last_n < -1) {
        fail_invalid("repeat_last_n must be >= -1, got " + std::to_string(p.repeat_last_n));
    }
    if (!std::isfinite(p.presence_penalty)) {
        fail_invalid("presence_penalty must be finite, got " + format_float(p.presence_penalty));
    }
    if (!std::isfinite(p.frequency_penalty)) {
        fail_invalid("frequency_penalty must be finite, got " + format_float(p.frequency_penalty));
    }
    if (p.num_logit_bias < 0 ||
        (p.num_logit_bias > 0 && (p.logit_bias_token_ids == nullptr || p.logit_bias_values == nullptr))) {
        fail_invalid("num_logit_bias must be >= 0 with non-NULL arrays, got " + std::to_string(p.num_logit_bias));
    }
    out.repeat_penalty = p.repeat_penalty;
    out.repeat_last_n = p.repeat_last_n;
    out.presence_penalty = p.presence_penalty;
    out.frequency_penalty = p.frequency_penalty;
    for (int32_t i = 0; i < p.num_logit_bias; ++i) {
        const int32_t token = p.logit_bias_token_ids[i];
        const float bias = p.logit_bias_values[i];
        // named as the caller's (token id, bias) pairs, which both the C arrays and SamplingParams.logit_bias index
        check_token("logit_bias[" + std::to_string(i) + "] token id", token, n_vocab);
        if (std::isnan(bias) || bias == INFINITY) {
            fail_invalid("logit_bias[" + std::to_string(i) + "] bias must be finite or -INFINITY");
        }
        out.logit_bias.emplace_back(token, bias);
    }
    std::vector<int32_t> biased;
    biased.reserve(out.logit_bias.size());
    for (const auto & [token, bias] : out.logit_bias) {
        biased.push_back(token);
    }
    std::sort(biased.begin(), biased.end());
    biased.erase(std::unique(biased.begin(), biased.end()), biased.end());
    const auto all_biases = [&out](auto pred) {
        return std::all_of(out.logit_bias.begin(), out.logit_bias.end(), [&](const auto & b) { return pred(b.second); });
    };
    out.num_lowered_tokens = all_biases([](float b) { return b <= 0.0f; }) ? (int32_t) biased.size() : -1;
    if (!biased.empty() && all_biases([](float b) { return b == -INFINITY; })) {
        out.banned_tokens = std::move(biased);
    }
    out.grammar = p.grammar != nullptr ? p.grammar : "";
}

void copy_logprobs(const cf_sampling_params & p, int32_t n_vocab, SamplingParams & out) {
    if (p.logprobs != 0 && p.logprobs != 1) {
        fail_invalid("logprobs must be 0 or 1, got " + std::to_string(p.logprobs));
    }
    if (p.top_logprobs < 0) {
        fail_invalid("top_logprobs must be >= 0, got " + std::to_string(p.top_logprobs));
    }
    if (p.top_logprobs > 0 && p.logprobs == 0) {
        fail_invalid("top_logprobs (" + std::to_string(p.top_logprobs) + ") needs logprobs = 1");
    }
    if (p.post_sampling_probs != 0 && p.post_sampling_probs != 1) {
        fail_invalid("post_sampling_probs must be 0 or 1, got " + std::to_string(p.post_sampling_probs));
    }
    out.logprobs = p.logprobs == 1;
    out.top_logprobs = out.logprobs ? (n_vocab > 0 ? std::min(p.top_logprobs, n_vocab) : p.top_logprobs) : 0;
    out.post_sampling_probs = out.logprobs && p.post_sampling_probs == 1;
}

// llama-server's other samplers (DRY, XTC, typical_p, mirostat, dynamic temperature,
// top_n_sigma, min_keep): the ranges of cf_sampling_params' comments.
void copy_other_samplers(const cf_sampling_params & p, SamplingParams & out) {
    const auto require_finite = [](const char * name, float value) {
        if (!std::isfinite(value)) {
            fail_invalid(std::string(name) + " must be finite, got " + format_float(value));
        }
    };
    require_finite("dry_multiplier", p.dry_multiplier);
    if (!(p.dry_base >= 1.0f && std::isfinite(p.dry_base))) {
        fail_invalid("dry_base must be finite and >= 1, got " + format_float(p.dry_base));
    }
    if (p.dry_allowed_length < 0) {
        fail_invalid("dry_allowed_length must be >= 0, got " + std::to_string(p.dry_allowed_length));
    }
    if (p.dry_penalty_last_n < -1) {
        fail_invalid("dry_penalty_last_n must be >= -1, got " + std::to_string(p.dry_penalty_last_n));
    }
    if (p.num_dry_sequence_breakers < 0 || (p.num_dry_sequence_breakers > 0 && p.dry_sequence_breakers == nullptr)) {
        fail_invalid("num_dry_sequence_breakers must be >= 0 with dry_sequence_breakers non-NULL, got " +
                     std::to_string(p.num_dry_sequence_breakers));
    }
    std::vector<std::string> breakers;
    breakers.reserve((size_t) p.num_dry_sequence_breakers);
    for (int32_t i = 0; i < p.num_dry_sequence_breakers; ++i) {
        const char * b = p.dry_sequence_breakers[i];
        if (b == nullptr || b[0] == '\0') {
            fail_invalid("dry_sequence_breakers[" + std::to_string(i) + "] must be a non-empty string");
        }
        breakers.emplace_back(b);
    }
    if (!(p.xtc_probability >= 0.0f && p.xtc_probability <= 1.0f)) {
        fail_invalid("xtc_probability must be in [0, 1], got " + format_float(p.xtc_probability));
    }
    if (!(p.xtc_threshold >= 0.0f && p.xtc_threshold <= 1.0f)) {
        fail_invalid("xtc_threshold must be in [0, 1], got " + format_float(p.xtc_threshold));
    }
    require_finite("typical_p", p.typical_p);
    if (p.mirostat < 0 || p.mirostat > 2) {
        fail_invalid("mirostat must be 0, 1 or 2, got " + std::to_string(p.mirostat));
    }
    require_finite("mirostat_tau", p.mirostat_tau);
    require_finite("mirostat_eta", p.mirostat_eta);
    require_finite("dynatemp_range", p.dynatemp_range);
    require_finite("dynatemp_exponent", p.dynatemp_exponent);
    require_finite("top_n_sigma", p.top_n_sigma);
    if (p.min_keep < 0) {
        fail_invalid("min_keep must be >= 0, got " + std::to_string(p.min_keep));
    }
    out.dry_multiplier = p.dry_multiplier;
    out.dry_base = p.dry_base;
    out.dry_allowed_length = p.dry_allowed_length;
    out.dry_penalty_last_n = p.dry_penalty_last_n;
    out.dry_sequence_breakers = std::move(breakers);
    out.xtc_probability = p.xtc_probability;
    out.xtc_threshold = p.xtc_threshold;
    out.typical_p = p.typical_p;
    out.mirostat = p.mirostat;
    out.mirostat_tau = p.mirostat_tau;
    out.mirostat_eta = p.mirostat_eta;
    out.dynatemp_range = p.dynatemp_range;
    out.dynatemp_exponent = p.dynatemp_exponent;
    out.top_n_sigma = p.top_n_sigma;
    out.min_keep = p.min_keep;
}

}  // namespace

SamplingParams SamplingParams::from_c(const cf_sampling_params & p, int32_t n_vocab) {
    validate_numbers(p);
    SamplingParams out;
    out.max_tokens = p.max_tokens;
    out.temperature = p.temperature;
    // top_k at or above the vocabulary keeps every token: the same as off (llama.cpp's CPU top_k clamps k to the
    // candidates; its in-graph top_k, ggml_top_k, asserts k <= n_vocab and would abort the process)
    out.top_k = n_vocab > 0 && p.top_k >= n_vocab ? 0 : p.top_k;
    out.top_p = p.top_p;
    out.min_p = p.min_p;
    out.seed = p.seed;
    out.stop_token_ids = copy_stop_token_ids(p, n_vocab);
    out.stop_strings = copy_stop_strings(p);
    out.ignore_eos = p.ignore_eos != 0;
    copy_penalties_and_bias(p, n_vocab, out);
    if (p.cache_prompt != 0 && p.cache_prompt != 1) {
        fail_invalid("cache_prompt must be 0 or 1, got " + std::to_string(p.cache_prompt));
    }
    out.cache_prompt = p.cache_prompt == 1;
    copy_logprobs(p, n_vocab, out);
    if (p.return_progress != 0 && p.return_progress != 1) {
        fail_invalid("return_progress must be 0 or 1, got " + std::to_string(p.return_progress));
    }
    out.return_progress = p.return_progress == 1;
    out.reasoning = copy_reasoning_budget(p, n_vocab);
    copy_other_samplers(p, out);
    return out;
}

void validate_prompt(const int32_t * tokens, int32_t num_tokens, int32_t n_vocab, int32_t n_ctx_per_seq) {
    if (num_tokens <= 0) {
        fail_invalid("prompt is empty");
    }
    if (tokens == nullptr) {
        fail_invalid("prompt_tokens is NULL but num_prompt_tokens is " + std::to_string(num_tokens));
    }
    for (int32_t i = 0; i < num_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            fail_invalid("prompt_tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                         " is out of range [0, " + std::to_string(n_vocab) + ")");
        }
    }
    if (num_tokens >= n_ctx_per_seq) {
        throw Error(CF_STATUS_PROMPT_TOO_LONG, "prompt has " + std::to_string(num_tokens) +
                                                   " tokens but the context holds at most " +
                                                   std::to_string(n_ctx_per_seq) +
                                                   " per sequence (prompt + 1 generated token must fit)");
    }
}

void opaque_handle_no_free(void * /*ptr*/) {}

Sequence::Sequence(int64_t request_id_, const int32_t * prompt, int32_t num_prompt_tokens_, SamplingParams params_,
                   int32_t priority_, int64_t arrival_ns_, int32_t max_tokens_capacity)
    : request_id(request_id_),
      priority(priority_),
      params(std::move(params_)),
      num_prompt_tokens(num_prompt_tokens_),
      arrival_ns(arrival_ns_),
      queued_since_ns(arrival_ns_) {
    // Reserve once so that appending output tokens never reallocates in the step loop.
    tokens.reserve((size_t) std::max(max_tokens_capacity, num_prompt_tokens_));
    tokens.assign(prompt, prompt + num_prompt_tokens_);
}

int32_t Sequence::max_kv_tokens(int32_t n_ctx_per_seq) const {
    const int64_t want = (int64_t) num_prompt_tokens + params.max_tokens;
    return (int32_t) std::min<int64_t>(want, n_ctx_per_seq);
}

}  // namespace cf
