// host_block_pool.cpp - see host_block_pool.h.
#include "kv/host_block_pool.h"

#include <cassert>

namespace cf {

HostBlockPool::HostBlockPool(int32_t num_slots) : num_slots_(num_slots) {
    assert(num_slots >= 0);
    free_.reserve((size_t) num_slots);
    for (int32_t h = num_slots - 1; h >= 0; --h) {
        free_.push_back(h);  // slot 0 is taken first
    }
}

bool HostBlockPool::allocate(int32_t n, std::vector<int32_t> * out) {
    assert(n >= 0);
    if (n > num_free()) {
        return false;
    }
    for (int32_t i = 0; i < n; ++i) {
        out->push_back(free_.back());
        free_.pop_back();
    }
    return true;
}

void HostBlockPool::free(int32_t slot_id) {
    assert(slot_id >= 0 && slot_id < num_slots_);
    parked_.push_back(slot_id);
}

void HostBlockPool::end_step() {
    free_.insert(free_.end(), parked_.begin(), parked_.end());
    parked_.clear();
}

std::string HostBlockPool::check_invariants(const std::vector<int32_t> & held) const {
    std::vector<int32_t> seen((size_t) num_slots_, 0);
    for (const auto * list : { &free_, &parked_, &held }) {
        for (int32_t h : *list) {
            if (h < 0 || h >= num_slots_) {
                return "host slot " + std::to_string(h) + " outside [0, " + std::to_string(num_slots_) + ")";
            }
            if (++seen[(size_t) h] > 1) {
                return "host slot " + std::to_string(h) + " is free, parked or held twice";
            }
        }
    }
    for (int32_t h = 0; h < num_slots_; ++h) {
        if (seen[(size_t) h] == 0) {
            return "host slot " + std::to_string(h) + " is lost (neither free, parked nor held)";
        }
    }
    return "";
}

}  // namespace cf
