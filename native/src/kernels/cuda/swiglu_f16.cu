// swiglu_f16.cu - the kernel and launcher of swiglu_f16.cuh (contract and arithmetic there).
#include "swiglu_f16.cuh"

#include <cstdint>

namespace cf::cuda {
namespace {

// ggml-cuda's silu (unary.cuh, ggml_cuda_op_silu_single), the same expression so the same instructions.
__device__ __forceinline__ float silu(float x) {
    return x / (1.0f + expf(-x));
}

__global__ void __launch_bounds__(kSwigluThreads) swiglu_f16_kernel(SwigluArgs p) {
    const int c = blockIdx.x * kSwigluThreads + threadIdx.x;  // float4 index in the row
    if (c >= p.n / 4) {
        return;
    }
    const int64_t r = blockIdx.y;
    const float4 x = reinterpret_cast<const float4 *>(p.gate + r * p.gate_stride)[c];
    const float4 u = reinterpret_cast<const float4 *>(p.up + r * p.up_stride)[c];
    const float4 o = make_float4(silu(x.x) * u.x, silu(x.y) * u.y, silu(x.z) * u.z, silu(x.w) * u.w);
    reinterpret_cast<float4 *>(p.out + r * p.n)[c] = o;
    if (p.out_f16 != nullptr) {
        const __half2 lo = __floats2half2_rn(o.x, o.y), hi = __floats2half2_rn(o.z, o.w);
        reinterpret_cast<uint2 *>(p.out_f16 + r * p.n)[c] =
            make_uint2(*reinterpret_cast<const unsigned *>(&lo), *reinterpret_cast<const unsigned *>(&hi));
    }
}

bool aligned16(const void * p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

const char * swiglu_f16_check(const SwigluArgs & p) {
    if (p.rows < 0 || p.rows > 65535 || p.n < 4 || p.n % 4 != 0) {
        return "swiglu_f16: rows must be in [0, 65535] and n a positive multiple of 4";
    }
    if (p.gate == nullptr || p.up == nullptr || p.out == nullptr) {
        return "swiglu_f16: gate, up and out must be set";
    }
    if (!aligned16(p.gate) || !aligned16(p.up) || !aligned16(p.out) ||
        (p.out_f16 != nullptr && !aligned16(p.out_f16))) {
        return "swiglu_f16: every pointer must be 16-byte aligned";
    }
    if (p.gate_stride < p.n || p.up_stride < p.n || p.gate_stride % 4 != 0 || p.up_stride % 4 != 0) {
        return "swiglu_f16: row strides must be multiples of 4 floats, at least n";
    }
    return nullptr;
}

void swiglu_f16_launch(const SwigluArgs & p, cudaStream_t stream) {
    if (p.rows == 0) {
        return;
    }
    const dim3 grid((unsigned) ((p.n / 4 + kSwigluThreads - 1) / kSwigluThreads), (unsigned) p.rows);
    swiglu_f16_kernel<<<grid, kSwigluThreads, 0, stream>>>(p);
}

}  // namespace cf::cuda
