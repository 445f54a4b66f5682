// paged_attention.cu - CUDA paged attention; the contract and the work split are in paged_attention.cuh.
#include "paged_attention.cuh"

#include <cstdio>

namespace cf {
namespace cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGqa = 8;

#define CF_CUDA_STR2(x) #x
#define CF_CUDA_STR(x) CF_CUDA_STR2(x)
#define CF_CUDA_WHERE __FILE__ ":" CF_CUDA_STR(__LINE__) ": "

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    }
    return v;
}

// Block-wide reduction of one value per thread; every thread gets the result. The order (lane
// butterfly, then warps 0..kWarps-1) is fixed, so the result depends only on the inputs.
template <bool kMax>
__device__ float block_reduce(float v, float * scratch /* [kWarps] */) {
    v = kMax ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    float r = scratch[0];
    for (int w = 1; w < kWarps; ++w) {
        r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
    }
    __syncthreads();  // scratch is reused by the next call
    return r;
}

// One CTA: KV head blockIdx.y, token blockIdx.z, keys [split * kPagedSplitKeys, +kPagedSplitKeys).
// D: head size; G: query heads per KV head.
template <int D, int G>
__global__ void __launch_bounds__(kThreads)
paged_attention_split_kernel(const PagedAttentionCudaArgs a, float * part_o /* [n_tokens][n_head][n_splits][D] */,
                             float * part_ml /* [n_tokens][n_head][n_splits][2] */, int n_splits) {
    constexpr int TG = D / 8;            // threads per key in Q.K (16 bytes of the K row each)
    constexpr int NG = kThreads / TG;    // keys in flight in Q.K
    constexpr int DP = D / 2;            // threads per key in P.V (one half2 each)
    constexpr int KPAR = kThreads / DP;  // keys in flight in P.V

    __shared__ float q_s[G][D];
    __shared__ float p_s[G][kPagedSplitKeys];
    __shared__ int32_t row_s[kPagedSplitKeys];
    __shared__ float red_s[KPAR][G][D];
    __shared__ float scratch[kWarps];

    const int split = blockIdx.x;
    const int kvh = blockIdx.y;
    const int t = blockIdx.z;
    const int tid = threadIdx.x;
    const int ctx = a.token_ctx_len[t];
    const int k0 = split * kPagedSplitKeys;
    if (k0 >= ctx) {
        return;  // beyond this row's context (the grid covers the longest row of the step)
    }
    const int nkeys = min(kPagedSplitKeys, ctx - k0);
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t] * a.block_table_stride;

    for (int i = tid; i < G * D; i += kThreads) {
        const int h = i / D;
        const int d = i % D;
        q_s[h][d] = a.q[(int64_t) t * a.q_stride_token + (int64_t) (kvh * G + h) * a.q_stride_head + d];
    }
    for (int i = tid; i < nkeys; i += kThreads) {
        const int p = k0 + i;
        row_s[i] = table[p / a.block_size] * a.block_size + p % a.block_size;
    }
    __syncthreads();

    // Q.K: group g of TG threads takes keys g, g + NG, ...; lane li holds dims [8 li, 8 li + 8).
    {
        const int g = tid / TG;
        const int li = tid % TG;
        float qr[G][8];
#pragma unroll
        for (int h = 0; h < G; ++h) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                qr[h][j] = q_s[h][li * 8 + j];
            }
        }
        // Every thread runs the same number of iterations: the lane shuffles below need whole warps.
#pragma unroll 4
        for (int base = 0; base < nkeys; base += NG) {
            const int i = base + g;
            const bool valid = i < nkeys;
            const half * krow = a.k_pool + (int64_t) row_s[valid ? i : 0] * a.k_stride_row + kvh * D + li * 8;
            const uint4 raw = *reinterpret_cast<const uint4 *>(krow);
            const half2 * k2 = reinterpret_cast<const half2 *>(&raw);
            float kf[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = __half22float2(k2[j]);
                kf[2 * j] = f.x;
                kf[2 * j + 1] = f.y;
            }
#pragma unroll
            for (int h = 0; h < G; ++h) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    s = fmaf(qr[h][j], kf[j], s);
                }
#pragma unroll
                for (int off = TG / 2; off > 0; off >>= 1) {
                    s += __shfl_xor_sync(0xffffffffu, s, off, TG);
                }
                if (valid && li == 0) {
                    s *= a.scale;
                    if (a.softcap != 0.0f) {
                        s = a.softcap * tanhf(s / a.softcap);
                    }
                    p_s[h][i] = s;
                }
            }
        }
    }
    __syncthreads();

    // Softmax over the split, per head: max, exp, sum (fixed orders, see block_reduce).
    float m[G];
    float l[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float v = -INFINITY;
        for (int i = tid; i < nkeys; i += kThreads) {
            v = fmaxf(v, p_s[h][i]);
        }
        m[h] = block_reduce<true>(v, scratch);
        float sum = 0.0f;
        for (int i = tid; i < nkeys; i += kThreads) {
            const float e = expf(p_s[h][i] - m[h]);
            p_s[h][i] = e;
            sum += e;
        }
        l[h] = block_reduce<false>(sum, scratch);
    }
    // (block_reduce ended with __syncthreads: every p_s write is visible)

    // P.V: KPAR keys in flight, DP threads per key, each thread two dims of every head.
    {
        const int kp = tid / DP;
        const int dp = tid % DP;
        float acc[G][2];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            acc[h][0] = 0.0f;
            acc[h][1] = 0.0f;
        }
#pragma unroll 8
        for (int i = kp; i < nkeys; i += KPAR) {
            const half2 * vrow =
                reinterpret_cast<const half2 *>(a.v_pool + (int64_t) row_s[i] * a.v_stride_row + kvh * D);
            const float2 v = __half22float2(vrow[dp]);
#pragma unroll
            for (int h = 0; h < G; ++h) {
                const float p = p_s[h][i];
                acc[h][0] = fmaf(p, v.x, acc[h][0]);
                acc[h][1] = fmaf(p, v.y, acc[h][1]);
            }
        }
#pragma unroll
        for (int h = 0; h < G; ++h) {
            red_s[kp][h][2 * dp] = acc[h][0];
            red_s[kp][h][2 * dp + 1] = acc[h][1];
        }
    }
    __syncthreads();

    const bool one_split = ctx <= kPagedSplitKeys;
    for (int i = tid; i < G * D; i += kThreads) {
        const int h = i / D;
        const int d = i % D;
        float o = red_s[0][h][d];
#pragma unroll
        for (int k = 1; k < KPAR; ++k) {
            o += red_s[k][h][d];
        }
        const int head = kvh * G + h;
        if (one_split) {
            a.out[((int64_t) t * a.n_head + head) * D + d] = o / l[h];
        } else {
            const int64_t part = ((int64_t) t * a.n_head + head) * n_splits + split;
            part_o[part * D + d] = o;
            if (d == 0) {
                part_ml[2 * part] = m[h];
                part_ml[2 * part + 1] = l[h];
            }
        }
    }
}

// Merge the splits of rows longer than one split, in split order: grid (n_head, n_tokens), D threads.
template <int D>
__global__ void paged_attention_combine_kernel(const PagedAttentionCudaArgs a, const float * part_o,
                                               const float * part_ml, int n_splits) {
    const int head = blockIdx.x;
    const int t = blockIdx.y;
    const int d = threadIdx.x;
    const int ctx = a.token_ctx_len[t];
    if (ctx <= kPagedSplitKeys) {
        return;  // written by the split kernel
    }
    const int ns = (ctx + kPagedSplitKeys - 1) / kPagedSplitKeys;
    const int64_t base = ((int64_t) t * a.n_head + head) * n_splits;
    float mx = -INFINITY;
    for (int s = 0; s < ns; ++s) {
        mx = fmaxf(mx, part_ml[2 * (base + s)]);
    }
    float l = 0.0f;
    float o = 0.0f;
    for (int s = 0; s < ns; ++s) {
        const float w = expf(part_ml[2 * (base + s)] - mx);
        l = fmaf(w, part_ml[2 * (base + s) + 1], l);
        o = fmaf(w, part_o[(base + s) * D + d], o);
    }
    a.out[((int64_t) t * a.n_head + head) * D + d] = o / l;
}

int num_splits(const PagedAttentionCudaArgs & a) {
    const int64_t max_ctx = a.block_table_stride * a.block_size;
    return (int) ((max_ctx + kPagedSplitKeys - 1) / kPagedSplitKeys);
}

template <int D, int G>
cudaError_t launch(const PagedAttentionCudaArgs & a, void * workspace, cudaStream_t stream) {
    const int n_splits = num_splits(a);
    float * part_o = nullptr;
    float * part_ml = nullptr;
    if (n_splits > 1) {
        part_o = static_cast<float *>(workspace);
        part_ml = part_o + (size_t) a.n_tokens * a.n_head * n_splits * D;
    }
    const dim3 grid((unsigned) n_splits, (unsigned) a.n_head_kv, (unsigned) a.n_tokens);
    paged_attention_split_kernel<D, G><<<grid, kThreads, 0, stream>>>(a, part_o, part_ml, n_splits);
    if (n_splits > 1) {
        const dim3 cgrid((unsigned) a.n_head, (unsigned) a.n_tokens);
        paged_attention_combine_kernel<D><<<cgrid, D, 0, stream>>>(a, part_o, part_ml, n_splits);
    }
    return cudaGetLastError();
}

template <int D>
cudaError_t launch_gqa(const PagedAttentionCudaArgs & a, void * workspace, cudaStream_t stream) {
    switch (a.n_head / a.n_head_kv) {
        case 1: return launch<D, 1>(a, workspace, stream);
        case 2: return launch<D, 2>(a, workspace, stream);
        case 3: return launch<D, 3>(a, workspace, stream);
        case 4: return launch<D, 4>(a, workspace, stream);
        case 5: return launch<D, 5>(a, workspace, stream);
        case 6: return launch<D, 6>(a, workspace, stream);
        case 7: return launch<D, 7>(a, workspace, stream);
        case 8: return launch<D, 8>(a, workspace, stream);
        default: return cudaErrorInvalidValue;  // excluded by paged_attention_cuda_unsupported
    }
}

}  // namespace

const char * paged_attention_cuda_unsupported(const PagedAttentionCudaArgs & a) {
    if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) {
        return "head size must be 64, 128 or 256";
    }
    if (a.n_head_kv < 1 || a.n_head % a.n_head_kv != 0 || a.n_head / a.n_head_kv > kMaxGqa) {
        return "query heads must be 1 to 8 times the KV heads";
    }
    if (a.k_stride_row % 8 != 0 || a.v_stride_row % 8 != 0 ||
        reinterpret_cast<uintptr_t>(a.k_pool) % 16 != 0 || reinterpret_cast<uintptr_t>(a.v_pool) % 16 != 0) {
        return "K/V pool rows must be 16-byte aligned";
    }
    if (a.block_size < 1 || a.block_table_stride < 1 || a.n_tokens < 0) {
        return "block size, block table width and token count must be positive";
    }
    return nullptr;
}

size_t paged_attention_cuda_workspace_bytes(const PagedAttentionCudaArgs & a) {
    const int n_splits = num_splits(a);
    if (n_splits <= 1) {
        return 0;
    }
    return (size_t) a.n_tokens * a.n_head * n_splits * ((size_t) a.head_dim + 2) * sizeof(float);
}

const char * paged_attention_cuda(const PagedAttentionCudaArgs & a, void * workspace, cudaStream_t stream) {
    static thread_local char message[256];
    if (const char * why = paged_attention_cuda_unsupported(a)) {
        std::snprintf(message, sizeof(message), CF_CUDA_WHERE "paged attention: %s (head size %d, %d/%d heads)", why,
                      a.head_dim, a.n_head, a.n_head_kv);
        return message;
    }
    if (a.n_tokens == 0) {
        return nullptr;
    }
    if (paged_attention_cuda_workspace_bytes(a) > 0 && workspace == nullptr) {
        std::snprintf(message, sizeof(message), CF_CUDA_WHERE "paged attention: no workspace for %d splits",
                      num_splits(a));
        return message;
    }
    cudaError_t err = cudaSuccess;
    switch (a.head_dim) {
        case 64: err = launch_gqa<64>(a, workspace, stream); break;
        case 128: err = launch_gqa<128>(a, workspace, stream); break;
        case 256: err = launch_gqa<256>(a, workspace, stream); break;
        default: break;
    }
    if (err != cudaSuccess) {
        std::snprintf(message, sizeof(message), CF_CUDA_WHERE "paged attention launch failed: %s",
                      cudaGetErrorString(err));
        return message;
    }
    return nullptr;
}

}  // namespace cuda
}  // namespace cf
