// sequence.h - one request while the engine works on it: tokens, progress, sampling parameters,
// timestamps and status. Plain data plus small helpers; no llama.cpp dependency.
//
// Token regions of a sequence (half-open ranges over `tokens`):
//
//   tokens:  | prompt ............................ | output ............ |
//            0                        num_prompt_tokens          num_tokens()
//   KV:      | computed (in the KV cache) | not computed yet |
//            0                 num_computed_tokens       num_tokens()
//
// A running sequence always has at least one uncomputed token: the rest of its prompt while it
// prefills, then exactly the last sampled token while it decodes.
#pragma once

#include "cacheflow.h"
#include "core/text_stream.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cf {

// WAITING: queued, holding no KV (new, or preempted by recompute: its KV is computed again).
// RUNNING: admitted, holding device KV. SWAPPED: preempted by swap, its KV blocks in host memory
// (KvCacheManager::swap_out); swap_in() brings them back and it runs on without recompute.
// SWAPPING_IN: swapped in by the step being planned or executed: it holds device blocks (in the
// running set, a place of max_num_seqs) whose bytes that step's swap-in copies bring back, and it
// joins the batch at the next step, as RUNNING (one step ahead: the copies overlap that step's
// compute). Never scheduled, never a preemption victim.
enum class SequenceStatus { WAITING, RUNNING, SWAPPING_IN, SWAPPED, FINISHED };

// A request's reasoning budget (cf_sampling_params.reasoning_budget and its token arrays).
struct ReasoningBudget {
    int32_t tokens = -1;            // -1 = none, else the most tokens inside a reasoning block
    std::vector<int32_t> start;     // the block's opening token sequence (non-empty if enabled)
    std::vector<int32_t> end;       // its closing sequence (non-empty if enabled)
    std::vector<int32_t> forced;    // forced once the budget is spent (non-empty if enabled)
    std::vector<int32_t> prefill;   // the answer's start already in the prompt, fed first

    bool enabled() const { return tokens >= 0; }
};

// Validated copy of cf_sampling_params (the engine owns the strings and arrays).
struct SamplingParams {
    int32_t max_tokens = 16;
    float temperature = 0.0f;  // 0 = greedy
    int32_t top_k = 0;         // 0 = disabled
    float top_p = 1.0f;        // 1 = disabled
    float min_p = 0.0f;        // 0 = disabled
    int64_t seed = CF_SEED_RANDOM;
    std::vector<int32_t> stop_token_ids;
    std::vector<std::string> stop_strings;
    bool ignore_eos = false;
    float repeat_penalty = 1.0f;     // 1 = disabled
    int32_t repeat_last_n = 64;      // 0 = disabled; -1 (the context) is resolved by the engine
    float presence_penalty = 0.0f;   // 0 = disabled
    float frequency_penalty = 0.0f;  // 0 = disabled
    std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
    // Set with logit_bias by from_c, read per row per step by LlamaSession::set_seq_sampling: the
    // number of distinct tokens it biases when no bias is positive (it only lowers), else -1; and the
    // distinct tokens it bans, ascending, when every bias is -INFINITY, else empty.
    int32_t num_lowered_tokens = 0;
    std::vector<int32_t> banned_tokens;
    std::string grammar;             // GBNF, rule "root"; "" = none
    bool cache_prompt = true;        // reuse and fill the prefix cache (paged mode)
    bool logprobs = false;           // report token probabilities (engine/logprobs.h)
    int32_t top_logprobs = 0;        // most likely tokens listed with each one, <= n_vocab
    bool post_sampling_probs = false;  // after the sampler chain instead of the raw logits
    bool return_progress = false;    // queue prompt progress events (cf_output_event.prompt_progress)
    ReasoningBudget reasoning;       // llama.cpp's reasoning-budget sampler, first in the chain
    // llama-server's other samplers (cf_sampling_params has their ranges and meaning)
    float dry_multiplier = 0.0f;     // 0 = disabled
    float dry_base = 1.75f;          // >= 1
    int32_t dry_allowed_length = 2;
    int32_t dry_penalty_last_n = 64;  // 0 = disabled; -1 (the context) is resolved by the engine
    std::vector<std::string> dry_sequence_breakers{"\n", ":", "\"", "*"};
    float xtc_probability = 0.0f;    // 0 = disabled
    float xtc_threshold = 0.1f;      // > 0.5 = disabled
    float typical_p = 1.0f;          // >= 1 = disabled
    int32_t mirostat = 0;            // 0 = off, 1 = Mirostat, 2 = Mirostat 2.0
    float mirostat_tau = 5.0f;
    float mirostat_eta = 0.1f;
    float dynatemp_range = 0.0f;     // <= 0 = disabled
    float dynatemp_exponent = 1.0f;
    float top_n_sigma = -1.0f;       // <= 0 = disabled
    int32_t min_keep = 0;

    bool is_greedy() const { return temperature == 0.0f; }
    // Mirostat replaces the samplers of llama-server's sampler list (penalties, DRY, top_n_sigma,
    // top_k, typical_p, top_p, min_p, XTC, temperature) with temperature -> mirostat; a greedy
    // request stays greedy (a temperature of 0 leaves mirostat one candidate).
    bool uses_mirostat() const { return mirostat != 0; }
    bool has_penalties() const {
        return !uses_mirostat() && repeat_last_n != 0 &&
               (repeat_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f);
    }
    // Each of llama-server's other samplers when it is on, as llama.cpp tells (its samplers do
    // nothing otherwise) and not replaced by Mirostat.
    bool has_dry() const { return !uses_mirostat() && dry_multiplier != 0.0f && dry_penalty_last_n != 0; }
    bool has_xtc() const { return !uses_mirostat() && xtc_probability > 0.0f && xtc_threshold <= 0.5f; }
    bool has_typical() const { return !uses_mirostat() && typical_p < 1.0f; }
    bool has_top_n_sigma() const { return !uses_mirostat() && top_n_sigma > 0.0f; }
    bool has_dynatemp() const { return !uses_mirostat() && dynatemp_range > 0.0f; }
    // Samplers that can change a greedy request's token: those before the temperature that may
    // drop or lower the argmax (DRY, XTC, typical_p; llama-server runs them at temperature 0 too).
    // top_k, top_p, min_p and top_n_sigma always keep the argmax.
    bool has_greedy_changers() const { return has_dry() || has_xtc() || has_typical(); }
    // llama-server's samplers that CacheFlow runs on the host only, whole row: those that change
    // the greedy token, and for sampled requests mirostat, top_n_sigma, the dynamic temperature
    // and a min_keep above 1 (0 and 1 keep the same).
    bool has_host_only_samplers() const {
        return has_greedy_changers() ||
               (!is_greedy() && (uses_mirostat() || has_top_n_sigma() || has_dynatemp() || min_keep > 1));
    }
    // Needs llama.cpp samplers before the token choice (penalties, logit bias, grammar, reasoning
    // budget, DRY, XTC, typical_p, ...): never in-graph.
    bool needs_cpu_samplers() const {
        return has_penalties() || !logit_bias.empty() || !grammar.empty() || reasoning.enabled() ||
               has_host_only_samplers();
    }
    // Of those, the ones kept out of the graph: penalties and DRY (their token history), grammars
    // (no backend implementation), the reasoning budget (a state machine over the tokens, and a
    // forced token may be any of the vocabulary) and llama-server's other samplers (no backend
    // implementation, or none that the in-graph top-k candidates could serve: they need the whole
    // row). A logit bias alone runs in-graph (llama.cpp's backend logit_bias). Token
    // probabilities need the row's logits (or the chain's candidates) on the host too.
    bool needs_host_samplers() const {
        return has_penalties() || !grammar.empty() || reasoning.enabled() || logprobs || has_host_only_samplers();
    }

    // Copy and validate; throws cf::Error(INVALID_ARGUMENT) naming the bad field.
    // n_vocab bounds stop_token_ids; pass 0 to skip that check.
    static SamplingParams from_c(const cf_sampling_params & params, int32_t n_vocab);
};

// Throws cf::Error for an empty prompt (INVALID_ARGUMENT), a token outside [0, n_vocab)
// (INVALID_ARGUMENT naming index and value) or num_tokens >= n_ctx_per_seq (PROMPT_TOO_LONG).
void validate_prompt(const int32_t * tokens, int32_t num_tokens, int32_t n_vocab, int32_t n_ctx_per_seq);

// Engine-owned state attached to a sequence without core knowing its type (the sampler chain).
using OpaqueHandle = std::unique_ptr<void, void (*)(void *)>;
void opaque_handle_no_free(void * ptr);

// Keyed by request_id everywhere in the scheduler and the KV cache manager; llama.cpp's sequence
// slot is not part of it (the llama.cpp adapter maps request ids to slots).
struct Sequence {
    Sequence(int64_t request_id, const int32_t * prompt, int32_t num_prompt_tokens, SamplingParams params,
             int32_t priority, int64_t arrival_ns, int32_t max_tokens_capacity);

    int64_t request_id;
    int32_t priority;
    SamplingParams params;
    SequenceStatus status = SequenceStatus::WAITING;
    int32_t num_prompt_tokens;
    int32_t num_computed_tokens = 0;  // the single progress counter, see the diagram above
    int32_t num_cached_tokens = 0;    // prompt tokens found in the prefix cache at first admission
    int32_t num_preemptions = 0;
    // num_computed_tokens when last admitted from WAITING (its prefix-cache hit), -1 after a swap-in or
    // a fork: while the two are equal it has computed nothing in this stay, and giving way loses nothing.
    int32_t num_tokens_at_admission = -1;
    bool holds_kv = false;            // the KV cache manager holds rows for it (admitted, not freed)
    bool scheduled = false;           // running and scheduled in the step being planned
    // Choices of one prompt (cf_request.num_forks), paged mode: the parent computes its prompt up
    // to the last token while fork_pending, then its waiting choices fork its blocks
    // (Scheduler::fork_choices); a choice names its parent until it forked or gave up on it.
    bool fork_pending = false;        // parent: choices wait to fork its prompt KV
    int64_t fork_parent_id = 0;       // choice: the parent's request id; 0 = none
    std::vector<int32_t> tokens;      // prompt then output, reserved up front
    cf_finish_reason finish_reason = CF_FINISH_REASON_NONE;
    std::string error_message;        // why it ended with CF_FINISH_REASON_ERROR, if it caused it

    int64_t arrival_ns;
    // Queue time, for the priority policy's aging (Scheduler::effective_priority): the sequence
    // entered WAITING or SWAPPED last at queued_since_ns (arrival, then each preemption) and had
    // waited wait_ns in earlier stays in a queue; time spent running does not count.
    int64_t queued_since_ns;
    int64_t wait_ns = 0;
    int64_t first_scheduled_ns = 0;
    int64_t first_token_ns = 0;
    int64_t finish_ns = 0;

    TextStream text;          // output text not released yet (stop_checker.h feeds it)
    std::string text_ready;   // released text that the request's next event carries
    // Token probabilities of the token just sampled (params.logprobs): entries
    // [logprobs_ready_offset, + num_logprobs_ready) of the step's buffer; its next event carries them.
    int32_t logprobs_ready_offset = 0;
    int32_t num_logprobs_ready = 0;
    int32_t slot_id = CF_SLOT_ID_NONE;       // held while running (cf_output_event.slot_id)
    int32_t last_slot_id = CF_SLOT_ID_NONE;  // the slot id it held last (for its final event)
    int32_t stop_string_index = -1;          // params.stop_strings[i] ended it; -1 = none
    // params.return_progress: num_prompt_processed of the last progress event queued; -1 = none yet.
    int32_t prompt_progress_reported = -1;
    OpaqueHandle sampler{nullptr, opaque_handle_no_free};

    int32_t num_tokens() const { return (int32_t) tokens.size(); }
    int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
    int32_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
    bool is_prefilled() const { return num_computed_tokens >= num_prompt_tokens; }
    bool is_finished() const { return status == SequenceStatus::FINISHED; }

    // Tokens the sequence may still occupy in the KV cache: prompt + max_tokens, capped.
    int32_t max_kv_tokens(int32_t n_ctx_per_seq) const;

    // Call only after sampling: appends one output token.
    void append_token(int32_t token_id) { tokens.push_back(token_id); }
};

// Sum of num_computed_tokens over seqs: the KV rows their attention reads, shared rows once per reader.
inline int64_t total_computed_tokens(const std::vector<std::unique_ptr<Sequence>> & seqs) {
    int64_t total = 0;
    for (const auto & seq : seqs) {
        total += seq->num_computed_tokens;
    }
    return total;
}

}  // namespace cf
