// block_copy.cuh - a list of byte-range copies in one kernel launch (KV block swaps and copy-on-write).
//
// A KV block of one layer's K or V pool is block_size rows of n_embd_kv f16 values (16 KiB for 16 rows of
// 8 heads x 64); a swap of one 512-token sequence of a 16-layer model is 32 blocks x 16 layers x 2 = 1,024
// such ranges. One cudaMemcpy each costs a few microseconds of driver time, so the copy is latency-bound
// far below the host link's bandwidth. Here every range is one CTA of one launch: 16-byte loads and
// stores, four in flight per thread. Pinned host memory is read and written directly through its
// unified-address pointer (zero-copy), so one launch moves device<->host and device<->device ranges alike.
// (vLLM's cache_kernels.cu swap_blocks issues one cudaMemcpyAsync per block instead; its copy_blocks
// kernel is one CTA per block pair on the device.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "copy_stream_api.h"

namespace cf::cuda {

// nullptr when every item is valid (non-null 16-byte aligned pointers, n_bytes >= 0 and a multiple of 16),
// else a message naming the first bad item. Host-side check of a host array of n_items items.
const char * block_copy_check(const cf_cuda_copy_item * items, int32_t n_items);

// Launch the copies of items_dev[0, n_items) on `stream`: items_dev is a device (or mapped pinned host)
// array of n_items items that stays valid until the launch has run. Precondition: block_copy_check passed
// on the same items. n_items == 0 launches nothing.
void block_copy_launch(const cf_cuda_copy_item * items_dev, int32_t n_items, cudaStream_t stream);

}  // namespace cf::cuda
