// test_kv_manager.cpp - the same scenarios through the KvCacheManager interface for each of its
// implementations (stock split, stock unified, paged), then what differs between them.
#undef NDEBUG  // the checks must run in Release builds too
#include "kv/kv_cache_manager.h"
#include "seq_builders.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

using namespace cf;
using cf::test::make_seq;

namespace {


void check(const KvCacheManager & kv, const std::vector<std::unique_ptr<Sequence>> & running) {
    const std::string error = kv.check_invariants(running);
    if (!error.empty()) {
        std::fprintf(stderr, "%s\n%s", error.c_str(), kv.dump().c_str());
        assert(false);
    }
}

// Scenarios every implementation passes (capacity: at least 2 sequences of 64 tokens).
// Admit two sequences, grow them step by step as the scheduler would, free them in another order:
// usage goes back to zero and the invariants hold after every call.
void scenario_admit_grow_free(KvCacheManager & kv) {
    std::vector<std::unique_ptr<Sequence>> running;
    assert(kv.kv_tokens_reserved() == 0 && kv.num_blocks_used() == 0);
    for (int64_t id = 1; id <= 2; ++id) {
        std::unique_ptr<Sequence> seq = make_seq(id, 10, 20);
        assert(kv.can_admit(*seq, (int32_t) running.size()));
        kv.admit(*seq);
        running.push_back(std::move(seq));
        check(kv, running);
    }
    for (int step = 0; step < 5; ++step) {
        for (auto & seq : running) {
            const int32_t n = step == 0 ? seq->num_prompt_tokens : 1;
            assert(kv.allocate(*seq, n));
            seq->num_computed_tokens += n;
            seq->append_token(7);  // every step ends at the last token: it samples one
            check(kv, running);
        }
    }
    assert(kv.kv_tokens_reserved() > 0);
    StepPlan plan;  // the KV part of a plan for both sequences' last token
    for (auto & seq : running) {
        seq->num_computed_tokens -= 1;
        plan.seqs.push_back({seq.get(), 1, true});
    }
    kv.fill_plan(&plan);
    for (auto & seq : running) {
        seq->num_computed_tokens += 1;
    }
    assert(plan.blocks_to_copy.empty());  // nothing is shared: no copy-on-write
    // Paged fills one slot per token and one context length per sequence; stock fills nothing.
    const size_t n = kv.block_manager() != nullptr ? 2 : 0;
    assert(plan.slot_mapping.size() == n && plan.context_lens.size() == n);
    kv.free(*running[0]);
    running.erase(running.begin());
    check(kv, running);
    kv.free(*running[0]);
    running.clear();
    check(kv, running);
    assert(kv.kv_tokens_reserved() == 0 && kv.num_blocks_used() == 0);
}

// A sequence freed right after admission (aborted before it computed anything) leaves no trace.
void scenario_free_before_allocate(KvCacheManager & kv) {
    std::vector<std::unique_ptr<Sequence>> running;
    std::unique_ptr<Sequence> seq = make_seq(9, 5, 5);
    assert(kv.can_admit(*seq, 0));
    kv.admit(*seq);
    running.push_back(std::move(seq));
    check(kv, running);
    kv.free(*running[0]);
    running.clear();
    check(kv, running);
    assert(kv.kv_tokens_reserved() == 0);
    assert(!kv.dump().empty() && std::string(kv.name()).size() > 0);
}

void run_common_scenarios(const std::function<std::unique_ptr<KvCacheManager>()> & make) {
    std::unique_ptr<KvCacheManager> kv = make();
    scenario_admit_grow_free(*kv);
    scenario_free_before_allocate(*kv);
    scenario_admit_grow_free(*kv);  // again on the same manager: nothing leaked
}

// What differs: split admits whatever runs (a stream per running slot) and reserves whole streams.
void test_split_specifics() {
    std::unique_ptr<KvCacheManager> kv = make_stock_split_kv(64);
    std::unique_ptr<Sequence> seq = make_seq(1, 10, 1000);
    assert(kv->can_admit(*seq, 100));
    kv->admit(*seq);
    assert(kv->kv_tokens_reserved() == 64 && kv->block_manager() == nullptr);
    kv->free(*seq);
}

// Unified reserves min(prompt + max_tokens, n_ctx_per_seq) at admission and admits while it fits.
void test_unified_specifics() {
    std::unique_ptr<KvCacheManager> kv = make_stock_unified_kv(100, 100);
    std::unique_ptr<Sequence> a = make_seq(1, 10, 50);
    std::unique_ptr<Sequence> b = make_seq(2, 10, 50);
    kv->admit(*a);
    assert(kv->kv_tokens_reserved() == 60 && !kv->can_admit(*b, 1));
    kv->free(*a);
    assert(kv->can_admit(*b, 0));
    std::unique_ptr<Sequence> huge = make_seq(3, 10, 1000);
    kv->admit(*huge);
    assert(kv->kv_tokens_reserved() == 100);  // capped by n_ctx_per_seq
    kv->free(*huge);
}

// Paged admits by free blocks plus a watermark, and allocate() fails, changing nothing, when the
// pool is short.
void test_paged_specifics() {
    std::unique_ptr<KvCacheManager> kv = make_paged_kv(8, 4);
    assert(kv->num_blocks_total() == 8 && kv->block_manager() != nullptr);
    std::vector<std::unique_ptr<Sequence>> running;
    running.push_back(make_seq(1, 10, 20));  // 3 blocks
    kv->admit(*running[0]);
    assert(kv->allocate(*running[0], 10) && kv->num_blocks_used() == 3);
    std::unique_ptr<Sequence> big = make_seq(2, 17, 4);  // 5 blocks + watermark 1 > 5 free
    assert(!kv->can_admit(*big, 1));
    std::unique_ptr<Sequence> fits = make_seq(3, 16, 4);  // 4 blocks + 1 <= 5 free
    assert(kv->can_admit(*fits, 1));
    assert(!kv->allocate(*running[0], 23) && kv->num_blocks_used() == 3);  // 9 blocks > 8: short
    assert(kv->block_manager()->find(1)->num_tokens == 10);
    check(*kv, running);
    kv->free(*running[0]);
    assert(kv->num_blocks_used() == 0 && kv->kv_tokens_reserved() == 0);
}

// Swap through the interface: a forked child swapped out copies the blocks it shares with its
// parent and leaves them valid (the parent keeps its table and rows); it comes back in private
// blocks; host slots freed by a swap-in are reused only after end_step(), device blocks released by
// a swap-out only after the next begin_step() (deferred free). The stock managers cannot swap.
void test_paged_swap() {
    std::unique_ptr<KvCacheManager> kv = make_paged_kv(8, 4, false, /*num_host_blocks=*/3, /*block_bytes=*/64);
    const BlockManager & blocks = *kv->block_manager();
    std::vector<std::unique_ptr<Sequence>> running;
    running.push_back(make_seq(1, 6, 8));
    running.push_back(make_seq(2, 6, 8));
    Sequence & parent = *running[0];
    Sequence & child = *running[1];
    kv->admit(parent);
    assert(kv->allocate(parent, 6));
    parent.num_computed_tokens = 6;
    kv->fork(parent, child);  // shares blocks 0 and 1 (1 partially filled)
    child.num_computed_tokens = 6;
    check(*kv, running);
    assert(kv->can_swap_out(child) && kv->swap_bytes(child) == 2 * 64);
    std::vector<BlockSwap> out;
    kv->swap_out(child, &out);
    assert(out.size() == 2 && out[0].src_block_id == 0 && out[0].dst_block_id == 0);
    assert(out[1].src_block_id == 1 && out[1].dst_block_id == 1);
    assert(blocks.find(2) == nullptr && blocks.find(1)->num_tokens == 6);
    // deferred free: the swap-out copy reads blocks 0 and 1 during this step, so the child's holds
    // last until the next begin_step() (the parent's plus the child's); nothing else is freed
    assert(blocks.pool().ref_count(0) == 2 && blocks.pool().ref_count(1) == 2);
    assert(blocks.num_deferred_blocks() == 2 && kv->num_blocks_freed_next_step() == 0);  // shared: still held
    kv->begin_step();
    assert(blocks.pool().ref_count(0) == 1 && blocks.pool().ref_count(1) == 1);  // the parent's now
    assert(blocks.num_deferred_blocks() == 0);
    child.status = SequenceStatus::SWAPPED;
    std::unique_ptr<Sequence> swapped = std::move(running[1]);
    running.pop_back();
    check(*kv, running);
    assert(kv->check_swapped({ swapped.get() }).empty() && kv->num_host_blocks_used() == 2);

    assert(kv->can_swap_in(*swapped, 1, 1));  // 2 blocks (7 tokens) + watermark 1 <= 6 free
    std::vector<BlockSwap> in;
    kv->swap_in(*swapped, &in);
    assert(in.size() == 2 && in[0].src_block_id == 0 && in[1].src_block_id == 1);
    assert(in[0].dst_block_id != 0 && in[0].dst_block_id != 1 && in[1].dst_block_id != in[0].dst_block_id);
    assert(blocks.find(2)->num_tokens == 6 && blocks.pool().ref_count(in[1].dst_block_id) == 1);
    // the two slots are parked: swapping the parent (2 blocks) out now needs them, so it cannot
    assert(kv->num_host_blocks_used() == 2 && !kv->can_swap_out(parent));
    kv->end_step();
    assert(kv->num_host_blocks_used() == 0 && kv->can_swap_out(parent));
    swapped->status = SequenceStatus::RUNNING;
    running.push_back(std::move(swapped));
    check(*kv, running);
    assert(kv->allocate(*running[1], 1) && kv->block_manager()->pending_copies().empty());
    kv->free(*running[0]);
    kv->free(*running[1]);
    assert(kv->num_blocks_used() == 0);

    // a private table swapped out: its blocks count as freed next step, and only then are free
    std::unique_ptr<Sequence> solo = make_seq(5, 8, 4);
    kv->admit(*solo);
    assert(kv->allocate(*solo, 8));
    solo->num_computed_tokens = 8;
    std::vector<BlockSwap> solo_out;
    kv->swap_out(*solo, &solo_out);
    assert(solo_out.size() == 2 && kv->num_blocks_used() == 2 && kv->num_blocks_freed_next_step() == 2);
    std::unique_ptr<Sequence> big = make_seq(6, 28, 4);  // 7 blocks: 6 free now, 8 once they are back
    assert(!kv->can_admit(*big, 0) && kv->can_admit(*big, 0, /*with_deferred=*/true));
    assert(!kv->can_swap_in(*solo, 0, 20) && kv->can_swap_in(*solo, 0, 20, /*with_deferred=*/true));
    kv->begin_step();
    assert(kv->num_blocks_used() == 0 && kv->num_blocks_freed_next_step() == 0 && kv->can_swap_in(*solo, 0, 20));
    assert(kv->can_admit(*big, 0));
    kv->free_swapped(*solo);
    kv->end_step();

    std::unique_ptr<Sequence> s = make_seq(9, 4, 4);
    for (auto & stock : { make_stock_split_kv(64), make_stock_unified_kv(256, 64) }) {
        assert(!stock->can_swap_out(*s) && stock->num_host_blocks_total() == 0);
    }
}

// KV streaming placement (PagedKv's rule): demotion of middle blocks (not sinks, not the window, not shared)
// into host slots with a deferred device free, the R cap, the plan's host reads, promotion back once
// blocks are plentiful, and free() of a streamed sequence returning every host slot; invariants after each call.
void check_all(const KvCacheManager & kv, const std::vector<std::unique_ptr<Sequence>> & running) {
    check(kv, running);
    const std::string error = kv.check_swapped({});
    if (!error.empty()) {
        std::fprintf(stderr, "%s\n%s", error.c_str(), kv.dump().c_str());
        assert(false);
    }
}

void test_paged_streaming() {
    KvStreamPolicy policy;
    policy.enabled = true;
    policy.max_staged = 3;
    policy.sink_blocks = 1;
    policy.window_blocks = 2;
    // 10 blocks of 4 tokens, 4 host slots; prefix cache on (committed ref-1 blocks may still move)
    std::unique_ptr<KvCacheManager> kv = make_paged_kv(10, 4, true, /*num_host_blocks=*/4, /*block_bytes=*/64, policy);
    const BlockManager & blocks = *kv->block_manager();
    std::vector<std::unique_ptr<Sequence>> running;
    running.push_back(make_seq(1, 32, 8));  // 8 blocks once computed
    Sequence & a = *running[0];
    a.status = SequenceStatus::RUNNING;
    a.holds_kv = true;
    kv->admit(a);
    assert(kv->allocate(a, 32));
    a.num_computed_tokens = 32;
    kv->commit(a);
    check_all(*kv, running);
    assert(!kv->allocate(a, 12));  // 3 more blocks, 2 free
    std::vector<BlockSwap> out;
    // candidates: blocks 1..(8 - 2) and below the last indexed one: at most R = 3 move
    assert(kv->demote(a, 10, running, &out) == 3 && out.size() == 3);
    assert(kv->kv_stream_stats().num_host_resident == 3 && kv->num_host_blocks_used() == 3);
    const BlockTable & t = *blocks.find(1);
    assert(!is_host_entry(t.block_ids[0]) && is_host_entry(t.block_ids[1]) && is_host_entry(t.block_ids[3]));
    assert(!is_host_entry(t.block_ids[4]) && !is_host_entry(t.block_ids[7]));
    assert(kv->num_blocks_freed_next_step() == 3);  // deferred: the copies read them this step
    check_all(*kv, running);
    assert(kv->demote(a, 1, running, &out) == 0);  // the R cap
    StepPlan plan;
    kv->end_step();
    kv->begin_step();  // next step: the demoted blocks are free
    assert(kv->allocate(a, 12));
    plan.seqs.push_back({&a, 12, false});
    kv->fill_plan(&plan);
    int32_t host_reads = 0;
    for (int32_t b = 0; b < plan.max_blocks; ++b) {
        host_reads += is_host_entry(plan.block_tables[(size_t) b]) ? 1 : 0;
    }
    assert(host_reads == 3 && plan.blocks_to_swap_in.empty());  // no room to promote yet
    kv->end_step();
    a.num_computed_tokens = 44;
    kv->commit(a);
    check_all(*kv, running);
    // free a: every host slot comes back (parked until end_step)
    kv->free(a);
    running.clear();
    check_all(*kv, running);
    kv->end_step();
    assert(kv->num_host_blocks_used() == 0 && kv->kv_stream_stats().num_host_resident == 0);
    assert(kv->kv_stream_stats().num_demotions == 3);

    // promotion: host entries move back into fresh blocks when the pool has room; the plan reads the host
    // slot in that step and the fresh block from the next one
    running.push_back(make_seq(2, 24, 8));
    Sequence & b = *running[0];
    b.status = SequenceStatus::RUNNING;
    b.holds_kv = true;
    b.params.cache_prompt = false;  // any full computed middle block may move
    kv->begin_step();
    kv->admit(b);
    assert(kv->allocate(b, 24));
    b.num_computed_tokens = 24;
    out.clear();
    assert(kv->demote(b, 2, running, &out) == 2);
    check_all(*kv, running);
    kv->end_step();
    kv->begin_step();  // 10 - 6 + 2 = 6 free > 2 * watermark (2)
    assert(kv->allocate(b, 1));
    StepPlan p2;
    p2.seqs.push_back({&b, 1, true});
    kv->fill_plan(&p2);
    assert(p2.blocks_to_swap_in.size() >= 1);
    int32_t host_now = 0;
    for (int32_t i = 0; i < p2.max_blocks; ++i) {
        host_now += is_host_entry(p2.block_tables[(size_t) i]) ? 1 : 0;
    }
    assert(host_now == 2);  // promoted entries still read their host slots in this step
    check_all(*kv, running);
    kv->end_step();
    assert(kv->kv_stream_stats().num_promotions == (int64_t) p2.blocks_to_swap_in.size());
    b.num_computed_tokens = 25;
    kv->free(b);
    running.clear();
    kv->end_step();
    check_all(*kv, running);
    assert(kv->num_host_blocks_used() == 0);
}

KvStreamPolicy stream_policy(int32_t max_staged) {
    KvStreamPolicy policy;
    policy.enabled = true;
    policy.max_staged = max_staged;
    policy.sink_blocks = 1;
    policy.window_blocks = 2;
    return policy;
}

// A RUNNING sequence of prompt_len tokens, admitted by kv, with all of them allocated and computed
// (committed to the prefix cache where kv has one).
Sequence & add_computed(KvCacheManager & kv, std::vector<std::unique_ptr<Sequence>> & running, int64_t id,
                        int32_t prompt_len) {
    running.push_back(make_seq(id, prompt_len, 8));
    Sequence & seq = *running.back();
    seq.status = SequenceStatus::RUNNING;
    seq.holds_kv = true;
    seq.num_computed_tokens = kv.admit(seq);
    assert(kv.allocate(seq, prompt_len - seq.num_computed_tokens));
    seq.num_computed_tokens = prompt_len;
    kv.commit(seq);
    return seq;
}

int32_t num_host_entries(const BlockManager & blocks, int64_t id) {
    const BlockTable & table = *blocks.find(id);
    return (int32_t) std::count_if(table.block_ids.begin(), table.block_ids.end(), is_host_entry);
}

// Shared blocks never move to the host: a forked table's (ref 2) nor a prefix-cache hit's, nor any of a
// sequence whose choices wait to fork; once the sharing ends the same blocks may move.
void test_streaming_never_demotes_shared() {
    {
        std::unique_ptr<KvCacheManager> kv = make_paged_kv(12, 4, false, 8, 64, stream_policy(8));
        const BlockManager & blocks = *kv->block_manager();
        std::vector<std::unique_ptr<Sequence>> running;
        Sequence & parent = add_computed(*kv, running, 1, 32);  // 8 full blocks
        running.push_back(make_seq(2, 32, 8));
        Sequence & child = *running.back();
        child.status = SequenceStatus::RUNNING;
        child.holds_kv = true;
        kv->fork(parent, child);
        child.num_computed_tokens = 32;
        assert(kv->allocate(child, 1));  // its own 9th block; its first 8 stay shared
        child.num_computed_tokens = 33;
        std::vector<BlockSwap> out;
        assert(kv->demote(child, 8, running, &out) == 0 && out.empty());
        for (int32_t i = 0; i < 8; ++i) {
            assert(blocks.pool().ref_count(blocks.find(1)->block_ids[(size_t) i]) == 2);
        }
        check_all(*kv, running);
        kv->free(child);
        running.pop_back();
        parent.fork_pending = true;  // choices about to fork: nothing of it moves either
        assert(kv->demote(parent, 8, running, &out) == 0);
        parent.fork_pending = false;
        assert(kv->demote(parent, 8, running, &out) == 5 && num_host_entries(blocks, 1) == 5);  // blocks 1..5
        kv->free(parent);
        running.clear();
        check_all(*kv, running);
        assert(kv->num_host_blocks_used() == 0);  // freed outside a step: the slots are back at once
    }
    {
        std::unique_ptr<KvCacheManager> kv = make_paged_kv(12, 4, true, 8, 64, stream_policy(8));
        const BlockManager & blocks = *kv->block_manager();
        std::vector<std::unique_ptr<Sequence>> running;
        Sequence & a = add_computed(*kv, running, 1, 32);
        Sequence & b = add_computed(*kv, running, 2, 32);  // a prefix hit: a's first 7 blocks
        for (int32_t i = 0; i < 7; ++i) {
            const int32_t id = blocks.find(1)->block_ids[(size_t) i];
            assert(blocks.find(2)->block_ids[(size_t) i] == id && blocks.pool().ref_count(id) == 2);
        }
        std::vector<BlockSwap> out;
        assert(kv->demote(b, 8, running, &out) == 0 && kv->demote(a, 8, running, &out) == 0);
        assert(blocks.num_host_entries() == 0);
        check_all(*kv, running);
        kv->free(b);
        running.pop_back();
        assert(kv->demote(a, 8, running, &out) == 5);  // private again: its middle blocks 1..5 move
        kv->free(a);
        running.clear();
        check_all(*kv, running);
    }
}

// The chunk cap, the fork rule and the out-of-blocks reason of a streaming manager; none without streaming.
void test_streaming_limits() {
    std::unique_ptr<KvCacheManager> off = make_paged_kv(10, 4, false, 4, 64);
    std::unique_ptr<KvCacheManager> kv = make_paged_kv(10, 4, false, 4, 64, stream_policy(3));
    std::unique_ptr<Sequence> fresh = make_seq(1, 100, 8);
    assert(off->max_chunk_tokens(*fresh) == INT32_MAX && kv->max_chunk_tokens(*fresh) == (10 - 1 - 2) * 4);
    std::unique_ptr<Sequence> fits = make_seq(2, 36, 8);  // 9 blocks + a copy-on-write block = the pool
    std::unique_ptr<Sequence> long_prompt = make_seq(3, 37, 8);
    assert(kv->fork_fits(*fits) && !kv->fork_fits(*long_prompt) && off->fork_fits(*long_prompt));
    std::vector<std::unique_ptr<Sequence>> running;
    Sequence & parent = add_computed(*kv, running, 4, 6);  // 2 blocks, 2 rows left
    assert(kv->max_chunk_tokens(parent) == 2 + 7 * 4);
    running.push_back(make_seq(5, 6, 8));
    Sequence & child = *running.back();
    child.status = SequenceStatus::RUNNING;
    child.holds_kv = true;
    kv->fork(parent, child);
    child.num_computed_tokens = 6;
    assert(kv->max_chunk_tokens(child) == 2 + 6 * 4);  // its shared last block is copied first: 7 new blocks
    assert(kv->num_blocks_to_allocate(child, kv->max_chunk_tokens(child)) == 7);
    kv->free(child);
    running.pop_back();
    assert(off->out_of_blocks_reason(*fresh, 4).empty());
    assert(kv->allocate(parent, 26));  // 8 blocks
    parent.num_computed_tokens = 32;
    std::vector<BlockSwap> out;
    assert(kv->demote(parent, 4, running, &out) == 3);  // R = 3
    const std::string why = kv->out_of_blocks_reason(parent, 12);
    assert(why.find("request 4 holds 8 blocks (5 of the device pool's 10, 3 host-resident)") != std::string::npos);
    assert(why.find("kv_stream_blocks=3 host-resident blocks already") != std::string::npos);
    kv->free(parent);
    running.clear();
    check_all(*kv, running);
}

// Swap-out of a streamed sequence: its host entries keep their slots (only device blocks are copied out),
// swap-in brings every block back into fresh device blocks (in table order), and every slot is free once
// the swap-in's step is built. A table longer than the device pool is not swapped (it could not come back).
void test_streaming_swap() {
    std::unique_ptr<KvCacheManager> kv = make_paged_kv(10, 4, false, 6, 64, stream_policy(3));
    const BlockManager & blocks = *kv->block_manager();
    std::vector<std::unique_ptr<Sequence>> running;
    Sequence & seq = add_computed(*kv, running, 1, 24);  // 6 blocks
    std::vector<BlockSwap> demoted;
    assert(kv->demote(seq, 2, running, &demoted) == 2);  // entries 1, 2 to slots h1, h2
    const std::vector<int32_t> device = blocks.find(1)->block_ids;
    kv->end_step();
    kv->begin_step();
    assert(kv->can_swap_out(seq) && kv->swap_bytes(seq) == 4 * 64);
    std::vector<BlockSwap> out;
    kv->swap_out(seq, &out);
    assert(out.size() == 4 && out[0].src_block_id == device[0] && out[1].src_block_id == device[3]);
    assert(kv->num_host_blocks_used() == 6 && kv->kv_stream_stats().num_host_resident == 0);
    kv->end_step();
    kv->begin_step();
    seq.status = SequenceStatus::SWAPPED;
    seq.holds_kv = false;
    std::unique_ptr<Sequence> swapped = std::move(running[0]);
    running.clear();
    assert(kv->check_swapped({ swapped.get() }).empty() && kv->num_blocks_used() == 0);
    assert(kv->can_swap_in(*swapped, 0, 1000));  // streaming: its blocks and one more token's must fit
    std::vector<BlockSwap> in;
    kv->swap_in(*swapped, &in);
    const std::vector<int32_t> slots = { out[0].dst_block_id, host_slot_of(device[1]), host_slot_of(device[2]),
                                         out[1].dst_block_id, out[2].dst_block_id, out[3].dst_block_id };
    assert(in.size() == 6);
    for (size_t i = 0; i < in.size(); ++i) {
        assert(in[i].src_block_id == slots[i] && in[i].dst_block_id == blocks.find(1)->block_ids[i]);
    }
    kv->end_step();
    assert(kv->num_host_blocks_used() == 0 && num_host_entries(blocks, 1) == 0);
    swapped->status = SequenceStatus::RUNNING;
    swapped->holds_kv = true;
    running.push_back(std::move(swapped));
    check_all(*kv, running);
    kv->free(*running[0]);
    running.clear();

    std::unique_ptr<KvCacheManager> small = make_paged_kv(5, 4, false, 8, 64, stream_policy(4));
    Sequence & big = add_computed(*small, running, 2, 16);  // the whole 5-block pool but one
    assert(small->demote(big, 1, running, &demoted) == 1);
    small->end_step();
    small->begin_step();
    assert(small->allocate(big, 8));  // 6 blocks, 1 of them host-resident
    big.num_computed_tokens = 24;
    assert(!small->can_swap_out(big));
    small->free(big);
    running.clear();
    small->end_step();
    check_all(*small, running);
}

}  // namespace

int main() {
    run_common_scenarios([] { return make_stock_split_kv(64); });
    run_common_scenarios([] { return make_stock_unified_kv(256, 64); });
    run_common_scenarios([] { return make_paged_kv(16, 8); });
    test_split_specifics();
    test_unified_specifics();
    test_paged_specifics();
    test_paged_swap();
    test_paged_streaming();
    test_streaming_never_demotes_shared();
    test_streaming_limits();
    test_streaming_swap();
    std::printf("test_kv_manager: ok\n");
    return 0;
}
