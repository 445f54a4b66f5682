// test_swiglu_f16.cu - swiglu_f16.cuh against ggml's SWIGLU arithmetic and a float64 reference, then its time per call
// against ggml's two launches it replaces (patches/0021).
//
// Cases: rows 1 to 256, row lengths 4 to 8,192 (the 1B shape's 8,192-wide FFN, SmolLM2's 1,536), gate and up as the
// two halves of one row (ggml's fused gate/up GEMM output, both orders) or as two padded tensors, with and without the
// F16 copy. Checks: out equals, bit for bit, a kernel written as ggml-cuda's gated kernel (unary.cu: one element per
// thread, silu(x) = x / (1 + expf(-x)) times up) built with the same flags; out is within 1e-5 relative of float64; the
// F16 copy is out rounded to nearest even, bit for bit; a row alone equals the same row in a batch. Then us per call
// at 64 and 256 rows of 8,192: this kernel with its F16 copy against ggml's gated kernel followed by its F32 -> F16
// conversion (back to back on one stream).
//
// Build: nvcc -std=c++17 -O3 -use_fast_math -arch=native -I native/src/kernels/cuda \
//        native/src/kernels/cuda/swiglu_f16.cu native/tests/cuda/test_swiglu_f16.cu
//        (tests/kernels/test_swiglu_f16_cuda.py does this)
#include "device_helpers.cuh"
#include "swiglu_f16.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using cf::cuda::SwigluArgs;

namespace {

int failures = 0;

void fail(const char * what, int rows, int n, int r, int c, double got, double want) {
    if (failures++ < 10) {
        std::printf("FAIL %s: rows %d n %d at row %d col %d: got %.9g want %.9g\n", what, rows, n, r, c, got, want);
    }
}

// ggml-cuda's gated kernel for SWIGLU in F32 (unary.cu's unary_gated_op_kernel with op_silu), rewritten here as the
// reference for bits: element i of row i / n, gate at j0 and up at j1.
__global__ void ggml_style_swiglu(const float * x, const float * g, float * dst, int64_t k, int64_t n, int64_t o0,
                                  int64_t o1) {
    const int64_t i = int64_t(blockDim.x) * blockIdx.x + threadIdx.x;
    if (i >= k) {
        return;
    }
    const int64_t j0 = (i / n) * o0 + (i % n);
    const int64_t j1 = (i / n) * o1 + (i % n);
    const float v = x[j0];
    dst[i] = (v / (1.0f + expf(-v))) * g[j1];
}

// ggml's F32 -> F16 conversion ahead of a cuBLAS F16 GEMM (one element per thread, round to nearest even).
__global__ void to_f16(const float * x, half * y, int64_t k) {
    const int64_t i = int64_t(blockDim.x) * blockIdx.x + threadIdx.x;
    if (i < k) {
        y[i] = __float2half(x[i]);
    }
}

// Layouts of gate and up: halves of one [rows][2n] row (gate first, or up first as ggml's "swapped"), or two
// tensors with rows padded by 12 floats.
enum Layout { kHalves, kHalvesSwapped, kSeparatePadded };

// One case; returns the kernel's out ([rows][n]) for the batch-invariance check.
std::vector<float> run_case(int rows, int n, Layout layout, bool f16, unsigned seed) {
    std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
    const int64_t stride = layout == kSeparatePadded ? n + 12 : 2 * (int64_t) n;
    std::vector<float> a((size_t) rows * stride), b(layout == kSeparatePadded ? (size_t) rows * stride : 0);
    for (int r = 0; r < rows; ++r) {  // row r's values depend on (seed, r) alone
        std::mt19937 row_rng(seed * 7919u + r);
        for (int64_t c = 0; c < stride; ++c) a[r * stride + c] = dist(row_rng);
        for (int64_t c = 0; c < (layout == kSeparatePadded ? stride : 0); ++c) b[r * stride + c] = dist(row_rng);
    }
    float *da, *db = nullptr, *dout, *dref;
    half * dh = nullptr;
    CHECK_CUDA(cudaMalloc(&da, a.size() * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    if (!b.empty()) {
        CHECK_CUDA(cudaMalloc(&db, b.size() * sizeof(float)));
        CHECK_CUDA(cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    CHECK_CUDA(cudaMalloc(&dout, (size_t) rows * n * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dref, (size_t) rows * n * sizeof(float)));
    if (f16) {
        CHECK_CUDA(cudaMalloc(&dh, (size_t) rows * n * sizeof(half)));
    }
    const float * gate = layout == kSeparatePadded ? da : layout == kHalves ? da : da + n;
    const float * up = layout == kSeparatePadded ? db : layout == kHalves ? da + n : da;
    const float * h_gate = layout == kHalvesSwapped ? a.data() + n : a.data();
    const float * h_up = layout == kSeparatePadded ? b.data() : layout == kHalves ? a.data() + n : a.data();
    SwigluArgs p{};
    p.gate = gate;
    p.up = up;
    p.out = dout;
    p.out_f16 = dh;
    p.gate_stride = p.up_stride = stride;
    p.rows = rows;
    p.n = n;
    if (const char * err = cf::cuda::swiglu_f16_check(p)) {
        std::printf("FAIL check refused a valid case: %s\n", err);
        std::exit(1);
    }
    cf::cuda::swiglu_f16_launch(p, nullptr);
    CHECK_CUDA(cudaGetLastError());
    const int64_t k = (int64_t) rows * n;
    ggml_style_swiglu<<<(unsigned) ((k + 255) / 256), 256>>>(gate, up, dref, k, n, stride, stride);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> out((size_t) k), ref((size_t) k);
    std::vector<half> h(f16 ? (size_t) k : 0);
    CHECK_CUDA(cudaMemcpy(out.data(), dout, k * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(ref.data(), dref, k * sizeof(float), cudaMemcpyDeviceToHost));
    if (f16) {
        CHECK_CUDA(cudaMemcpy(h.data(), dh, k * sizeof(half), cudaMemcpyDeviceToHost));
    }
    for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < n; ++c) {
            const size_t i = (size_t) r * n + c;
            if (std::memcmp(&out[i], &ref[i], sizeof(float)) != 0) {
                fail("out vs ggml's kernel", rows, n, r, c, out[i], ref[i]);
            }
            const double x = h_gate[r * stride + c], u = h_up[r * stride + c];
            const double want = x / (1.0 + std::exp(-x)) * u;
            if (std::fabs(out[i] - want) > 1e-5 * std::fabs(want) + 1e-6) {
                fail("out vs float64", rows, n, r, c, out[i], want);
            }
            if (f16) {
                const half hw = __float2half_rn(out[i]);
                if (std::memcmp(&h[i], &hw, sizeof(half)) != 0) {
                    fail("f16 copy", rows, n, r, c, __half2float(h[i]), __half2float(hw));
                }
            }
        }
    }
    for (void * q : {(void *) da, (void *) db, (void *) dout, (void *) dref, (void *) dh}) {
        if (q != nullptr) CHECK_CUDA(cudaFree(q));
    }
    return out;
}

// us per call at rows x n (gate and up as halves of one row): this kernel with its F16 copy, and ggml's gated kernel
// followed by the conversion; back to back on one stream, 200 calls each after 10 to warm up.
void time_case(int rows, int n, float * ours, float * ggml_two) {
    const int64_t k = (int64_t) rows * n;
    float *da, *dout;
    half * dh;
    CHECK_CUDA(cudaMalloc(&da, 2 * k * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dout, k * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dh, k * sizeof(half)));
    CHECK_CUDA(cudaMemset(da, 0, 2 * k * sizeof(float)));
    SwigluArgs p{da, da + n, dout, dh, 2 * (int64_t) n, 2 * (int64_t) n, rows, n};
    const unsigned blocks = (unsigned) ((k + 255) / 256);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    const int reps = 200;
    float ms = 0;
    for (int pass = 0; pass < 2; ++pass) {
        for (int i = 0; i < 10 + reps; ++i) {
            if (i == 10) CHECK_CUDA(cudaEventRecord(e0));
            if (pass == 0) {
                cf::cuda::swiglu_f16_launch(p, nullptr);
            } else {
                ggml_style_swiglu<<<blocks, 256>>>(da, da + n, dout, k, n, 2 * (int64_t) n, 2 * (int64_t) n);
                to_f16<<<blocks, 256>>>(dout, dh, k);
            }
        }
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        *(pass == 0 ? ours : ggml_two) = ms * 1000.0f / reps;
    }
    for (void * q : {(void *) da, (void *) dout, (void *) dh}) CHECK_CUDA(cudaFree(q));
}

}  // namespace

int main() {
    const int ns[] = {4, 1536, 8192, 1028};
    const int row_counts[] = {1, 7, 64, 256};
    unsigned seed = 1;
    for (int n : ns) {
        for (int rows : row_counts) {
            for (Layout layout : {kHalves, kHalvesSwapped, kSeparatePadded}) {
                run_case(rows, n, layout, (seed & 1) == 0 || rows == 64, seed);
                ++seed;
            }
        }
        // a row alone equals the same row in a batch of 64 (same inputs: same seed)
        const std::vector<float> batch = run_case(64, n, kHalves, true, 1000 + n);
        const std::vector<float> alone = run_case(1, n, kHalves, true, 1000 + n);
        if (std::memcmp(batch.data(), alone.data(), n * sizeof(float)) != 0) {
            fail("row alone vs in a batch", 64, n, 0, 0, alone[0], batch[0]);
        }
    }
    // the check refuses what the launcher cannot take
    SwigluArgs bad{};
    if (cf::cuda::swiglu_f16_check(bad) == nullptr) {
        fail("check accepted an empty argument set", 0, 0, 0, 0, 0, 0);
    }
    for (int rows : {64, 256}) {
        float ours = 0, two = 0;
        time_case(rows, 8192, &ours, &two);
        std::printf("us per call (%d x 8192): swiglu_f16 %.2f; ggml's swiglu + F16 conversion %.2f\n", rows, ours, two);
    }
    if (failures != 0) {
        std::printf("FAIL: %d mismatches\n", failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}
