// paged_kv.h - the paged KV cache manager: block tables over one block pool (BlockManager),
// keyed by request id. Nothing is reserved: each scheduled token gets its row when it is
// scheduled, and a sequence that cannot get one makes the scheduler preempt. The prefix cache
// lives in the BlockManager: admit() starts a sequence on its longest cached prefix, commit()
// indexes what a step computed. A request with SamplingParams::cache_prompt false neither reads
// nor fills the cache. Swap preemption keeps a host block pool here too (HostBlockPool: slot ids;
// the engine's Swapper owns the bytes): a swapped sequence's host slots, in table order.
//
// KV streaming (issue 16; KvStreamPolicy, kernels/kv_stream.h). The same host slots also hold
// host-resident blocks of running sequences (BlockManager's host entries). The rule:
//   - demote (Scheduler, when a sequence's allocate() fails, before anyone is preempted; alone_only: only
//     when it runs alone): middle blocks of running sequences, newest sequence first and its oldest middle
//     block first, move to host slots. A candidate is full and computed, private (ref 1: never a forked or
//     prefix-shared block), not among the first sink_blocks or the last window_blocks of its table, for a
//     sequence using the prefix cache already indexed and not its last indexed block (the parent of the
//     next commit), and of a sequence that will not fork (fork_pending). The copy goes to
//     blocks_to_swap_out; the device block is freed at the next step (deferred, like a swap-out), so the
//     needy sequence waits one step (StepPlan::deferred). Never more than max_staged (R) host entries over
//     all running sequences (plus this step's promotions): past that the scheduler preempts as before.
//   - promote (fill_plan, in a step without demotions): while more than twice the admission watermark of
//     blocks stays free, host entries of the step's sequences move back into fresh blocks
//     (blocks_to_swap_in); the host slot is parked until end_step.
//   - reads: an entry demoted in this step still reads its device block (the copy runs beside the step), and
//     an entry promoted in this step still reads its host slot (its fresh block is written beside it); every
//     other host entry reads its host slot. fill_plan writes host reads as host_entry(slot) (<= -2) in the
//     plan's block tables; the engine rewrites them per decode to staging ids (LlamaSession::set_kv_plan).
//
//   step t:   allocate fails -> demote b (copy b -> h in blocks_to_swap_out); table entry = h, reads b
//   step t+1: b is free (deferred free released); entry reads h through staging
//   step u:   promote h -> fresh b' (blocks_to_swap_in); entry = b', reads h; h parked
//   step u+1: entry reads b'
//
// Preemption of a streamed sequence: recompute frees its host slots with its blocks; swap-out keeps its
// host entries' slots as they are (already on the host) and copies only its device blocks. Swap-in brings
// every block back into device blocks, so a table that could not come back whole (its blocks plus one
// token's > the pool) is not swapped out (can_swap_out), and can_swap_in counts one token of the next
// chunk only (the rest gets blocks by streaming once it runs).
//
// Limits (what the scheduler asks before it plans): max_chunk_tokens caps a chunk so that its new blocks
// plus sink_blocks + window_blocks fit the pool (else a lone long prompt could never be allocated);
// fork_fits is false for a prompt whose blocks and a copy-on-write block exceed the pool (a sequence whose
// choices wait never streams); out_of_blocks_reason says which limit ended a sequence.
// Host slots freed while a plan is built (begin_step .. end_step) are parked until end_step; those freed
// outside (a sequence finished after its step ran) are free at once.
//
// Thread-safety: none; the engine calls it from the stepping thread only.
#pragma once

#include "kv/host_block_pool.h"
#include "kv/kv_cache_manager.h"

#include <unordered_map>

namespace cf {

class PagedKv final : public KvCacheManager {
  public:
    // num_blocks >= 1 blocks of block_size >= 1 rows (see BlockPool).
    // num_host_blocks >= 0 host slots of block_bytes bytes each (swap space; 0: none).
    // stream: KV streaming's policy (off by default); max_staged <= num_host_blocks when enabled.
    PagedKv(int32_t num_blocks, int32_t block_size, bool prefix_caching = false, int32_t num_host_blocks = 0,
            int64_t block_bytes = 0, const KvStreamPolicy & stream = KvStreamPolicy());

    const char * name() const override { return "paged"; }
    // Free blocks for the rest of the prompt plus a watermark: 1% of the pool and at least one
    // block per running sequence, so that admitting a prompt does not force a preemption (and its
    // recompute) on the very next decode. Alone, a sequence may take the whole pool. Blocks of a
    // cached prefix are not needed again; cached free blocks count as free.
    bool can_admit(const Sequence & seq, int32_t num_running, bool with_deferred,
                   int64_t num_reserved_blocks) const override;
    int32_t admit(const Sequence & seq) override;
    bool allocate(const Sequence & seq, int32_t num_new_tokens) override;
    void commit(const Sequence & seq) override;
    void free(const Sequence & seq) override;
    void fill_plan(StepPlan * plan) override;
    int64_t kv_tokens_reserved() const override;
    int64_t kv_tokens_used(const std::vector<std::unique_ptr<Sequence>> & running) const override {
        (void) running;
        return blocks_.num_rows_filled();
    }
    int32_t num_blocks_total() const override { return blocks_.pool().num_blocks(); }
    int32_t num_blocks_used() const override { return blocks_.pool().num_used(); }
    PrefixCacheStats prefix_cache_stats() const override { return blocks_.prefix_cache_stats(); }
    const BlockManager * block_manager() const override { return &blocks_; }
    int32_t reserve_next_block(const Sequence & seq) override { return blocks_.reserve_next_block(seq.request_id); }
    std::string check_invariants(const std::vector<std::unique_ptr<Sequence>> & running) const override;
    std::string dump() const override;

    // `child` (admitted, nothing allocated yet) shares every block of `parent` and its token count,
    // the way the prefix cache will share a cached prefix; its next allocate() copies a shared,
    // partially filled last block first (copy-on-write, reported in StepPlan::blocks_to_copy).
    // Call only when parent holds a table and child holds none.
    bool supports_fork() const override { return true; }
    int32_t pending_shared_prefix_tokens(const Sequence & seq, const Sequence & other) const override;

    bool holds_device_blocks(const Sequence & seq) const override;
    int64_t num_blocks_to_reserve(const Sequence & seq) const override;
    bool can_swap_out(const Sequence & seq) const override;
    int64_t swap_bytes(const Sequence & seq) const override;
    void swap_out(const Sequence & seq, std::vector<BlockSwap> * out) override;
    bool can_swap_in(const Sequence & seq, int32_t num_running, int32_t num_new_tokens, bool with_deferred,
                     int64_t num_reserved_blocks) const override;
    void swap_in(const Sequence & seq, std::vector<BlockSwap> * out) override;
    void free_swapped(const Sequence & seq) override;
    void begin_step() override;
    void end_step() override {
        host_.end_step();
        planning_ = false;
    }
    int32_t num_blocks_freed_next_step() const override { return blocks_.num_blocks_freed_by_release(); }
    int64_t num_blocks_to_allocate(const Sequence & seq, int32_t num_new_tokens) const override {
        return blocks_.num_blocks_needed(seq.request_id, num_new_tokens);
    }
    int32_t num_host_blocks_total() const override { return host_.num_slots(); }
    int32_t num_host_blocks_used() const override { return host_.num_used(); }
    std::string check_swapped(const std::vector<const Sequence *> & swapped) const override;
    void fork(const Sequence & parent, const Sequence & child) override;

    bool streams() const override { return stream_.enabled; }
    int32_t demote(const Sequence & needy, int64_t num_blocks, const std::vector<std::unique_ptr<Sequence>> & running,
                   std::vector<BlockSwap> * out) override;
    KvStreamStats kv_stream_stats() const override;
    int32_t max_chunk_tokens(const Sequence & seq) const override;
    bool fork_fits(const Sequence & parent) const override;
    std::string out_of_blocks_reason(const Sequence & seq, int32_t num_new_tokens) const override;

  private:
    bool uses_cache(const Sequence & seq) const { return blocks_.prefix_caching() && seq.params.cache_prompt; }
    // The cached prefix seq starts on: the longest match, without its partial copy when pinning
    // the copy's free source would need more blocks than the pool has.
    PrefixMatch match(const Sequence & seq) const;
    // Blocks admitting seq takes from the free list (its cached prefix not counted).
    int64_t num_blocks_to_admit(const Sequence & seq) const;
    // Free blocks now, plus those the next begin_step() frees when with_deferred.
    int64_t num_free_blocks(bool with_deferred) const {
        return blocks_.num_free_blocks() + (with_deferred ? blocks_.num_blocks_freed_by_release() : 0);
    }

    BlockManager blocks_;
    // A swapped-out sequence: its host slots in table order and its token count.
    struct SwappedTable {
        std::vector<int32_t> host_slots;
        int32_t num_tokens = 0;
    };
    HostBlockPool host_;
    int64_t block_bytes_;
    std::unordered_map<int64_t, SwappedTable> swapped_;  // by request id
    int64_t watermark_blocks_;  // free blocks kept for running sequences: 1% of the pool, at least 1
    // Between begin_step() and end_step(): a plan is being built, so host slots freed now are parked (a copy
    // of this plan may still touch them); slots freed outside (a sequence finished after its step ran) are
    // free at once, since every copy of a plan runs before any of the next plan's.
    bool planning_ = false;
    void release_host_slots_unless_planning() {
        if (!planning_) {
            host_.end_step();
        }
    }

    // KV streaming
    // Demote one candidate block of seq (see the rule above); false if it has none left.
    bool demote_one(const Sequence & seq, std::vector<BlockSwap> * out);
    // Promote host entries of the plan's sequences while blocks are plentiful.
    void promote(StepPlan * plan);
    // What entry i of seq's table reads in this step: a device block id, or host_entry(slot).
    int32_t read_entry(int64_t seq_id, int32_t i, int32_t entry) const;
    struct Moved {  // one entry moved in this step
        int64_t seq_id;
        int32_t index;
        int32_t read;  // what it still reads in this step: the old device block (demoted) or host_entry(slot)
    };
    KvStreamPolicy stream_;
    std::vector<Moved> demoted_;   // this step's demotions
    std::vector<Moved> promoted_;  // this step's promotions
    int64_t num_demotions_ = 0;
    int64_t num_promotions_ = 0;
};

}  // namespace cf
