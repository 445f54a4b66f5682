// device_helpers.cuh - what the standalone CUDA tests and benchmarks share: CHECK_CUDA (print the error
// with file and line and exit 2), DeviceBuffer (an owned device array), and the device-to-device copy
// bandwidth that kernel figures are compared with. Header-only; each binary includes it once.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                                         \
    do {                                                                                      \
        cudaError_t err_ = (x);                                                               \
        if (err_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
            std::exit(2);                                                                     \
        }                                                                                     \
    } while (0)

namespace cf_test {

// n elements of T in device memory (at least one element is allocated), freed on destruction; not
// copyable. Errors exit the process (CHECK_CUDA).
template <typename T>
struct DeviceBuffer {
    T * ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(size_t count) : n(count) { CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T))); }
    explicit DeviceBuffer(const std::vector<T> & host) : DeviceBuffer(host.size()) { upload(host); }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer & operator=(const DeviceBuffer &) = delete;
    ~DeviceBuffer() { cudaFree(ptr); }
    void upload(const std::vector<T> & host) {  // host.size() <= n
        CHECK_CUDA(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> host(n);
        CHECK_CUDA(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
};

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written): 1 GiB cudaMemcpyAsync on `stream`,
// the median of 7 runs of 5 copies timed with CUDA events; the ceiling a memory-bound kernel is compared with.
inline double copy_bandwidth_gbs(cudaStream_t stream = nullptr) {
    const size_t n = (size_t) 1 << 30;
    DeviceBuffer<char> src(n), dst(n);
    CHECK_CUDA(cudaMemset(src.ptr, 1, n));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    CHECK_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyDeviceToDevice, stream));
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
        CHECK_CUDA(cudaEventRecord(e0, stream));
        for (int i = 0; i < 5; ++i) CHECK_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyDeviceToDevice, stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t / 5);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * n / (ms[ms.size() / 2] * 1e6);
}

}  // namespace cf_test
