// prefix_cache.cpp - see prefix_cache.h.
#include "core/prefix_cache.h"

#include "cacheflow.h"

#include <algorithm>
#include <cassert>
#include <sstream>

namespace cf {

namespace {

// splitmix64's finalizer: a cheap mix with full avalanche (the index never trusts it alone).
uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace

uint64_t hash_block(uint64_t parent_hash, const int32_t * tokens, int32_t n) {
    uint64_t h = mix64(parent_hash ^ (uint64_t) n);
    for (int32_t i = 0; i < n; ++i) {
        h = mix64(h ^ (uint64_t) (uint32_t) tokens[i]) + 0x9e3779b97f4a7c15ull;
    }
    return h;
}

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size, BlockHashFn hash)
    : block_size_(block_size), hash_(hash) {
    assert(num_blocks >= 1 && block_size >= 1);
    const size_t n = (size_t) num_blocks;
    tokens_.assign(n * (size_t) block_size, 0);
    rows_.assign(n, 0);
    key_.assign(n, 0);
    parent_hash_.assign(n, 0);
    parent_block_.assign(n, CF_BLOCK_ID_NONE);
    parent_generation_.assign(n, 0);
    generation_.assign(n, 0);
}

bool PrefixCache::parent_matches(int32_t block_id, uint64_t parent_hash, int32_t parent_block_id) const {
    const size_t b = (size_t) block_id;
    if (parent_hash_[b] != parent_hash || parent_block_[b] != parent_block_id) {
        return false;
    }
    return parent_block_id == CF_BLOCK_ID_NONE || parent_generation_[b] == generation_[(size_t) parent_block_id];
}

int32_t PrefixCache::common_prefix(int32_t block_id, const int32_t * tokens, int32_t n) const {
    const int32_t * mine = &tokens_[(size_t) block_id * (size_t) block_size_];
    const int32_t limit = std::min(n, rows_[(size_t) block_id]);
    int32_t k = 0;
    while (k < limit && mine[k] == tokens[k]) {
        ++k;
    }
    return k;
}

int32_t PrefixCache::find_full(uint64_t parent_hash, int32_t parent_block_id, const int32_t * tokens) const {
    auto it = full_.find(key_of(parent_hash, tokens));
    if (it == full_.end()) {
        return CF_BLOCK_ID_NONE;
    }
    const int32_t block_id = it->second;
    const bool same = rows_[(size_t) block_id] == block_size_ && parent_matches(block_id, parent_hash, parent_block_id) &&
                      common_prefix(block_id, tokens, block_size_) == block_size_;
    return same ? block_id : CF_BLOCK_ID_NONE;  // a hash collision is a miss, never a hit
}

PartialHit PrefixCache::find_partial(uint64_t parent_hash, int32_t parent_block_id, const int32_t * tokens,
                                     int32_t n) const {
    assert(n >= 1 && n <= block_size_);
    PartialHit best{ CF_BLOCK_ID_NONE, 0 };
    auto it = children_.find(parent_hash);
    if (it == children_.end()) {
        return best;
    }
    const std::vector<int32_t> & children = it->second;
    int32_t scanned = 0;
    for (auto rit = children.rbegin(); rit != children.rend() && scanned < kMaxPartialCandidates; ++rit, ++scanned) {
        if (!parent_matches(*rit, parent_hash, parent_block_id)) {
            continue;
        }
        const int32_t k = common_prefix(*rit, tokens, n);
        if (k > best.num_tokens) {
            best = { *rit, k };
        }
    }
    return best;
}

void PrefixCache::put(int32_t block_id, uint64_t parent_hash, int32_t parent_block_id, const int32_t * tokens,
                      int32_t num_rows) {
    const size_t b = (size_t) block_id;
    // Call only to create an entry or to grow a partial entry of the same parent.
    assert(num_rows >= 1 && num_rows <= block_size_);
    assert(rows_[b] == 0 || (rows_[b] < block_size_ && rows_[b] <= num_rows && parent_hash_[b] == parent_hash &&
                             parent_block_[b] == parent_block_id));
    if (rows_[b] == 0) {
        children_[parent_hash].push_back(block_id);
        parent_hash_[b] = parent_hash;
        parent_block_[b] = parent_block_id;
        parent_generation_[b] = parent_block_id == CF_BLOCK_ID_NONE ? 0 : generation_[(size_t) parent_block_id];
        num_entries_ += 1;
    }
    std::copy(tokens, tokens + num_rows, tokens_.begin() + (std::ptrdiff_t) (b * (size_t) block_size_));
    rows_[b] = num_rows;
    if (num_rows == block_size_) {
        key_[b] = key_of(parent_hash, tokens);
        assert(full_.count(key_[b]) == 0);
        full_[key_[b]] = block_id;
    }
}

bool PrefixCache::drop(int32_t block_id) {
    const size_t b = (size_t) block_id;
    if (rows_[b] == 0) {
        return false;
    }
    if (rows_[b] == block_size_) {
        full_.erase(key_[b]);
    }
    auto it = children_.find(parent_hash_[b]);
    assert(it != children_.end());
    std::vector<int32_t> & siblings = it->second;
    siblings.erase(std::find(siblings.begin(), siblings.end(), block_id));  // keeps newest-last order
    if (siblings.empty()) {
        children_.erase(it);
    }
    rows_[b] = 0;
    num_entries_ -= 1;
    return true;
}

bool PrefixCache::on_allocate(int32_t block_id) {
    const bool evicted = drop(block_id);
    generation_[(size_t) block_id] += 1;
    return evicted;
}

std::string PrefixCache::check_invariants() const {
    int32_t listed = 0;
    for (const auto & [parent_hash, children] : children_) {
        for (int32_t block_id : children) {
            const std::string name = "prefix cache: block " + std::to_string(block_id);
            if (block_id < 0 || (size_t) block_id >= rows_.size() || rows_[(size_t) block_id] == 0) {
                return name + " is listed as a child but has no entry";
            }
            if (parent_hash_[(size_t) block_id] != parent_hash) {
                return name + " is listed under another parent";
            }
            listed += 1;
        }
    }
    if (listed != num_entries_) {
        return "prefix cache: " + std::to_string(listed) + " children listed but " + std::to_string(num_entries_) +
               " entries";
    }
    int32_t num_full = 0;
    for (size_t b = 0; b < rows_.size(); ++b) {
        if (rows_[b] < 0 || rows_[b] > block_size_) {
            return "prefix cache: block " + std::to_string(b) + " has " + std::to_string(rows_[b]) + " rows";
        }
        if (rows_[b] == block_size_) {
            num_full += 1;
            auto it = full_.find(key_[b]);
            if (it == full_.end() || it->second != (int32_t) b ||
                key_[b] != key_of(parent_hash_[b], &tokens_[b * (size_t) block_size_])) {
                return "prefix cache: full block " + std::to_string(b) + " is not indexed under its key";
            }
        }
    }
    if (num_full != (int32_t) full_.size()) {
        return "prefix cache: " + std::to_string(full_.size()) + " keys but " + std::to_string(num_full) +
               " full entries";
    }
    return "";
}

std::string PrefixCache::dump() const {
    std::ostringstream os;
    os << "PrefixCache(entries=" << num_entries_ << ", full=" << full_.size() << ")\n";
    for (size_t b = 0; b < rows_.size(); ++b) {
        if (rows_[b] > 0) {
            os << "  block " << b << ": rows=" << rows_[b] << " parent=" << parent_block_[b] << " gen="
               << generation_[b] << "\n";
        }
    }
    return os.str();
}

}  // namespace cf
