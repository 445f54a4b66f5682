// test_profiler.cpp - unit tests of cf::Profiler: off by default, events come out in the order
// recorded, a full ring drops new events and counts them, partial drains, and a producer thread
// racing a consumer thread loses or duplicates nothing.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/profiler.h"

#include <cassert>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

using namespace cf;

namespace {

// Record `n` arrival events numbered first..first+n-1 (request_id = number).
void record_arrivals(Profiler & p, int64_t first, int64_t n) {
    for (int64_t i = first; i < first + n; ++i) {
        p.request(CF_PROFILE_EVENT_REQUEST_ARRIVAL, 0, 1000 + i, i, 7);
    }
}

std::vector<cf_profile_event> drain_all(Profiler & p, int32_t chunk = 4) {
    std::vector<cf_profile_event> out;
    std::vector<cf_profile_event> buf((size_t) chunk);
    while (true) {
        const int32_t n = p.drain(buf.data(), chunk);
        out.insert(out.end(), buf.begin(), buf.begin() + n);
        if (n < chunk) {
            return out;
        }
    }
}

void test_disabled() {
    Profiler p(0);
    assert(!p.enabled() && p.capacity() == 0);
    record_arrivals(p, 1, 10);
    p.step_begin(1, 5, 2, 1, 3);
    cf_profile_event ev{};
    assert(p.drain(&ev, 1) == 0);
    assert(p.num_dropped() == 0);
}

void test_fields_and_order() {
    Profiler p(8);
    p.step_begin(3, 100, 2, 1, 16);
    p.request(CF_PROFILE_EVENT_REQUEST_FINISH, 3, 150, 42, 9, CF_FINISH_REASON_LENGTH);
    p.step_end(3, 200, 5, 33, 60, 0, 41);
    p.request_copy(CF_PROFILE_EVENT_REQUEST_KV_DEMOTE, 4, 210, 7, 32, 2 * 368640);
    const std::vector<cf_profile_event> evs = drain_all(p);
    assert(evs.size() == 4);
    assert(evs[0].kind == CF_PROFILE_EVENT_STEP_BEGIN && evs[0].step_id == 3 && evs[0].time_ns == 100);
    assert(evs[0].num_seqs == 2 && evs[0].num_decode_tokens == 1 && evs[0].num_prefill_tokens == 16);
    assert(evs[0].request_id == 0 && evs[0].kv_tokens_used == 0);
    assert(evs[1].kind == CF_PROFILE_EVENT_REQUEST_FINISH && evs[1].request_id == 42);
    assert(evs[1].num_tokens == 9 && evs[1].finish_reason == CF_FINISH_REASON_LENGTH);
    assert(evs[2].kind == CF_PROFILE_EVENT_STEP_END && evs[2].num_waiting == 5);
    assert(evs[2].kv_tokens_used == 33 && evs[2].kv_tokens_free == 60 && evs[2].time_ns == 200);
    assert(evs[2].num_tokens == 41);  // STEP_END: the KV rows attended
    assert(evs[3].kind == CF_PROFILE_EVENT_REQUEST_KV_DEMOTE && evs[3].request_id == 7 && evs[3].step_id == 4);
    assert(evs[3].num_tokens == 32 && evs[3].num_bytes == 2 * 368640 && evs[3].finish_reason == 0);
    assert(drain_all(p).empty());
}

void test_full_ring_drops_newest() {
    Profiler p(4);
    record_arrivals(p, 1, 6);  // 5 and 6 do not fit
    assert(p.num_dropped() == 2);
    std::vector<cf_profile_event> evs = drain_all(p, 3);
    assert(evs.size() == 4);
    for (size_t i = 0; i < evs.size(); ++i) {
        assert(evs[i].request_id == (int64_t) i + 1);
    }
    // Drained slots are reused; wrap-around keeps the order.
    record_arrivals(p, 7, 3);
    evs = drain_all(p, 2);
    assert(evs.size() == 3 && evs[0].request_id == 7 && evs[2].request_id == 9);
    assert(p.num_dropped() == 2);
}

void test_partial_drain() {
    Profiler p(16);
    record_arrivals(p, 1, 10);
    cf_profile_event buf[3];
    assert(p.drain(buf, 3) == 3 && buf[2].request_id == 3);
    record_arrivals(p, 11, 2);
    const std::vector<cf_profile_event> evs = drain_all(p, 5);
    assert(evs.size() == 9 && evs.front().request_id == 4 && evs.back().request_id == 12);
}

// One producer, one consumer: every event comes out exactly once, in order; drops are counted.
void test_concurrent_producer_consumer() {
    constexpr int64_t kEvents = 200000;
    Profiler p(64);
    std::thread producer([&] { record_arrivals(p, 1, kEvents); });
    std::vector<int64_t> seen;
    std::vector<cf_profile_event> buf(16);
    bool producer_done = false;
    while (true) {
        const int32_t n = p.drain(buf.data(), (int32_t) buf.size());
        for (int32_t i = 0; i < n; ++i) {
            seen.push_back(buf[(size_t) i].request_id);
        }
        if (n == 0 && producer_done) {
            break;
        }
        if (n == 0 && (int64_t) seen.size() + p.num_dropped() == kEvents) {
            producer.join();
            producer_done = true;
        }
    }
    assert((int64_t) seen.size() + p.num_dropped() == kEvents);
    for (size_t i = 1; i < seen.size(); ++i) {
        assert(seen[i] > seen[i - 1]);
    }
}

// Cost of one recorded event (the overhead budget: a step records ~2 + a few request events and
// lasts milliseconds). Printed, and bounded generously so a loaded machine does not flake.
void test_record_cost() {
    constexpr int32_t kEvents = 1 << 20;
    Profiler on(kEvents);
    Profiler off(0);
    const auto time_ns = [](Profiler & p) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int32_t i = 0; i < kEvents; ++i) {
            p.step_begin(i, i, 8, 8, 0);
        }
        const auto t1 = std::chrono::steady_clock::now();
        return std::chrono::duration<double, std::nano>(t1 - t0).count() / kEvents;
    };
    const double off_ns = time_ns(off);
    const double on_ns = time_ns(on);
    assert(on.num_dropped() == 0);
    std::printf("test_profiler: record %.1f ns/event (off: %.1f ns)\n", on_ns, off_ns);
    assert(on_ns < 2000.0);
}

}  // namespace

int main() {
    test_disabled();
    test_fields_and_order();
    test_full_ring_drops_newest();
    test_partial_drain();
    test_concurrent_producer_consumer();
    test_record_cost();
    std::printf("test_profiler: ok\n");
    return 0;
}
