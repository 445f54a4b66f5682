// test_add_rms_norm.cu - add_rms_norm.cuh against a CPU reference, then its time per call (patches/0020).
//
// Cases: rows 1 to 256, row lengths 4 to 8,192 (SmolLM2's 576, the 1B shape's 2048, the 8B shape's 4096), padded row
// strides, the sum written over the first addend and the output over the second (ggml-alloc's in-place ADD), with and
// without the F16 copy. Checks: the sum equals the CPU's float sum bit for bit; the output is within 4e-6 relative of
// a double-precision reference (the sum of squares' order differs); the F16 copy is the GPU output rounded to nearest
// even, bit for bit; rows do not depend on the number of rows (a row alone equals the same row in a batch).
// Then the time per call at 64 and 256 rows of 2,048 and 64 of 4,096 (back to back on one stream).
//
// Build: nvcc -std=c++17 -O3 -arch=native -I native/src/kernels/cuda native/src/kernels/cuda/add_rms_norm.cu \
//        native/tests/cuda/test_add_rms_norm.cu   (tests/kernels/test_add_rms_norm_cuda.py does this)
#include "add_rms_norm.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            std::printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

using cf::cuda::AddRmsNormArgs;

namespace {

int failures = 0;

void fail(const char * what, int rows, int n, int r, int c, double got, double want) {
    if (failures++ < 10) {
        std::printf("FAIL %s: rows %d n %d at row %d col %d: got %.9g want %.9g\n", what, rows, n, r, c, got, want);
    }
}

// One case: rows x n, strides padded by `pad` floats, in place (sum over a, out over b) or not, F16 copy or not.
// Returns the GPU's out (for the batch-invariance check).
std::vector<float> run_case(int rows, int n, int pad, bool in_place, bool f16, unsigned seed) {
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    const int64_t stride = n + pad;
    std::vector<float> a(rows * stride), b(rows * stride), w(n);
    std::mt19937 rng(seed);
    for (float & x : w) x = dist(rng);
    for (int r = 0; r < rows; ++r) {  // row r's values depend on (seed, r) alone
        std::mt19937 row_rng(seed * 7919u + r);
        for (int c = 0; c < n; ++c) {
            a[r * stride + c] = dist(row_rng);
            b[r * stride + c] = dist(row_rng);
        }
    }
    const float eps = 1e-5f;

    float *da, *db, *dw, *dsum, *dout;
    half * dh = nullptr;
    const size_t bytes = rows * stride * sizeof(float);
    CK(cudaMalloc(&da, bytes + 16));
    CK(cudaMalloc(&db, bytes + 16));
    CK(cudaMalloc(&dw, n * sizeof(float)));
    CK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    if (in_place) {
        dsum = da;
        dout = db;
    } else {
        CK(cudaMalloc(&dsum, bytes));
        CK(cudaMalloc(&dout, bytes));
    }
    if (f16) {
        CK(cudaMalloc(&dh, (size_t) rows * n * sizeof(half)));
    }
    AddRmsNormArgs p{};
    p.a = da;
    p.b = db;
    p.w = dw;
    p.sum = dsum;
    p.out = dout;
    p.out_f16 = dh;
    p.a_stride = p.b_stride = p.sum_stride = p.out_stride = stride;
    p.rows = rows;
    p.n = n;
    p.eps = eps;
    if (const char * err = cf::cuda::add_rms_norm_check(p)) {
        std::printf("FAIL check refused a valid case: %s\n", err);
        std::exit(1);
    }
    cf::cuda::add_rms_norm_launch(p, nullptr);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> sum(rows * stride), out(rows * stride);
    std::vector<half> h(f16 ? (size_t) rows * n : 0);
    CK(cudaMemcpy(sum.data(), dsum, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out.data(), dout, bytes, cudaMemcpyDeviceToHost));
    if (f16) {
        CK(cudaMemcpy(h.data(), dh, h.size() * sizeof(half), cudaMemcpyDeviceToHost));
    }
    std::vector<float> out_rows((size_t) rows * n);
    for (int r = 0; r < rows; ++r) {
        double sq = 0;
        std::vector<float> s(n);
        for (int c = 0; c < n; ++c) {
            s[c] = a[r * stride + c] + b[r * stride + c];
            sq += (double) s[c] * s[c];
        }
        const double scale = 1.0 / std::sqrt(sq / n + eps);
        for (int c = 0; c < n; ++c) {
            const float gs = sum[r * stride + c];
            if (std::memcmp(&gs, &s[c], sizeof(float)) != 0) {
                fail("sum", rows, n, r, c, gs, s[c]);
            }
            const double want = scale * s[c] * w[c];
            const float go = out[r * stride + c];
            if (std::fabs(go - want) > 4e-6 * std::fabs(want) + 1e-6) {
                fail("out", rows, n, r, c, go, want);
            }
            out_rows[(size_t) r * n + c] = go;
            if (f16) {
                const half hw = __float2half_rn(go);
                if (std::memcmp(&h[(size_t) r * n + c], &hw, sizeof(half)) != 0) {
                    fail("f16 copy", rows, n, r, c, __half2float(h[(size_t) r * n + c]), __half2float(hw));
                }
            }
        }
    }
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dw));
    if (!in_place) {
        CK(cudaFree(dsum));
        CK(cudaFree(dout));
    }
    if (dh != nullptr) {
        CK(cudaFree(dh));
    }
    return out_rows;
}

// us per call, rows x n, back to back on one stream (warm L2: the rows are small)
float time_case(int rows, int n) {
    float *da, *db, *dw, *ds, *dout;
    half * dh;
    CK(cudaMalloc(&da, (size_t) rows * n * 4));
    CK(cudaMalloc(&db, (size_t) rows * n * 4));
    CK(cudaMalloc(&dw, (size_t) n * 4));
    CK(cudaMalloc(&ds, (size_t) rows * n * 4));
    CK(cudaMalloc(&dout, (size_t) rows * n * 4));
    CK(cudaMalloc(&dh, (size_t) rows * n * 2));
    CK(cudaMemset(da, 0, (size_t) rows * n * 4));
    CK(cudaMemset(db, 0, (size_t) rows * n * 4));
    CK(cudaMemset(dw, 0, (size_t) n * 4));
    AddRmsNormArgs p{da, db, dw, ds, dout, dh, n, n, n, n, rows, n, 1e-5f};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 10; ++i) cf::cuda::add_rms_norm_launch(p, nullptr);
    const int reps = 200;
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) cf::cuda::add_rms_norm_launch(p, nullptr);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    for (void * q : {(void *) da, (void *) db, (void *) dw, (void *) ds, (void *) dout, (void *) dh}) CK(cudaFree(q));
    return ms * 1000.0f / reps;
}

}  // namespace

int main() {
    const int ns[] = {4, 576, 2048, 4096, 8192, 1028};
    const int row_counts[] = {1, 7, 64, 256};
    unsigned seed = 1;
    for (int n : ns) {
        for (int rows : row_counts) {
            for (int variant = 0; variant < 4; ++variant) {
                run_case(rows, n, variant & 1 ? 12 : 0, variant & 2, variant == 3 || variant == 0, seed++);
            }
        }
        // a row alone equals the same row in a batch of 64 (same inputs: same seed)
        const std::vector<float> batch = run_case(64, n, 0, false, false, 1000 + n);
        const std::vector<float> alone = run_case(1, n, 0, false, false, 1000 + n);
        if (std::memcmp(batch.data(), alone.data(), n * sizeof(float)) != 0) {
            fail("row alone vs in a batch", 64, n, 0, 0, alone[0], batch[0]);
        }
    }
    // the check refuses what the launcher cannot take
    AddRmsNormArgs bad{};
    if (cf::cuda::add_rms_norm_check(bad) == nullptr) {
        fail("check accepted an empty argument set", 0, 0, 0, 0, 0, 0);
    }
    std::printf("us per call (64 x 2048): %.2f; (256 x 2048): %.2f; (64 x 4096): %.2f\n", time_case(64, 2048),
                time_case(256, 2048), time_case(64, 4096));
    if (failures != 0) {
        std::printf("FAIL: %d mismatches\n", failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}
