// bench_prefix_cache.cpp - cost of the prefix cache lookup on admission: BlockManager::match_prefix
// (hash chain walk + token-by-token verification + partial-block scan) of a batch of prompts
// against a populated index, and the whole admission of the same batch (the scheduler's
// can_admit and admit each match once, then allocate_prefix shares the blocks).
//
// Build and run (arguments: prompts per batch, prompt tokens, block size):
//   cmake --build build/dev --target bench_prefix_cache && build/dev/bench_prefix_cache [256 1000 16]
// Workloads, each with every prompt of the batch committed to the index first:
//   shared:   one system prompt of prompt_len - 50 tokens + 50 tokens unique to each prompt (the
//             shared-prefix benchmark's shape): every lookup walks the whole shared chain;
//   distinct: prompt_len unique tokens per prompt: every lookup walks its own chain, in an index
//             of batch * prompt_len / block_size blocks;
//   miss:     the distinct index, looked up with prompts it has never seen (the first block
//             misses).
// Prints one line per workload and operation: the median over 15 rounds of the time for the
// whole batch, per prompt, per prompt token, and the tokens matched per prompt.
#include "core/block_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int32_t kUniqueTailTokens = 50;
constexpr int kRounds = 15;

using Prompts = std::vector<std::vector<int32_t>>;

// [num_prompts][prompt_len] token ids in [100, 49152); the first shared_len are the same in all.
Prompts make_prompts(int32_t num_prompts, int32_t prompt_len, int32_t shared_len, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> token(100, 49151);
    std::vector<int32_t> shared((size_t) shared_len);
    for (int32_t & t : shared) {
        t = token(rng);
    }
    Prompts prompts((size_t) num_prompts, shared);
    for (std::vector<int32_t> & p : prompts) {
        while ((int32_t) p.size() < prompt_len) {
            p.push_back(token(rng));
        }
    }
    return prompts;
}

// Each prompt computed once and finished: its full and partial blocks stay indexed (ref 0, in
// the free list), as after a wave of requests that finished.
void populate(cf::BlockManager & bm, const Prompts & prompts, int64_t first_seq_id) {
    int64_t seq_id = first_seq_id;
    for (const std::vector<int32_t> & p : prompts) {
        const cf::PrefixMatch m = bm.match_prefix(p.data(), (int32_t) p.size() - 1);
        bm.allocate_prefix(seq_id, m, (int32_t) p.size());
        const int32_t rest = (int32_t) p.size() - bm.find(seq_id)->num_tokens;
        if (!bm.append_slots(seq_id, rest, nullptr)) {
            std::fprintf(stderr, "pool too small\n");
            std::exit(1);
        }
        std::vector<cf::BlockCopy> copies;
        bm.take_copies(&copies);
        bm.commit(seq_id, p.data(), (int32_t) p.size());
        bm.free(seq_id);
        ++seq_id;
    }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
}

void report(const char * workload, const char * op, const std::vector<double> & rounds_s, const Prompts & prompts,
            double matched_per_prompt) {
    const double batch_us = median(rounds_s) * 1e6;
    const double n = (double) prompts.size();
    std::printf("%-9s %-9s batch %9.1f us  per prompt %7.2f us  per token %6.1f ns  matched/prompt %6.1f\n", workload, op,
                batch_us, batch_us / n, batch_us * 1e3 / (n * (double) prompts[0].size()), matched_per_prompt);
}

// Times match_prefix over the batch, then whole admissions (match twice + allocate_prefix; the
// tables are freed after each timed round, untimed).
void bench(const char * workload, cf::BlockManager & bm, const Prompts & prompts) {
    std::vector<double> match_s, admit_s;
    double matched = 0.0;
    volatile int64_t sink = 0;  // keeps the matches from being optimized away
    for (int round = 0; round < kRounds; ++round) {
        auto t0 = std::chrono::steady_clock::now();
        int64_t tokens = 0;
        for (const std::vector<int32_t> & p : prompts) {
            tokens += bm.match_prefix(p.data(), (int32_t) p.size() - 1).num_tokens();
        }
        match_s.push_back(seconds_since(t0));
        sink = sink + tokens;
        matched = (double) tokens / (double) prompts.size();

        const int64_t first_seq_id = 1'000'000;
        t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < prompts.size(); ++i) {
            const std::vector<int32_t> & p = prompts[i];
            const int32_t n = (int32_t) p.size() - 1;
            const int64_t needed = bm.num_blocks_needed(bm.match_prefix(p.data(), n), (int32_t) p.size());
            const cf::PrefixMatch m = bm.match_prefix(p.data(), n);
            if (needed <= bm.num_free_blocks()) {
                bm.allocate_prefix(first_seq_id + (int64_t) i, m, (int32_t) p.size());
            }
        }
        admit_s.push_back(seconds_since(t0));
        std::vector<cf::BlockCopy> copies;
        bm.take_copies(&copies);
        for (size_t i = 0; i < prompts.size(); ++i) {
            if (bm.find(first_seq_id + (int64_t) i) != nullptr) {
                bm.free(first_seq_id + (int64_t) i);
            }
        }
    }
    report(workload, "match", match_s, prompts, matched);
    report(workload, "admission", admit_s, prompts, matched);
}

}  // namespace

int main(int argc, char ** argv) {
    const int32_t num_prompts = argc > 1 ? std::max(1, std::atoi(argv[1])) : 256;
    const int32_t prompt_len = argc > 2 ? std::max(kUniqueTailTokens + 1, std::atoi(argv[2])) : 1000;
    const int32_t block_size = argc > 3 ? std::max(1, std::atoi(argv[3])) : 16;
    // Room for every prompt's own blocks twice over (the distinct index plus a batch admitted).
    const int32_t num_blocks = 2 * num_prompts * ((prompt_len + block_size - 1) / block_size + 1);
    std::printf("prefix cache lookup: %d prompts of %d tokens, block size %d, %d blocks, median of %d rounds\n",
                num_prompts, prompt_len, block_size, num_blocks, kRounds);

    const Prompts shared = make_prompts(num_prompts, prompt_len, prompt_len - kUniqueTailTokens, 1);
    cf::BlockManager shared_bm(num_blocks, block_size, true);
    populate(shared_bm, shared, 0);
    bench("shared", shared_bm, shared);

    const Prompts distinct = make_prompts(num_prompts, prompt_len, 0, 2);
    cf::BlockManager distinct_bm(num_blocks, block_size, true);
    populate(distinct_bm, distinct, 0);
    bench("distinct", distinct_bm, distinct);
    bench("miss", distinct_bm, make_prompts(num_prompts, prompt_len, 0, 3));

    const std::string error = distinct_bm.check_invariants() + shared_bm.check_invariants();
    if (!error.empty()) {
        std::fprintf(stderr, "invariants: %s\n", error.c_str());
        return 1;
    }
    return 0;
}
