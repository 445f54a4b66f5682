// stop_checker.cpp - see stop_checker.h.
#include "engine/stop_checker.h"

#include "llama.h"

#include <algorithm>

namespace cf {

StopChecker::StopChecker(const llama_vocab * vocab, int32_t n_ctx_per_seq)
    : vocab_(vocab), n_ctx_per_seq_(n_ctx_per_seq), piece_(256) {}

cf_finish_reason StopChecker::check(Sequence & seq, int32_t token_id) {
    int32_t n = llama_token_to_piece(vocab_, token_id, piece_.data(), (int32_t) piece_.size(), 0, false);
    if (n < 0) {
        piece_.resize((size_t) -n);
        n = llama_token_to_piece(vocab_, token_id, piece_.data(), (int32_t) piece_.size(), 0, false);
    }
    const SamplingParams & p = seq.params;
    const int stop_index = seq.text.push(piece_.data(), (size_t) std::max(n, 0), p.stop_strings, seq.text_ready);
    if (!p.ignore_eos && llama_vocab_is_eog(vocab_, token_id)) {
        return CF_FINISH_REASON_STOP;
    }
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token_id) != p.stop_token_ids.end()) {
        return CF_FINISH_REASON_STOP;
    }
    if (stop_index >= 0) {
        seq.stop_string_index = stop_index;
        return CF_FINISH_REASON_STOP;
    }
    if (seq.num_output_tokens() >= p.max_tokens || seq.num_tokens() >= n_ctx_per_seq_) {
        return CF_FINISH_REASON_LENGTH;
    }
    return CF_FINISH_REASON_NONE;
}

}  // namespace cf
