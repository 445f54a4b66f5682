// test_top_k_rows.cu - top_k_rows.cu against a host reference: exact ids (the documented order:
// above the k-th largest value first, then equal to it, each ascending) on random rows, rows with
// many ties and -inf, ragged shapes; the launcher's argument checks; and the time of the batched
// top-k candidates' shape (rows of a 49,152- and a 128,256-token vocabulary, k = 64).
//
//   nvcc -std=c++17 -O3 -arch=native -I native/src/kernels/cuda native/src/kernels/cuda/top_k_rows.cu \
//        native/tests/cuda/test_top_k_rows.cu -o test_top_k_rows && ./test_top_k_rows
// Prints PASS and exits 0 when every case matches.
#include "top_k_rows.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

int failures = 0;

#define CHECK_CUDA(x)                                                              \
    do {                                                                           \
        cudaError_t e_ = (x);                                                      \
        if (e_ != cudaSuccess) {                                                   \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(2);                                                          \
        }                                                                          \
    } while (0)

// The documented result for one row.
std::vector<int> reference(const float * row, int n, int k) {
    std::vector<float> sorted(row, row + n);
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
    const float t = sorted[(size_t) k - 1];
    std::vector<int> out;
    for (int i = 0; i < n; ++i) {
        if (row[i] > t) {
            out.push_back(i);
        }
    }
    for (int i = 0; i < n && (int) out.size() < k; ++i) {
        if (row[i] == t) {
            out.push_back(i);
        }
    }
    return out;
}

enum class Kind { RANDOM, TIES, NEG_INF };

void run_case(int n_rows, int n_cols, int k, Kind kind, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> h((size_t) n_rows * n_cols);
    for (size_t i = 0; i < h.size(); ++i) {
        float v = normal(rng);
        if (kind == Kind::TIES) {
            v = std::round(v);  // about 30 distinct values: long runs of equal keys at the threshold
        } else if (kind == Kind::NEG_INF && rng() % 3 != 0) {
            v = -INFINITY;  // most of the row banned, as a logit bias does
        }
        h[i] = v;
    }
    float * d_src = nullptr;
    int32_t * d_dst = nullptr;
    CHECK_CUDA(cudaMalloc(&d_src, h.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_dst, (size_t) n_rows * k * sizeof(int32_t)));
    CHECK_CUDA(cudaMemcpy(d_src, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    cf::cuda::TopKRowsArgs a{d_src, n_cols, d_dst, k, n_rows, n_cols, k};
    if (const char * err = cf::cuda::top_k_rows_check(a)) {
        std::printf("FAIL check rejected valid args: %s\n", err);
        ++failures;
        return;
    }
    cf::cuda::top_k_rows_launch(a, nullptr);
    CHECK_CUDA(cudaGetLastError());
    std::vector<int32_t> got((size_t) n_rows * k);
    CHECK_CUDA(cudaMemcpy(got.data(), d_dst, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    int bad_rows = 0;
    for (int r = 0; r < n_rows; ++r) {
        const std::vector<int> want = reference(h.data() + (size_t) r * n_cols, n_cols, k);
        if (!std::equal(want.begin(), want.end(), got.begin() + (size_t) r * k)) {
            ++bad_rows;
        }
    }
    std::printf("%s rows=%d cols=%d k=%d kind=%d: %d/%d rows exact\n", bad_rows ? "FAIL" : "ok  ", n_rows, n_cols,
                k, (int) kind, n_rows - bad_rows, n_rows);
    failures += bad_rows != 0;
    CHECK_CUDA(cudaFree(d_src));
    CHECK_CUDA(cudaFree(d_dst));
}

void check_rejects(const cf::cuda::TopKRowsArgs & a, const char * what) {
    const char * err = cf::cuda::top_k_rows_check(a);
    std::printf("%s rejects %s: %s\n", err ? "ok  " : "FAIL", what, err ? err : "(accepted)");
    failures += err == nullptr;
}

void time_shape(int n_rows, int n_cols, int k) {
    float * d_src = nullptr;
    int32_t * d_dst = nullptr;
    CHECK_CUDA(cudaMalloc(&d_src, (size_t) n_rows * n_cols * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_dst, (size_t) n_rows * k * sizeof(int32_t)));
    std::vector<float> h((size_t) n_rows * n_cols);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    for (float & v : h) {
        v = normal(rng);
    }
    CHECK_CUDA(cudaMemcpy(d_src, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    cf::cuda::TopKRowsArgs a{d_src, n_cols, d_dst, k, n_rows, n_cols, k};
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    for (int i = 0; i < 3; ++i) {
        cf::cuda::top_k_rows_launch(a, nullptr);
    }
    const int iters = 50;
    CHECK_CUDA(cudaEventRecord(t0));
    for (int i = 0; i < iters; ++i) {
        cf::cuda::top_k_rows_launch(a, nullptr);
    }
    CHECK_CUDA(cudaEventRecord(t1));
    CHECK_CUDA(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    std::printf("time rows=%d cols=%d k=%d: %.1f us per launch\n", n_rows, n_cols, k, 1000.0f * ms / iters);
    CHECK_CUDA(cudaFree(d_src));
    CHECK_CUDA(cudaFree(d_dst));
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (Kind kind : {Kind::RANDOM, Kind::TIES, Kind::NEG_INF}) {
        run_case(1, 1, 1, kind, seed++);
        run_case(3, 7, 3, kind, seed++);
        run_case(5, 1000, 40, kind, seed++);
        run_case(2, 1000, 1000, kind, seed++);
        run_case(64, 49152, 64, kind, seed++);
        run_case(256, 49152, 40, kind, seed++);
        run_case(17, 128256, 64, kind, seed++);
        run_case(9, 32001, 1, kind, seed++);
    }
    float * d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, 64 * sizeof(float)));
    std::vector<float> host(64);
    check_rejects({d, 8, reinterpret_cast<int32_t *>(d), 4, 2, 8, 9}, "k > n_cols");
    check_rejects({d, 8, reinterpret_cast<int32_t *>(d), 4, 2, 8, 0}, "k = 0");
    check_rejects({d, 4, reinterpret_cast<int32_t *>(d), 4, 2, 8, 4}, "src_stride < n_cols");
    check_rejects({d, 8, reinterpret_cast<int32_t *>(d), 2, 2, 8, 4}, "dst_stride < k");
    check_rejects({nullptr, 8, reinterpret_cast<int32_t *>(d), 4, 2, 8, 4}, "a null src");
    check_rejects({host.data(), 8, reinterpret_cast<int32_t *>(d), 4, 2, 8, 4}, "host memory");
    CHECK_CUDA(cudaFree(d));
    time_shape(1, 49152, 64);
    time_shape(64, 49152, 64);
    time_shape(256, 49152, 64);
    time_shape(256, 128256, 64);
    std::printf(failures == 0 ? "PASS\n" : "FAILED: %d\n", failures);
    return failures == 0 ? 0 : 1;
}
