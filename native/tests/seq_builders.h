// seq_builders.h - builders shared by the native scheduler, KV manager and step plan tests (STYLE.md
// section 7: builders instead of setup code).
#pragma once

#include "core/sequence.h"
#include "core/step_plan.h"

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

namespace cf {
namespace test {

// n consecutive token ids [start, start + n).
inline std::vector<int32_t> tokens(int32_t n, int32_t start = 0) {
    std::vector<int32_t> v((size_t) n);
    std::iota(v.begin(), v.end(), start);
    return v;
}

// After commit_step(plan): appends token to every scheduled row that samples and returns those that
// reached their max_tokens or n_ctx_per_seq tokens (for the caller to finish), in plan order.
inline std::vector<Sequence *> sample_rows(const StepPlan & plan, int32_t token, int64_t n_ctx_per_seq) {
    std::vector<Sequence *> done;
    for (const ScheduledSeq & s : plan.seqs) {
        if (!s.needs_sample) {
            continue;
        }
        s.seq->append_token(token);
        if (s.seq->num_output_tokens() >= s.seq->params.max_tokens || s.seq->num_tokens() >= n_ctx_per_seq) {
            done.push_back(s.seq);
        }
    }
    return done;
}

// A WAITING sequence of prompt tokens [0, prompt_len) that may grow to prompt_len + max_tokens.
inline std::unique_ptr<Sequence> make_seq(int64_t request_id, int32_t prompt_len, int32_t max_tokens = 4,
                                          int32_t priority = 0) {
    SamplingParams p;
    p.max_tokens = max_tokens;
    const std::vector<int32_t> prompt = tokens(prompt_len);
    return std::make_unique<Sequence>(request_id, prompt.data(), prompt_len, p, priority, 0, prompt_len + max_tokens);
}

}  // namespace test
}  // namespace cf
