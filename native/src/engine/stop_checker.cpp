// stop_checker.cpp - see stop_checker.h.
#include "engine/stop_checker.h"

#include "llama.h"

#include <algorithm>

namespace cf {

StopChecker::StopChecker(const llama_vocab * vocab, int32_t n_ctx_per_seq)
    : vocab_(vocab), n_ctx_per_seq_(n_ctx_per_seq), piece_(256) {}

cf_finish_reason StopChecker::check(Sequence & seq, int32_t token_id) {
    const SamplingParams & p = seq.params;
    if (!p.ignore_eos && llama_vocab_is_eog(vocab_, token_id)) {
        return CF_FINISH_REASON_STOP;
    }
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token_id) != p.stop_token_ids.end()) {
        return CF_FINISH_REASON_STOP;
    }
    if (!p.stop_strings.empty() && hits_stop_string(seq, token_id)) {
        return CF_FINISH_REASON_STOP;
    }
    if (seq.num_output_tokens() >= p.max_tokens || seq.num_tokens() >= n_ctx_per_seq_) {
        return CF_FINISH_REASON_LENGTH;
    }
    return CF_FINISH_REASON_NONE;
}

bool StopChecker::hits_stop_string(Sequence & seq, int32_t token_id) {
    const size_t old_len = seq.output_text.size();
    append_piece(seq.output_text, token_id);
    for (const std::string & stop : seq.params.stop_strings) {
        // A new match must end inside the new piece, so it starts at most len-1 bytes earlier.
        const size_t from = old_len >= stop.size() - 1 ? old_len - (stop.size() - 1) : 0;
        if (seq.output_text.find(stop, from) != std::string::npos) {
            return true;
        }
    }
    return false;
}

void StopChecker::append_piece(std::string & text, int32_t token_id) {
    int32_t n = llama_token_to_piece(vocab_, token_id, piece_.data(), (int32_t) piece_.size(), 0, false);
    if (n < 0) {
        piece_.resize((size_t) -n);
        n = llama_token_to_piece(vocab_, token_id, piece_.data(), (int32_t) piece_.size(), 0, false);
    }
    if (n > 0) {
        text.append(piece_.data(), (size_t) n);
    }
}

}  // namespace cf
