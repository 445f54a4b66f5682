// event_queue.cpp - see event_queue.h.
#include "engine/event_queue.h"

#include <algorithm>
#include <chrono>

namespace cf {

void EventQueue::push(const std::vector<cf_output_event> & events) {
    if (events.empty()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        events_.insert(events_.end(), events.begin(), events.end());
    }
    ready_cv_.notify_all();
}

int32_t EventQueue::drain(cf_output_event * out, int32_t capacity, int32_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    if (events_.empty() && timeout_ms != 0 && !closed_) {
        const uint64_t generation = wake_generation_;
        auto ready = [&] { return !events_.empty() || closed_ || wake_generation_ != generation; };
        ++num_waiters_;
        if (timeout_ms < 0) {
            ready_cv_.wait(lock, ready);
        } else {
            ready_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
        }
        --num_waiters_;
        if (closed_ && num_waiters_ == 0) {
            idle_cv_.notify_all();
        }
    }
    const int32_t n = (int32_t) std::min<size_t>((size_t) capacity, events_.size());
    std::copy(events_.begin(), events_.begin() + n, out);
    events_.erase(events_.begin(), events_.begin() + n);
    return n;
}

void EventQueue::wake_all() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++wake_generation_;
    }
    ready_cv_.notify_all();
}

void EventQueue::close() {
    std::unique_lock<std::mutex> lock(mu_);
    closed_ = true;
    ready_cv_.notify_all();
    idle_cv_.wait(lock, [&] { return num_waiters_ == 0; });
}

size_t EventQueue::size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_.size();
}

}  // namespace cf
