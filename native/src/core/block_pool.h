// block_pool.h - fixed-size KV blocks: the free list and a reference count per block.
//
// A block holds the K/V rows of block_size consecutive tokens of one or more sequences (more
// than one when it is shared after a fork or a prefix hit). The pool only counts: it knows
// which blocks are free and how many holders each used block has, never what they contain or
// who the holders are (that is BlockManager's job). No llama.cpp dependency.
//
// Free list order. allocate() takes blocks off the front. decref() puts a block that reaches
// ref 0 at the back (FreePos::BACK, the default: the block freed longest ago is reused first, so
// a freed block's contents live as long as possible; with the prefix cache the free list is its
// LRU eviction queue) or at the front (FreePos::FRONT: a block whose contents nobody will look
// up, reused before any cached one). Initially the list is 0, 1, ..., num_blocks - 1.
//
//   free list:  front -> | uncached (FRONT) ... | cached, least recently used first ... | <- back
//
// revive() takes a free block out of the middle of the list in O(1) (a prefix-cache hit on a
// block whose ref count had reached 0): the list is a doubly linked list threaded through two
// arrays indexed by block id (vLLM's FreeKVCacheBlockQueue has the same shape).
//
// Thread-safety: none; the owner serializes all calls.
#pragma once

#include "cacheflow.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cf {

static_assert(CF_BLOCK_ID_NONE < 0, "CF_BLOCK_ID_NONE must never be a valid block id");

enum class FreePos { BACK, FRONT };

class BlockPool {
  public:
    // num_blocks >= 1, block_size >= 1 (tokens per block), and num_blocks * block_size fits
    // int32 so that every slot id (block_id * block_size + offset) does.
    BlockPool(int32_t num_blocks, int32_t block_size);

    int32_t num_blocks() const { return (int32_t) ref_counts_.size(); }
    int32_t block_size() const { return block_size_; }
    int32_t num_free() const { return num_free_; }
    int32_t num_used() const { return num_blocks() - num_free(); }
    bool is_valid(int32_t block_id) const { return block_id >= 0 && block_id < num_blocks(); }

    // Holders of a used block (>= 1), 0 for a free block. Call only with a valid block id.
    int32_t ref_count(int32_t block_id) const;

    // True if allocate(num_blocks_needed) would succeed (num_blocks_needed >= 0).
    bool can_allocate(int64_t num_blocks_needed) const { return num_blocks_needed <= num_free(); }

    // All-or-nothing: take n free blocks off the front of the free list, each with ref count 1,
    // and append their ids to *out in the order taken. Returns false, touching nothing, if fewer
    // than n are free. Call only with n >= 0.
    bool allocate(int32_t n, std::vector<int32_t> * out);

    // Add a holder to a used block. Call only when ref_count(block_id) >= 1.
    void incref(int32_t block_id);

    // Take a free block out of the free list (wherever it is) with ref count 1. Call only when
    // ref_count(block_id) == 0.
    void revive(int32_t block_id);

    // Drop a holder; at ref 0 the block goes to the free list at `pos` (see above).
    // Call only when ref_count(block_id) >= 1.
    void decref(int32_t block_id, FreePos pos = FreePos::BACK);

    // Free block ids from front to back (allocates; tests and dump).
    std::vector<int32_t> free_list() const;

    // "" if the pool is consistent, else a description of the first violation found:
    // free + used == total, each block at most once in the free list, free blocks have ref 0,
    // used blocks ref >= 1, the links agree in both directions. O(num_blocks).
    std::string check_invariants() const;

    // Human-readable state (free list, ref counts) for failing tests and debugging.
    std::string dump() const;

  private:
    void link_back(int32_t block_id);
    void link_front(int32_t block_id);
    void unlink(int32_t block_id);

    int32_t block_size_;
    std::vector<int32_t> ref_counts_;  // [num_blocks]
    // Doubly linked free list; index num_blocks is the sentinel (its next_ is the front).
    std::vector<int32_t> next_;  // [num_blocks + 1]
    std::vector<int32_t> prev_;  // [num_blocks + 1]
    int32_t num_free_ = 0;
};

}  // namespace cf
