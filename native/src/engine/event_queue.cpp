// event_queue.cpp - see event_queue.h.
#include "engine/event_queue.h"

#include <algorithm>
#include <chrono>

namespace cf {

void EventQueue::push(const std::vector<cf_output_event> & events, const std::string & text) {
    if (events.empty()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        const int64_t base = text_pushed_;
        for (cf_output_event ev : events) {
            ev.text_offset += base;
            events_.push_back(ev);
        }
        text_.append(text);
        text_pushed_ += (int64_t) text.size();
    }
    ready_cv_.notify_all();
}

int32_t EventQueue::drain(cf_output_event * out, int32_t capacity, int32_t timeout_ms, char * text,
                          int32_t text_capacity, int32_t * text_len) {
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
    const int32_t max_n = (int32_t) std::min<size_t>((size_t) capacity, events_.size());
    int32_t n = 0;
    int64_t written = 0;
    for (; n < max_n; ++n) {
        cf_output_event ev = events_[(size_t) n];
        const char * src = text_.data() + (ev.text_offset - text_base_);
        if (text != nullptr) {
            if (written + ev.text_len > text_capacity) {
                if (n == 0) {
                    *text_len = ev.text_len;
                    return 0;
                }
                break;
            }
            std::copy(src, src + ev.text_len, text + written);
            ev.text_offset = written;
            written += ev.text_len;
        } else {
            ev.text_offset = 0;
        }
        out[n] = ev;
    }
    if (n > 0) {
        const cf_output_event & last = events_[(size_t) n - 1];
        const int64_t consumed = last.text_offset + last.text_len - text_base_;
        text_.erase(0, (size_t) consumed);
        text_base_ += consumed;
        events_.erase(events_.begin(), events_.begin() + n);
    }
    if (text_len != nullptr) {
        *text_len = (int32_t) written;
    }
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
