// profiler.cpp - ring buffer of cf_profile_event (see profiler.h for the threading contract).
#include "core/profiler.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace cf {

Profiler::Profiler(int32_t capacity) : capacity_(capacity > 0 ? capacity : 0) {
    if (capacity_ > 0) {
        ring_ = std::make_unique<cf_profile_event[]>((size_t) capacity_);
    }
}

void Profiler::push(const cf_profile_event & event) {
    const uint64_t head = head_.load(std::memory_order_relaxed);  // only this thread writes it
    const uint64_t tail = tail_.load(std::memory_order_acquire);  // slots before tail are free again
    if (head - tail >= (uint64_t) capacity_) {
        num_dropped_.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    ring_[head % (uint64_t) capacity_] = event;
    head_.store(head + 1, std::memory_order_release);  // publishes the slot to consumers
}

void Profiler::step_begin(int64_t step_id, int64_t time_ns, int32_t num_seqs, int32_t num_decode_tokens,
                          int32_t num_prefill_tokens) {
    if (capacity_ == 0) {
        return;
    }
    cf_profile_event ev{};
    ev.kind = CF_PROFILE_EVENT_STEP_BEGIN;
    ev.time_ns = time_ns;
    ev.step_id = step_id;
    ev.num_seqs = num_seqs;
    ev.num_decode_tokens = num_decode_tokens;
    ev.num_prefill_tokens = num_prefill_tokens;
    push(ev);
}

void Profiler::step_end(int64_t step_id, int64_t time_ns, int32_t num_waiting, int32_t kv_tokens_used,
                        int32_t kv_tokens_free, int32_t kv_blocks_used, int32_t kv_tokens_attended) {
    if (capacity_ == 0) {
        return;
    }
    cf_profile_event ev{};
    ev.kind = CF_PROFILE_EVENT_STEP_END;
    ev.time_ns = time_ns;
    ev.step_id = step_id;
    ev.num_waiting = num_waiting;
    ev.kv_tokens_used = kv_tokens_used;
    ev.kv_tokens_free = kv_tokens_free;
    ev.kv_blocks_used = kv_blocks_used;
    ev.num_tokens = kv_tokens_attended;
    push(ev);
}

void Profiler::request(cf_profile_event_kind kind, int64_t step_id, int64_t time_ns, int64_t request_id,
                       int32_t num_tokens, int32_t finish_reason) {
    if (capacity_ == 0) {
        return;
    }
    cf_profile_event ev{};
    ev.kind = kind;
    ev.time_ns = time_ns;
    ev.step_id = step_id;
    ev.request_id = request_id;
    ev.num_tokens = num_tokens;
    ev.finish_reason = finish_reason;
    push(ev);
}

void Profiler::request_copy(cf_profile_event_kind kind, int64_t step_id, int64_t time_ns, int64_t request_id,
                            int32_t num_tokens, int64_t num_bytes) {
    if (capacity_ == 0) {
        return;
    }
    cf_profile_event ev{};
    ev.kind = kind;
    ev.time_ns = time_ns;
    ev.step_id = step_id;
    ev.request_id = request_id;
    ev.num_tokens = num_tokens;
    ev.num_bytes = num_bytes;
    push(ev);
}

int32_t Profiler::drain(cf_profile_event * out, int32_t capacity) {
    if (capacity_ == 0 || capacity <= 0) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(drain_mu_);
    const uint64_t tail = tail_.load(std::memory_order_relaxed);  // consumers serialize on drain_mu_
    const uint64_t head = head_.load(std::memory_order_acquire);  // slots before head are complete
    assert(head - tail <= (uint64_t) capacity_);
    const uint64_t n = std::min<uint64_t>(head - tail, (uint64_t) capacity);
    for (uint64_t i = 0; i < n; ++i) {
        out[i] = ring_[(tail + i) % (uint64_t) capacity_];
    }
    tail_.store(tail + n, std::memory_order_release);  // hands the slots back to the producer
    return (int32_t) n;
}

}  // namespace cf
