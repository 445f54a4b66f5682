// stop_checker.h - decides whether a sequence finishes after its newest token.
//
// Order of checks: end-of-generation token (unless ignore_eos), stop token ids, stop strings
// (STOP); then max_tokens and a full sequence context (LENGTH). Stop strings are matched against
// the incremental detokenized text of the output tokens (special tokens not rendered); only
// the tail that the newest piece can complete is searched.
#pragma once

#include "cacheflow.h"
#include "core/sequence.h"

#include <cstdint>
#include <vector>

struct llama_vocab;

namespace cf {

class StopChecker {
  public:
    StopChecker(const llama_vocab * vocab, int32_t n_ctx_per_seq);

    // Call right after seq.append_token(token_id). Returns CF_FINISH_REASON_NONE to continue.
    cf_finish_reason check(Sequence & seq, int32_t token_id);

  private:
    bool hits_stop_string(Sequence & seq, int32_t token_id);
    void append_piece(std::string & text, int32_t token_id);

    const llama_vocab * vocab_;
    int32_t n_ctx_per_seq_;
    std::vector<char> piece_;  // reused buffer for one token's text
};

}  // namespace cf
