// sampling_pool.h - samples a step's top-k candidate rows on a small persistent thread pool.
//
// A stochastic row reduced in-graph to its top-k candidates (LlamaSession::top_k_candidates) is
// sampled on the CPU by its sequence's own llama.cpp chain (sample_candidates, sampling.h): 0.5 to
// 2 us per row (bench_sampling), which one thread spent row after row adds up to a large part of a
// step at a few hundred sequences (0.4 ms of a 3.3 ms step at 64 on an H200 host, before the
// candidates were sorted for top_k). The rows are independent (each sequence has its own chain and
// generator, and no chain element the candidate rows use shares state across sequences: top_k,
// top_p, min_p, temp, dist, logit_bias, greedy; penalties and grammars keep a row off this path),
// so they are split over threads:
//
//   engine thread: sample(rows) ── publish job, wake workers ──┐
//        │                                                     │ workers 1..num_threads-1
//        ├── claim rows (next_row_) ◄── claim rows ◄───────────┘ (each with its own scratch)
//        └── close the job, wait until no worker holds it ── rows[i].token set for every i
//
// Each row is claimed by exactly one thread (one fetch_add), which runs its sequence's chain once:
// the tokens are bit-identical to the serial order for any thread count and any claiming order.
// Below kMinParallelRows rows, or with one thread, the caller samples them all itself: waking a
// sleeping worker takes as long as sampling several rows, so fewer rows would only pay for the
// wake-up (the rows are claimed one at a time, so a late worker simply takes fewer).
//
// Nothing is allocated or created in sample(): the threads start in the constructor and sleep on a
// condition variable between steps; each thread's scratch buffer is sized once (max_candidates).
//
// Thread-safety: sample() from one thread at a time (the stepping thread); the rows' sequences must
// not be touched by anyone else during the call.
#pragma once

#include "core/sequence.h"
#include "engine/sampling.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cf {

// One top-k candidate row of a step: seq's chain picks token from ids [n] / logits [n] (owned by
// the llama.cpp context, valid until its next decode).
struct CandidateRow {
    Sequence * seq = nullptr;
    const int32_t * ids = nullptr;
    const float * logits = nullptr;
    int32_t n = 0;
    size_t index = 0;                // the caller's: which scheduled sequence the row belongs to
    int32_t token = CF_TOKEN_NONE;  // out: the sampled token
};

class SamplingPool {
  public:
    // Fewer rows than this are sampled by the calling thread alone.
    static constexpr size_t kMinParallelRows = 16;

    // num_threads >= 1 threads sample, the caller of sample() among them (num_threads - 1 workers
    // start here); max_candidates >= 1: the largest n of any row (each thread's scratch size).
    SamplingPool(int32_t num_threads, int32_t max_candidates);
    // Wakes the workers and joins them.
    ~SamplingPool();
    SamplingPool(const SamplingPool &) = delete;
    SamplingPool & operator=(const SamplingPool &) = delete;

    // Set rows[i].token for every i with sample_candidates (sampling.h), on up to num_threads
    // threads, the caller's included. Rows must belong to distinct sequences, each with n <=
    // max_candidates. Throws Error(INTERNAL) (after every thread let go of the rows) when a row
    // failed: the first failure's message; the other rows' tokens are then unspecified.
    void sample(CandidateRow * rows, size_t num_rows);

    int32_t num_threads() const { return (int32_t) scratch_.size(); }

  private:
    void worker_loop(size_t thread_index);
    // Claim and sample rows of the current job with scratch_[thread_index] until none is left.
    void run_rows(size_t thread_index, CandidateRow * rows, size_t num_rows);
    void sample_serial(CandidateRow * rows, size_t num_rows);

    int32_t max_candidates_;
    std::vector<CandidateScratch> scratch_;  // [num_threads], each for max_candidates
    std::vector<std::thread> workers_;                    // num_threads - 1

    // The current job, guarded by mu_ (next_row_ and num_active_ are atomics, the rest is written
    // only under mu_ while no worker holds a job).
    std::mutex mu_;
    std::condition_variable wake_cv_;
    uint64_t generation_ = 0;  // bumped per published job
    bool job_open_ = false;    // workers may still take the job (false once the caller claimed all)
    bool stopping_ = false;
    CandidateRow * rows_ = nullptr;
    size_t num_rows_ = 0;
    alignas(64) std::atomic<size_t> next_row_{0};    // next unclaimed row of the job
    alignas(64) std::atomic<int32_t> num_active_{0};  // workers holding the job (took it, not yet let go)
    std::string error_;  // the job's first failure (under mu_); "" = none
};

}  // namespace cf
