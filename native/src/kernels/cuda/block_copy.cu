// block_copy.cu - see block_copy.cuh.
#include "block_copy.cuh"

#include <cstdio>

namespace cf::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread before the first store

// grid.x = items (grid-stride over items when there are more than the grid), one CTA per item.
__global__ void block_copy_kernel(const cf_cuda_copy_item * __restrict__ items, int32_t n_items) {
    for (int32_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const cf_cuda_copy_item it = items[item];
        const uint4 * __restrict__ src = static_cast<const uint4 *>(it.src);
        uint4 * __restrict__ dst = static_cast<uint4 *>(it.dst);
        const int64_t n = it.n_bytes / 16;
        int64_t i = threadIdx.x;
        for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
            uint4 v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                v[u] = src[i + u * kThreads];
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                dst[i + u * kThreads] = v[u];
            }
        }
        for (; i < n; i += kThreads) {
            dst[i] = src[i];
        }
    }
}

}  // namespace

const char * block_copy_check(const cf_cuda_copy_item * items, int32_t n_items) {
    static thread_local char msg[160];
    if (n_items < 0 || (n_items > 0 && items == nullptr)) {
        return "block copy: n_items < 0 or a null item array";
    }
    for (int32_t i = 0; i < n_items; ++i) {
        const cf_cuda_copy_item & it = items[i];
        const bool aligned = ((uintptr_t) it.src % 16 == 0) && ((uintptr_t) it.dst % 16 == 0) && it.n_bytes % 16 == 0;
        if (it.src == nullptr || it.dst == nullptr || it.n_bytes < 0 || !aligned) {
            std::snprintf(msg, sizeof(msg),
                          "block copy: item %d (src %p, dst %p, %lld bytes) needs non-null 16-byte aligned pointers "
                          "and a size that is a multiple of 16",
                          (int) i, it.src, (void *) it.dst, (long long) it.n_bytes);
            return msg;
        }
    }
    return nullptr;
}

void block_copy_launch(const cf_cuda_copy_item * items_dev, int32_t n_items, cudaStream_t stream) {
    if (n_items == 0) {
        return;
    }
    const int32_t grid = n_items < 65535 ? n_items : 65535;
    block_copy_kernel<<<grid, kThreads, 0, stream>>>(items_dev, n_items);
}

}  // namespace cf::cuda
