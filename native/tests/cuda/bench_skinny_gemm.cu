// bench_skinny_gemm.cu - how fast the decode step's weight GEMMs can run at 32 to 256 tokens (issue 11, B=64 target).
//
// Y[M x N] (F32, token-major: row m holds N outputs) = X[M x K] (F16, token-major) . W[N x K]^T (F16, row-major),
// the shapes of the 1B-shape decode step (fused QKV 3072x2048, wo 2048x2048, fused gate/up 16384x2048, down
// 2048x8192, output 49152x2048). For each shape and M it times:
//   gemmex   cublasGemmEx(T, N) with F16 inputs, F32 output and F32 compute, the call ggml-cuda makes for an F16 weight
//            with patch 0008's F32 output (CACHEFLOW_CUDA_GEMM) - the engine's GEMMs today;
//   lt_h0    cublasLtMatmul with the heuristic's first algorithm (what cuBLAS picks by itself);
//   lt_best  the fastest of up to kMaxAlgos algorithms the heuristic returns, timed here (an autotuner's pick), with its
//            tile, stages and split-K;
// and reports us per GEMM and the weight bytes per second. Weights rotate over copies spanning >= 256 MiB, so every
// GEMM reads its weight from HBM as in a decode step (the H100's L2 is 50 MB). A device-to-device copy of 256 MiB gives
// the run's bandwidth reference.
//
// Build and run on the GPU machine: nvcc -std=c++17 -arch=sm_90a -O3 bench_skinny_gemm.cu -lcublasLt -lcublas
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)
#define CB(x)                                                                                   \
    do {                                                                                        \
        int s_ = (int) (x);                                                                     \
        if (s_ != 0) {                                                                          \
            std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, s_);  \
            std::exit(1);                                                                       \
        }                                                                                       \
    } while (0)

namespace {

constexpr int kMaxAlgos = 32;
constexpr size_t kRotateBytes = 256ull << 20;
constexpr size_t kWorkspaceBytes = 64ull << 20;
constexpr int kReps = 60;
constexpr size_t kPartBytes = 128ull << 20;  // split-K partials of the cf kernel

struct Shape {
    const char * name;
    int n;  // output features (W rows)
    int k;  // input features (W columns)
};

__global__ void fill_half(half * p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        unsigned h = (unsigned) i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        p[i] = __float2half(((int) (h & 0xffff) - 32768) * (1.0f / 32768.0f) * 0.05f);
    }
}

__global__ void half_to_float(const half * in, float * out, size_t n) {
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        out[i] = __half2float(in[i]);
    }
}

// Mean us per call of `fn(i)` over kReps calls, after 5 warm-up calls (i: the weight copy to use).
template <typename F> float time_us(cudaStream_t s, int copies, F fn) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 5; ++i) {
        fn(i % copies);
    }
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < kReps; ++i) {
        fn(i % copies);
    }
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms * 1000.0f / kReps;
}


// ---- cf: a skinny tensor-core GEMM streaming W once (the candidate to replace cuBLAS at 16 < M <= 128) ----
//
// Each warp owns FW tiles of 16 output features and all M tokens (MT tiles of 8); a CTA of kWarps warps owns
// 16 * FW * kWarps features and one K slice (split-K over gridDim.y). X's slice (M x Kc, F16) is staged once in shared
// memory; W streams from HBM straight into registers, kDepth chunks of 32 k ahead. mma.m16n8k16 with a permuted k
// order: thread (g = lane / 4, q = lane % 4) loads 8 consecutive k of its W rows and X tokens with one 16-byte load, and
// the same permutation on both operands leaves every dot product's terms unchanged. Split-K partials go to a workspace
// in fragment order; the last CTA of a feature block (an atomic ticket) sums the splits in split order (deterministic)
// and writes Y.
constexpr int kWarps = 4;
constexpr int kDepth = 4;
constexpr int kChunk = 32;
constexpr int kPad = 32;  // halves of padding per staged X row
constexpr int kStageBatch = 8;  // X's 16-byte loads in flight per thread while staging

__device__ __forceinline__ uint4 ld_stream(const void * p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int FW, int MT> __device__ __forceinline__ void zero_acc(float (&acc)[FW][MT][4]) {
#pragma unroll
    for (int i = 0; i < FW; ++i)
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

// grid (N / (16 * FW * kWarps), S), block 32 * kWarps, dynamic smem MT * 8 * (Kc + kPad) halves.
// w: [N][K] F16 row-major; x: [M][K] F16 row-major (M <= 8 * MT); y: [M][N] F32; part: [S][gridDim.x][kWarps * FW *
// MT * 128] F32 (S > 1); tickets: [gridDim.x] int, zero, left zero.
template <int MT, int FW, typename XT>
__global__ void __launch_bounds__(32 * kWarps) skinny_gemm(const half * __restrict__ w, const XT * __restrict__ x,
                                                          float * __restrict__ y, float * __restrict__ part,
                                                          int * __restrict__ tickets, int N, int K, int M, int Kc) {
    extern __shared__ uint4 smem_u4[];
    half * xs = reinterpret_cast<half *>(smem_u4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int k_begin = blockIdx.y * Kc;
    const int f_warp = (blockIdx.x * kWarps + warp) * 16 * FW;
    const int nchunks = Kc / kChunk;
    const int xs_stride = Kc + kPad;  // halves: rows g and g + 1 start 64 bytes apart mod 128, so the LDS.128 of a
                                     // quarter warp (g in {0, 1}, q in 0..3) hit distinct banks

    // W ring: chunk c's rows (g, g + 8) of each tile, 8 k each
    uint4 wr[kDepth][FW][2];
    const half * wrow = w + (size_t) (f_warp + g) * K + k_begin + q * 8;
#pragma unroll
    for (int p = 0; p < kDepth; ++p) {
        if (p < nchunks) {
#pragma unroll
            for (int i = 0; i < FW; ++i) {
                wr[p][i][0] = ld_stream(wrow + (size_t) (16 * i) * K + p * kChunk);
                wr[p][i][1] = ld_stream(wrow + (size_t) (16 * i + 8) * K + p * kChunk);
            }
        }
    }
    // stage X's slice (tokens >= M as zeros), kStageBatch 16-byte loads in flight per thread before any store: a
    // load-store loop would wait one L2 round trip per 16 bytes (the first version did, stop 43's run 1)
    const int row_u4 = Kc / 8;
    const int total_u4 = MT * 8 * row_u4;
    for (int base = threadIdx.x; base < total_u4; base += 32 * kWarps * kStageBatch) {
        uint4 v[kStageBatch];
#pragma unroll
        for (int u = 0; u < kStageBatch; ++u) {
            const int idx = base + u * 32 * kWarps;
            const int m = idx / row_u4, c = idx % row_u4;
            v[u] = make_uint4(0, 0, 0, 0);
            if (idx < total_u4 && m < M) {
                if constexpr (sizeof(XT) == 2) {
                    v[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t) m * K + k_begin + c * 8));
                } else {  // F32 X, rounded to F16 here (as ggml's conversion kernel would)
                    const float4 * xf = reinterpret_cast<const float4 *>(x + (size_t) m * K + k_begin + c * 8);
                    const float4 a = __ldg(xf), b = __ldg(xf + 1);
                    const __half2 h0 = __floats2half2_rn(a.x, a.y), h1 = __floats2half2_rn(a.z, a.w);
                    const __half2 h2 = __floats2half2_rn(b.x, b.y), h3 = __floats2half2_rn(b.z, b.w);
                    v[u] = make_uint4(*reinterpret_cast<const unsigned *>(&h0), *reinterpret_cast<const unsigned *>(&h1),
                                      *reinterpret_cast<const unsigned *>(&h2), *reinterpret_cast<const unsigned *>(&h3));
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kStageBatch; ++u) {
            const int idx = base + u * 32 * kWarps;
            if (idx < total_u4) {
                const int m = idx / row_u4, c = idx % row_u4;
                *reinterpret_cast<uint4 *>(xs + m * xs_stride + c * 8) = v[u];
            }
        }
    }
    __syncthreads();

    float acc[FW][MT][4];
    zero_acc(acc);

    for (int c0 = 0; c0 < nchunks; c0 += kDepth) {
#pragma unroll
        for (int p = 0; p < kDepth; ++p) {
            const int c = c0 + p;
            if (c < nchunks) {
#pragma unroll
                for (int j = 0; j < MT; ++j) {
                    const uint4 xv = *reinterpret_cast<const uint4 *>(xs + (j * 8 + g) * xs_stride + c * kChunk + q * 8);
#pragma unroll
                    for (int i = 0; i < FW; ++i) {
                        const uint4 lo = wr[p][i][0], hi = wr[p][i][1];
                        mma16816(acc[i][j], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
                        mma16816(acc[i][j], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
                    }
                }
                if (c + kDepth < nchunks) {
#pragma unroll
                    for (int i = 0; i < FW; ++i) {
                        wr[p][i][0] = ld_stream(wrow + (size_t) (16 * i) * K + (c + kDepth) * kChunk);
                        wr[p][i][1] = ld_stream(wrow + (size_t) (16 * i + 8) * K + (c + kDepth) * kChunk);
                    }
                }
            }
        }
    }

    const int S = gridDim.y;
    if (S > 1) {
        const size_t block_floats = (size_t) kWarps * FW * MT * 128;
        float4 * mine = reinterpret_cast<float4 *>(part + ((size_t) blockIdx.y * gridDim.x + blockIdx.x) * block_floats);
#pragma unroll
        for (int i = 0; i < FW; ++i)
#pragma unroll
            for (int j = 0; j < MT; ++j)
                __stcg(&mine[((warp * FW + i) * MT + j) * 32 + lane],
                       make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));
        __threadfence();
        __shared__ int ticket;
        __syncthreads();
        if (threadIdx.x == 0) {
            ticket = atomicAdd(&tickets[blockIdx.x], 1);
        }
        __syncthreads();
        if (ticket != S - 1) {
            return;
        }
        __threadfence();
        zero_acc(acc);
        for (int s = 0; s < S; ++s) {
            const float4 * ps =
                reinterpret_cast<const float4 *>(part + ((size_t) s * gridDim.x + blockIdx.x) * block_floats);
#pragma unroll
            for (int i = 0; i < FW; ++i)
#pragma unroll
                for (int j = 0; j < MT; ++j) {
                    const float4 v = __ldcg(&ps[((warp * FW + i) * MT + j) * 32 + lane]);
                    acc[i][j][0] += v.x;
                    acc[i][j][1] += v.y;
                    acc[i][j][2] += v.z;
                    acc[i][j][3] += v.w;
                }
        }
        if (threadIdx.x == 0) {
            tickets[blockIdx.x] = 0;
        }
    }
#pragma unroll
    for (int i = 0; i < FW; ++i)
#pragma unroll
        for (int j = 0; j < MT; ++j) {
            const int f = f_warp + 16 * i + g;
            const int t = j * 8 + 2 * q;
            if (t < M) {
                y[(size_t) t * N + f] = acc[i][j][0];
                y[(size_t) t * N + f + 8] = acc[i][j][2];
            }
            if (t + 1 < M) {
                y[(size_t) (t + 1) * N + f] = acc[i][j][1];
                y[(size_t) (t + 1) * N + f + 8] = acc[i][j][3];
            }
        }
}

struct SkinnyPlan {
    int mt, fw, blocks, splits, kc;
    size_t smem;
};

// The split rule: about kTargetCtas CTAs, K slices of at most kMaxKc and at least 128 k, a power of two dividing K/32.
SkinnyPlan skinny_plan(int N, int K, int M, int target_ctas, int max_kc) {
    SkinnyPlan p{};
    p.mt = M <= 32 ? 4 : M <= 64 ? 8 : 16;
    p.fw = M <= 64 ? 2 : 1;
    const int feats = 16 * p.fw * kWarps;
    p.blocks = N / feats;
    int s = 1;
    while (s * 2 * 128 <= K && (p.blocks * s * 2 <= target_ctas || K / s > max_kc) && K % (s * 2 * kChunk) == 0) {
        s *= 2;
    }
    p.splits = s;
    p.kc = K / s;
    p.smem = (size_t) p.mt * 8 * (p.kc + kPad) * sizeof(half);
    return p;
}

template <typename XT>
void skinny_launch(const SkinnyPlan & p, const half * w, const XT * x, float * y, float * part, int * tickets, int N,
                   int K, int M, cudaStream_t s) {
    const dim3 grid(p.blocks, p.splits), block(32 * kWarps);
#define CF_SKINNY(MT_, FW_)                                                                                      \
    if (p.mt == MT_ && p.fw == FW_) {                                                                            \
        static bool attr = false;                                                                                \
        if (!attr) {                                                                                             \
            CK(cudaFuncSetAttribute(skinny_gemm<MT_, FW_, XT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024)); \
            attr = true;                                                                                         \
        }                                                                                                        \
        skinny_gemm<MT_, FW_, XT><<<grid, block, p.smem, s>>>(w, x, y, part, tickets, N, K, M, p.kc);                \
        return;                                                                                                  \
    }
    CF_SKINNY(4, 2)
    CF_SKINNY(8, 2)
    CF_SKINNY(16, 1)
#undef CF_SKINNY
    std::fprintf(stderr, "no skinny kernel for mt %d fw %d\n", p.mt, p.fw);
    std::exit(1);
}

}  // namespace

int main() {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    // bandwidth reference: a 256 MiB device-to-device copy
    {
        void *src, *dst;
        CK(cudaMalloc(&src, kRotateBytes));
        CK(cudaMalloc(&dst, kRotateBytes));
        const float us = time_us(s, 1, [&](int) { CK(cudaMemcpyAsync(dst, src, kRotateBytes, cudaMemcpyDeviceToDevice, s)); });
        std::printf("d2d copy 256 MiB: %.1f us, %.0f GB/s (read + write)\n", us, 2.0 * kRotateBytes / us / 1e3);
        CK(cudaFree(src));
        CK(cudaFree(dst));
    }

    cublasHandle_t blas;
    CB(cublasCreate(&blas));
    CB(cublasSetStream(blas, s));
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    void * workspace;
    CK(cudaMalloc(&workspace, kWorkspaceBytes));
    CB(cublasSetWorkspace(blas, workspace, kWorkspaceBytes));

    float * part;
    CK(cudaMalloc(&part, kPartBytes));
    int * tickets;
    CK(cudaMalloc(&tickets, 4096 * sizeof(int)));
    CK(cudaMemset(tickets, 0, 4096 * sizeof(int)));

    const Shape shapes[] = {{"qkv", 3072, 2048}, {"wo", 2048, 2048}, {"gate_up", 16384, 2048}, {"down", 2048, 8192},
                            {"output", 49152, 2048}};
    const int ms[] = {32, 64, 128, 256};
    const float one = 1.0f, zero = 0.0f;

    std::printf("%-8s %4s | %9s %7s | %9s %7s | %9s %7s  %s\n", "shape", "M", "gemmex us", "GB/s", "lt_h0 us", "GB/s",
                "best us", "GB/s", "best algo (index of n, tile, stages, splitK)");
    for (const Shape & sh : shapes) {
        const size_t wbytes = (size_t) sh.n * sh.k * sizeof(half);
        const int copies = (int) std::max<size_t>(2, (kRotateBytes + wbytes - 1) / wbytes);
        half * w;
        CK(cudaMalloc(&w, wbytes * copies));
        fill_half<<<1024, 256, 0, s>>>(w, (size_t) sh.n * sh.k * copies, 1u);
        for (int m : ms) {
            half * x;
            float * y;
            CK(cudaMalloc(&x, (size_t) m * sh.k * sizeof(half)));
            CK(cudaMalloc(&y, (size_t) m * sh.n * sizeof(float)));
            float * y_ref;
            CK(cudaMalloc(&y_ref, (size_t) m * sh.n * sizeof(float)));
            fill_half<<<256, 256, 0, s>>>(x, (size_t) m * sh.k, 7u);
            float * x32;  // the same X in F32 (the engine's activations before ggml's F16 conversion)
            CK(cudaMalloc(&x32, (size_t) m * sh.k * sizeof(float)));
            half_to_float<<<256, 256, 0, s>>>(x, x32, (size_t) m * sh.k);
            auto wp = [&](int i) { return w + (size_t) i * sh.n * sh.k; };

            const float t_ex = time_us(s, copies, [&](int i) {
                CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &one, wp(i), CUDA_R_16F, sh.k, x,
                                CUDA_R_16F, sh.k, &zero, y, CUDA_R_32F, sh.n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT_TENSOR_OP));
            });

            // cublasLt: C[N x M] (column-major, ld N) = op(A)[N x K] . B[K x M]; A = W stored K x N column-major (ld K),
            // transposed; B = X stored K x M column-major (ld K)
            cublasLtMatmulDesc_t desc;
            CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
            CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
            CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
            cublasLtMatrixLayout_t la, lb, lc;
            CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, sh.k, sh.n, sh.k));
            CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, sh.k, m, sh.k));
            CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, sh.n, m, sh.n));
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            const size_t ws = kWorkspaceBytes;
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
            cublasLtMatmulHeuristicResult_t res[kMaxAlgos];
            int n_res = 0;
            CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, kMaxAlgos, res, &n_res));
            float t_h0 = -1, t_best = 1e30f;
            int best = -1;
            for (int r = 0; r < n_res; ++r) {
                if (res[r].state != CUBLAS_STATUS_SUCCESS || res[r].workspaceSize > ws) {
                    continue;
                }
                const float t = time_us(s, copies, [&](int i) {
                    CB(cublasLtMatmul(lt, desc, &one, wp(i), la, x, lb, &zero, y, lc, y, lc, &res[r].algo, workspace,
                                      ws, s));
                });
                if (r == 0) {
                    t_h0 = t;
                }
                if (t < t_best) {
                    t_best = t;
                    best = r;
                }
            }
            int tile = -1, stages = -1, splitk = -1;
            if (best >= 0) {
                size_t got = 0;
                cublasLtMatmulAlgoConfigGetAttribute(&res[best].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                                     &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[best].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                                     sizeof(stages), &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[best].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                     sizeof(splitk), &got);
            }
            const double gb = wbytes / 1e3;  // bytes / us / 1e3 = GB/s
            std::printf("%-8s %4d | %9.2f %7.0f | %9.2f %7.0f | %9.2f %7.0f  #%d of %d, tile %d, stages %d, splitK %d\n",
                        sh.name, m, t_ex, gb / t_ex, t_h0, t_h0 > 0 ? gb / t_h0 : 0.0, t_best, gb / t_best, best, n_res,
                        tile, stages, splitk);
            std::fflush(stdout);

            // cf: correctness against gemmex on copy 0, then timed at three grid targets
            if (m <= 128) {
                CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &one, wp(0), CUDA_R_16F, sh.k, x,
                                CUDA_R_16F, sh.k, &zero, y_ref, CUDA_R_32F, sh.n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT_TENSOR_OP));
                const int max_kc = m <= 32 ? 1024 : m <= 64 ? 512 : 256;
                for (int target : {132, 264, 528}) {
                    const SkinnyPlan plan = skinny_plan(sh.n, sh.k, m, target, max_kc);
                    if ((size_t) plan.splits * sh.n * plan.mt * 8 * sizeof(float) > kPartBytes ||
                        plan.blocks * (size_t) (16 * plan.fw * kWarps) != (size_t) sh.n) {
                        std::printf("%-8s %4d | cf target %d: no plan\n", sh.name, m, target);
                        continue;
                    }
                    CK(cudaMemsetAsync(y, 0, (size_t) m * sh.n * sizeof(float), s));
                    skinny_launch(plan, wp(0), x, y, part, tickets, sh.n, sh.k, m, s);
                    CK(cudaGetLastError());
                    CK(cudaStreamSynchronize(s));
                    std::vector<float> a((size_t) m * sh.n), b((size_t) m * sh.n);
                    CK(cudaMemcpy(a.data(), y, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(b.data(), y_ref, b.size() * sizeof(float), cudaMemcpyDeviceToHost));
                    double max_err = 0, max_ref = 0;
                    for (size_t i = 0; i < a.size(); ++i) {
                        max_err = std::max(max_err, (double) std::fabs(a[i] - b[i]));
                        max_ref = std::max(max_ref, (double) std::fabs(b[i]));
                    }
                    const float t_cf = time_us(s, copies, [&](int i) {
                        skinny_launch(plan, wp(i), x, y, part, tickets, sh.n, sh.k, m, s);
                    });
                    const float t_cf32 = time_us(s, copies, [&](int i) {
                        skinny_launch(plan, wp(i), x32, y, part, tickets, sh.n, sh.k, m, s);
                    });
                    std::printf("%-8s %4d | cf target %3d: %9.2f us %7.0f GB/s (%.2fx gemmex), F32 X %.2f us; grid %dx%d "
                                "kc %d smem %zu | max err %.3g of max %.3g%s\n",
                                sh.name, m, target, t_cf, gb / t_cf, t_ex / t_cf, t_cf32, plan.blocks, plan.splits,
                                plan.kc, plan.smem, max_err, max_ref,
                                max_err > 1e-3 * max_ref + 1e-4 ? "  MISMATCH" : "");
                    std::fflush(stdout);
                }
            }
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(desc);
            CK(cudaFree(x));
            CK(cudaFree(y));
            CK(cudaFree(y_ref));
            CK(cudaFree(x32));
        }
        CK(cudaFree(w));
    }
    CK(cudaFree(workspace));
    cublasLtDestroy(lt);
    cublasDestroy(blas);
    return 0;
}
