#include "core/block_pool.h"

#include <cassert>
#include <climits>
#include <sstream>

namespace cf {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
    assert(num_blocks >= 1 && block_size >= 1);
    assert((int64_t) num_blocks * block_size <= INT32_MAX);
    ref_counts_.assign((size_t) num_blocks, 0);
    for (int32_t block_id = 0; block_id < num_blocks; ++block_id) {
        free_.push_back(block_id);
    }
}

int32_t BlockPool::ref_count(int32_t block_id) const {
    assert(is_valid(block_id));
    return ref_counts_[(size_t) block_id];
}

bool BlockPool::allocate(int32_t n, std::vector<int32_t> * out) {
    // Call only with n >= 0 and an out vector; a shortage is a result, not a bug.
    assert(n >= 0 && out != nullptr);
    if (!can_allocate(n)) {
        return false;
    }
    for (int32_t i = 0; i < n; ++i) {
        const int32_t block_id = free_.front();
        free_.pop_front();
        assert(ref_counts_[(size_t) block_id] == 0);
        ref_counts_[(size_t) block_id] = 1;
        out->push_back(block_id);
    }
    return true;
}

void BlockPool::incref(int32_t block_id) {
    // Call only on a used block: reviving a free block would leave it in the free list too.
    assert(is_valid(block_id) && ref_counts_[(size_t) block_id] >= 1);
    ref_counts_[(size_t) block_id] += 1;
}

void BlockPool::decref(int32_t block_id) {
    // Call only on a used block: a ref count never goes below 0.
    assert(is_valid(block_id) && ref_counts_[(size_t) block_id] >= 1);
    if (--ref_counts_[(size_t) block_id] == 0) {
        free_.push_back(block_id);
    }
}

std::string BlockPool::check_invariants() const {
    std::vector<uint8_t> in_free(ref_counts_.size(), 0);
    for (int32_t block_id : free_) {
        if (!is_valid(block_id)) {
            return "free list holds invalid block id " + std::to_string(block_id);
        }
        if (in_free[(size_t) block_id]) {
            return "block " + std::to_string(block_id) + " is in the free list twice";
        }
        in_free[(size_t) block_id] = 1;
    }
    int32_t num_used = 0;
    for (int32_t block_id = 0; block_id < num_blocks(); ++block_id) {
        const int32_t ref = ref_counts_[(size_t) block_id];
        const std::string name = "block " + std::to_string(block_id);
        if (ref < 0) {
            return name + " has negative ref count " + std::to_string(ref);
        }
        if (in_free[(size_t) block_id] && ref != 0) {
            return name + " is free but has ref count " + std::to_string(ref);
        }
        if (!in_free[(size_t) block_id] && ref == 0) {
            return name + " has ref count 0 but is not in the free list (leaked)";
        }
        num_used += ref > 0 ? 1 : 0;
    }
    if (num_free() + num_used != num_blocks()) {
        return "free (" + std::to_string(num_free()) + ") + used (" + std::to_string(num_used) +
               ") != total (" + std::to_string(num_blocks()) + ")";
    }
    return "";
}

std::string BlockPool::dump() const {
    std::ostringstream os;
    os << "BlockPool(num_blocks=" << num_blocks() << ", block_size=" << block_size_ << ", free=" << num_free()
       << ")\n  free list (next first):";
    for (int32_t block_id : free_) {
        os << " " << block_id;
    }
    os << "\n  ref counts:";
    for (int32_t block_id = 0; block_id < num_blocks(); ++block_id) {
        if (ref_counts_[(size_t) block_id] != 0) {
            os << " " << block_id << ":" << ref_counts_[(size_t) block_id];
        }
    }
    os << "\n";
    return os.str();
}

}  // namespace cf
