// paged_attn_support.h - which ggml devices run the paged attention op (GGML_OP_PAGED_ATTN).
//
// In paged KV mode every attention layer is one ggml_paged_attn node (patches/0004), run by the device
// that holds the layer's KV cache. A backend without an implementation answers supports_op false for it
// (today every backend but the CPU; CUDA's place is native/src/kernels/cuda/). The engine asks before it
// creates a paged context, so that kv_mode=auto falls back to the stock KV cache and kv_mode=paged fails
// with the backend's name; llama.cpp checks again, layer by layer, when it creates the context (0003).
#pragma once

#include "ggml-backend.h"
#include "ggml.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cf {

// The shape of one layer's paged attention, as llama.cpp builds it.
struct PagedAttnShape {
    int64_t head_dim_k;              // elements per K head
    int64_t head_dim_v;              // elements per V head
    int64_t n_head;                  // query heads, a multiple of n_head_kv
    int64_t n_head_kv;
    int32_t block_size;              // tokens per block
    ggml_type kv_type;               // type of the K and V pools (llama.cpp's default cache: F16)
    ggml_paged_attn_kernel kernel;
};

// Whether dev's supports_op accepts a one-token GGML_OP_PAGED_ATTN node of this shape (a metadata-only
// graph: nothing is allocated on the device). Thread-safe.
bool device_supports_paged_attn(ggml_backend_dev_t dev, const PagedAttnShape & shape);

// "backend NAME (DESCRIPTION)" of the first of devs that does not support the op, "" if all do.
std::string first_device_without_paged_attn(const std::vector<ggml_backend_dev_t> & devs,
                                            const PagedAttnShape & shape);

// The devices that hold attention layers' KV caches with n_gpu_layers offloaded to offload_devices (the
// model's device list, devices.h): the CPU, plus those devices when n_gpu_layers != 0.
std::vector<ggml_backend_dev_t> attention_devices(int32_t n_gpu_layers,
                                                  const std::vector<ggml_backend_dev_t> & offload_devices);

}  // namespace cf
