// kv_cache_manager.h - the KV cache manager interface: what the scheduler asks of KV memory,
// whatever holds it. No llama.cpp dependency.
//
// The scheduler talks only to this interface; each KV mode is one implementation:
//
//   implementation  | KV rows                           | admission                        | allocate
//   ----------------+-----------------------------------+----------------------------------+------------------
//   stock split     | one stream of n_ctx_per_seq rows  | always (a running slot is a      | always true
//                   | per running sequence              | whole stream)                    |
//   stock unified   | one pool of n_ctx rows, reserved  | sum over running of              | always true
//                   | per sequence at admission         | min(prompt + max_tokens,         |
//                   |                                   | n_ctx_per_seq) <= n_ctx          |
//   paged           | one pool of num_blocks blocks of  | blocks for the rest of the prompt| appends blocks as
//                   | block_size rows, shared by block  | + a watermark (1% of the pool, at| tokens are
//                   | tables (BlockManager)             | least one block per running seq) | scheduled; false
//                   |                                   | are free                         | when short
//
// The paged implementation owns the BlockManager (block pool and block tables) and the prefix
// cache inside it, and the host block pool of swap preemption. Sequences are keyed by request id.
//
// Lifecycle of one sequence, as the scheduler drives it:
//
//   can_admit? -> admit -> allocate (once per step it is scheduled) -> commit ... -> free
//                   |         |  false: the scheduler preempts (free) or ends the sequence
//                   returns the tokens already cached (prefix hit): computing starts after them
//
// admit() and free() pair up exactly once per stay in the running set (a preempted sequence is
// admitted again later). Between them, allocate() may be called any number of times.
//
// Thread-safety: none; the engine calls it from the stepping thread only.
#pragma once

#include "core/block_manager.h"
#include "core/sequence.h"
#include "core/step_plan.h"

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cf {

// KV streaming's placement policy (paged only; see PagedKv and kernels/kv_stream.h).
struct KvStreamPolicy {
    bool enabled = false;     // host-resident blocks may exist
    bool alone_only = false;  // demote only for a sequence running alone (it could not get a block otherwise)
    int32_t max_staged = 0;   // R: host-resident blocks of the running sequences together, at most (>= 1 when enabled)
    int32_t sink_blocks = 1;  // leading blocks of a sequence that stay on the device (attention sinks)
    int32_t window_blocks = 2;  // trailing blocks that stay on the device (>= 1: the one being written)
};

// KV streaming counters (zeros when off).
struct KvStreamStats {
    int32_t num_host_resident = 0;  // host entries of running sequences now
    int64_t num_demotions = 0;      // blocks moved device -> host since start
    int64_t num_promotions = 0;     // blocks moved host -> device since start
};

class KvCacheManager {
  public:
    virtual ~KvCacheManager() = default;

    // "stock split", "stock unified" or "paged" (for dump and messages).
    virtual const char * name() const = 0;

    // True if `seq` (waiting, holding no KV) may start running next to `num_running` running
    // sequences without starving them. Does not mutate. The scheduler checks max_num_seqs itself.
    // with_deferred: also count the blocks that this step's swap-outs free at the next step
    // (num_blocks_freed_next_step), to ask whether seq fits once they are back (priority
    // preemption stops preempting then); admission itself always asks without them.
    // num_reserved_blocks: free blocks set aside for running sequences ahead of seq in policy order
    // (long prefills passed over in this step, Scheduler::blocks_reserved_before), so not free for seq.
    virtual bool can_admit(const Sequence & seq, int32_t num_running, bool with_deferred = false,
                           int64_t num_reserved_blocks = 0) const = 0;

    // `seq` starts running: take what the mode sets aside at admission (unified: its reservation;
    // paged: the blocks of the longest cached prefix of its tokens). Returns the number of leading
    // tokens of seq whose KV is in place already (a prefix-cache hit; always < seq.num_tokens(),
    // so the last token is computed and gives logits); 0 without a prefix cache. The scheduler
    // sets num_computed_tokens to it. Call only after can_admit(seq) returned true and only once
    // per stay in the running set.
    virtual int32_t admit(const Sequence & seq) = 0;

    // Give tokens [seq.num_computed_tokens, + num_new_tokens) of `seq` a KV row each; the step
    // computes them. Returns false when KV memory is short, changing nothing (all-or-nothing); the
    // scheduler then preempts someone or ends the sequence. Call only for an admitted sequence, with
    // num_new_tokens >= 1, once per step it is scheduled.
    virtual bool allocate(const Sequence & seq, int32_t num_new_tokens) = 0;

    // The step ran: seq's tokens [0, seq.num_computed_tokens) hold KV now. The prefix cache
    // indexes the blocks they filled. Call once per step it was scheduled in, after the step.
    virtual void commit(const Sequence & seq) { (void) seq; }

    // `seq` leaves the running set (finished, aborted, failed or preempted): release its KV rows.
    // Call only for an admitted sequence, once.
    virtual void free(const Sequence & seq) = 0;

    // Write the KV part of the step plan for plan->seqs, which are final and in batch order (every
    // one allocated this step): slot_mapping, block_tables, max_blocks and context_lens, and move
    // the block copies (copy-on-write) that allocate() recorded into blocks_to_copy, oldest first;
    // with KV streaming also promote (blocks_to_swap_in) and list the step's moves in streamed_blocks.
    // The stock implementations write nothing (llama.cpp places the rows itself).
    virtual void fill_plan(StepPlan * plan) = 0;

    // Usage, for stats and the profiler.
    // KV rows set aside for running sequences: split, whole streams; unified, the reservations;
    // paged, rows of the blocks in use.
    virtual int64_t kv_tokens_reserved() const = 0;
    // KV rows holding a token. The stock modes: every running sequence's computed tokens (each
    // has rows of its own); paged overrides it with the distinct device rows filled, so that
    // blocks shared by the prefix cache or a fork count once (used <= reserved).
    virtual int64_t kv_tokens_used(const std::vector<std::unique_ptr<Sequence>> & running) const {
        return total_computed_tokens(running);
    }
    virtual int32_t num_blocks_total() const { return 0; }  // 0 in the stock modes
    virtual int32_t num_blocks_used() const { return 0; }
    // Prefix cache counters (zeros without one).
    virtual PrefixCacheStats prefix_cache_stats() const { return {}; }

    // True if fork() can share KV rows between sequences (paged); the stock modes compute every
    // prompt themselves.
    virtual bool supports_fork() const { return false; }

    // Admit `child` (instead of admit(); free() releases it as usual) sharing every KV row of
    // `parent`, a running sequence; writing into a shared, partially filled block copies it
    // first (copy-on-write, reported in StepPlan::blocks_to_copy). Allocates nothing. Call only
    // when supports_fork(), for a child that holds nothing.
    virtual void fork(const Sequence & parent, const Sequence & child) {
        (void) parent;
        (void) child;
    }

    // Prompt tokens that `seq` (waiting) could take from the prefix cache once `other` (running) has
    // computed them, and that `other` has not computed yet: the full blocks of the two sequences' common
    // prefix (seq's last token excluded: it is always computed), less other's full computed blocks. 0 when
    // either sequence does not use a prefix cache (the stock modes have none). The scheduler passes seq
    // over while this is large (Scheduler::waits_for_shared_prefix). Does not mutate; O(common prefix).
    virtual int32_t pending_shared_prefix_tokens(const Sequence & seq, const Sequence & other) const {
        (void) seq;
        (void) other;
        return 0;
    }

    // ---- swap preemption (paged only; the stock modes never preempt, so they never swap)
    //
    //   RUNNING --swap_out--> SWAPPED --swap_in--> SWAPPING_IN --next step--> RUNNING
    //      |                     \--free_swapped (abort)   (KV moved, nothing recomputed)
    //      \--free (recompute preemption) --> WAITING --admit--> RUNNING (KV computed again)
    //
    // A swapped sequence holds host slots instead of device blocks. Blocks it shared (fork,
    // prefix cache) are copied out like its own and stay valid for their other holders; it comes
    // back in private blocks. A host slot freed by a swap-in is reused only from the next step on,
    // and the device blocks a swap-out releases become free only at the next step too (deferred
    // free, begin_step): the copies of one step touch disjoint blocks and slots, so they may run in
    // any order and beside the step's compute (engine/swapper.h). A sequence swapped in at step t
    // (its copies in step t's plan) joins the batch at step t + 1 (the scheduler's SWAPPING_IN).

    // True if seq's table holds at least one device block (its own or shared). One that holds none (a
    // long prefill passed over before its first chunk) frees nothing if preempted, so the scheduler
    // never picks it as a victim. The stock modes never run short of rows: true.
    virtual bool holds_device_blocks(const Sequence & seq) const {
        (void) seq;
        return true;
    }
    // True if swap_out(seq) can take host slots for every block of `seq` (admitted, with a table).
    // With KV streaming its host-resident blocks keep their slots (only device blocks take new ones),
    // and a table that could not come back to the device pool whole (its blocks and one more token's)
    // is not swapped. Does not mutate.
    virtual bool can_swap_out(const Sequence & seq) const {
        (void) seq;
        return false;
    }
    // Bytes one direction of seq's swap moves (its blocks times the block's bytes); 0 without swap.
    virtual int64_t swap_bytes(const Sequence & seq) const {
        (void) seq;
        return 0;
    }
    // Move seq's blocks to host slots: append (device block, host slot) pairs to *out in table
    // order and release the device blocks at the next begin_step() (deferred free: the copy reads
    // them during this step; free() for it is not called then). Call only when can_swap_out(seq).
    virtual void swap_out(const Sequence & seq, std::vector<BlockSwap> * out) {
        (void) seq;
        (void) out;
    }
    // True if a swapped `seq` fits back next to `num_running` running sequences: its blocks, the
    // blocks of its next num_new_tokens tokens (with KV streaming, of its next token only: the rest of
    // its chunk gets blocks by streaming once it runs), and the admission watermark are free.
    // with_deferred and num_reserved_blocks as for can_admit.
    virtual bool can_swap_in(const Sequence & seq, int32_t num_running, int32_t num_new_tokens,
                             bool with_deferred = false, int64_t num_reserved_blocks = 0) const {
        (void) seq;
        (void) num_running;
        (void) num_new_tokens;
        (void) with_deferred;
        (void) num_reserved_blocks;
        return false;
    }
    // Give a swapped seq fresh device blocks: append (host slot, device block) pairs to *out and
    // release its host slots (reusable from the next step). It holds a table again, admitted as by
    // admit(). Call only when can_swap_in(seq, ...).
    virtual void swap_in(const Sequence & seq, std::vector<BlockSwap> * out) {
        (void) seq;
        (void) out;
    }
    // Drop a swapped seq's host slots (abort). Call only for a swapped sequence.
    virtual void free_swapped(const Sequence & seq) { (void) seq; }
    // A step's plan begins (the scheduler calls it first in schedule()): the previous step's
    // swap-outs release their device blocks now (their copies come before anything this step
    // issues; on a copy stream the engine makes this step's graph wait for them).
    virtual void begin_step() {}
    // The step's plan is built (the scheduler calls it last in schedule()).
    virtual void end_step() {}
    // Blocks this step's swap-outs return to the free list at the next begin_step().
    virtual int32_t num_blocks_freed_next_step() const { return 0; }
    // Blocks a running seq passed over in this step still needs for the rest of what it computes (as
    // can_admit counts a prompt: with KV streaming at most the pool less one block); 0 in the stock
    // modes. Admission and swap-in behind it leave them free (Scheduler, "Long prefills").
    virtual int64_t num_blocks_to_reserve(const Sequence & seq) const {
        (void) seq;
        return 0;
    }
    // Blocks allocate(seq, num_new_tokens) would take from the free list now. Does not mutate.
    virtual int64_t num_blocks_to_allocate(const Sequence & seq, int32_t num_new_tokens) const {
        (void) seq;
        (void) num_new_tokens;
        return 0;
    }
    virtual int32_t num_host_blocks_total() const { return 0; }
    virtual int32_t num_host_blocks_used() const { return 0; }
    // "" if the swapped sequences' host state agrees with `swapped` (the scheduler's list).
    virtual std::string check_swapped(const std::vector<const Sequence *> & swapped) const {
        return swapped.empty() ? "" : "sequences are swapped but this KV manager cannot swap";
    }

    // ---- KV streaming (paged only; PagedKv's comment has the rule)
    virtual bool streams() const { return false; }
    // `needy` could not get its next blocks: move up to num_blocks middle blocks of running sequences (needy
    // included) to host slots, appending the copies (device block, host slot) to *out (the plan's
    // blocks_to_swap_out); their device blocks are free at the next step (num_blocks_freed_next_step).
    // Returns the blocks moved (0 when streaming is off, or nothing may move). Call while scheduling.
    virtual int32_t demote(const Sequence & needy, int64_t num_blocks,
                           const std::vector<std::unique_ptr<Sequence>> & running, std::vector<BlockSwap> * out) {
        (void) needy;
        (void) num_blocks;
        (void) running;
        (void) out;
        return 0;
    }
    virtual KvStreamStats kv_stream_stats() const { return {}; }
    // Tokens allocate(seq, n) can ever get in one step, however much the others free: with streaming, the
    // new blocks of a chunk and the blocks of seq that stay on the device (sink_blocks + window_blocks) must
    // fit the device pool together, so a chunk is capped at (num_blocks_total - sink - window, at least 1)
    // new blocks plus the free rows of seq's last block. >= 1; INT32_MAX when the manager does not stream
    // (the pool alone bounds a sequence there, and n_ctx_per_seq bounds it). Does not mutate.
    virtual int32_t max_chunk_tokens(const Sequence & seq) const {
        (void) seq;
        return INT32_MAX;
    }
    // True if `parent` (waiting, fork_pending) can compute its prompt for its choices to fork: a sequence
    // whose choices wait never streams (its blocks are about to be shared), so with streaming its prompt
    // and a copy-on-write block must fit the device pool. Always true without streaming. Does not mutate.
    virtual bool fork_fits(const Sequence & parent) const {
        (void) parent;
        return true;
    }
    // Why allocate(seq, num_new_tokens) failed for a sequence running alone (the scheduler ends it), for
    // its error: with streaming, the blocks it holds on the device and the host against the limits; ""
    // when the manager does not stream (then only a full context ends a sequence, finish reason length).
    // Call before free(seq). Does not mutate.
    virtual std::string out_of_blocks_reason(const Sequence & seq, int32_t num_new_tokens) const {
        (void) seq;
        (void) num_new_tokens;
        return "";
    }
    // Free blocks now (paged), for admission decisions outside can_admit (a fork needs at most
    // one: its copy-on-write block). The stock modes report 0.
    int32_t num_blocks_free() const { return num_blocks_total() - num_blocks_used(); }

    // The block manager of the paged implementation, else nullptr (tests and the C ABI read it).
    virtual const BlockManager * block_manager() const { return nullptr; }

    // Async decode (paged): the block seq's next token goes into, taken now, ahead of the allocate()
    // that will use it (BlockManager::reserve_next_block), or CF_BLOCK_ID_NONE when no block is free or
    // the mode has no blocks. Call only for a running sequence holding a table whose last block is full.
    virtual int32_t reserve_next_block(const Sequence & seq) {
        (void) seq;
        return CF_BLOCK_ID_NONE;
    }

    // "" if the manager agrees with the scheduler's running set, else the first violation.
    virtual std::string check_invariants(const std::vector<std::unique_ptr<Sequence>> & running) const = 0;

    // Human-readable state for failing tests and debugging.
    virtual std::string dump() const = 0;
};

// One stream of n_ctx_per_seq rows per running sequence (llama.cpp's split mode).
std::unique_ptr<KvCacheManager> make_stock_split_kv(int32_t n_ctx_per_seq);

// One pool of n_ctx rows; each running sequence reserves min(prompt + max_tokens, n_ctx_per_seq)
// rows at admission (llama.cpp's unified mode).
std::unique_ptr<KvCacheManager> make_stock_unified_kv(int32_t n_ctx, int32_t n_ctx_per_seq);

// num_blocks blocks of block_size rows shared through block tables (see BlockManager), with a
// prefix cache when prefix_caching is true, and num_host_blocks host slots of block_bytes bytes
// each for swap preemption (0: no swap space).
std::unique_ptr<KvCacheManager> make_paged_kv(int32_t num_blocks, int32_t block_size, bool prefix_caching = false,
                                              int32_t num_host_blocks = 0, int64_t block_bytes = 0,
                                              const KvStreamPolicy & stream = KvStreamPolicy());

}  // namespace cf
