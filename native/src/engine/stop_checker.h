// stop_checker.h - decides whether a sequence finishes after its newest token, and releases its
// output text.
//
// Order of checks: end-of-generation token (unless ignore_eos), stop token ids, stop strings
// (STOP); then max_tokens and a full sequence context (LENGTH). Every token's text (special
// tokens render as nothing, as llama-server streams them) goes through the sequence's TextStream
// (core/text_stream.h), which holds back incomplete characters and possible stop-string starts
// and finds stop strings, also ones that span tokens or end inside a token.
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

    // Call right after seq.append_token(token_id). Appends the text the token releases to
    // seq.text_ready. Returns CF_FINISH_REASON_NONE to continue; when the sequence finishes, the
    // caller must release the rest with flush() (a stop string leaves nothing to flush).
    cf_finish_reason check(Sequence & seq, int32_t token_id);

    // The sequence ends (any reason): release the text still held into seq.text_ready.
    static void flush(Sequence & seq) { seq.text.flush(seq.text_ready); }

  private:
    const llama_vocab * vocab_;
    int32_t n_ctx_per_seq_;
    std::vector<char> piece_;  // reused buffer for one token's text
};

}  // namespace cf
