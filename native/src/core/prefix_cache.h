// prefix_cache.h - the prefix cache index: which KV blocks hold which tokens after which prefix.
// Bookkeeping only (no ref counts, no tensors): BlockManager owns the blocks and asks this index
// what to share; the pool's free list is the LRU eviction queue (block_pool.h).
//
// Hash chain. A full block is keyed by hash_block(parent_hash, its block_size tokens), where
// parent_hash is the key of the block before it (kPrefixRootHash for the first block), so one key
// names a whole prefix. Anything else that changes the KV of the same tokens (a LoRA, a model id)
// belongs in the root hash [TAG_PREFIX_SALT]; one engine has one model, so the root is a constant.
//
// Collision safety. A key only proposes a block. Every entry stores its tokens and its parent's
// identity (block id + generation, the incarnation counter bumped each time the pool hands the
// block out again), and a lookup accepts a block only when its tokens equal the prompt's token by
// token and its parent is exactly the block accepted one level up. By induction every accepted
// block holds the KV of exactly the prompt's prefix, whatever the hash does.
//
// Partial entries. The computed rows of a sequence's last, partially filled block are indexed
// too (num_rows < block_size; not under a hash key, only as a child of their parent). A lookup
// that cannot extend the chain by a full block may take the longest common token prefix of one
// child of the last matched block (full or partial): the caller copies those rows into a fresh
// block (never shares them: the block's free rows belong to its holder).
//
//   prompt:   | b0 full, shared | b1 full, shared | first k tokens of a child of b1, copied | rest |
//             0                                   2*bs                           2*bs + k
//
// Thread-safety: none; BlockManager serializes all calls.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace cf {

constexpr uint64_t kPrefixRootHash = 0x9e3779b97f4a7c15ull;

// Key of a block holding tokens[0, n) after the prefix keyed parent_hash. Pure.
uint64_t hash_block(uint64_t parent_hash, const int32_t * tokens, int32_t n);
using BlockHashFn = uint64_t (*)(uint64_t parent_hash, const int32_t * tokens, int32_t n);

// The best partial match of find_partial(): num_tokens leading rows of block_id.
struct PartialHit {
    int32_t block_id;
    int32_t num_tokens;
};

class PrefixCache {
  public:
    // Children scanned per partial lookup, newest first: bounds the lookup cost at nodes with
    // many children (the root of a server that saw many distinct prompts).
    static constexpr int32_t kMaxPartialCandidates = 64;

    // hash: the key function; tests pass a colliding one to prove that collisions are harmless.
    PrefixCache(int32_t num_blocks, int32_t block_size, BlockHashFn hash = hash_block);

    // Key of a full block of tokens[0, block_size) after the prefix keyed parent_hash.
    uint64_t key_of(uint64_t parent_hash, const int32_t * tokens) const { return hash_(parent_hash, tokens, block_size_); }

    int32_t block_size() const { return block_size_; }
    int32_t num_entries() const { return num_entries_; }
    bool contains(int32_t block_id) const { return rows_[(size_t) block_id] > 0; }
    int32_t num_rows(int32_t block_id) const { return rows_[(size_t) block_id]; }  // 0 = no entry
    uint64_t key(int32_t block_id) const { return key_[(size_t) block_id]; }       // full entries
    uint32_t generation(int32_t block_id) const { return generation_[(size_t) block_id]; }

    // The full block holding tokens[0, block_size) after the prefix keyed parent_hash whose last
    // block is parent_block_id (CF_BLOCK_ID_NONE for the empty prefix), verified token by token;
    // CF_BLOCK_ID_NONE if none. Does not mutate.
    int32_t find_full(uint64_t parent_hash, int32_t parent_block_id, const int32_t * tokens) const;

    // The child of that prefix (full or partial entry) sharing the longest common prefix with
    // tokens[0, n), 1 <= n <= block_size; {CF_BLOCK_ID_NONE, 0} if none shares a token.
    PartialHit find_partial(uint64_t parent_hash, int32_t parent_block_id, const int32_t * tokens, int32_t n) const;

    // Index block_id as holding tokens[0, num_rows) after the prefix keyed parent_hash whose last
    // block is parent_block_id. num_rows == block_size makes it a full entry under
    // hash_block(parent_hash, tokens); call that only when find_full() found no block for it and
    // no other block is indexed under that key (key_taken()). Call only when block_id has no
    // entry or a partial entry of the same parent with at most num_rows rows (it grows).
    void put(int32_t block_id, uint64_t parent_hash, int32_t parent_block_id, const int32_t * tokens,
             int32_t num_rows);

    // True if some block is indexed under `key` (full entries).
    bool key_taken(uint64_t key) const { return full_.count(key) != 0; }

    // Forget block_id's entry, if any. Returns true if it had one.
    bool drop(int32_t block_id);

    // The pool hands block_id out again: drop its entry and start a new incarnation, so that no
    // entry naming the old one as parent is ever accepted. Returns true if an entry was evicted.
    bool on_allocate(int32_t block_id);

    // "" if the index is consistent, else the first violation: each entry once among its parent's
    // children, full entries under their key and only those, num_entries agrees.
    std::string check_invariants() const;

    std::string dump() const;

  private:
    bool parent_matches(int32_t block_id, uint64_t parent_hash, int32_t parent_block_id) const;
    int32_t common_prefix(int32_t block_id, const int32_t * tokens, int32_t n) const;

    int32_t block_size_;
    BlockHashFn hash_;
    int32_t num_entries_ = 0;
    std::vector<int32_t> tokens_;          // [num_blocks * block_size] tokens of each entry's rows
    std::vector<int32_t> rows_;            // [num_blocks] rows of the entry; 0 = no entry
    std::vector<uint64_t> key_;            // [num_blocks] hash_block(parent_hash, tokens) when full
    std::vector<uint64_t> parent_hash_;    // [num_blocks]
    std::vector<int32_t> parent_block_;    // [num_blocks] CF_BLOCK_ID_NONE for the first block
    std::vector<uint32_t> parent_generation_;  // [num_blocks]
    std::vector<uint32_t> generation_;     // [num_blocks] incarnation of each block
    std::unordered_map<uint64_t, int32_t> full_;                   // key -> full block
    std::unordered_map<uint64_t, std::vector<int32_t>> children_;  // parent_hash -> entries, oldest first
};

}  // namespace cf
