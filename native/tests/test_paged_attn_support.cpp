// test_paged_attn_support.cpp - which devices run the paged attention op (GGML_OP_PAGED_ATTN), and the
// message naming the backend that does not.
//
// The CPU backend runs the op for F16 and F32 pools with both kernels (CacheFlow's kernels compiled
// into ggml-cpu by patches/0004's hook) and refuses what they do not cover (a quantized pool): the
// engine's check then names the backend, as it does for a GPU backend without an implementation.
#undef NDEBUG  // the checks must run in Release builds too
#include "engine/paged_attn_support.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <cassert>
#include <cstdio>
#include <string>
#include <vector>

namespace {

cf::PagedAttnShape make_shape(ggml_type kv_type, ggml_paged_attn_kernel kernel) {
    return cf::PagedAttnShape{64, 64, 9, 3, 16, kv_type, kernel};
}

void test_cpu_supports_f16_and_f32_pools() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    assert(cpu != nullptr);
    for (ggml_type type : {GGML_TYPE_F16, GGML_TYPE_F32}) {
        for (ggml_paged_attn_kernel kernel : {GGML_PAGED_ATTN_KERNEL_GGML, GGML_PAGED_ATTN_KERNEL_INVARIANT}) {
            assert(cf::device_supports_paged_attn(cpu, make_shape(type, kernel)));
            assert(cf::first_device_without_paged_attn({cpu}, make_shape(type, kernel)).empty());
        }
    }
}

void test_unsupported_pool_names_the_backend() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    const cf::PagedAttnShape q8 = make_shape(GGML_TYPE_Q8_0, GGML_PAGED_ATTN_KERNEL_GGML);
    assert(!cf::device_supports_paged_attn(cpu, q8));
    const std::string why = cf::first_device_without_paged_attn({cpu}, q8);
    std::printf("  Q8_0 pool: %s\n", why.c_str());
    assert(why == std::string("backend ") + ggml_backend_dev_name(cpu) + " (" + ggml_backend_dev_description(cpu) + ")");
}

void test_attention_devices() {
    // the CPU always; the offload devices (the model's device list) only with n_gpu_layers != 0
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_dev_t fake_gpu = cpu;  // any device handle stands for one here: the list is only copied
    const std::vector<ggml_backend_dev_t> cpu_only = cf::attention_devices(0, {fake_gpu});
    assert(cpu_only.size() == 1 && ggml_backend_dev_type(cpu_only[0]) == GGML_BACKEND_DEVICE_TYPE_CPU);
    const std::vector<ggml_backend_dev_t> offload = cf::attention_devices(99, {fake_gpu});
    assert(offload.size() == 2 && offload[1] == fake_gpu);
    assert(cf::attention_devices(-1, {}).size() == 1);
}

}  // namespace

int main() {
    ggml_cpu_init();
    test_cpu_supports_f16_and_f32_pools();
    test_unsupported_pool_names_the_backend();
    test_attention_devices();
    std::printf("test_paged_attn_support: ok\n");
    return 0;
}
