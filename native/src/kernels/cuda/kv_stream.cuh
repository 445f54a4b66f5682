// kv_stream.cuh - the CUDA side of KV streaming (issue 16; contract: ../kv_stream.h), internal to ggml-cuda and the
// standalone test: the per-layer hooks the paged attention op calls, the C entry points behind get_proc_address, and
// the gather kernel's launcher. Free of ggml headers, so the standalone test links kv_stream.cu directly.
//
// Algorithm: layer-ahead prefetch (FastFlowLM's KV streaming): a side stream copies layer L + depth's staged rows
// into staging slot (L + depth) % depth once layer L's attention has read that slot; fork/join through events only
// (cudaEventRecord + cudaStreamWaitEvent), the pattern that is legal inside CUDA stream capture.
#pragma once

#include "../kv_stream.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cf {
namespace cuda {

// Where layer L's staged rows are: row r >= base_row of the op's K/V is row (r - base_row) of k / v.
struct KvStreamStage {
    const half * k;    // [max_staged * block_size][k_row_bytes / 2] f16 (device), slot L % depth
    const half * v;    // same for V
    int64_t base_row;  // desc->stage_base_block * block_size
};

// Entry points of kv_stream.h (reserve / release / stats), by function; ggml_cuda_cf_proc_address returns them.
int kv_stream_reserve(const cf_kv_stream_desc * desc);
void kv_stream_release(const cf_kv_stream_desc * desc);
void kv_stream_stats(const cf_kv_stream_desc * desc, int64_t out[4]);

// Before layer `layer`'s attention kernel on `compute` (the device of desc must be current). Layers of one decode
// must come in order 0, 1, ..., n_layer - 1, each followed by kv_stream_after_layer; layer 0 forks the side stream
// from `compute` and enqueues the copies of layers [0, depth); every layer makes `compute` wait for its own copy.
// Legal inside stream capture of `compute` (no query, sync or allocation then). Returns nullptr, or a message with
// file and line (desc not reserved, layer out of order or range, a CUDA error).
const char * kv_stream_before_layer(cudaStream_t compute, const cf_kv_stream_desc * desc, int layer,
                                    KvStreamStage * stage);
// After layer `layer`'s attention kernel on `compute`: the side stream waits for it and copies layer layer + depth
// into the slot it just read (nothing past the last layer). Same rules and errors.
const char * kv_stream_after_layer(cudaStream_t compute, const cf_kv_stream_desc * desc, int layer);

// One layer's gather (the kernel the hooks launch; public for the test's bandwidth figure).
struct KvGatherArgs {
    const uint8_t * host_base;     // [*][host_block_bytes] host tier, device-readable (pinned, unified addressing)
    int64_t host_block_bytes;
    int64_t layer_offset_bytes;    // L * (k_block_bytes + v_block_bytes)
    const int32_t * staged_slots;  // [max_staged] device-readable (pinned host)
    const int32_t * num_staged;    // [1] device-readable; clamped to [0, max_staged]
    int32_t max_staged;
    int64_t k_block_bytes;         // block_size * k_row_bytes, a multiple of 16
    int64_t v_block_bytes;
    uint8_t * k_dst;               // [max_staged][k_block_bytes] device
    uint8_t * v_dst;               // [max_staged][v_block_bytes] device
    unsigned long long * counters; // [kKvCounters] device, or nullptr (see kv_stream.cu)
    int32_t count_decode;          // 1: a decode that stages >= 1 block is counted (layer 0's copy)
};
constexpr int kKvCounters = 5;
// Fixed grid for `max_staged` (independent of *num_staged, so a captured graph stays valid).
int kv_gather_grid(const KvGatherArgs & a, int num_sms);
cudaError_t kv_gather_launch(const KvGatherArgs & a, int grid, cudaStream_t stream);

}  // namespace cuda
}  // namespace cf
