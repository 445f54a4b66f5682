// add_rms_norm.cu - the kernel and launcher of add_rms_norm.cuh (contract, arithmetic and aliasing there).
#include "add_rms_norm.cuh"

#include <cstdint>

namespace cf::cuda {
namespace {

constexpr int kThreads = kAddRmsNormThreads;

// One CTA per row; VPT float4 per thread (n <= 4 * kThreads * VPT).
template <int VPT>
__global__ void __launch_bounds__(kThreads) add_rms_norm_kernel(AddRmsNormArgs p) {
    const int64_t row = blockIdx.x;
    const float4 * a4 = reinterpret_cast<const float4 *>(p.a + row * p.a_stride);
    const float4 * b4 = reinterpret_cast<const float4 *>(p.b + row * p.b_stride);
    const int n4 = p.n / 4;
    float4 v[VPT];
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int c = threadIdx.x + i * kThreads;
        if (c < n4) {
            const float4 x = a4[c], y = b4[c];
            v[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
            sq += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
        }
    }
    // every read of this row is done before the first write below (the destinations may alias the addends' rows)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, off);
    }
    __shared__ float warp_sq[kThreads / 32];
    if ((threadIdx.x & 31) == 0) {
        warp_sq[threadIdx.x >> 5] = sq;
    }
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) {
        total += warp_sq[i];
    }
    const float scale = rsqrtf(total / p.n + p.eps);

    float4 * s4 = reinterpret_cast<float4 *>(p.sum + row * p.sum_stride);
    float4 * o4 = reinterpret_cast<float4 *>(p.out + row * p.out_stride);
    const float4 * w4 = reinterpret_cast<const float4 *>(p.w);
    uint2 * h4 = p.out_f16 == nullptr ? nullptr : reinterpret_cast<uint2 *>(p.out_f16 + row * (int64_t) p.n);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int c = threadIdx.x + i * kThreads;
        if (c < n4) {
            const float4 m = w4[c];
            const float4 o = make_float4(scale * v[i].x * m.x, scale * v[i].y * m.y, scale * v[i].z * m.z,
                                         scale * v[i].w * m.w);
            s4[c] = v[i];
            o4[c] = o;
            if (h4 != nullptr) {
                const __half2 lo = __floats2half2_rn(o.x, o.y), hi = __floats2half2_rn(o.z, o.w);
                h4[c] = make_uint2(*reinterpret_cast<const unsigned *>(&lo), *reinterpret_cast<const unsigned *>(&hi));
            }
        }
    }
}

bool aligned16(const void * p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

const char * add_rms_norm_check(const AddRmsNormArgs & p) {
    if (p.rows < 0 || p.n < 4 || p.n % 4 != 0 || p.n > kAddRmsNormMaxCols) {
        return "add_rms_norm: rows must be >= 0 and n a multiple of 4 in [4, 8192]";
    }
    if (p.a == nullptr || p.b == nullptr || p.w == nullptr || p.sum == nullptr || p.out == nullptr) {
        return "add_rms_norm: a, b, w, sum and out must be set";
    }
    if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.w) || !aligned16(p.sum) || !aligned16(p.out) ||
        (p.out_f16 != nullptr && !aligned16(p.out_f16))) {
        return "add_rms_norm: every pointer must be 16-byte aligned";
    }
    if (p.a_stride < p.n || p.b_stride < p.n || p.sum_stride < p.n || p.out_stride < p.n || p.a_stride % 4 != 0 ||
        p.b_stride % 4 != 0 || p.sum_stride % 4 != 0 || p.out_stride % 4 != 0) {
        return "add_rms_norm: row strides must be multiples of 4 floats, at least n";
    }
    return nullptr;
}

void add_rms_norm_launch(const AddRmsNormArgs & p, cudaStream_t stream) {
    if (p.rows == 0) {
        return;
    }
    const int vpt = (p.n / 4 + kThreads - 1) / kThreads;
    if (vpt <= 1) {
        add_rms_norm_kernel<1><<<p.rows, kThreads, 0, stream>>>(p);
    } else if (vpt <= 2) {
        add_rms_norm_kernel<2><<<p.rows, kThreads, 0, stream>>>(p);
    } else if (vpt <= 4) {
        add_rms_norm_kernel<4><<<p.rows, kThreads, 0, stream>>>(p);
    } else {
        add_rms_norm_kernel<8><<<p.rows, kThreads, 0, stream>>>(p);
    }
}

}  // namespace cf::cuda
