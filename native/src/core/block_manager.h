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
// first append_slots() (or fork()) until free().
//
// Thread-safety: none; the engine calls it from the stepping thread only.
#pragma once

#include "core/block_pool.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace cf {

struct BlockTable {
    std::vector<int32_t> block_ids;  // [num_blocks] block ids in token order
    int32_t num_tokens = 0;          // tokens with a slot; == ceil-div into block_ids.size()

    int32_t num_blocks() const { return (int32_t) block_ids.size(); }
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
    BlockManager(int32_t num_blocks, int32_t block_size);

    const BlockPool & pool() const { return pool_; }
    int32_t block_size() const { return pool_.block_size(); }
    int32_t num_free_blocks() const { return pool_.num_free(); }
    int32_t num_seqs() const { return (int32_t) tables_.size(); }

    // The sequence's table, or nullptr if it holds none.
    const BlockTable * find(int64_t seq_id) const;

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

    // The child shares every block of the parent (ref counts + 1) and its token count. Never
    // allocates. Call only when parent_seq_id exists and child_seq_id (>= 0, != parent) does not.
    void fork(int64_t parent_seq_id, int64_t child_seq_id);

    // Drop the sequence's table; blocks whose ref count reaches 0 return to the free list, last
    // block first (so the blocks nearest the prompt start, the most shareable ones, are reused
    // last). Call only when seq_id exists.
    void free(int64_t seq_id);

    // Copy the sequence's block ids into row[0, max_blocks), padding with CF_BLOCK_ID_NONE.
    // Call only when seq_id exists and max_blocks >= its num_blocks().
    void write_block_table(int64_t seq_id, int32_t * row, int32_t max_blocks) const;

    // Copies recorded by append_slots and not yet taken, oldest first.
    const std::vector<BlockCopy> & pending_copies() const { return copies_; }

    // Move the pending copies to the end of *out (the executor performs them in order).
    void take_copies(std::vector<BlockCopy> * out);

    // "" if consistent, else a description of the first violation: pool invariants, each
    // table's block count == ceil(num_tokens / block_size), each block's ref count == the
    // number of tables holding it, no block twice in one table, and all holders of a block
    // agree on how many of its rows are filled (proof that shared blocks are never written).
    std::string check_invariants() const;

    // Human-readable state (pool, tables by ascending seq id, pending copies).
    std::string dump() const;

  private:
    BlockTable * find_mut(int64_t seq_id);
    // Rows of block index i of `table` that hold tokens (block_size for every block but the last).
    int32_t rows_filled(const BlockTable & table, int32_t i) const;
    // True when the next append must first copy the last block: it is shared and partially filled.
    bool needs_copy_on_write(const BlockTable & table) const;

    BlockPool pool_;
    std::unordered_map<int64_t, BlockTable> tables_;
    std::vector<BlockCopy> copies_;  // pending, oldest first
};

}  // namespace cf
