// op_util.cuh - what the ggml-cuda glue of CacheFlow's fused ops (add_rms_norm_op.cu, swiglu_f16_op.cu) asks of a
// tensor before handing it to a kernel: whether two tensors' bytes overlap, and 16-byte alignment (float4 / uint2
// loads and stores). Host code; compiled into the ggml-cuda target with those files.
#pragma once

#include "ggml.h"

#include <cstdint>

namespace cf::cuda {

// Whether the bytes of x and y overlap (data .. data + ggml_nbytes).
inline bool tensors_overlap(const ggml_tensor * x, const ggml_tensor * y) {
    const char * xs = static_cast<const char *>(x->data);
    const char * ys = static_cast<const char *>(y->data);
    return xs < ys + ggml_nbytes(y) && ys < xs + ggml_nbytes(x);
}

inline bool aligned16(const void * p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace cf::cuda
