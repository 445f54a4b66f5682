// top_k_rows.cu - see top_k_rows.cuh.
#include "top_k_rows.cuh"

namespace cf::cuda {

namespace {

#ifndef CF_TOP_K_THREADS
#define CF_TOP_K_THREADS 1024
#endif
// Threads per CTA (one CTA per row): 1024 measured fastest on the H200 (results/h200_gpu/stop22).
constexpr int kThreads = CF_TOP_K_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;     // 8-bit digits

// Order-preserving map float -> uint32: a > b as floats (non-NaN) <=> key(a) > key(b) as integers.
__device__ __forceinline__ uint32_t ordered_key(float f) {
    const uint32_t bits = __float_as_uint(f);
    return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// After a histogram pass: with hist[] over the keys matching the digits so far and *rank the
// rank (1-based, from the top) of the wanted key among them, find the digit of its bin and its
// rank inside that bin. Warp 0 only: lane l owns bins 255 - 8l - 7 .. 255 - 8l (descending).
__device__ __forceinline__ void select_bin(const int * hist, int * rank, uint32_t * digit) {
    const int lane = (int) threadIdx.x;
    const int top = kBins - 1 - 8 * lane;  // this lane's highest bin
    int sum = 0;
    for (int j = 0; j < 8; ++j) {
        sum += hist[top - j];
    }
    int incl = sum;  // inclusive scan over lanes (descending bins)
    for (int off = 1; off < 32; off <<= 1) {
        const int other = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) {
            incl += other;
        }
    }
    const int want = *rank;
    const unsigned hit = __ballot_sync(0xffffffffu, incl >= want);
    const int owner = __ffs((int) hit) - 1;  // first lane whose range reaches the rank (always exists)
    if (lane == owner) {
        int before = incl - sum;  // keys in higher bins than this lane's
        for (int j = 0; j < 8; ++j) {
            const int c = hist[top - j];
            if (before + c >= want) {
                *digit = (uint32_t) (top - j);
                *rank = want - before;
                break;
            }
            before += c;
        }
    }
}

// One CTA per row. Shapes: see TopKRowsArgs.
__global__ void __launch_bounds__(kThreads) top_k_rows_kernel(const float * __restrict__ src, int64_t src_stride,
                                                              int32_t * __restrict__ dst, int64_t dst_stride,
                                                              int32_t n_cols, int32_t k) {
    __shared__ int hist[kBins];
    __shared__ int rank;          // rank of the k-th largest key among those matching prefix
    __shared__ uint32_t digit;
    __shared__ int warp_gt[kWarps];
    __shared__ int warp_eq[kWarps];

    const float * row = src + (int64_t) blockIdx.x * src_stride;
    int32_t * out = dst + (int64_t) blockIdx.x * dst_stride;
    const int tid = (int) threadIdx.x;

    if (tid == 0) {
        rank = k;
    }
    uint32_t prefix = 0;  // digits chosen so far (same in every thread)
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < kBins; b += kThreads) {
            hist[b] = 0;
        }
        __syncthreads();
        for (int base = 0; base < n_cols; base += kThreads) {  // whole warps in every iteration
            const int i = base + tid;
            int bin = -1;
            if (i < n_cols) {
                const uint32_t key = ordered_key(row[i]);
                bin = (key & mask) == prefix ? (int) ((key >> shift) & (kBins - 1)) : -1;
            }
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin >= 0 && (int) (threadIdx.x % 32) == __ffs((int) peers) - 1) {
                atomicAdd(&hist[bin], __popc(peers));
            }
        }
        __syncthreads();
        if (tid < 32) {
            select_bin(hist, &rank, &digit);
        }
        __syncthreads();
        prefix |= digit << shift;
        mask |= (uint32_t) (kBins - 1) << shift;
        __syncthreads();  // digit is rewritten by the next pass
    }
    const uint32_t threshold = prefix;  // the k-th largest key
    const int n_eq_take = rank;         // keys == threshold that belong to the top k
    const int n_gt = k - n_eq_take;     // keys > threshold (all belong)

    // Gather in increasing id order: warp w owns the segment [w * seg, (w + 1) * seg).
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int seg = ((n_cols + kWarps - 1) / kWarps + 31) / 32 * 32;
    const int begin = warp * seg;
    const int end = min(n_cols, begin + seg);
    int gt = 0;
    int eq = 0;
    for (int base = begin; base < end; base += 32) {
        const int i = base + lane;
        const uint32_t key = i < end ? ordered_key(row[i]) : 0u;
        gt += __popc(__ballot_sync(0xffffffffu, i < end && key > threshold));
        eq += __popc(__ballot_sync(0xffffffffu, i < end && key == threshold));
    }
    if (lane == 0) {
        warp_gt[warp] = gt;
        warp_eq[warp] = eq;
    }
    __syncthreads();
    int gt_pos = 0;  // exclusive scan over the warps before this one
    int eq_pos = 0;
    for (int w = 0; w < warp; ++w) {
        gt_pos += warp_gt[w];
        eq_pos += warp_eq[w];
    }
    const unsigned lower = (1u << lane) - 1u;
    for (int base = begin; base < end; base += 32) {
        const int i = base + lane;
        const uint32_t key = i < end ? ordered_key(row[i]) : 0u;
        const unsigned gt_mask = __ballot_sync(0xffffffffu, i < end && key > threshold);
        const unsigned eq_mask = __ballot_sync(0xffffffffu, i < end && key == threshold);
        if (i < end && key > threshold) {
            out[gt_pos + __popc(gt_mask & lower)] = i;
        } else if (i < end && key == threshold) {
            const int p = eq_pos + __popc(eq_mask & lower);
            if (p < n_eq_take) {
                out[n_gt + p] = i;
            }
        }
        gt_pos += __popc(gt_mask);
        eq_pos += __popc(eq_mask);
    }
}

bool on_current_device(const void * ptr) {
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess) {
        return false;
    }
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error of a host pointer on older runtimes
        return false;
    }
    return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) && attr.device == device;
}

}  // namespace

const char * top_k_rows_check(const TopKRowsArgs & a, bool check_device) {
    if (a.n_rows < 0 || a.n_cols < 1) {
        return "top_k_rows: n_rows must be >= 0 and n_cols >= 1";
    }
    if (a.k < 1 || a.k > a.n_cols) {
        return "top_k_rows: k must be in [1, n_cols]";
    }
    if (a.src_stride < a.n_cols || a.dst_stride < a.k) {
        return "top_k_rows: src_stride must be >= n_cols and dst_stride >= k";
    }
    if (a.n_rows > 0 && (a.src == nullptr || a.dst_ids == nullptr)) {
        return "top_k_rows: src and dst_ids must not be null";
    }
    if (check_device && a.n_rows > 0 && (!on_current_device(a.src) || !on_current_device(a.dst_ids))) {
        return "top_k_rows: src and dst_ids must be device memory of the current device";
    }
    return nullptr;
}

void top_k_rows_launch(const TopKRowsArgs & a, cudaStream_t stream) {
    if (a.n_rows == 0) {
        return;
    }
    top_k_rows_kernel<<<a.n_rows, kThreads, 0, stream>>>(a.src, a.src_stride, a.dst_ids, a.dst_stride, a.n_cols, a.k);
}

}  // namespace cf::cuda
