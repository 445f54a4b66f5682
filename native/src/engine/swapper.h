// swapper.h - the host memory of swap preemption, and the copies of a plan's block swaps and copy-on-write
// block copies.
//
// Host slot h (kv/host_block_pool.h: the paged KV manager hands out slot ids) is bytes
// [h * block_bytes, (h + 1) * block_bytes) of one host buffer allocated at engine creation. A block's bytes are
// every layer's K and V rows of block_size tokens, as llama_paged_block_bytes() lays them out (patches/0007):
// layer by layer, K rows then V rows.
//
// Two routes, chosen once at construction:
//   - copy stream (every pool on a CUDA device, CacheFlow's CUDA sources built in, CACHEFLOW_SWAP_ASYNC not 0):
//     the host buffer is pinned (the pool device's host buffer type, cudaMallocHost), and each batch of swaps or
//     copies becomes one list of (src, dst, bytes) ranges run as one kernel on CacheFlow's CUDA side stream
//     (kernels/cuda/copy_stream_api.h, patches/0011). The engine thread does not wait. Copy-on-write copies
//     are due at once (this step's graph waits for them on the device); swap-outs and swap-ins are deferred:
//     they run beside this step's graph, and the next step's graph waits for them (begin_step releases
//     them). Times are device times (CUDA events).
//   - llama copies (the CPU, or a CUDA build whose copy stream is unavailable): the buffer is calloc'd (pages
//     backed only once a swap-out writes them) and llama.cpp copies each block, layer and tensor
//     synchronously (llama_paged_swap_blocks / llama_paged_copy_blocks). Times are host wall times.
// Outputs are bit-identical either way: both move the same bytes.
//
// Ordering on the copy stream: batches run in the order they were issued (step t: its copy-on-write copies,
// then its swap-outs, then its swap-ins; the batches of step t - 1 before all of them). Why the overlap is
// safe (the scheduler's side, step_plan.h): step t's graph touches none of the blocks of step t's swaps (a
// swap-out's blocks are freed only at step t + 1, a swapped-in sequence joins the batch only at step t + 1),
// and within a step the three lists touch disjoint blocks and host slots. A block freed at step t + 1 and
// written by a new holder is written either by step t + 1's graph (which waits for everything of step t) or
// by a later batch of the same stream. The side stream itself never waits for the compute stream: every call
// first synchronizes the llama context (the previous step's kernels are done; the engine has read their
// results already, so this costs nothing).
//
// Overlap counters (stats): deferred_ns, the device time of the deferred batches; num_graphs_beside, graph
// evaluations enqueued while a deferred batch still ran on the device (ggml-cuda checks at each graph);
// num_graphs_overlapping and compute_overlap_ns, the same on the device timeline (when the graph began on the
// device vs when the batch ended there: overlap with compute, not only with the host's work).
//
// Thread-safety: none; the stepping thread only.
#pragma once

#include "core/step_plan.h"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

struct ggml_backend_buffer;

namespace cf {

class LlamaSession;

struct SwapStats {
    int64_t num_out_bytes = 0;
    int64_t num_in_bytes = 0;
    int64_t out_ns = 0;  // copy stream: device time of the completed batches; else host wall time
    int64_t in_ns = 0;
    int64_t num_copy_bytes = 0;  // copy-on-write, device -> device
    int64_t deferred_ns = 0;       // copy stream: device time of the swap batches not waited for by their step
    int64_t num_graphs_beside = 0; // copy stream: graph evaluations enqueued while such a batch still ran
    // copy stream, device timeline (CUDA events on both streams): graphs that began on the device before the
    // deferred batch beside them ended, and the time both ran at once, ns
    int64_t num_graphs_overlapping = 0;
    int64_t compute_overlap_ns = 0;
};

class Swapper {
  public:
    // num_slots >= 0 host slots of block_bytes >= 0 bytes (block_bytes == session.paged_block_bytes()); the
    // session outlives the Swapper. Throws OUT_OF_MEMORY when the host buffer cannot be reserved.
    Swapper(LlamaSession & session, int32_t num_slots, int64_t block_bytes);
    ~Swapper();
    Swapper(const Swapper &) = delete;
    Swapper & operator=(const Swapper &) = delete;

    int32_t num_slots() const { return num_slots_; }
    int64_t block_bytes() const { return block_bytes_; }
    bool on_copy_stream() const { return copy_stream_ != nullptr; }
    // The host buffer (slot h at h * block_bytes; pinned on the copy stream route), nullptr without slots.
    // KV streaming reads host-resident blocks from it (kernels/kv_stream.h).
    const uint8_t * host_base() const { return slot_bytes_base(); }
    // Refreshes the device times of completed batches first (copy stream; no wait).
    const SwapStats & stats();

    // A step begins: the swaps issued by the previous step become due (the copy stream: graphs from now on
    // wait for them, on the device; nothing on llama copies, where they are done already). Call once per step
    // before that step's copies and graph, whether or not it has any.
    void begin_step();
    // Steps 1-3 of a plan: every swap-out (device block -> host slot), every swap-in (host slot -> device
    // block), every copy-on-write copy (device block -> device block); the lists touch disjoint blocks, and
    // the copy stream runs the copies first (due now), then the swaps (deferred to the next step). Throws
    // INTERNAL when a copy is refused (a bug: ids out of range, or a CUDA error). Call only with slot ids
    // below num_slots().
    void swap_out(const std::vector<BlockSwap> & swaps);
    void swap_in(const std::vector<BlockSwap> & swaps);
    void copy_blocks(const std::vector<BlockCopy> & copies);

    // The host waits until every copy issued so far is done (copy stream; nothing to wait for otherwise).
    void fence();
    // AUTO preemption's first copy rate, measured on this route before any sequence holds KV: device blocks
    // [0, n) are copied out to host slots [0, n) and back (n = the most of num_blocks, the host slots and
    // the device pool's blocks; the blocks' bytes come back unchanged), the host waits for both, and the
    // result is ns per byte copied one way (copy stream: device times; else host wall times), or 0 when
    // nothing could be copied. The counters of stats() leave the measurement out. Call only while no
    // sequence holds a block (the engine calls it at construction).
    double measure_ns_per_byte(int32_t num_blocks);

    // The copy stream route's entry points and per-layer pool addresses (defined in swapper.cpp).
    struct CopyStream;

  private:

    void run_llama(const std::vector<BlockSwap> & swaps, bool to_host);
    void run_stream(const std::vector<BlockSwap> & swaps, bool to_host);  // deferred
    uint8_t * slot_bytes(int32_t slot) const;
    const uint8_t * slot_bytes_base() const { return copy_stream_ ? pinned_base_ : host_.get(); }

    LlamaSession & session_;
    int32_t num_slots_;
    int64_t block_bytes_;
    std::unique_ptr<CopyStream> copy_stream_;  // nullptr: llama copies
    std::unique_ptr<uint8_t, decltype(&std::free)> host_{nullptr, &std::free};  // llama copies
    ggml_backend_buffer * pinned_ = nullptr;  // copy stream: the pinned host pool (ggml buffer, owned)
    uint8_t * pinned_base_ = nullptr;
    std::vector<int32_t> block_ids_;  // scratch
    std::vector<void *> bufs_;        // scratch
    SwapStats stats_;
    // Copy stream: device time left out of stats_ (its counters are per device and process): the totals when
    // this Swapper was made (earlier engines of the process) plus measure_ns_per_byte's copies.
    int64_t measured_out_ns_ = 0;
    int64_t measured_in_ns_ = 0;
    int64_t measured_deferred_ns_ = 0;
    int64_t measured_graphs_ = 0;
    int64_t measured_graphs_overlapping_ = 0;
    int64_t measured_overlap_ns_ = 0;
};

}  // namespace cf
