#include "core/block_pool.h"

#include <cassert>
#include <climits>
#include <sstream>

namespace cf {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
    assert(num_blocks >= 1 && block_size >= 1);
    assert((int64_t) num_blocks * block_size <= INT32_MAX);
    ref_counts_.assign((size_t) num_blocks, 0);
    next_.assign((size_t) num_blocks + 1, num_blocks);
    prev_.assign((size_t) num_blocks + 1, num_blocks);
    for (int32_t block_id = 0; block_id < num_blocks; ++block_id) {
        link_back(block_id);
    }
}

int32_t BlockPool::ref_count(int32_t block_id) const {
    assert(is_valid(block_id));
    return ref_counts_[(size_t) block_id];
}

void BlockPool::link_back(int32_t block_id) {
    const int32_t sentinel = num_blocks();
    const int32_t last = prev_[(size_t) sentinel];
    next_[(size_t) last] = block_id;
    prev_[(size_t) block_id] = last;
    next_[(size_t) block_id] = sentinel;
    prev_[(size_t) sentinel] = block_id;
    num_free_ += 1;
}

void BlockPool::link_front(int32_t block_id) {
    const int32_t sentinel = num_blocks();
    const int32_t first = next_[(size_t) sentinel];
    prev_[(size_t) first] = block_id;
    next_[(size_t) block_id] = first;
    prev_[(size_t) block_id] = sentinel;
    next_[(size_t) sentinel] = block_id;
    num_free_ += 1;
}

void BlockPool::unlink(int32_t block_id) {
    const int32_t before = prev_[(size_t) block_id];
    const int32_t after = next_[(size_t) block_id];
    next_[(size_t) before] = after;
    prev_[(size_t) after] = before;
    next_[(size_t) block_id] = prev_[(size_t) block_id] = num_blocks();
    num_free_ -= 1;
}

bool BlockPool::allocate(int32_t n, std::vector<int32_t> * out) {
    // Call only with n >= 0 and an out vector; a shortage is a result, not a bug.
    assert(n >= 0 && out != nullptr);
    if (!can_allocate(n)) {
        return false;
    }
    for (int32_t i = 0; i < n; ++i) {
        const int32_t block_id = next_[(size_t) num_blocks()];
        assert(ref_counts_[(size_t) block_id] == 0);
        unlink(block_id);
        ref_counts_[(size_t) block_id] = 1;
        out->push_back(block_id);
    }
    return true;
}

void BlockPool::incref(int32_t block_id) {
    // Call only on a used block: a free block comes back through revive().
    assert(is_valid(block_id) && ref_counts_[(size_t) block_id] >= 1);
    ref_counts_[(size_t) block_id] += 1;
}

void BlockPool::revive(int32_t block_id) {
    // Call only on a free block.
    assert(is_valid(block_id) && ref_counts_[(size_t) block_id] == 0);
    unlink(block_id);
    ref_counts_[(size_t) block_id] = 1;
}

void BlockPool::decref(int32_t block_id, FreePos pos) {
    // Call only on a used block: a ref count never goes below 0.
    assert(is_valid(block_id) && ref_counts_[(size_t) block_id] >= 1);
    if (--ref_counts_[(size_t) block_id] == 0) {
        if (pos == FreePos::BACK) {
            link_back(block_id);
        } else {
            link_front(block_id);
        }
    }
}

std::vector<int32_t> BlockPool::free_list() const {
    std::vector<int32_t> ids;
    ids.reserve((size_t) num_free_);
    const int32_t sentinel = num_blocks();
    for (int32_t b = next_[(size_t) sentinel]; b != sentinel && (int32_t) ids.size() <= num_blocks(); b = next_[(size_t) b]) {
        ids.push_back(b);
    }
    return ids;
}

std::string BlockPool::check_invariants() const {
    const int32_t sentinel = num_blocks();
    std::vector<uint8_t> in_free(ref_counts_.size(), 0);
    int32_t walked = 0;
    for (int32_t b = next_[(size_t) sentinel]; b != sentinel; b = next_[(size_t) b]) {
        if (!is_valid(b)) {
            return "free list holds invalid block id " + std::to_string(b);
        }
        if (in_free[(size_t) b]) {
            return "block " + std::to_string(b) + " is in the free list twice";
        }
        if (next_[(size_t) prev_[(size_t) b]] != b) {
            return "free list links of block " + std::to_string(b) + " disagree";
        }
        in_free[(size_t) b] = 1;
        walked += 1;
    }
    if (walked != num_free_) {
        return "free list holds " + std::to_string(walked) + " blocks but num_free is " + std::to_string(num_free_);
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
    for (int32_t block_id : free_list()) {
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
