// add_rms_norm.cu - the residual add, the RMS norm after it and the norm's weight in one kernel on ggml-cuda
// (patches/0020): the graph's ADD -> RMS_NORM -> MUL, where the ADD's sum is also the next residual.
//
// At decode batch sizes each of these is a tiny launch: on an H200 at 64 sequences (1B shape) the residual ADD took
// 3.1 us and the fused RMS_NORM + MUL 3.9 us, 32 and 33 times per step, about 13% of the step's device time
// (results/h200_gpu/stop43). One CTA per row reads both addends once into registers, writes the sum, reduces its
// squares, and writes the normalized row times the weight, and, where the caller passes a buffer, the same row rounded
// to F16 (ggml's F32 -> F16 conversion, round to nearest even): the copy patch 0008's cuBLAS path would otherwise make
// for the GEMM that reads this row next (its CF_GEMM_REUSE_SRC1 buffer).
//
// Arithmetic: sum = a + b (the ADD's, bit for bit); scale = rsqrtf(sum of squares / n + eps) and out = scale * sum * w
// as ggml's fused RMS_NORM + MUL (norm.cu), except that the sum of squares is reduced in this kernel's order (float4
// lanes, then a warp tree, then across warps), so `out` may differ from the unfused graph in the last bits. The order
// depends on the row length alone, never on the number of rows, so a row's result does not depend on the batch.
//
// Aliasing: ggml-alloc may give the sum or the output the memory of an addend (the ADD runs in place). Each CTA reads
// its whole row before writing any of it, so a destination may share an addend's rows exactly (same data pointer and
// row stride); any other overlap is refused (ggml_cuda_cf_add_rms_norm_applies), as ggml refuses its own fusions then.
//
// Compiled into the ggml-cuda target (hook of patches/0004 for CacheFlow's CUDA sources); patches/0020 declares the
// two functions below in ggml-cuda.cu and calls them from its fusion pass.
#include "ggml-cuda/common.cuh"

#include <cstdint>
#include <cstring>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecPerThread = 8;  // rows of up to 8 * 4 * 256 = 8,192 floats

// One CTA per row. a, b: [rows][n] F32 (row strides sa, sb floats); w: [n] F32; sum, out: [rows][n] F32 (row
// strides ss, so floats); out_f16: [rows][n] F16 contiguous, or nullptr. n % 4 == 0, n <= 4 * kThreads * VPT.
template <int VPT>
__global__ void __launch_bounds__(kThreads) add_rms_norm_mul_kernel(const float * a, const float * b,
                                                                   const float * __restrict__ w, float * sum,
                                                                   float * out, half * __restrict__ out_f16, int n,
                                                                   int64_t sa, int64_t sb, int64_t ss, int64_t so,
                                                                   float eps) {
    const int64_t row = blockIdx.x;
    const float4 * a4 = reinterpret_cast<const float4 *>(a + row * sa);
    const float4 * b4 = reinterpret_cast<const float4 *>(b + row * sb);
    const int n4 = n / 4;
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
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_sq[warp] = sq;
    }
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) {
        total += warp_sq[i];
    }
    const float scale = rsqrtf(total / n + eps);

    float4 * s4 = reinterpret_cast<float4 *>(sum + row * ss);
    float4 * o4 = reinterpret_cast<float4 *>(out + row * so);
    const float4 * w4 = reinterpret_cast<const float4 *>(w);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int c = threadIdx.x + i * kThreads;
        if (c < n4) {
            const float4 m = w4[c];
            const float4 o = make_float4(scale * v[i].x * m.x, scale * v[i].y * m.y, scale * v[i].z * m.z,
                                         scale * v[i].w * m.w);
            s4[c] = v[i];
            o4[c] = o;
            if (out_f16 != nullptr) {
                const __half2 lo = __floats2half2_rn(o.x, o.y), hi = __floats2half2_rn(o.z, o.w);
                uint2 packed;
                packed.x = *reinterpret_cast<const unsigned *>(&lo);
                packed.y = *reinterpret_cast<const unsigned *>(&hi);
                reinterpret_cast<uint2 *>(out_f16 + row * (int64_t) n)[c] = packed;
            }
        }
    }
}

// Whether the bytes of x and y overlap.
bool overlaps(const ggml_tensor * x, const ggml_tensor * y) {
    const char * xs = static_cast<const char *>(x->data);
    const char * ys = static_cast<const char *>(y->data);
    return xs < ys + ggml_nbytes(y) && ys < xs + ggml_nbytes(x);
}

// A destination may share an addend's memory only row for row (same start, same row stride).
bool alias_ok(const ggml_tensor * dst, const ggml_tensor * src) {
    return !overlaps(dst, src) || (dst->data == src->data && dst->nb[1] == src->nb[1]);
}

}  // namespace

// Whether add -> norm -> mul is a residual add, an RMS norm of its sum and a multiplication by one weight row that
// this kernel computes: F32 everywhere, both addends of the sum's shape, 2-D rows with 16-byte aligned starts and
// strides, the norm's input the sum, the weight a contiguous row of the norm's width, no destination overlapping a
// source except row for row (see the file comment), rows of at most 8,192 floats.
bool ggml_cuda_cf_add_rms_norm_applies(const ggml_tensor * add, const ggml_tensor * norm, const ggml_tensor * mul) {
    if (add->op != GGML_OP_ADD || norm->op != GGML_OP_RMS_NORM || mul->op != GGML_OP_MUL || norm->src[0] != add) {
        return false;
    }
    const ggml_tensor * w = mul->src[0] == norm ? mul->src[1] : mul->src[1] == norm ? mul->src[0] : nullptr;
    const ggml_tensor * a = add->src[0];
    const ggml_tensor * b = add->src[1];
    if (w == nullptr || a == nullptr || b == nullptr) {
        return false;
    }
    for (const ggml_tensor * t : {add, norm, mul, w, a, b}) {
        if (t->type != GGML_TYPE_F32 || t->data == nullptr || t->nb[0] != sizeof(float)) {
            return false;
        }
    }
    const int64_t n = add->ne[0];
    if (n % 4 != 0 || n > 4 * kThreads * kMaxVecPerThread || ggml_nrows(add) > INT32_MAX) {
        return false;
    }
    for (const ggml_tensor * t : {a, b, mul}) {
        if (!ggml_are_same_shape(t, add)) {
            return false;
        }
    }
    if (!ggml_is_contiguous(w) || w->ne[0] != n || ggml_nrows(w) != 1) {
        return false;
    }
    for (const ggml_tensor * t : {add, mul, a, b}) {  // 2-D rows: one stride, 16-byte aligned starts
        if (t->ne[2] != 1 || t->ne[3] != 1 || t->nb[1] % 16 != 0 || reinterpret_cast<uintptr_t>(t->data) % 16 != 0) {
            return false;
        }
    }
    if (reinterpret_cast<uintptr_t>(w->data) % 16 != 0) {
        return false;
    }
    for (const ggml_tensor * dst : {add, mul}) {
        if (!alias_ok(dst, a) || !alias_ok(dst, b) || overlaps(dst, w)) {
            return false;
        }
    }
    return !overlaps(add, mul);
}

// Computes add, norm's result (not written: the norm is elided) and mul, as the file comment says; out_f16: the
// buffer for mul's rows in F16, [rows][n] contiguous, or nullptr. Call only where ..._applies said yes.
void ggml_cuda_cf_add_rms_norm(ggml_backend_cuda_context & ctx, ggml_tensor * add, const ggml_tensor * norm,
                               ggml_tensor * mul, half * out_f16) {
    const ggml_tensor * w = mul->src[0] == norm ? mul->src[1] : mul->src[0];
    const ggml_tensor * a = add->src[0];
    const ggml_tensor * b = add->src[1];
    float eps = 0.0f;
    memcpy(&eps, norm->op_params, sizeof(float));
    const int n = (int) add->ne[0];
    const int rows = (int) ggml_nrows(add);
    if (rows == 0) {
        return;
    }
    const int vpt = (n / 4 + kThreads - 1) / kThreads;
    const int64_t sa = a->nb[1] / sizeof(float), sb = b->nb[1] / sizeof(float);
    const int64_t ss = add->nb[1] / sizeof(float), so = mul->nb[1] / sizeof(float);
    const float * ap = static_cast<const float *>(a->data);
    const float * bp = static_cast<const float *>(b->data);
    const float * wp = static_cast<const float *>(w->data);
    float * sp = static_cast<float *>(add->data);
    float * op = static_cast<float *>(mul->data);
    cudaStream_t stream = ctx.stream();
#define CF_ADD_RMS_NORM(V)                                                                                        \
    add_rms_norm_mul_kernel<V><<<rows, kThreads, 0, stream>>>(ap, bp, wp, sp, op, out_f16, n, sa, sb, ss, so, eps); \
    break;
    switch (vpt <= 1 ? 1 : vpt <= 2 ? 2 : vpt <= 4 ? 4 : 8) {
        case 1: CF_ADD_RMS_NORM(1)
        case 2: CF_ADD_RMS_NORM(2)
        case 4: CF_ADD_RMS_NORM(4)
        default: CF_ADD_RMS_NORM(8)
    }
#undef CF_ADD_RMS_NORM
    CUDA_CHECK(cudaGetLastError());
}
