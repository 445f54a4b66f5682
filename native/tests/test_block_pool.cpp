// test_block_pool.cpp - unit tests of cf::BlockPool: FIFO free list, all-or-nothing allocate,
// ref counting, invariants after every operation, and a seeded random op stream checked against
// a plain per-block model.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/block_pool.h"

#include <cassert>
#include <cstdio>
#include <random>
#include <vector>

using namespace cf;

namespace {

// Abort with the pool's dump when an invariant is broken.
void check(const BlockPool & pool) {
    const std::string violation = pool.check_invariants();
    if (!violation.empty()) {
        std::fprintf(stderr, "invariant broken: %s\n%s", violation.c_str(), pool.dump().c_str());
        assert(false);
    }
}

BlockPool make_pool(int32_t num_blocks = 8, int32_t block_size = 4) {
    BlockPool pool(num_blocks, block_size);
    check(pool);
    return pool;
}

void test_fresh_pool() {
    BlockPool pool = make_pool(8, 4);
    assert(pool.num_blocks() == 8 && pool.block_size() == 4);
    assert(pool.num_free() == 8 && pool.num_used() == 0);
    for (int32_t b = 0; b < 8; ++b) {
        assert(pool.ref_count(b) == 0);
    }
    assert(pool.is_valid(0) && pool.is_valid(7));
    assert(!pool.is_valid(8) && !pool.is_valid(CF_BLOCK_ID_NONE));
}

void test_allocate_in_fifo_order() {
    BlockPool pool = make_pool(8, 4);
    std::vector<int32_t> ids;
    assert(pool.allocate(3, &ids));
    check(pool);
    assert((ids == std::vector<int32_t>{ 0, 1, 2 }));
    assert(pool.num_free() == 5 && pool.ref_count(1) == 1);

    // Freed blocks go to the back: 3..7 come out before 1 and 0.
    pool.decref(1);
    pool.decref(0);
    check(pool);
    ids.clear();
    assert(pool.allocate(7, &ids));
    check(pool);
    assert((ids == std::vector<int32_t>{ 3, 4, 5, 6, 7, 1, 0 }));
    assert(pool.num_free() == 0);
}

void test_allocate_is_all_or_nothing() {
    BlockPool pool = make_pool(4, 2);
    std::vector<int32_t> ids;
    assert(pool.allocate(3, &ids));
    const std::string before = pool.dump();
    assert(pool.can_allocate(1) && !pool.can_allocate(2));
    assert(!pool.allocate(2, &ids));
    check(pool);
    assert(ids.size() == 3 && pool.dump() == before);
    assert(pool.allocate(0, &ids) && ids.size() == 3);  // zero blocks always succeed
    assert(pool.allocate(1, &ids) && pool.num_free() == 0);
    assert(!pool.allocate(1, &ids) && pool.allocate(0, &ids));
    check(pool);
}

void test_ref_counts() {
    BlockPool pool = make_pool(4, 4);
    std::vector<int32_t> ids;
    assert(pool.allocate(1, &ids));
    const int32_t b = ids[0];
    pool.incref(b);
    pool.incref(b);
    check(pool);
    assert(pool.ref_count(b) == 3 && pool.num_free() == 3);
    pool.decref(b);
    pool.decref(b);
    check(pool);
    assert(pool.ref_count(b) == 1 && pool.num_free() == 3);
    pool.decref(b);  // last holder: back to the free list
    check(pool);
    assert(pool.ref_count(b) == 0 && pool.num_free() == 4);
}

void test_dump_mentions_state() {
    BlockPool pool = make_pool(3, 4);
    std::vector<int32_t> ids;
    assert(pool.allocate(1, &ids));
    pool.incref(ids[0]);
    const std::string text = pool.dump();
    assert(text.find("num_blocks=3") != std::string::npos);
    assert(text.find("0:2") != std::string::npos);  // block 0 with ref count 2
}

// Seeded random incref/decref/allocate stream; a plain vector of ref counts plus a FIFO model
// predicts every allocation.
void test_random_stream() {
    constexpr int32_t kNumBlocks = 16;
    BlockPool pool = make_pool(kNumBlocks, 4);
    std::vector<int32_t> model_refs(kNumBlocks, 0);
    std::vector<int32_t> model_free;
    for (int32_t b = 0; b < kNumBlocks; ++b) {
        model_free.push_back(b);
    }
    std::mt19937 rng(1234);
    for (int op = 0; op < 20000; ++op) {
        const int kind = (int) (rng() % 3);
        const int32_t block_id = (int32_t) (rng() % kNumBlocks);
        if (kind == 0) {
            const int32_t n = (int32_t) (rng() % 5);
            std::vector<int32_t> ids;
            const bool ok = pool.allocate(n, &ids);
            assert(ok == (n <= (int32_t) model_free.size()));
            if (ok) {
                const std::vector<int32_t> expected(model_free.begin(), model_free.begin() + n);
                assert(ids == expected);
                model_free.erase(model_free.begin(), model_free.begin() + n);
                for (int32_t b : ids) {
                    model_refs[(size_t) b] = 1;
                }
            } else {
                assert(ids.empty());
            }
        } else if (model_refs[(size_t) block_id] >= 1) {
            if (kind == 1) {
                pool.incref(block_id);
                model_refs[(size_t) block_id] += 1;
            } else {
                pool.decref(block_id);
                if (--model_refs[(size_t) block_id] == 0) {
                    model_free.push_back(block_id);
                }
            }
        }
        check(pool);
        assert(pool.num_free() == (int32_t) model_free.size());
        for (int32_t b = 0; b < kNumBlocks; ++b) {
            assert(pool.ref_count(b) == model_refs[(size_t) b]);
        }
    }
}

}  // namespace

int main() {
    test_fresh_pool();
    test_allocate_in_fifo_order();
    test_allocate_is_all_or_nothing();
    test_ref_counts();
    test_dump_mentions_state();
    test_random_stream();
    std::printf("test_block_pool: ok\n");
    return 0;
}
