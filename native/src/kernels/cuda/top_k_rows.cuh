// top_k_rows.cuh - the k largest values of every row of an f32 matrix, all rows in one launch.
//
// Used for CacheFlow's batched top-k candidates (patches/0006: one GGML_OP_TOP_K node over all output
// rows of a decode). ggml-cuda's own top-k runs one cub::DeviceTopK call per row (a launch and a
// temporary allocation each: 256 rows = 256 calls); this kernel gives each row one CTA.
//
// Algorithm: radix select (as in "Efficient Selection Algorithms on GPUs", Alabi et al., and cub's
// radix-select top-k). Floats map to order-preserving 32-bit keys; four passes of an 8-bit digit,
// most significant first, each build a 256-bin shared-memory histogram of the keys that match the
// digits chosen so far and pick the bin holding the k-th largest key. After the fourth pass the k-th
// largest key T is known exactly, with how many keys equal to T belong to the top k. A last pass
// writes the ids of keys > T, then of keys == T up to k, in increasing index order (per-warp
// segments, ballots and a scan over warps): the output is deterministic, ties at T taken at the
// lowest ids, and does not depend on the launch or on other rows.
//
// Histogram updates are aggregated per warp (__match_any_sync: one shared atomic per distinct bin
// of a warp's 32 keys), since logits crowd into few bins of the top digit.
// Costs: six reads of each row (four histograms, two for the gather), typically from L2.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cf::cuda {

struct TopKRowsArgs {
    const float * src;       // [n_rows][src_stride] f32, row r at src + r * src_stride; values read: [0, n_cols)
    int64_t src_stride;      // elements between rows (>= n_cols)
    int32_t * dst_ids;       // [n_rows][dst_stride] i32 out: the k ids (column indices) of row r: those whose
                             // value is above the k-th largest first, then those equal to it, each ascending
    int64_t dst_stride;      // elements between output rows (>= k)
    int32_t n_rows;          // >= 0
    int32_t n_cols;          // >= 1
    int32_t k;               // 1 <= k <= n_cols
};

// nullptr when the arguments are valid (shapes and strides as documented above, pointers non-null
// and, with check_device, device memory of the current device: a cudaPointerGetAttributes call
// per pointer, which callers whose buffers are known to be there skip), else a message naming
// what is wrong.
const char * top_k_rows_check(const TopKRowsArgs & args, bool check_device = true);

// Launch on `stream`. Precondition: top_k_rows_check(args) == nullptr (not re-checked here).
void top_k_rows_launch(const TopKRowsArgs & args, cudaStream_t stream);

}  // namespace cf::cuda
