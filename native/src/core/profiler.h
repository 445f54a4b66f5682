// profiler.h - the engine's event recorder: a fixed-size ring buffer of cf_profile_event.
//
// One producer (the stepping thread, which already holds the step lock) records; any number of
// consumers drain. The ring is single-producer / single-consumer lock-free: the producer only
// touches `head_` (release) and reads `tail_` (acquire); consumers serialize among themselves on
// `drain_mu_`, which the producer never takes. Nothing allocates after construction.
//
//   slots:   [ ... drained ... | tail_ ... recorded, not drained ... head_ | ... free ... ]
//            (indices grow forever; slot of index i is i % capacity)
//
// When the ring is full a new event is dropped (and counted), never an old one: a consumer may be
// copying the old slots at that moment, and a trace with a hole at its end is easier to read than
// one whose beginning changed under the reader.
//
// Disabled (capacity 0) every record call is one predictable branch.
#pragma once

#include "cacheflow.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace cf {

class Profiler {
  public:
    // capacity: events the ring holds (>= 0; 0 = profiling off). Allocates the ring once.
    explicit Profiler(int32_t capacity);
    Profiler(const Profiler &) = delete;
    Profiler & operator=(const Profiler &) = delete;

    bool enabled() const { return capacity_ > 0; }
    int32_t capacity() const { return capacity_; }

    // ---- producer side: call only from the stepping thread (one producer at a time).

    // Record one event; drops it (num_dropped + 1) when the ring is full.
    void record(const cf_profile_event & event) {
        if (capacity_ > 0) {
            push(event);
        }
    }

    // A step starts: the batch holds num_seqs sequences, num_decode_tokens + num_prefill_tokens
    // tokens. time_ns: when the step began (before the inbox was read).
    void step_begin(int64_t step_id, int64_t time_ns, int32_t num_seqs, int32_t num_decode_tokens,
                    int32_t num_prefill_tokens);

    // The step's results are published. KV rows: used = holding a token (a shared row once), free =
    // not set aside for any running sequence, attended = every running sequence's computed tokens
    // (a shared row once per holder: what attention reads; in the event's num_tokens); blocks in
    // paged mode only (0 otherwise).
    void step_end(int64_t step_id, int64_t time_ns, int32_t num_waiting, int32_t kv_tokens_used,
                  int32_t kv_tokens_free, int32_t kv_blocks_used, int32_t kv_tokens_attended);

    // A request event (CF_PROFILE_EVENT_REQUEST_*); num_tokens and finish_reason as documented
    // for each kind in cacheflow.h.
    void request(cf_profile_event_kind kind, int64_t step_id, int64_t time_ns, int64_t request_id,
                 int32_t num_tokens, int32_t finish_reason = CF_FINISH_REASON_NONE);

    // A request event that moved KV (CF_PROFILE_EVENT_REQUEST_KV_DEMOTE / KV_PROMOTE): num_tokens KV rows,
    // num_bytes bytes copied.
    void request_copy(cf_profile_event_kind kind, int64_t step_id, int64_t time_ns, int64_t request_id,
                      int32_t num_tokens, int64_t num_bytes);

    // ---- consumer side: thread-safe.

    // Move up to capacity recorded events, oldest recorded first, into out[0..n); returns n.
    int32_t drain(cf_profile_event * out, int32_t capacity);

    // Events dropped because the ring was full, since construction. Thread-safe.
    int64_t num_dropped() const { return num_dropped_.load(std::memory_order_relaxed); }

  private:
    void push(const cf_profile_event & event);

    const int32_t capacity_;
    std::unique_ptr<cf_profile_event[]> ring_;
    alignas(64) std::atomic<uint64_t> head_{0};  // next index the producer writes
    alignas(64) std::atomic<uint64_t> tail_{0};  // next index a consumer reads
    std::atomic<int64_t> num_dropped_{0};
    std::mutex drain_mu_;  // consumers only
};

}  // namespace cf
