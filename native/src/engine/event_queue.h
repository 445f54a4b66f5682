// event_queue.h - the queue of output events between the stepping thread and drainers.
//
// Thread-safe. push() appends a whole step's events under one lock; drain() waits on a
// condition variable. wake_all() releases current waiters (engine stop); close() also refuses
// further waits and returns only once no thread is inside drain() (engine free).
#pragma once

#include "cacheflow.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace cf {

class EventQueue {
  public:
    void push(const std::vector<cf_output_event> & events);

    // Move up to capacity events into out; wait up to timeout_ms for the first one
    // (0 = no wait, < 0 = until one arrives or wake_all/close). Returns the count moved.
    int32_t drain(cf_output_event * out, int32_t capacity, int32_t timeout_ms);

    void wake_all();
    void close();
    size_t size() const;

  private:
    mutable std::mutex mu_;
    std::condition_variable ready_cv_;
    std::condition_variable idle_cv_;
    std::deque<cf_output_event> events_;
    uint64_t wake_generation_ = 0;
    int32_t num_waiters_ = 0;
    bool closed_ = false;
};

}  // namespace cf
