// event_queue.cpp - see event_queue.h.
#include "engine/event_queue.h"

#include <algorithm>
#include <chrono>

namespace cf {

void EventQueue::push(const std::vector<cf_output_event> & events, const std::string & text,
                      const std::vector<cf_token_logprob> & logprobs) {
    if (events.empty()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (cf_output_event ev : events) {
            ev.text_offset += text_pushed_;
            ev.logprobs_offset += logprobs_pushed_;
            events_.push_back(ev);
        }
        text_.append(text);
        text_pushed_ += (int64_t) text.size();
        logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
        logprobs_pushed_ += (int64_t) logprobs.size();
    }
    ready_cv_.notify_all();
}

int32_t EventQueue::drain(cf_output_event * out, int32_t capacity, int32_t timeout_ms, const DrainBuffers & buffers) {
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
    int64_t text_written = 0;
    int64_t logprobs_written = 0;
    for (; n < max_n; ++n) {
        cf_output_event ev = events_[(size_t) n];
        const int64_t span = (int64_t) ev.text_len + ev.error_len;  // the text, then the error's reason
        const bool text_fits = buffers.text == nullptr || text_written + span <= buffers.text_capacity;
        const bool logprobs_fit =
            buffers.logprobs == nullptr || logprobs_written + ev.num_logprobs <= buffers.logprobs_capacity;
        if (!text_fits || !logprobs_fit) {
            if (n == 0) {  // report the oldest event's needs, take nothing
                if (buffers.text_len != nullptr) {
                    *buffers.text_len = (int32_t) span;
                }
                if (buffers.num_logprobs != nullptr) {
                    *buffers.num_logprobs = ev.num_logprobs;
                }
                return 0;
            }
            break;
        }
        const char * src = text_.data() + (ev.text_offset - text_base_);
        if (buffers.text != nullptr) {
            std::copy(src, src + span, buffers.text + text_written);
            ev.text_offset = text_written;
            text_written += span;
        } else {
            ev.text_offset = 0;
        }
        if (buffers.logprobs != nullptr) {
            const auto first = logprobs_.begin() + (ev.logprobs_offset - logprobs_base_);
            std::copy(first, first + ev.num_logprobs, buffers.logprobs + logprobs_written);
            ev.logprobs_offset = logprobs_written;
            logprobs_written += ev.num_logprobs;
        } else {
            ev.logprobs_offset = 0;
        }
        out[n] = ev;
    }
    if (n > 0) {
        const cf_output_event & last = events_[(size_t) n - 1];
        const int64_t consumed = last.text_offset + last.text_len + last.error_len - text_base_;
        text_.erase(0, (size_t) consumed);
        text_base_ += consumed;
        const int64_t consumed_logprobs = last.logprobs_offset + last.num_logprobs - logprobs_base_;
        logprobs_.erase(logprobs_.begin(), logprobs_.begin() + consumed_logprobs);
        logprobs_base_ += consumed_logprobs;
        events_.erase(events_.begin(), events_.begin() + n);
    }
    if (buffers.text_len != nullptr) {
        *buffers.text_len = (int32_t) text_written;
    }
    if (buffers.num_logprobs != nullptr) {
        *buffers.num_logprobs = (int32_t) logprobs_written;
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
