// event_queue.h - the queue of output events between the stepping thread and drainers.
//
// Thread-safe. push() appends a whole step's events, their text and token probabilities under
// one lock; drain() waits on a condition variable. The text of queued events lives in one byte
// buffer and their probabilities in one entry buffer; a queued event's text_offset
// (logprobs_offset) is its position in the bytes (entries) ever pushed (rewritten on drain). wake_all() releases current waiters (engine stop); close() also refuses
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

// Where drain() packs the events' text and probabilities. A null buffer drops that part
// (offsets 0); *_len / *num_logprobs receive what was written (or the oldest event's need).
struct DrainBuffers {
    char * text = nullptr;
    int32_t text_capacity = 0;
    int32_t * text_len = nullptr;
    cf_token_logprob * logprobs = nullptr;
    int32_t logprobs_capacity = 0;
    int32_t * num_logprobs = nullptr;
};

class EventQueue {
  public:
    // events[i].text_offset: where its text_len bytes start in `text`; events[i].logprobs_offset:
    // where its num_logprobs entries start in `logprobs`.
    void push(const std::vector<cf_output_event> & events, const std::string & text,
              const std::vector<cf_token_logprob> & logprobs = {});

    // Move up to capacity events into out; wait up to timeout_ms for the first one
    // (0 = no wait, < 0 = until one arrives or wake_all/close). Returns the count moved.
    // Their text and probabilities are packed into the buffers given (offsets rewritten),
    // stopping before an event whose text or probabilities do not fit; if the oldest does not
    // fit, returns 0 with its needs in *text_len and *num_logprobs and takes nothing.
    int32_t drain(cf_output_event * out, int32_t capacity, int32_t timeout_ms, const DrainBuffers & buffers = {});

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
    std::deque<cf_token_logprob> logprobs_;  // probabilities of the queued events, oldest first
    int64_t logprobs_base_ = 0;    // absolute index of logprobs_[0] among all entries ever pushed
    int64_t logprobs_pushed_ = 0;  // entries ever pushed
    uint64_t wake_generation_ = 0;
    int32_t num_waiters_ = 0;
    bool closed_ = false;
};

}  // namespace cf
