// event_queue.h - the queue of output events between the stepping thread and drainers.
//
// Thread-safe. push() appends a whole step's events and their text under one lock; drain() waits
// on a condition variable. The text of queued events lives in one byte buffer; a queued event's
// text_offset is its position in the bytes ever pushed (rewritten on drain). wake_all() releases current waiters (engine stop); close() also refuses
// further waits and returns only once no thread is inside drain() (engine free).
#pragma once

#include "cacheflow.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace cf {

class EventQueue {
  public:
    // events[i].text_offset: where its text_len bytes start in `text`.
    void push(const std::vector<cf_output_event> & events, const std::string & text);

    // Move up to capacity events into out; wait up to timeout_ms for the first one
    // (0 = no wait, < 0 = until one arrives or wake_all/close). Returns the count moved.
    // With text != nullptr their text is packed into text[0, text_capacity) (offsets rewritten,
    // *text_len = bytes written), stopping before an event whose text does not fit; if the oldest
    // does not fit, returns 0 with *text_len = its need and takes nothing. Without, text_offset = 0.
    int32_t drain(cf_output_event * out, int32_t capacity, int32_t timeout_ms, char * text = nullptr,
                  int32_t text_capacity = 0, int32_t * text_len = nullptr);

    void wake_all();
    void close();
    size_t size() const;

  private:
    mutable std::mutex mu_;
    std::condition_variable ready_cv_;
    std::condition_variable idle_cv_;
    std::deque<cf_output_event> events_;
    std::string text_;        // text of the queued events, oldest first
    int64_t text_base_ = 0;   // absolute offset of text_[0] among all bytes ever pushed
    int64_t text_pushed_ = 0; // bytes ever pushed
    uint64_t wake_generation_ = 0;
    int32_t num_waiters_ = 0;
    bool closed_ = false;
};

}  // namespace cf
