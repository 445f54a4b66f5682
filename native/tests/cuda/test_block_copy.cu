// test_block_copy.cu - block_copy.cu: exact bytes for scattered KV-block swaps out of and back into a device
// pool (pinned host memory, zero-copy), device-to-device block copies, uneven sizes, the argument checks;
// then the host link's bandwidth for the swap shape: the kernel against one cudaMemcpyAsync per block range
// (what a per-block swap costs) and against one contiguous pinned cudaMemcpy of the same bytes (the link's
// own figure), both directions.
//
//   nvcc -std=c++17 -O3 -arch=native -I native/src/kernels/cuda native/src/kernels/cuda/block_copy.cu \
//        native/tests/cuda/test_block_copy.cu -o test_block_copy && ./test_block_copy
// Prints PASS and exits 0 when every case matches.
#include "block_copy.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

int failures = 0;

#define CHECK_CUDA(x)                                                                            \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(2);                                                                        \
        }                                                                                        \
    } while (0)

void expect(bool ok, const char * what) {
    if (!ok) {
        std::printf("FAIL: %s\n", what);
        ++failures;
    }
}

// The swap layout of the engine (patches/0007): host slot h holds every layer's K then V range of one block.
struct Shape {
    int n_layers;
    int64_t range_bytes;  // one block of one layer's K (or V) pool: block_size rows
    int n_blocks;         // device pool blocks
};

// Items moving blocks[i] <-> host slot slots[i] (all layers, K and V), host layout as patches/0007.
std::vector<cf_cuda_copy_item> swap_items(const Shape & s, uint8_t * const * pools, uint8_t * host,
                                          const std::vector<int> & blocks, const std::vector<int> & slots,
                                          bool to_host) {
    std::vector<cf_cuda_copy_item> items;
    const int64_t block_bytes = 2 * s.n_layers * s.range_bytes;
    for (size_t i = 0; i < blocks.size(); ++i) {
        int64_t off = 0;
        for (int t = 0; t < 2 * s.n_layers; ++t) {
            uint8_t * dev = pools[t] + (int64_t) blocks[i] * s.range_bytes;
            uint8_t * hst = host + (int64_t) slots[i] * block_bytes + off;
            items.push_back(to_host ? cf_cuda_copy_item{dev, hst, s.range_bytes} : cf_cuda_copy_item{hst, dev, s.range_bytes});
            off += s.range_bytes;
        }
    }
    return items;
}

void run_items(const std::vector<cf_cuda_copy_item> & items, cudaStream_t stream) {
    expect(cf::cuda::block_copy_check(items.data(), (int32_t) items.size()) == nullptr, "items pass the check");
    cf_cuda_copy_item * dev = nullptr;
    CHECK_CUDA(cudaMalloc(&dev, std::max<size_t>(1, items.size()) * sizeof(cf_cuda_copy_item)));
    CHECK_CUDA(cudaMemcpy(dev, items.data(), items.size() * sizeof(cf_cuda_copy_item), cudaMemcpyHostToDevice));
    cf::cuda::block_copy_launch(dev, (int32_t) items.size(), stream);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaFree(dev));
}

// Swap out a random subset of blocks, scribble over them, swap them back into other free blocks; the bytes
// must equal the originals (per layer, K and V), and untouched blocks must be unchanged.
void test_swap_round_trip(const Shape & s, uint32_t seed) {
    std::mt19937 rng(seed);
    const int n_pools = 2 * s.n_layers;
    const size_t pool_bytes = (size_t) s.n_blocks * (size_t) s.range_bytes;
    std::vector<uint8_t *> pools(n_pools);
    std::vector<std::vector<uint8_t>> ref(n_pools, std::vector<uint8_t>(pool_bytes));
    for (int t = 0; t < n_pools; ++t) {
        for (auto & b : ref[t]) b = (uint8_t) rng();
        CHECK_CUDA(cudaMalloc(&pools[t], pool_bytes));
        CHECK_CUDA(cudaMemcpy(pools[t], ref[t].data(), pool_bytes, cudaMemcpyHostToDevice));
    }
    std::vector<int> perm(s.n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const int n_swap = s.n_blocks / 3;
    std::vector<int> out_blocks(perm.begin(), perm.begin() + n_swap);
    std::vector<int> in_blocks(perm.begin() + n_swap, perm.begin() + 2 * n_swap);
    std::vector<int> slots(n_swap);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    uint8_t * host = nullptr;
    const int64_t block_bytes = 2 * s.n_layers * s.range_bytes;
    CHECK_CUDA(cudaMallocHost(&host, (size_t) n_swap * (size_t) block_bytes));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    run_items(swap_items(s, pools.data(), host, out_blocks, slots, true), stream);
    for (int i = 0; i < n_swap; ++i) {  // the host slots hold the blocks, layer by layer, K then V
        for (int t = 0; t < n_pools; ++t) {
            const uint8_t * got = host + (int64_t) slots[i] * block_bytes + t * s.range_bytes;
            const uint8_t * want = ref[t].data() + (int64_t) out_blocks[i] * s.range_bytes;
            if (std::memcmp(got, want, (size_t) s.range_bytes) != 0) {
                expect(false, "swap-out: host slot bytes equal the device block");
                i = n_swap;
                break;
            }
        }
    }
    for (int t = 0; t < n_pools; ++t) {  // the swapped-out blocks are reused by someone else
        for (int b : out_blocks) CHECK_CUDA(cudaMemset(pools[t] + (int64_t) b * s.range_bytes, 0xAB, s.range_bytes));
    }
    run_items(swap_items(s, pools.data(), host, in_blocks, slots, false), stream);
    for (int t = 0; t < n_pools; ++t) {
        std::vector<uint8_t> got(pool_bytes);
        CHECK_CUDA(cudaMemcpy(got.data(), pools[t], pool_bytes, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n_swap; ++i) {
            expect(std::memcmp(got.data() + (int64_t) in_blocks[i] * s.range_bytes,
                               ref[t].data() + (int64_t) out_blocks[i] * s.range_bytes, (size_t) s.range_bytes) == 0,
                   "swap-in: the block comes back bit-exact in its new place");
        }
        for (int b = 0; b < s.n_blocks; ++b) {
            const bool touched = std::find(out_blocks.begin(), out_blocks.end(), b) != out_blocks.end() ||
                                 std::find(in_blocks.begin(), in_blocks.end(), b) != in_blocks.end();
            if (!touched) {
                expect(std::memcmp(got.data() + (int64_t) b * s.range_bytes, ref[t].data() + (int64_t) b * s.range_bytes,
                                   (size_t) s.range_bytes) == 0,
                       "blocks outside the swap are untouched");
            }
        }
    }
    // device-to-device (copy-on-write): block a -> block b in every pool, uneven sizes within one launch
    std::vector<cf_cuda_copy_item> cow;
    for (int t = 0; t < n_pools; ++t) {
        cow.push_back({pools[t] + (int64_t) in_blocks[0] * s.range_bytes, pools[t] + (int64_t) out_blocks[0] * s.range_bytes,
                       s.range_bytes});
        cow.push_back({pools[t] + (int64_t) in_blocks[1] * s.range_bytes, pools[t] + (int64_t) out_blocks[1] * s.range_bytes,
                       16});  // just the first 16 bytes
    }
    run_items(cow, stream);
    for (int t = 0; t < n_pools; ++t) {
        std::vector<uint8_t> a((size_t) s.range_bytes), b((size_t) s.range_bytes);
        CHECK_CUDA(cudaMemcpy(a.data(), pools[t] + (int64_t) out_blocks[0] * s.range_bytes, s.range_bytes, cudaMemcpyDeviceToHost));
        expect(std::memcmp(a.data(), ref[t].data() + (int64_t) out_blocks[0] * s.range_bytes, (size_t) s.range_bytes) == 0,
               "device copy: whole range");
        CHECK_CUDA(cudaMemcpy(b.data(), pools[t] + (int64_t) out_blocks[1] * s.range_bytes, s.range_bytes, cudaMemcpyDeviceToHost));
        expect(std::memcmp(b.data(), ref[t].data() + (int64_t) out_blocks[1] * s.range_bytes, 16) == 0 &&
                   b[16] == 0xAB && b[(size_t) s.range_bytes - 1] == 0xAB,
               "device copy: a 16-byte range copies exactly 16 bytes");
    }
    for (uint8_t * p : pools) CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFreeHost(host));
    CHECK_CUDA(cudaStreamDestroy(stream));
}

void test_checks() {
    alignas(16) static uint8_t buf[64];
    cf_cuda_copy_item ok{buf, buf + 32, 16};
    cf_cuda_copy_item odd{buf, buf + 32, 20};
    cf_cuda_copy_item misaligned{buf + 4, buf + 32, 16};
    cf_cuda_copy_item null{nullptr, buf, 16};
    expect(cf::cuda::block_copy_check(&ok, 1) == nullptr, "check: a valid item passes");
    expect(cf::cuda::block_copy_check(&odd, 1) != nullptr, "check: a size not a multiple of 16 is refused");
    expect(cf::cuda::block_copy_check(&misaligned, 1) != nullptr, "check: a misaligned pointer is refused");
    expect(cf::cuda::block_copy_check(&null, 1) != nullptr, "check: a null pointer is refused");
    expect(cf::cuda::block_copy_check(nullptr, 1) != nullptr, "check: a null list is refused");
    expect(cf::cuda::block_copy_check(nullptr, 0) == nullptr, "check: an empty list passes");
}

// GB/s of moving n_swap scattered blocks of shape s to the host and back: the kernel, one cudaMemcpyAsync
// per range, and one contiguous pinned cudaMemcpyAsync of the same bytes.
void bench(const Shape & s, int n_swap) {
    const int n_pools = 2 * s.n_layers;
    const size_t pool_bytes = (size_t) s.n_blocks * (size_t) s.range_bytes;
    std::vector<uint8_t *> pools(n_pools);
    for (auto & p : pools) CHECK_CUDA(cudaMalloc(&p, pool_bytes));
    const int64_t block_bytes = 2 * s.n_layers * s.range_bytes;
    const size_t total = (size_t) n_swap * (size_t) block_bytes;
    uint8_t * host = nullptr;
    uint8_t * dev_flat = nullptr;
    CHECK_CUDA(cudaMallocHost(&host, total));
    CHECK_CUDA(cudaMalloc(&dev_flat, total));
    std::memset(host, 1, total);
    std::mt19937 rng(7);
    std::vector<int> perm(s.n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> blocks(perm.begin(), perm.begin() + n_swap);
    std::vector<int> slots(n_swap);
    std::iota(slots.begin(), slots.end(), 0);
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    auto time_ms = [&](auto && body) {
        body();  // warm-up
        CHECK_CUDA(cudaStreamSynchronize(stream));
        float best = 1e30f;
        for (int r = 0; r < 5; ++r) {
            CHECK_CUDA(cudaEventRecord(e0, stream));
            body();
            CHECK_CUDA(cudaEventRecord(e1, stream));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms;
            CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            best = std::min(best, ms);
        }
        return best;
    };
    for (int to_host = 1; to_host >= 0; --to_host) {
        const std::vector<cf_cuda_copy_item> items = swap_items(s, pools.data(), host, blocks, slots, to_host != 0);
        cf_cuda_copy_item * items_dev = nullptr;
        CHECK_CUDA(cudaMalloc(&items_dev, items.size() * sizeof(cf_cuda_copy_item)));
        CHECK_CUDA(cudaMemcpy(items_dev, items.data(), items.size() * sizeof(cf_cuda_copy_item), cudaMemcpyHostToDevice));
        const float k_ms = time_ms([&] { cf::cuda::block_copy_launch(items_dev, (int32_t) items.size(), stream); });
        const float m_ms = time_ms([&] {
            for (const auto & it : items) {
                CHECK_CUDA(cudaMemcpyAsync(it.dst, it.src, (size_t) it.n_bytes, cudaMemcpyDefault, stream));
            }
        });
        const float f_ms = time_ms([&] {
            CHECK_CUDA(cudaMemcpyAsync(to_host ? (void *) host : (void *) dev_flat, to_host ? (void *) dev_flat : (void *) host,
                                       total, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream));
        });
        auto gbs = [&](float ms) { return (double) total / ((double) ms * 1e-3) / 1e9; };
        std::printf("measured: %s %d blocks x %d layers x K,V of %lld B (%.1f MiB): kernel %.3f ms %.1f GB/s | "
                    "cudaMemcpyAsync per range (%zu calls) %.3f ms %.1f GB/s | one contiguous pinned memcpy %.3f ms %.1f GB/s\n",
                    to_host ? "device->host" : "host->device", n_swap, s.n_layers, (long long) s.range_bytes,
                    (double) total / (1 << 20), k_ms, gbs(k_ms), items.size(), m_ms, gbs(m_ms), f_ms, gbs(f_ms));
        CHECK_CUDA(cudaFree(items_dev));
    }
    for (uint8_t * p : pools) CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFreeHost(host));
    CHECK_CUDA(cudaFree(dev_flat));
    CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main() {
    test_checks();
    test_swap_round_trip({2, 16 * 128, 40}, 1);     // 2 KiB ranges: 16 rows of 64 f16
    test_swap_round_trip({16, 16 * 1024, 96}, 2);   // Llama-3.2-1B shape: 8 KV heads x 64, block size 16
    test_swap_round_trip({3, 48, 30}, 3);           // 48-byte ranges: the tail loop only
    if (failures == 0) {
        bench({16, 16 * 1024, 4096}, 1024);   // 1B shape: 1,024 blocks = 16K tokens, 512 MiB
        bench({32, 16 * 2048, 2048}, 512);    // 8B shape (8 KV heads x 128): 512 blocks = 8K tokens, 1 GiB
    }
    std::printf("%s (%d failures)\n", failures == 0 ? "PASS" : "FAIL", failures);
    return failures == 0 ? 0 : 1;
}
