// bench_argmax_rows.cu - how fast the greedy step's argmax over the logits can run (issue 11, B=64 step).
//
// x: [rows][n] F32 logits, row-major, contiguous; out: [rows] I32, the lowest index of each row's maximum.
// At 64 sequences of the 1B shape (49,152-token vocabulary) ggml-cuda's argmax took 11.6 us of a 1,602 us step
// (results/h200_gpu/stop43, CUPTI timeline): one CTA per row, so 64 of the H200's 132 SMs read 12.6 MB with scalar
// loads. Timed here, same data, same answers:
//   one_cta   one CTA of 1024 threads per row, scalar loads (the shape of ggml-cuda's kernel, as a baseline);
//   split     kSplit CTAs per row, float4 loads, each CTA's (max, index) into a workspace; the last CTA of a row to
//             finish (a per-row arrival counter, reset by that CTA, so a captured graph replays it) merges them.
// Both take the lowest index among equal maxima. Build and run on the GPU machine:
//   nvcc -std=c++17 -arch=sm_90a -O3 bench_argmax_rows.cu && ./a.out
#include "device_helpers.cuh"

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kThreads = 256;  // split kernel
constexpr int kSplit = 8;      // CTAs per row

// (v, i) beats (bv, bi): larger value, or equal value and lower index
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_best(float & v, int & i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        if (better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// the CTA's best (v, i), valid in thread 0; nthreads a multiple of 32, at most 1024
__device__ void block_best(float & v, int & i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    warp_best(v, i);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        v = lane < nw ? sv[lane] : -FLT_MAX;
        i = lane < nw ? si[lane] : INT_MAX;
        warp_best(v, i);
    }
}

__global__ void one_cta_kernel(const float * x, int * out, int n) {
    const float * r = x + (size_t) blockIdx.x * n;
    float v = -FLT_MAX;
    int i = INT_MAX;
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
        if (better(r[c], c, v, i)) {
            v = r[c];
            i = c;
        }
    }
    block_best(v, i);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = i;
    }
}

// grid (kSplit, rows); n % 4 == 0; part_v/part_i: [rows][kSplit]; arrivals: [rows], zero before the first launch
__global__ void __launch_bounds__(kThreads) split_kernel(const float * x, int * out, int n, float * part_v,
                                                         int * part_i, unsigned * arrivals) {
    const int row = blockIdx.y, s = blockIdx.x;
    const int n4 = n / 4, per = (n4 + kSplit - 1) / kSplit;
    const int c0 = s * per, c1 = min(n4, c0 + per);
    const float4 * r = reinterpret_cast<const float4 *>(x + (size_t) row * n);
    float v = -FLT_MAX;
    int i = INT_MAX;
    for (int c = c0 + threadIdx.x; c < c1; c += kThreads) {
        const float4 q = r[c];
        const int b = 4 * c;
        if (better(q.x, b, v, i)) { v = q.x; i = b; }
        if (better(q.y, b + 1, v, i)) { v = q.y; i = b + 1; }
        if (better(q.z, b + 2, v, i)) { v = q.z; i = b + 2; }
        if (better(q.w, b + 3, v, i)) { v = q.w; i = b + 3; }
    }
    block_best(v, i);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        part_v[row * kSplit + s] = v;
        part_i[row * kSplit + s] = i;
        __threadfence();
        last = atomicAdd(&arrivals[row], 1u) == kSplit - 1;
    }
    __syncthreads();
    if (last && threadIdx.x < 32) {
        __threadfence();
        float bv = threadIdx.x < kSplit ? ((volatile float *) part_v)[row * kSplit + threadIdx.x] : -FLT_MAX;
        int bi = threadIdx.x < kSplit ? ((volatile int *) part_i)[row * kSplit + threadIdx.x] : INT_MAX;
        warp_best(bv, bi);
        if (threadIdx.x == 0) {
            out[row] = bi;
            arrivals[row] = 0;
        }
    }
}

}  // namespace

int main() {
    const int shapes[][2] = {{1, 49152}, {64, 49152}, {256, 49152}, {64, 128256}, {256, 128256}};
    bool ok = true;
    for (const auto & sh : shapes) {
        const int rows = sh[0], n = sh[1];
        std::vector<float> h((size_t) rows * n);
        unsigned s = 12345u + rows;
        for (float & f : h) {
            s = s * 1664525u + 1013904223u;
            f = (float) (s >> 8) / (float) (1u << 24) * 20.0f - 10.0f;
        }
        for (int r = 0; r < rows; r += 3) {  // ties: the row's maximum twice, the lower index must win
            const int a = (r * 7919) % n, b = (a + n / 3) % n;
            h[(size_t) r * n + a] = 11.0f;
            h[(size_t) r * n + b] = 11.0f;
        }
        std::vector<int> want(rows);
        for (int r = 0; r < rows; ++r) {
            int bi = 0;
            for (int c = 1; c < n; ++c) {
                if (h[(size_t) r * n + c] > h[(size_t) r * n + bi]) {
                    bi = c;
                }
            }
            want[r] = bi;
        }
        // rotate over copies spanning >= 256 MiB so each call reads from HBM, as in a decode step
        const size_t bytes = h.size() * sizeof(float);
        const int copies = (int) ((256ull << 20) / bytes) + 1;
        float * x;
        int *out, *part_i;
        float * part_v;
        unsigned * arrivals;
        CHECK_CUDA(cudaMalloc(&x, bytes * copies));
        for (int k = 0; k < copies; ++k) {
            CHECK_CUDA(cudaMemcpy(x + h.size() * k, h.data(), bytes, cudaMemcpyHostToDevice));
        }
        CHECK_CUDA(cudaMalloc(&out, rows * sizeof(int)));
        CHECK_CUDA(cudaMalloc(&part_v, rows * kSplit * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&part_i, rows * kSplit * sizeof(int)));
        CHECK_CUDA(cudaMalloc(&arrivals, rows * sizeof(unsigned)));
        CHECK_CUDA(cudaMemset(arrivals, 0, rows * sizeof(unsigned)));
        cudaEvent_t e0, e1;
        CHECK_CUDA(cudaEventCreate(&e0));
        CHECK_CUDA(cudaEventCreate(&e1));
        std::vector<int> got(rows);
        for (int variant = 0; variant < 2; ++variant) {
            auto launch = [&](int k) {
                const float * xk = x + h.size() * (k % copies);
                if (variant == 0) {
                    one_cta_kernel<<<rows, 1024>>>(xk, out, n);
                } else {
                    split_kernel<<<dim3(kSplit, rows), kThreads>>>(xk, out, n, part_v, part_i, arrivals);
                }
            };
            CHECK_CUDA(cudaMemset(out, 0xff, rows * sizeof(int)));
            for (int k = 0; k < 3; ++k) {
                launch(k);
            }
            CHECK_CUDA(cudaDeviceSynchronize());
            CHECK_CUDA(cudaMemcpy(got.data(), out, rows * sizeof(int), cudaMemcpyDeviceToHost));
            int bad = 0;
            for (int r = 0; r < rows; ++r) {
                bad += got[r] != want[r];
            }
            const int iters = 200;
            CHECK_CUDA(cudaEventRecord(e0));
            for (int k = 0; k < iters; ++k) {
                launch(k);
            }
            CHECK_CUDA(cudaEventRecord(e1));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            const double us = 1000.0 * ms / iters;
            std::printf("%-8s rows %4d n %6d: %7.2f us, %6.2f TB/s, wrong rows %d\n",
                        variant == 0 ? "one_cta" : "split", rows, n, us, bytes / us / 1e6, bad);
            ok = ok && bad == 0;
        }
        CHECK_CUDA(cudaFree(x));
        CHECK_CUDA(cudaFree(out));
        CHECK_CUDA(cudaFree(part_v));
        CHECK_CUDA(cudaFree(part_i));
        CHECK_CUDA(cudaFree(arrivals));
    }
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
