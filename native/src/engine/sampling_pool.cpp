// sampling_pool.cpp - see sampling_pool.h.
#include "engine/sampling_pool.h"

#include "core/error.h"

#include <algorithm>

namespace cf {

SamplingPool::SamplingPool(int32_t num_threads, int32_t max_candidates)
    : max_candidates_(max_candidates),
      scratch_((size_t) std::max(1, num_threads), CandidateScratch(std::max(1, max_candidates))) {
    workers_.reserve(scratch_.size() - 1);
    for (size_t t = 1; t < scratch_.size(); ++t) {
        workers_.emplace_back([this, t] { worker_loop(t); });
    }
}

SamplingPool::~SamplingPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    wake_cv_.notify_all();
    for (std::thread & w : workers_) {
        w.join();
    }
}

void SamplingPool::sample(CandidateRow * rows, size_t num_rows) {
    for (size_t i = 0; i < num_rows; ++i) {
        if (rows[i].n > max_candidates_) {
            throw Error(CF_STATUS_INTERNAL, "a row of " + std::to_string(rows[i].n) + " top-k candidates, more than the " +
                                                std::to_string(max_candidates_) + " the sampling pool was sized for");
        }
    }
    if (num_rows < kMinParallelRows || workers_.empty()) {
        sample_serial(rows, num_rows);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        rows_ = rows;
        num_rows_ = num_rows;
        next_row_.store(0, std::memory_order_relaxed);
        error_.clear();
        job_open_ = true;
        ++generation_;
    }
    wake_cv_.notify_all();
    run_rows(0, rows, num_rows);
    {
        // Every row is claimed: a worker waking from here on must not take the job, and one that
        // took it is still running its last row (or finding none left).
        std::lock_guard<std::mutex> lock(mu_);
        job_open_ = false;
    }
    while (num_active_.load(std::memory_order_acquire) != 0) {
        std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) {
        throw Error(CF_STATUS_INTERNAL, error_);
    }
}

void SamplingPool::sample_serial(CandidateRow * rows, size_t num_rows) {
    CandidateScratch & scratch = scratch_[0];
    for (size_t i = 0; i < num_rows; ++i) {
        CandidateRow & r = rows[i];
        r.token = sample_candidates(*r.seq, r.ids, r.logits, r.n, scratch);
    }
}

void SamplingPool::run_rows(size_t thread_index, CandidateRow * rows, size_t num_rows) {
    CandidateScratch & scratch = scratch_[thread_index];
    while (true) {
        const size_t i = next_row_.fetch_add(1, std::memory_order_relaxed);
        if (i >= num_rows) {
            return;
        }
        CandidateRow & r = rows[i];
        try {
            r.token = sample_candidates(*r.seq, r.ids, r.logits, r.n, scratch);
        } catch (const std::exception & e) {
            std::lock_guard<std::mutex> lock(mu_);
            if (error_.empty()) {
                error_ = e.what();
            }
        }
    }
}

void SamplingPool::worker_loop(size_t thread_index) {
    uint64_t seen_generation = 0;
    while (true) {
        CandidateRow * rows = nullptr;
        size_t num_rows = 0;
        {
            std::unique_lock<std::mutex> lock(mu_);
            wake_cv_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
            if (stopping_) {
                return;
            }
            seen_generation = generation_;
            if (!job_open_) {
                continue;  // woke after the caller had claimed every row
            }
            rows = rows_;
            num_rows = num_rows_;
            // under mu_: the caller closes the job under mu_, then waits for this to drop to 0
            num_active_.fetch_add(1, std::memory_order_relaxed);
        }
        run_rows(thread_index, rows, num_rows);
        num_active_.fetch_sub(1, std::memory_order_release);
    }
}

}  // namespace cf
