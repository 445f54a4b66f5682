// paged_attn_support.cpp - see paged_attn_support.h.
#include "engine/paged_attn_support.h"

#include <cstddef>

namespace cf {

bool device_supports_paged_attn(ggml_backend_dev_t dev, const PagedAttnShape & shape) {
    ggml_init_params ip = {8 * ggml_tensor_overhead(), nullptr, /*no_alloc =*/true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, shape.head_dim_k, shape.n_head, 1);
    ggml_tensor * k = ggml_new_tensor_2d(ctx, shape.kv_type, shape.head_dim_k * shape.n_head_kv, shape.block_size);
    ggml_tensor * v = ggml_new_tensor_2d(ctx, shape.kv_type, shape.head_dim_v * shape.n_head_kv, shape.block_size);
    ggml_tensor * block_tables = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, 1);
    ggml_tensor * tok_seq = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    ggml_tensor * tok_ctx_len = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    ggml_tensor * op = ggml_paged_attn(ctx, q, k, v, block_tables, tok_seq, tok_ctx_len, 1.0f, 0.0f,
                                       shape.block_size, shape.kernel);
    const bool supported = ggml_backend_dev_supports_op(dev, op);
    ggml_free(ctx);
    return supported;
}

std::string first_device_without_paged_attn(const std::vector<ggml_backend_dev_t> & devs,
                                            const PagedAttnShape & shape) {
    for (ggml_backend_dev_t dev : devs) {
        if (!device_supports_paged_attn(dev, shape)) {
            return std::string("backend ") + ggml_backend_dev_name(dev) + " (" + ggml_backend_dev_description(dev) +
                   ")";
        }
    }
    return "";
}

std::vector<ggml_backend_dev_t> attention_devices(int32_t n_gpu_layers,
                                                  const std::vector<ggml_backend_dev_t> & offload_devices) {
    std::vector<ggml_backend_dev_t> devs;
    if (ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); cpu != nullptr) {
        devs.push_back(cpu);
    }
    if (n_gpu_layers != 0) {
        devs.insert(devs.end(), offload_devices.begin(), offload_devices.end());
    }
    return devs;
}

}  // namespace cf
