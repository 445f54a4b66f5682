// test_block_manager.cpp - unit tests of cf::BlockManager and its C shims: slot mapping, block
// growth, fork + copy-on-write, out-of-blocks all-or-nothing, free order, block table export,
// and seeded random op streams run against a simulated KV memory (each token's value must be
// readable through its own block table after every op, so a write into a shared block shows).
#undef NDEBUG  // the checks must run in Release builds too
#include "cacheflow.h"
#include "core/block_manager.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

using namespace cf;

namespace {

using Slots = std::vector<int32_t>;

void check(const BlockManager & m) {
    const std::string violation = m.check_invariants();
    if (!violation.empty()) {
        std::fprintf(stderr, "invariant broken: %s\n%s", violation.c_str(), m.dump().c_str());
        assert(false);
    }
}

// Append and return the slot mapping; asserts success and invariants.
Slots append(BlockManager & m, int64_t seq_id, int32_t num_new_tokens) {
    Slots slots;
    const bool ok = m.append_slots(seq_id, num_new_tokens, &slots);
    assert(ok && (int32_t) slots.size() == num_new_tokens);
    check(m);
    return slots;
}

Slots range_slots(int32_t start, int32_t end) {
    Slots v;
    for (int32_t s = start; s < end; ++s) {
        v.push_back(s);
    }
    return v;
}

const std::vector<int32_t> & blocks_of(const BlockManager & m, int64_t seq_id) {
    assert(m.find(seq_id) != nullptr);
    return m.find(seq_id)->block_ids;
}

void test_append_new_sequence() {
    BlockManager m(8, 4);
    check(m);
    assert(m.can_allocate(1, 10) && m.num_blocks_needed(1, 10) == 3);
    assert(append(m, 1, 10) == range_slots(0, 10));
    assert((blocks_of(m, 1) == std::vector<int32_t>{ 0, 1, 2 }));
    assert(m.find(1)->num_tokens == 10 && m.num_free_blocks() == 5);
    // Two more tokens fill block 2 without a new block; the third takes block 3.
    assert(m.num_blocks_needed(1, 2) == 0 && m.num_blocks_needed(1, 3) == 1);
    assert(append(m, 1, 2) == range_slots(10, 12));
    assert(m.num_free_blocks() == 5);
    assert(append(m, 1, 1) == Slots{ 12 });
    assert(m.num_free_blocks() == 4 && m.pending_copies().empty());
}

void test_zero_tokens_registers_sequence() {
    BlockManager m(2, 4);
    assert(m.find(5) == nullptr && m.num_blocks_needed(5, 0) == 0);
    assert(append(m, 5, 0).empty());
    assert(m.find(5) != nullptr && m.find(5)->num_tokens == 0 && m.num_seqs() == 1);
    m.fork(5, 6);  // forking an empty sequence shares nothing
    check(m);
    assert(m.find(6)->num_blocks() == 0 && m.num_free_blocks() == 2);
}

void test_fork_then_copy_on_write() {
    BlockManager m(8, 4);
    append(m, 1, 10);  // blocks 0 1 2, block 2 holds 2 rows
    assert(m.num_rows_filled() == 10);
    m.fork(1, 2);
    check(m);
    assert(m.num_rows_filled() == 10);  // the child's rows are the parent's: counted once
    assert(blocks_of(m, 2) == blocks_of(m, 1) && m.find(2)->num_tokens == 10);
    assert(m.pool().ref_count(0) == 2 && m.pool().ref_count(2) == 2 && m.num_free_blocks() == 5);

    // The child writes first: it moves to a fresh block 3, copying block 2.
    assert(m.num_blocks_needed(2, 1) == 1 && m.num_blocks_needed(2, 0) == 0);
    assert(append(m, 2, 1) == Slots{ 3 * 4 + 2 });
    assert((blocks_of(m, 2) == std::vector<int32_t>{ 0, 1, 3 }));
    assert((blocks_of(m, 1) == std::vector<int32_t>{ 0, 1, 2 }));
    assert(m.pending_copies().size() == 1);
    assert(m.pending_copies()[0].src_block_id == 2 && m.pending_copies()[0].dst_block_id == 3);
    assert(m.pool().ref_count(2) == 1 && m.pool().ref_count(3) == 1 && m.pool().ref_count(1) == 2);
    assert(m.num_rows_filled() == 8 + 2 + 3);  // shared blocks 0 1, the parent's 2, the child's copy 3

    // The parent now owns block 2 alone: no copy.
    assert(m.num_blocks_needed(1, 1) == 0);
    assert(append(m, 1, 1) == Slots{ 2 * 4 + 2 });
    assert(m.pending_copies().size() == 1);

    std::vector<BlockCopy> copies;
    m.take_copies(&copies);
    assert(copies.size() == 1 && m.pending_copies().empty());
    check(m);
}

void test_fork_at_block_boundary_needs_no_copy() {
    BlockManager m(8, 4);
    append(m, 1, 8);
    m.fork(1, 2);
    assert(append(m, 2, 1) == Slots{ 2 * 4 });
    assert(m.pending_copies().empty() && m.pool().ref_count(1) == 2);
}

void test_copy_on_write_with_growth() {
    BlockManager m(8, 4);
    append(m, 1, 6);  // blocks 0 1
    m.fork(1, 2);
    // 7 new tokens from 6: copy of block 1 (-> 2), then blocks 3 and 4 for positions 8..12.
    assert(m.num_blocks_needed(2, 7) == 3);
    const Slots expected{ 2 * 4 + 2, 2 * 4 + 3, 12, 13, 14, 15, 16 };
    assert(append(m, 2, 7) == expected);
    assert((blocks_of(m, 2) == std::vector<int32_t>{ 0, 2, 3, 4 }));
    assert(m.pending_copies().size() == 1 && m.pending_copies()[0].src_block_id == 1);
}

void test_out_of_blocks_changes_nothing() {
    BlockManager m(4, 4);
    append(m, 1, 10);  // 3 blocks, 1 free
    m.fork(1, 2);
    const std::string before = m.dump();

    Slots slots{ 99 };
    assert(!m.can_allocate(1, 7) && !m.append_slots(1, 7, &slots));  // needs copy + 1 more
    assert(!m.append_slots(3, 5, &slots));                           // new sequence, 2 blocks
    check(m);
    assert(m.dump() == before && slots == Slots{ 99 } && m.find(3) == nullptr);

    // Exactly enough: the copy-on-write block is the last free one.
    assert(m.can_allocate(2, 2) && !m.can_allocate(2, 3));
    assert(append(m, 2, 2).size() == 2 && m.num_free_blocks() == 0);
    // Now seq 1 holds block 2 alone; it can still fill it without blocks.
    assert(m.can_allocate(1, 2) && !m.can_allocate(1, 3));
    const std::string full = m.dump();
    assert(!m.append_slots(1, 3, &slots) && m.dump() == full);
}

void test_huge_request_does_not_overflow() {
    BlockManager m(4, 4);
    append(m, 1, 3);
    assert(!m.can_allocate(1, INT32_MAX));
    Slots slots;
    assert(!m.append_slots(1, INT32_MAX, &slots) && slots.empty());
    check(m);
}

void test_free_returns_blocks_last_first() {
    BlockManager m(6, 2);
    append(m, 1, 6);  // blocks 0 1 2; free list: 3 4 5
    m.fork(1, 2);
    m.free(1);  // still held by seq 2
    check(m);
    assert(m.num_free_blocks() == 3 && m.find(1) == nullptr);
    m.free(2);
    check(m);
    assert(m.num_free_blocks() == 6 && m.num_seqs() == 0);
    // Free list is now 3 4 5 2 1 0.
    append(m, 7, 12);
    assert((blocks_of(m, 7) == std::vector<int32_t>{ 3, 4, 5, 2, 1, 0 }));
}

// free_deferred (a swap-out's copy still reads the blocks): the table is gone at once, the blocks stay
// held (not free, not reusable, still shareable) until release_deferred(), which frees them as free()
// would have, last block first; a block also held by a fork stays with it.
void test_free_deferred_holds_blocks_until_release() {
    BlockManager m(6, 2);
    append(m, 1, 6);  // blocks 0 1 2; free list: 3 4 5
    m.fork(1, 2);
    append(m, 3, 2);  // block 3
    assert(m.num_rows_filled() == 6 + 2);  // seq 2's rows are seq 1's
    m.free_deferred(1);
    check(m);
    assert(m.find(1) == nullptr && m.num_deferred_blocks() == 3 && m.num_blocks_freed_by_release() == 0);
    assert(m.num_rows_filled() == 6 + 2);  // the fork still holds blocks 0-2: counted once, through it
    m.free_deferred(3);
    check(m);
    assert(m.num_free_blocks() == 2 && m.num_deferred_blocks() == 4 && m.num_blocks_freed_by_release() == 1);
    assert(m.num_rows_filled() == 6);  // block 3, held only for the copy, holds no table's token
    assert(!m.can_allocate(7, 5) && m.can_allocate(7, 4));  // the held blocks are not handed out
    m.free(2);  // the fork's other holder: its blocks now wait only for the release
    check(m);
    assert(m.num_free_blocks() == 2 && m.num_blocks_freed_by_release() == 4);
    m.release_deferred();
    check(m);
    assert(m.num_free_blocks() == 6 && m.num_deferred_blocks() == 0 && m.num_seqs() == 0);
    // Free list now: 4 5, then seq 1's blocks last first (held last by the release), then block 3:
    // free() of seq 2 found them still held, so only the release returned them.
    append(m, 7, 12);
    assert((blocks_of(m, 7) == std::vector<int32_t>{ 4, 5, 2, 1, 0, 3 }));
}

// Host entries (KV streaming's demote) hold no device row: num_rows_filled leaves them out.
void test_rows_filled_leaves_out_host_entries() {
    BlockManager m(8, 4);
    append(m, 1, 14);  // blocks 0 1 2 3, the last with 2 rows
    assert(m.num_rows_filled() == 14);
    assert(m.demote(1, 0, 5) == 0 && m.demote(1, 1, 6) == 1);  // full, private, away from the end
    check(m);
    assert(m.find(1)->block_ids[0] == host_entry(5) && m.num_host_entries() == 2);
    assert(m.num_rows_filled() == 14 - 8);
    m.release_deferred();
    assert(m.num_rows_filled() == 6 && m.num_free_blocks() == 6);
}

void test_write_block_table_pads() {
    BlockManager m(8, 4);
    append(m, 1, 5);
    int32_t row[4] = { 7, 7, 7, 7 };
    m.write_block_table(1, row, 4);
    assert(row[0] == 0 && row[1] == 1 && row[2] == CF_BLOCK_ID_NONE && row[3] == CF_BLOCK_ID_NONE);
}

void test_dump_lists_tables_and_copies() {
    BlockManager m(4, 4);
    append(m, 3, 5);
    m.fork(3, 4);
    append(m, 4, 1);
    const std::string text = m.dump();
    assert(text.find("seq 3: num_tokens=5 blocks=[0 1]") != std::string::npos);
    assert(text.find("seq 4: num_tokens=6 blocks=[0 2]") != std::string::npos);
    assert(text.find("copy 1 -> 2") != std::string::npos);
}

// Async decode's block reserved ahead (reserve_next_block): taken from the pool at once, counted as the
// table's, used as the next entry by the append that grows the table, given back by free() and
// free_deferred() unused; a fork leaves it with the parent; the pool running dry reserves nothing.
void test_reserve_next_block() {
    BlockManager m(6, 4);
    append(m, 1, 8);  // blocks 0 1, full
    assert(m.reserve_next_block(1) == 2 && m.reserve_next_block(1) == 2);  // the held one again
    check(m);
    assert(m.find(1)->num_blocks() == 2 && m.find(1)->next_block == 2 && m.num_free_blocks() == 3);
    assert(m.num_blocks_needed(1, 1) == 0 && m.num_blocks_needed(1, 5) == 1 && m.num_rows_filled() == 8);
    assert(m.dump().find("seq 1: num_tokens=8 blocks=[0 1] next=2") != std::string::npos);
    m.fork(1, 2);
    check(m);
    assert(m.find(2)->next_block == CF_BLOCK_ID_NONE && m.num_blocks_needed(2, 1) == 1);
    m.free(2);
    assert(append(m, 1, 5) == (Slots{ 8, 9, 10, 11, 12 }));  // the reserved block first, then block 3
    assert((blocks_of(m, 1) == std::vector<int32_t>{ 0, 1, 2, 3 }) && m.find(1)->next_block == CF_BLOCK_ID_NONE);
    assert(m.num_free_blocks() == 2);

    append(m, 3, 4);  // block 4, full
    assert(m.reserve_next_block(3) == 5 && m.num_free_blocks() == 0);
    append(m, 4, 0);  // an empty table: its next block is its first
    assert(m.reserve_next_block(4) == CF_BLOCK_ID_NONE);  // the pool is dry: nothing reserved, nothing changed
    check(m);
    m.free(3);  // the unused reserved block goes back before the table's last block
    check(m);
    assert(m.num_free_blocks() == 2);
    assert(m.reserve_next_block(4) == 5);  // the front of the free list: the unused reserved block
    m.free_deferred(4);  // a decode launched ahead may still write it: held until the release
    check(m);
    assert(m.num_free_blocks() == 1 && m.num_deferred_blocks() == 1);
    m.release_deferred();
    check(m);
    assert(m.num_free_blocks() == 2);
}

// ---- seeded random op streams against a simulated KV memory --------------------------------

struct Sim {
    BlockManager m;
    int32_t block_size;
    std::vector<int64_t> kv;                       // [num_blocks * block_size] token values
    std::map<int64_t, std::vector<int64_t>> seqs;  // seq id -> value of each token, in order
    int64_t next_value = 1;
    int64_t next_seq_id = 0;
    int32_t num_out_of_blocks = 0;  // coverage counters: the stream must hit every path
    int32_t num_copies = 0;
    int32_t num_reserved = 0;

    Sim(int32_t num_blocks, int32_t bs) : m(num_blocks, bs), block_size(bs), kv((size_t) num_blocks * bs, 0) {}

    int64_t pick_live(std::mt19937 & rng) const {
        auto it = seqs.begin();
        std::advance(it, (long) (rng() % seqs.size()));
        return it->first;
    }

    // The executor's side: copies first, then the step's writes.
    void run_append(int64_t seq_id, int32_t n) {
        const std::string before = m.dump();
        const int32_t free_before = m.num_free_blocks();
        const int64_t needed = m.num_blocks_needed(seq_id, n);
        const bool expect_ok = m.can_allocate(seq_id, n);
        Slots slots;
        const bool ok = m.append_slots(seq_id, n, &slots);
        assert(ok == expect_ok);
        if (!ok) {
            assert(slots.empty() && m.dump() == before);
            num_out_of_blocks += 1;
            return;
        }
        assert((int32_t) slots.size() == n && m.num_free_blocks() == free_before - needed);
        std::vector<BlockCopy> copies;
        m.take_copies(&copies);
        assert(copies.size() <= 1);
        num_copies += (int32_t) copies.size();
        for (const BlockCopy & c : copies) {
            for (int32_t r = 0; r < block_size; ++r) {
                kv[(size_t) (c.dst_block_id * block_size + r)] = kv[(size_t) (c.src_block_id * block_size + r)];
            }
        }
        std::vector<int64_t> & values = seqs[seq_id];
        for (int32_t slot : slots) {
            assert(slot >= 0 && slot < (int32_t) kv.size());
            kv[(size_t) slot] = next_value;
            values.push_back(next_value++);
        }
    }

    void verify() const {
        check(m);
        assert(m.num_seqs() == (int32_t) seqs.size());
        std::unordered_map<int32_t, int32_t> fill;  // device block -> rows filled, each block once
        for (const auto & [seq_id, values] : seqs) {
            const BlockTable * table = m.find(seq_id);
            for (int32_t i = 0; i < table->num_blocks(); ++i) {
                const int32_t rows = std::min(block_size, table->num_tokens - i * block_size);
                int32_t & f = fill[table->block_ids[(size_t) i]];
                f = std::max(f, rows);
            }
        }
        int64_t filled = 0;
        for (const auto & [block_id, rows] : fill) {
            filled += rows;
        }
        assert(m.num_rows_filled() == filled);
        assert(filled <= (int64_t) m.pool().num_used() * block_size);
        for (const auto & [seq_id, values] : seqs) {
            const BlockTable * table = m.find(seq_id);
            assert(table != nullptr && table->num_tokens == (int32_t) values.size());
            for (int32_t pos = 0; pos < table->num_tokens; ++pos) {
                const int32_t block_id = table->block_ids[(size_t) (pos / block_size)];
                assert(kv[(size_t) (block_id * block_size + pos % block_size)] == values[(size_t) pos]);
            }
        }
    }

    void step(std::mt19937 & rng) {
        const uint32_t kind = rng() % 11;
        if (seqs.empty() || kind < 2) {
            const int64_t seq_id = next_seq_id++;
            run_append(seq_id, (int32_t) (rng() % (3 * block_size + 1)));
        } else if (kind < 6) {
            run_append(pick_live(rng), rng() % 4 == 0 ? (int32_t) (rng() % (2 * block_size + 1)) : 1);
        } else if (kind < 7) {
            // Async decode's reservation at a full last block, and the row a decode launched ahead writes
            // there (a stray value: the append that uses the block writes the row again, a free drops it).
            const int64_t seq_id = pick_live(rng);
            if (m.find(seq_id)->num_tokens % block_size == 0) {
                const int32_t block_id = m.reserve_next_block(seq_id);
                num_reserved += block_id != CF_BLOCK_ID_NONE ? 1 : 0;
                if (block_id != CF_BLOCK_ID_NONE) {
                    kv[(size_t) (block_id * block_size)] = -1;
                }
            }
        } else if (kind < 8) {
            const int64_t parent = pick_live(rng);
            const int64_t child = next_seq_id++;
            m.fork(parent, child);
            seqs[child] = seqs.at(parent);
        } else {
            const int64_t seq_id = pick_live(rng);
            m.free(seq_id);
            seqs.erase(seq_id);
        }
        verify();
    }
};

void test_random_streams() {
    const int32_t configs[][2] = { { 8, 4 }, { 16, 1 }, { 5, 3 }, { 32, 16 }, { 1, 2 } };
    int64_t total_out_of_blocks = 0;
    int64_t total_copies = 0;
    int64_t total_reserved = 0;
    for (uint32_t seed = 0; seed < 4; ++seed) {
        for (const auto & c : configs) {
            Sim sim(c[0], c[1]);
            std::mt19937 rng(seed * 7919 + (uint32_t) c[0]);
            for (int op = 0; op < 3000; ++op) {
                sim.step(rng);
            }
            for (auto it = sim.seqs.begin(); it != sim.seqs.end(); it = sim.seqs.erase(it)) {
                sim.m.free(it->first);
            }
            sim.verify();
            assert(sim.m.num_free_blocks() == c[0]);
            total_out_of_blocks += sim.num_out_of_blocks;
            total_copies += sim.num_copies;
            total_reserved += sim.num_reserved;
            assert(sim.num_out_of_blocks > 0);
            // Block size 1 has no partial blocks; a single block leaves none to copy into.
            assert(sim.num_copies > 0 || c[1] == 1 || c[0] == 1);
        }
    }
    assert(total_reserved > 0);
    std::printf("random streams: 60000 ops, %lld out-of-blocks, %lld copies-on-write, %lld blocks reserved ahead\n",
                (long long) total_out_of_blocks, (long long) total_copies, (long long) total_reserved);
}

// ---- C shims ------------------------------------------------------------------------------

void test_c_abi() {
    cf_block_manager_t mgr = (cf_block_manager_t) 0x1;
    assert(cf_block_manager_init(0, 4, &mgr) == CF_STATUS_INVALID_ARGUMENT && mgr == nullptr);
    assert(std::strstr(cf_last_error(), "num_blocks") != nullptr);
    assert(cf_block_manager_init(1 << 20, 1 << 12, &mgr) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_block_manager_init(4, 4, nullptr) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_block_manager_init(4, 4, &mgr) == CF_STATUS_OK && mgr != nullptr);

    int32_t slots[16];
    int32_t n = -1;
    int32_t num_cow = -1;
    assert(cf_block_manager_append_slots(mgr, 1, 10, slots, 16, &num_cow) == CF_STATUS_OK);
    assert(num_cow == 0 && slots[0] == 0 && slots[9] == 9);
    assert(cf_block_manager_append_slots(mgr, 1, 3, slots, 2, &num_cow) == CF_STATUS_BUFFER_TOO_SMALL);
    assert(cf_block_manager_append_slots(mgr, -1, 1, slots, 16, &num_cow) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_block_manager_append_slots(mgr, 1, -1, slots, 16, &num_cow) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_block_manager_fork(mgr, 9, 2) == CF_STATUS_NOT_FOUND);
    assert(cf_block_manager_fork(mgr, 1, 1) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_block_manager_fork(mgr, 1, 2) == CF_STATUS_OK);
    assert(cf_block_manager_fork(mgr, 1, 2) == CF_STATUS_INVALID_ARGUMENT);

    // Copy-on-write plus growth needs 2 blocks; only 1 is free.
    assert(cf_block_manager_append_slots(mgr, 2, 3, slots, 16, &num_cow) == CF_STATUS_OUT_OF_MEMORY);
    assert(std::strcmp(cf_last_error(), "out of KV blocks: seq 2 needs 2 blocks for 3 new tokens, 1 free") == 0);
    int32_t can = -1;
    assert(cf_block_manager_can_allocate(mgr, 2, 3, &can) == CF_STATUS_OK && can == 0);
    assert(cf_block_manager_can_allocate(mgr, 2, 2, &can) == CF_STATUS_OK && can == 1);
    assert(cf_block_manager_append_slots(mgr, 2, 2, slots, 16, &num_cow) == CF_STATUS_OK);
    assert(num_cow == 1 && slots[0] == 3 * 4 + 2 && slots[1] == 3 * 4 + 3);

    int32_t src[2];
    int32_t dst[2];
    assert(cf_block_manager_take_copies(mgr, src, dst, 0, &n) == CF_STATUS_BUFFER_TOO_SMALL && n == 1);
    assert(cf_block_manager_take_copies(mgr, src, dst, 2, &n) == CF_STATUS_OK && n == 1);
    assert(src[0] == 2 && dst[0] == 3);
    assert(cf_block_manager_take_copies(mgr, nullptr, nullptr, 0, &n) == CF_STATUS_OK && n == 0);

    int32_t table[4];
    assert(cf_block_manager_block_table(mgr, 2, table, 2, &n) == CF_STATUS_BUFFER_TOO_SMALL && n == 3);
    assert(cf_block_manager_block_table(mgr, 2, table, 4, &n) == CF_STATUS_OK && n == 3);
    assert(table[0] == 0 && table[1] == 1 && table[2] == 3 && table[3] == CF_BLOCK_ID_NONE);
    assert(cf_block_manager_block_table(mgr, 8, table, 4, &n) == CF_STATUS_NOT_FOUND);

    int32_t ref = -1;
    assert(cf_block_manager_ref_count(mgr, 0, &ref) == CF_STATUS_OK && ref == 2);
    assert(cf_block_manager_ref_count(mgr, 4, &ref) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_block_manager_check_invariants(mgr) == CF_STATUS_OK);

    char buf[512];
    int32_t len = -1;
    assert(cf_block_manager_dump(mgr, buf, 4, &len) == CF_STATUS_BUFFER_TOO_SMALL && len > 4);
    assert(cf_block_manager_dump(mgr, buf, (int32_t) sizeof buf, &len) == CF_STATUS_OK);
    assert(std::string(buf, (size_t) len).find("seq 2: num_tokens=12 blocks=[0 1 3]") != std::string::npos);

    int32_t num_free = -1;
    assert(cf_block_manager_free_seq(mgr, 7) == CF_STATUS_NOT_FOUND);
    assert(cf_block_manager_free_seq(mgr, 1) == CF_STATUS_OK);
    assert(cf_block_manager_free_seq(mgr, 2) == CF_STATUS_OK);
    assert(cf_block_manager_num_free_blocks(mgr, &num_free) == CF_STATUS_OK && num_free == 4);
    assert(cf_block_manager_num_free_blocks(nullptr, &num_free) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_block_manager_check_invariants(nullptr) == CF_STATUS_INVALID_ARGUMENT);
    cf_block_manager_free(mgr);
    cf_block_manager_free(nullptr);
}

}  // namespace

int main() {
    test_append_new_sequence();
    test_zero_tokens_registers_sequence();
    test_fork_then_copy_on_write();
    test_fork_at_block_boundary_needs_no_copy();
    test_copy_on_write_with_growth();
    test_out_of_blocks_changes_nothing();
    test_huge_request_does_not_overflow();
    test_free_returns_blocks_last_first();
    test_free_deferred_holds_blocks_until_release();
    test_rows_filled_leaves_out_host_entries();
    test_write_block_table_pads();
    test_dump_lists_tables_and_copies();
    test_reserve_next_block();
    test_random_streams();
    test_c_abi();
    std::printf("test_block_manager: ok\n");
    return 0;
}
