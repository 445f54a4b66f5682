// test_prefix_cache.cpp - the prefix cache inside BlockManager (core/prefix_cache.h): hash-chain
// matching, partial rows copied, ref counts, LRU eviction order, copy-on-write, one copy for
// concurrent identical prefixes, collisions that are never acted on, and a randomized run over a
// simulated KV store that proves every sequence always reads exactly its own tokens' KV.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/block_manager.h"
#include "kv/kv_cache_manager.h"
#include "seq_builders.h"

#include <cassert>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace cf;
using cf::test::make_seq;
using cf::test::tokens;

namespace {

constexpr int32_t kBs = 4;  // block_size of every test

void check(const BlockManager & m) {
    const std::string error = m.check_invariants();
    if (!error.empty()) {
        std::fprintf(stderr, "invariant broken: %s\n%s", error.c_str(), m.dump().c_str());
        assert(false);
    }
}

// Run a sequence through the manager as PagedKv and the engine do: admit on its cached prefix,
// give the rest slots, run the step (take copies), commit. Returns the cached token count.
int32_t run_seq(BlockManager & m, int64_t seq_id, const std::vector<int32_t> & toks) {
    const PrefixMatch match = m.match_prefix(toks.data(), (int32_t) toks.size() - 1);
    m.allocate_prefix(seq_id, match, (int32_t) toks.size());
    check(m);
    assert(m.append_slots(seq_id, (int32_t) toks.size() - match.num_tokens(), nullptr));
    std::vector<BlockCopy> copies;
    m.take_copies(&copies);
    m.commit(seq_id, toks.data(), (int32_t) toks.size());
    check(m);
    return match.num_tokens();
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t> & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

void test_full_blocks_shared_and_last_token_computed() {
    BlockManager m(16, kBs, true);
    const std::vector<int32_t> prompt = tokens(10);  // 2 full blocks + 2 rows
    assert(run_seq(m, 1, prompt) == 0);
    // Same 2 blocks, then a different token: 2 blocks shared + the 2 matching rows copied.
    std::vector<int32_t> other = concat(tokens(10), { 99 });
    assert(run_seq(m, 2, other) == 10);
    const BlockTable & a = *m.find(1);
    const BlockTable & b = *m.find(2);
    assert(a.block_ids[0] == b.block_ids[0] && a.block_ids[1] == b.block_ids[1]);
    assert(a.block_ids[2] != b.block_ids[2]);  // partial rows are copied, never shared
    assert(m.pool().ref_count(a.block_ids[0]) == 2 && m.pool().ref_count(a.block_ids[2]) == 1);
    // The identical prompt again: everything but its last token is cached.
    assert(run_seq(m, 3, prompt) == 9);
    // A prompt of exactly 2 blocks whose blocks are cached: block 0 shared, 3 rows of block 1
    // copied, the last token computed into the copy (block 1 itself is never written). Once
    // committed, the copy holds what block 1 holds and the table moves onto block 1.
    const PrefixMatch exact = m.match_prefix(tokens(8).data(), 7);
    assert(exact.block_ids.size() == 1 && exact.copy_src_block_id == a.block_ids[1] && exact.num_copy_tokens == 3);
    assert(run_seq(m, 4, tokens(8)) == 7);
    assert(m.find(4)->block_ids[0] == a.block_ids[0] && m.find(4)->block_ids[1] == a.block_ids[1]);
    // Diverging inside block 1: block 0 shared, the common rows of block 1 copied.
    std::vector<int32_t> diverge = tokens(6);
    diverge.push_back(42);
    diverge.push_back(43);
    assert(run_seq(m, 5, diverge) == 6);
    const PrefixCacheStats stats = m.prefix_cache_stats();
    assert(stats.num_hit_tokens == 10 + 9 + 7 + 6 && stats.num_queried_tokens == 10 + 11 + 10 + 8 + 8);
}

void test_ref_counts_and_cached_free_blocks() {
    BlockManager m(8, kBs, true);
    run_seq(m, 1, tokens(9));  // 3 blocks
    run_seq(m, 2, tokens(9));  // shares 2, copies 0 rows of the third? (8 cached: 2 blocks)
    const int32_t b0 = m.find(1)->block_ids[0];
    assert(m.pool().ref_count(b0) == 2);
    m.free(1);
    check(m);
    assert(m.pool().ref_count(b0) == 1);
    m.free(2);
    check(m);
    // Nothing is held, everything counts as free, and the cached blocks are still found.
    assert(m.num_free_blocks() == 8 && m.pool().ref_count(b0) == 0);
    assert(m.prefix_cache_stats().num_cached_blocks >= 3);
    const PrefixMatch hit = m.match_prefix(tokens(9).data(), 8);
    assert(hit.block_ids.size() == 2 && hit.num_revived == 2 && hit.block_ids[0] == b0);
    assert(m.num_blocks_needed(hit, 9) == 1 + 2);  // one own block + two revived from the free list
    run_seq(m, 3, tokens(9));
    assert(m.pool().ref_count(b0) == 1 && m.num_free_blocks() == 8 - 3);
    m.free(3);
    check(m);
}

void test_lru_eviction_order() {
    BlockManager m(6, kBs, true);
    run_seq(m, 1, tokens(4, 100));  // 1 block each, full
    run_seq(m, 2, tokens(4, 200));
    run_seq(m, 3, tokens(4, 300));
    const int32_t b1 = m.find(1)->block_ids[0], b2 = m.find(2)->block_ids[0], b3 = m.find(3)->block_ids[0];
    m.free(2);
    m.free(1);
    m.free(3);  // LRU order now: b2, b1, b3
    // The 3 never-used blocks go first, then the least recently used cached block (b2).
    std::vector<int32_t> got;
    assert(m.append_slots(9, 4 * kBs, &got));
    check(m);
    const BlockTable & t = *m.find(9);
    assert(t.block_ids[3] == b2 && m.prefix_cache_stats().num_evictions == 1);
    assert(m.match_prefix(tokens(4, 200).data(), 4).block_ids.empty());  // b2 is gone
    assert(m.match_prefix(tokens(4, 100).data(), 4).block_ids.size() == 1);
    // A hit moves a block to the most recently used end: use b1 and free it again.
    run_seq(m, 4, concat(tokens(4, 100), { 7 }));
    m.free(4);
    assert(m.append_slots(9, kBs, nullptr) && m.find(9)->block_ids.back() == b3);  // b3 is now the oldest
    check(m);
    (void) b1;
}

void test_eviction_never_touches_blocks_in_use() {
    BlockManager m(4, kBs, true);
    run_seq(m, 1, tokens(8));  // holds 2 blocks, both cached
    assert(m.num_free_blocks() == 2 && !m.can_allocate(2, 3 * kBs));
    assert(!m.append_slots(2, 3 * kBs, nullptr));  // short: nothing is evicted from seq 1
    assert(m.prefix_cache_stats().num_evictions == 0 && m.match_prefix(tokens(8).data(), 8).block_ids.size() == 2);
    check(m);
}

void test_copy_on_write_and_pins() {
    BlockManager m(8, kBs, true);
    run_seq(m, 1, tokens(6));
    // Seq 2 copies 2 rows of seq 1's running tail block; the source is pinned until the step.
    const std::vector<int32_t> p2 = concat(tokens(6), { 50, 51 });
    const PrefixMatch match = m.match_prefix(p2.data(), 7);
    assert(match.num_copy_tokens == 2 && match.copy_src_block_id == m.find(1)->block_ids[1]);
    m.allocate_prefix(2, match, 8);
    assert(m.pool().ref_count(match.copy_src_block_id) == 2);  // seq 1 + the pin
    check(m);
    std::vector<BlockCopy> copies;
    m.take_copies(&copies);
    assert(copies.size() == 1 && copies[0].src_block_id == match.copy_src_block_id &&
           copies[0].dst_block_id == m.find(2)->block_ids[1]);
    assert(m.pool().ref_count(match.copy_src_block_id) == 1);
    check(m);
    // Seq 1 keeps writing its own tail in place: it holds it alone.
    assert(m.append_slots(1, 1, nullptr) && m.pending_copies().empty());
    // A fork shares the partial tail; the next append of either copies it first.
    m.fork(2, 3);
    assert(m.append_slots(3, 1, nullptr) && m.pending_copies().size() == 1);
    check(m);
}

void test_concurrent_identical_prefixes_converge_on_one_copy() {
    BlockManager m(16, kBs, true);
    const std::vector<int32_t> prompt = tokens(9);
    for (int64_t id = 1; id <= 3; ++id) {  // admitted in one step: nothing cached yet
        m.allocate_prefix(id, m.match_prefix(prompt.data(), 8), 9);
        assert(m.append_slots(id, 9, nullptr));
    }
    assert(m.pool().num_used() == 9);
    for (int64_t id = 1; id <= 3; ++id) {
        m.commit(id, prompt.data(), 9);
        check(m);
    }
    // The full blocks are held once; each keeps its own partial tail.
    assert(m.pool().num_used() == 2 + 3);
    assert(m.find(2)->block_ids[0] == m.find(1)->block_ids[0] && m.find(3)->block_ids[1] == m.find(1)->block_ids[1]);
    assert(m.pool().ref_count(m.find(1)->block_ids[0]) == 3);
}

// Every key is the same: each lookup finds some block, and only token-by-token and parent checks
// keep the cache from acting on a collision.
uint64_t colliding_hash(uint64_t, const int32_t *, int32_t) {
    return 42;
}

void test_collisions_are_never_acted_on() {
    BlockManager m(16, kBs, true, colliding_hash);
    run_seq(m, 1, tokens(9, 0));
    assert(run_seq(m, 2, tokens(9, 100)) == 0);  // same key, other tokens: a miss
    // Same first block, other second block: the key of block 1 is taken by seq 1's block 1.
    std::vector<int32_t> p3 = concat(tokens(4, 0), tokens(5, 500));
    assert(run_seq(m, 3, p3) == 4);
    // The one key belongs to seq 1's block 0, so only that block is indexed; it is still found.
    assert(run_seq(m, 4, tokens(9, 0)) == 4);
    assert(m.find(4)->block_ids[0] == m.find(1)->block_ids[0]);
    check(m);
}

// Through the KV manager interface: a sequence that needs the whole pool alone is admitted; it
// does not pin the free source of a partial copy on top (that would need one block too many).
void test_sequence_filling_the_pool_is_admitted() {
    std::unique_ptr<KvCacheManager> kv = make_paged_kv(4, kBs, true);
    std::unique_ptr<Sequence> a = make_seq(1, 15, 1);
    assert(kv->can_admit(*a, 0) && kv->admit(*a) == 0 && kv->allocate(*a, 15));
    a->num_computed_tokens = 15;
    kv->commit(*a);
    kv->free(*a);
    std::unique_ptr<Sequence> b = make_seq(2, 16, 1);  // 3 cached blocks + 3 rows of a's tail
    assert(kv->can_admit(*b, 0));
    assert(kv->admit(*b) == 3 * kBs && kv->allocate(*b, 4));
    assert(kv->num_blocks_used() == 4);
    kv->free(*b);
}

// ---- randomized run over a simulated KV store

// What a KV row holds: a hash of the token at pos and everything before it (as real K/V do).
uint64_t row_value(const std::vector<int32_t> & toks, int32_t pos) {
    return hash_block(kPrefixRootHash, toks.data(), pos + 1);
}

struct Sim {
    BlockManager m;
    std::vector<uint64_t> kv;  // [num_blocks * kBs] the simulated pool
    std::map<int64_t, std::vector<int32_t>> live;  // seq id -> its tokens (all computed)
    Sim(int32_t num_blocks, BlockHashFn hash) : m(num_blocks, kBs, true, hash), kv((size_t) num_blocks * kBs, 0) {}

    void execute_copies() {
        std::vector<BlockCopy> copies;
        m.take_copies(&copies);
        for (const BlockCopy & c : copies) {
            for (int32_t r = 0; r < kBs; ++r) {
                kv[(size_t) (c.dst_block_id * kBs + r)] = kv[(size_t) (c.src_block_id * kBs + r)];
            }
        }
    }
    void write(int64_t seq_id, const std::vector<int32_t> & toks, int32_t begin, int32_t end) {
        const BlockTable & t = *m.find(seq_id);
        for (int32_t pos = begin; pos < end; ++pos) {
            kv[(size_t) (t.block_ids[(size_t) (pos / kBs)] * kBs + pos % kBs)] = row_value(toks, pos);
        }
    }
    void verify(int64_t seq_id) const {
        const std::vector<int32_t> & toks = live.at(seq_id);
        const BlockTable & t = *m.find(seq_id);
        for (int32_t pos = 0; pos < (int32_t) toks.size(); ++pos) {
            assert(kv[(size_t) (t.block_ids[(size_t) (pos / kBs)] * kBs + pos % kBs)] == row_value(toks, pos));
        }
    }
    // Admit and prefill a new sequence in chunks of `chunk`; false if the pool is short.
    bool add(int64_t seq_id, const std::vector<int32_t> & toks, int32_t chunk) {
        const PrefixMatch match = m.match_prefix(toks.data(), (int32_t) toks.size() - 1);
        if (m.num_blocks_needed(match, (int32_t) toks.size()) > m.num_free_blocks()) {
            return false;
        }
        m.allocate_prefix(seq_id, match, (int32_t) toks.size());
        int32_t done = match.num_tokens();
        while (done < (int32_t) toks.size()) {
            const int32_t n = std::min(chunk, (int32_t) toks.size() - done);
            assert(m.append_slots(seq_id, n, nullptr));
            execute_copies();
            write(seq_id, toks, done, done + n);
            done += n;
            m.commit(seq_id, toks.data(), done);
            check(m);
        }
        live[seq_id] = toks;
        return true;
    }
    // Decode one token onto a live sequence; false if the pool is short.
    bool grow(int64_t seq_id, int32_t token) {
        std::vector<int32_t> & toks = live.at(seq_id);
        if (!m.can_allocate(seq_id, 1)) {
            return false;
        }
        toks.push_back(token);
        assert(m.append_slots(seq_id, 1, nullptr));
        execute_copies();
        write(seq_id, toks, (int32_t) toks.size() - 1, (int32_t) toks.size());
        m.commit(seq_id, toks.data(), (int32_t) toks.size());
        return true;
    }
};

void test_randomized_against_simulated_kv(BlockHashFn hash, uint32_t seed) {
    Sim sim(24, hash);
    std::mt19937 rng(seed);
    auto pick = [&rng](int32_t n) { return (int32_t) (rng() % (uint32_t) n); };
    const std::vector<int32_t> system = tokens(7, 1000);  // shared by many prompts
    int64_t next_id = 1;
    for (int op = 0; op < 3000; ++op) {
        const int32_t kind = pick(10);
        if (kind < 4) {  // a new prompt: maybe the system prefix, then a few tokens of 3 letters
            std::vector<int32_t> toks = pick(2) ? system : std::vector<int32_t>{};
            const int32_t n = 1 + pick(12);
            for (int32_t i = 0; i < n; ++i) {
                toks.push_back(pick(3));
            }
            sim.add(next_id++, toks, 1 + pick(6));
        } else if (kind < 7 && !sim.live.empty()) {
            auto it = std::next(sim.live.begin(), pick((int32_t) sim.live.size()));
            sim.grow(it->first, pick(3));
        } else if (!sim.live.empty()) {
            auto it = std::next(sim.live.begin(), pick((int32_t) sim.live.size()));
            sim.verify(it->first);
            sim.m.free(it->first);
            sim.live.erase(it);
        }
        check(sim.m);
        for (const auto & entry : sim.live) {
            sim.verify(entry.first);
        }
    }
    const PrefixCacheStats stats = sim.m.prefix_cache_stats();
    assert(stats.num_hit_tokens > 0 && stats.num_evictions > 0);
    std::printf("  seed %u: hits %lld of %lld tokens, %lld evictions\n", seed, (long long) stats.num_hit_tokens,
                (long long) stats.num_queried_tokens, (long long) stats.num_evictions);
}

}  // namespace

int main() {
    test_full_blocks_shared_and_last_token_computed();
    test_ref_counts_and_cached_free_blocks();
    test_lru_eviction_order();
    test_eviction_never_touches_blocks_in_use();
    test_copy_on_write_and_pins();
    test_concurrent_identical_prefixes_converge_on_one_copy();
    test_collisions_are_never_acted_on();
    test_sequence_filling_the_pool_is_admitted();
    for (uint32_t seed = 1; seed <= 3; ++seed) {
        test_randomized_against_simulated_kv(hash_block, seed);
        test_randomized_against_simulated_kv(colliding_hash, seed);
    }
    std::printf("test_prefix_cache: all passed\n");
    return 0;
}
