// block_manager.h - per-sequence block tables over one BlockPool: the single owner of paged-KV
// block state (ARCHITECTURE.md: llama.cpp keeps no per-cell bookkeeping in paged mode; each
// ubatch it gets a slot mapping and block tables built from here).
//
// A sequence's tokens live in the blocks of its BlockTable, in order: token pos sits in block
// block_ids[pos / block_size] at row pos % block_size, i.e. at slot
// block_id * block_size + pos % block_size of the per-layer K/V pools. Blocks are shared between
// sequences after fork() (ref count > 1) and are written only while private: appending into a
// shared, partially filled last block first moves the sequence to a fresh block and records a
// copy (src, dst) that the executor must perform (copy-on-write).
//
// Sequence ids are chosen by the caller (>= 0, e.g. request ids); a sequence exists from its
// first append_slots() (or fork(), or allocate_prefix()) until free().
//
// Prefix cache (optional, core/prefix_cache.h). Blocks whose tokens are computed are indexed as
// the engine commits steps (commit()); a new sequence starts with the longest cached prefix of
// its tokens (match_prefix(), allocate_prefix()): full blocks shared by ref count, plus the first
// rows of one more cached block copied into a fresh block. A block whose ref count reaches 0 stays
// indexed and goes to the back of the pool's free list, which is the LRU eviction queue; blocks
// nobody can look up go to its front, so they are reused first. The pool evicts (allocate()
// takes a cached block off the front and its entry is dropped) only when no such block is left;
// a block in use (ref >= 1) is never in the free list, so never evicted. Cached free blocks count
// as free everywhere (num_free_blocks, admission).
//
// Host-resident entries (KV streaming, issue 16; kernels/kv_stream.h). A table entry may name a host
// slot instead of a device block: the entry holds host_entry(h) = -2 - h (<= -2; CF_BLOCK_ID_NONE is -1).
// Only a full, private (ref 1) block away from the table's end is moved there (demote()), and moved back
// into a fresh block (promote()); the pool knows nothing of host entries (no ref count), the host slot ids
// belong to the caller (PagedKv's HostBlockPool), and the last block of a table is always on the device.
//
//   block_ids:  |  7  |  3  | -2-4 | -2-9 |  12 |  5  |     entries 2, 3: host slots 4 and 9
//   on:         | dev | dev | host | host | dev | dev |     (sink blocks | streamed middle | window)
//
// Thread-safety: none; the engine calls it from the stepping thread only.
#pragma once

#include "core/block_pool.h"
#include "core/prefix_cache.h"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace cf {

// Host-resident table entries (see the file comment).
constexpr int32_t host_entry(int32_t host_slot) { return -2 - host_slot; }
constexpr bool is_host_entry(int32_t entry) { return entry <= -2; }
constexpr int32_t host_slot_of(int32_t entry) { return -2 - entry; }

struct BlockTable {
    std::vector<int32_t> block_ids;  // [num_blocks] block ids in token order
    int32_t num_tokens = 0;          // tokens with a slot; == ceil-div into block_ids.size()
    // Prefix cache: leading full blocks already offered to the index by commit() (or shared from
    // it), and the chain key of the last of them (kPrefixRootHash when none).
    int32_t num_hashed_blocks = 0;
    uint64_t last_hash = kPrefixRootHash;
    // Async decode: the block the table's next token goes into, taken ahead of that token
    // (BlockManager::reserve_next_block), or CF_BLOCK_ID_NONE. Held beside block_ids, not in it, so
    // num_blocks() == ceil(num_tokens / block_size) holds; set only while num_tokens % block_size == 0.
    int32_t next_block = CF_BLOCK_ID_NONE;

    int32_t num_blocks() const { return (int32_t) block_ids.size(); }
};

// The longest cached prefix of a token sequence (BlockManager::match_prefix):
//
//   tokens:  | block_ids[0] | block_ids[1] | copy_src rows [0, num_copy_tokens) | rest ... |
//            0                             num_full_tokens()              num_tokens()
struct PrefixMatch {
    std::vector<int32_t> block_ids;      // full cached blocks, shared
    int32_t num_revived = 0;             // of those, blocks with ref 0 (taken from the free list)
    uint64_t last_hash = kPrefixRootHash;  // chain key of the last shared block
    int32_t copy_src_block_id = CF_BLOCK_ID_NONE;  // a cached block whose first rows are copied
    int32_t num_copy_tokens = 0;
    bool copy_src_free = false;          // copy_src has ref 0: pinning it takes a free block
    int32_t block_size = 0;

    int32_t num_full_tokens() const { return (int32_t) block_ids.size() * block_size; }
    int32_t num_tokens() const { return num_full_tokens() + num_copy_tokens; }
};

// Prefix cache counters since construction (zeros when the cache is off).
struct PrefixCacheStats {
    int64_t num_queried_tokens = 0;  // tokens looked up at admission (allocate_prefix)
    int64_t num_hit_tokens = 0;      // of those, found in the cache
    int64_t num_evictions = 0;       // cached blocks whose entry was dropped to reuse the block
    int32_t num_cached_blocks = 0;   // blocks indexed now (in use or free)
};

// One block copy the executor performs before writing the slots of the same step: all
// block_size rows of src_block_id (every layer, K and V) into dst_block_id. Apply in order.
struct BlockCopy {
    int32_t src_block_id;
    int32_t dst_block_id;
};

class BlockManager {
  public:
    // See BlockPool: num_blocks >= 1, block_size >= 1, num_blocks * block_size fits int32.
    // prefix_caching: keep a prefix cache (see above), keyed by `hash` (tests pass a colliding one).
    BlockManager(int32_t num_blocks, int32_t block_size, bool prefix_caching = false, BlockHashFn hash = hash_block);

    bool prefix_caching() const { return cache_ != nullptr; }

    const BlockPool & pool() const { return pool_; }
    int32_t block_size() const { return pool_.block_size(); }
    int32_t num_free_blocks() const { return pool_.num_free(); }
    int32_t num_seqs() const { return (int32_t) tables_.size(); }

    // The sequence's table, or nullptr if it holds none.
    const BlockTable * find(int64_t seq_id) const;

    // Device KV rows holding a token: over the distinct device blocks of all tables, the rows
    // filled (a block shared by several tables, prefix-cached or forked, counts once; host
    // entries of KV streaming do not count). <= num_used blocks * block_size. O(table entries).
    int64_t num_rows_filled() const;

    // Blocks append_slots(seq_id, num_new_tokens) takes from the pool, counting a copy-on-write
    // block. An unknown sequence counts as empty. int64 so that huge requests cannot overflow.
    int64_t num_blocks_needed(int64_t seq_id, int32_t num_new_tokens) const;

    // True if append_slots(seq_id, num_new_tokens) would succeed. Does not mutate.
    bool can_allocate(int64_t seq_id, int32_t num_new_tokens) const {
        return pool_.can_allocate(num_blocks_needed(seq_id, num_new_tokens));
    }

    // Token regions of one sequence vs its blocks (block_size 4, num_tokens 10, num_new_tokens 7;
    // x = token that already has a slot, n = new token, . = row left free):
    //
    //   block   |   b0    |   b1    |   b2    |  new    |  new    |
    //   row     | 0 1 2 3 | 0 1 2 3 | 0 1 2 3 | 0 1 2 3 | 0 1 2 3 |
    //   token   | x x x x | x x x x | x x n n | n n n n | n . . . |
    //   pos       0                   8   10              16
    //             |<---- num_tokens ----->|< num_new_tokens >|
    //
    // b2, the last block, is partially filled: its free rows take the first new tokens. If b2 is
    // shared (ref > 1) the sequence first moves to a fresh block and the copy (b2, fresh) is
    // recorded (copy-on-write), so the other holders never see the new rows.
    // Blocks taken = ceil(17 / 4) - ceil(10 / 4) = 2, plus 1 for copy-on-write.
    //
    // Give the next num_new_tokens tokens of seq_id a slot each, allocating blocks as needed;
    // creates the sequence's table if it has none. Appends [num_new_tokens] slot ids to
    // *slot_mapping unless it is nullptr (the engine's step plan reads the slots from the table
    // once the step is final) and may record one copy-on-write in pending_copies(). Returns false
    // when the pool is short of blocks, changing nothing (all-or-nothing).
    // Call only with seq_id >= 0 and num_new_tokens >= 0 (0 only registers the sequence).
    bool append_slots(int64_t seq_id, int32_t num_new_tokens, std::vector<int32_t> * slot_mapping);

    // Async decode (engine_step.cpp, "Lookahead"): give seq_id the block its next token goes into
    // before append_slots() does, so that a decode launched one step ahead can write that token's
    // row. The table holds it in next_block (ref count 1, no cache entry) until the next
    // append_slots() that grows the table makes it the table's next entry, in place of a block
    // from the pool (num_blocks_needed() counts it); free() and free_deferred() give it back
    // unused, fork() leaves it with the parent. Returns its id (the one held already, if any), or
    // CF_BLOCK_ID_NONE when the pool has no free block. Call only when seq_id exists and its last
    // block is full (num_tokens % block_size == 0).
    int32_t reserve_next_block(int64_t seq_id);

    // The child shares every block of the parent (ref counts + 1) and its token count. Never
    // allocates. Call only when parent_seq_id exists and child_seq_id (>= 0, != parent) does not.
    void fork(int64_t parent_seq_id, int64_t child_seq_id);

    // Drop the sequence's table; blocks whose ref count reaches 0 return to the free list, last
    // block first (so the blocks nearest the prompt start, the most shareable ones, are reused
    // last; with the prefix cache, uncached blocks go to the front). Pending copies stay pending:
    // one into a block that became free only writes rows its next holder overwrites or never
    // reads (copies run before the step's writes). Call only when seq_id exists.
    void free(int64_t seq_id);

    // Deferred free (swap-out on a copy stream): drop the sequence's table like free(), but its
    // blocks keep their ref counts until release_deferred(): a copy still reading them (the
    // swap-out of this step, running beside the step's graph) is never overtaken by a new holder
    // writing them. Until then they count as used (num_free_blocks leaves them out) and can still
    // be shared (prefix hits, which only read them). Call only when seq_id exists.
    void free_deferred(int64_t seq_id);
    // Blocks free_deferred() holds now (they become free at the next release_deferred()).
    int32_t num_deferred_blocks() const { return (int32_t) deferred_.size(); }
    // Of those, the blocks release_deferred() would return to the free list (no other holder).
    int32_t num_blocks_freed_by_release() const;
    // Release every block free_deferred() held, as free() would have (last block first). Call only
    // once the copies that read them are ordered before any later writer (the engine: next step).
    void release_deferred();

    // Swap-in: create seq_id's table with num_tokens tokens in ceil(num_tokens / block_size)
    // fresh private blocks (their rows come back from host memory before the step's writes) and
    // return it. The blocks are not indexed yet: the next commit() offers their full blocks to
    // the prefix cache again. Call only when seq_id has no table and the blocks are free
    // (can_allocate(seq_id, num_tokens)), with num_tokens >= 1.
    const BlockTable & allocate_table(int64_t seq_id, int32_t num_tokens);

    // ---- host-resident entries (KV streaming; see the file comment)

    // Entry i of seq_id (a device block: full, ref 1, not the last) moves to host slot host_slot: the entry
    // becomes host_entry(host_slot) and the device block is released at the next release_deferred() (the
    // caller's copy device -> host reads it during this step). Returns the device block id.
    int32_t demote(int64_t seq_id, int32_t i, int32_t host_slot);
    // Host entry i of seq_id moves back into a fresh private block (the caller copies host -> device):
    // returns its id. Call only when a block is free (num_free_blocks() >= 1).
    int32_t promote(int64_t seq_id, int32_t i);
    // Host entries in all tables now.
    int32_t num_host_entries() const { return num_host_entries_; }
    // Append the host slots of seq_id's host entries (table order) to *out; nothing for an unknown seq.
    void host_slots(int64_t seq_id, std::vector<int32_t> * out) const;
    // Append the host slots of every table's host entries to *out.
    void all_host_slots(std::vector<int32_t> * out) const;

    // ---- prefix cache (call only when prefix_caching())

    // The longest cached prefix of tokens[0, max_tokens) (see PrefixMatch and prefix_cache.h).
    // Callers pass max_tokens = num_tokens - 1 so that the last token is always computed (its
    // logits are needed). Does not mutate.
    PrefixMatch match_prefix(const int32_t * tokens, int32_t max_tokens) const;

    // Blocks taken from the free list by allocate_prefix(m) and the growth of the sequence to
    // num_tokens tokens: the blocks past the shared ones, revived shared blocks, a pinned copy
    // source. int64 so that huge requests cannot overflow.
    int64_t num_blocks_needed(const PrefixMatch & m, int32_t num_tokens) const;

    // Create seq_id's table from m: share m's full blocks (ref counts + 1, revived from the free
    // list where free), then copy m's partial rows into a fresh block (recorded in
    // pending_copies(); the source stays pinned by one ref until take_copies()). The table holds
    // m.num_tokens() tokens. Counts num_queried_tokens tokens looked up and m's hits.
    // Call only when seq_id has no table and can_allocate the match's own blocks
    // (num_blocks_needed(m, m.num_tokens()) <= num_free_blocks()).
    void allocate_prefix(int64_t seq_id, const PrefixMatch & m, int32_t num_queried_tokens);

    // The step computed tokens[0, num_computed_tokens) of seq_id (tokens: [num_computed_tokens]
    // int32): index its newly full blocks under the hash chain and its partial last block. A
    // full block whose prefix and tokens are cached in another block already is replaced by it
    // (its own block goes back to the pool): concurrent sequences converge on one copy.
    // Call only when seq_id exists and num_computed_tokens <= its num_tokens.
    void commit(int64_t seq_id, const int32_t * tokens, int32_t num_computed_tokens);

    PrefixCacheStats prefix_cache_stats() const;
    const PrefixCache * prefix_cache() const { return cache_.get(); }

    // Copy the sequence's block ids into row[0, max_blocks), padding with CF_BLOCK_ID_NONE.
    // Call only when seq_id exists and max_blocks >= its num_blocks().
    void write_block_table(int64_t seq_id, int32_t * row, int32_t max_blocks) const;

    // Copies recorded by append_slots and not yet taken, oldest first.
    const std::vector<BlockCopy> & pending_copies() const { return copies_; }

    // Move the pending copies to the end of *out (the executor performs them in order) and
    // release the copy sources pinned by allocate_prefix().
    void take_copies(std::vector<BlockCopy> * out);

    // "" if consistent, else a description of the first violation: pool invariants, each
    // table's block count == ceil(num_tokens / block_size), a next_block only on a table whose
    // last block is full, each block's ref count == the number of tables holding it (in
    // block_ids or as next_block), no block twice in one table, and all holders of a block
    // agree on how many of its rows are filled (proof that shared blocks are never written).
    // With the prefix cache also: ref count == table holders + pins, holders of a cached block
    // see at least its indexed rows, no uncached block behind a cached one in the free list, and
    // the index's own invariants.
    std::string check_invariants() const;

    // Human-readable state (pool, tables by ascending seq id, pending copies).
    std::string dump() const;

  private:
    BlockTable * find_mut(int64_t seq_id);
    // Rows of block index i of `table` that hold tokens (block_size for every block but the last).
    int32_t rows_filled(const BlockTable & table, int32_t i) const;
    // True when the next append must first copy the last block: it is shared and partially filled.
    bool needs_copy_on_write(const BlockTable & table) const;
    // pool_.allocate, dropping the cache entries of the blocks it takes (evictions).
    void take_blocks(int32_t n, std::vector<int32_t> * out);
    // Where a block whose ref count reaches 0 goes: the back if the cache can still use it.
    FreePos free_pos(int32_t block_id) const;
    void share(int32_t block_id);  // one more holder: incref, or revive a free block
    void commit_full_block(BlockTable & table, int32_t i, const int32_t * block_tokens);
    void commit_partial_block(BlockTable & table, const int32_t * block_tokens, int32_t num_rows);
    std::string check_cache_invariants(const std::vector<int32_t> & holders, const std::vector<int32_t> & fill) const;

    BlockPool pool_;
    std::unordered_map<int64_t, BlockTable> tables_;
    mutable std::vector<int32_t> shared_fill_;  // num_rows_filled's scratch: [num_blocks], all 0 between calls
    mutable std::vector<int32_t> shared_blocks_;  // num_rows_filled's scratch: the shared blocks it met
    std::vector<BlockCopy> copies_;  // pending, oldest first
    std::unique_ptr<PrefixCache> cache_;  // nullptr when the prefix cache is off
    std::vector<int32_t> pinned_;         // copy sources held until take_copies()
    std::vector<int32_t> deferred_;       // free_deferred(): blocks in free() order, held until release_deferred()
    PrefixCacheStats stats_;
    int32_t num_host_entries_ = 0;  // host entries over all tables
};

}  // namespace cf
