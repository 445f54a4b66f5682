// copy_stream.cu - CacheFlow's KV block copies on a per-device CUDA side stream (contract: copy_stream_api.h).
//
// Compiled into the ggml-cuda target (hook of patches/0004 for CacheFlow's CUDA sources). patches/0011 declares
// the two ggml-facing functions at the end of this file in ggml-cuda.cu: its graph evaluation calls
// ggml_cuda_cf_before_graph first, and its registry's get_proc_address asks ggml_cuda_cf_proc_address for names
// it does not know, which is how the engine reaches the functions of copy_stream_api.h.
//
// Ordering (one device):
//   - copies run on the side stream in the order they were enqueued (a swap-out that reads block b runs before
//     a later swap-in or copy that writes b; a host slot read by a swap-in is rewritten only by a later
//     swap-out);
//   - every graph evaluation of ggml-cuda on that device first makes its compute stream wait for the `due`
//     event (cudaStreamWaitEvent, before any CUDA graph capture or launch, so it is never captured). `due` is
//     recorded on the side stream after each batch of copy_async and at each copy_release, so it marks the
//     latest stream position graphs depend on; deferred batches enqueued after it (copy_async_deferred) run
//     beside the graphs until the next release (the engine releases at the start of the next step);
//   - the side stream does not wait for the compute stream: the engine synchronizes its context after every
//     step (it reads the step's logits or token ids) and before it enqueues copies, so no kernel that writes or
//     reads the pools is still running.
#include "ggml-cuda/common.cuh"

#include "block_copy.cuh"
#include "copy_stream_api.h"
#include "kv_stream.cuh"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

namespace {

struct KindState {
    cudaEvent_t start = nullptr;
    cudaEvent_t done = nullptr;
    bool timing_pending = false;           // the last batch's elapsed time is not yet added to ns
    bool deferred = false;                 // the last batch was enqueued by copy_async_deferred
    int64_t ns = 0;                        // device time of completed batches
    int64_t deferred_ns = 0;               // of which, deferred batches
    cf_cuda_copy_item * host_items = nullptr;  // pinned staging of the item list, `capacity` items
    cf_cuda_copy_item * dev_items = nullptr;   // its device copy, read by the kernel
    int32_t capacity = 0;
};

struct DeviceState {
    std::mutex mu;
    std::atomic<bool> used{false};         // a batch was ever enqueued (read without the mutex)
    cudaStream_t stream = nullptr;
    std::array<KindState, CF_CUDA_COPY_KINDS> kinds;
    cudaEvent_t due = nullptr;             // graphs wait for it (see the ordering above)
    bool due_recorded = false;
    cudaEvent_t last_deferred_done = nullptr;  // done event of the latest deferred batch
    bool deferred_unreleased = false;      // a deferred batch was enqueued since the last release
    int64_t num_graphs_beside = 0;         // graphs enqueued while an unreleased deferred batch still ran
    int32_t last_deferred_kind = -1;       // kind of the latest deferred batch (its events are kinds[kind]'s)
    // Device-timeline probe: the first graph evaluated while a deferred batch is unreleased records
    // graph_begin on its compute stream; once that event and the batch's done event have completed, the
    // batch's end is compared with the graph's start on the device (cudaEventElapsedTime across streams).
    cudaEvent_t graph_begin = nullptr;
    int32_t probe_kind = -1;               // kinds[probe_kind] holds the probed batch's events; -1: none pending
    int64_t num_graphs_overlapping = 0;    // graphs that began on the device before the batch beside them ended
    int64_t overlap_ns = 0;                // summed: that batch's end - the graph's start (both on the device)
};

DeviceState & device_state(int device) {
    static DeviceState states[GGML_CUDA_MAX_DEVICES];
    return states[device];
}

bool valid_device(int device) {
    return device >= 0 && device < ggml_cuda_info().device_count && device < GGML_CUDA_MAX_DEVICES;
}

int report(cudaError_t err, const char * what) {
    GGML_LOG_ERROR("cacheflow copy stream: %s: %s\n", what, cudaGetErrorString(err));
    return (int) err;
}

// Adds the last batch's device time to k.ns once its events are complete (waits for them if `wait`).
void harvest(KindState & k, bool wait) {
    if (!k.timing_pending) {
        return;
    }
    const cudaError_t status = wait ? cudaEventSynchronize(k.done) : cudaEventQuery(k.done);
    if (status == cudaErrorNotReady) {
        return;
    }
    if (status == cudaSuccess) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, k.start, k.done) == cudaSuccess) {
            const int64_t ns = (int64_t) ((double) ms * 1e6);
            k.ns += ns;
            k.deferred_ns += k.deferred ? ns : 0;
        }
    }
    (void) cudaGetLastError();
    k.timing_pending = false;
}

// Resolves the device-timeline probe once its events have completed (waits for them if `wait`).
void resolve_probe(DeviceState & s, bool wait) {
    if (s.probe_kind < 0) {
        return;
    }
    KindState & k = s.kinds[s.probe_kind];
    for (cudaEvent_t e : {s.graph_begin, k.done}) {
        const cudaError_t status = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
        if (status == cudaErrorNotReady) {
            (void) cudaGetLastError();
            return;
        }
    }
    float to_graph_ms = 0.0f;
    float to_done_ms = 0.0f;
    if (cudaEventElapsedTime(&to_graph_ms, k.start, s.graph_begin) == cudaSuccess &&
        cudaEventElapsedTime(&to_done_ms, k.start, k.done) == cudaSuccess && to_graph_ms < to_done_ms) {
        // the graph began before the batch ended: they ran at once from max(start, graph) to the batch's end
        s.num_graphs_overlapping += 1;
        s.overlap_ns += (int64_t) ((double) (to_done_ms - std::max(to_graph_ms, 0.0f)) * 1e6);
    }
    (void) cudaGetLastError();
    s.probe_kind = -1;
}

cudaError_t init_locked(DeviceState & s) {
    if (s.stream != nullptr) {
        return cudaSuccess;
    }
    cudaError_t err = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
    if (err == cudaSuccess) {
        err = cudaEventCreateWithFlags(&s.due, cudaEventDisableTiming);
    }
    if (err == cudaSuccess) {
        err = cudaEventCreate(&s.graph_begin);
    }
    for (KindState & k : s.kinds) {
        if (err == cudaSuccess) {
            err = cudaEventCreate(&k.start);
        }
        if (err == cudaSuccess) {
            err = cudaEventCreate(&k.done);
        }
    }
    return err;
}

// Room for n items in k's staging buffers; the previous batch of this kind is done (harvest waited).
cudaError_t reserve_locked(KindState & k, int32_t n) {
    if (n <= k.capacity) {
        return cudaSuccess;
    }
    const int32_t cap = std::max<int32_t>({n, 2 * k.capacity, 4096});
    if (k.host_items != nullptr) {
        cudaFreeHost(k.host_items);
        k.host_items = nullptr;
    }
    if (k.dev_items != nullptr) {
        cudaFree(k.dev_items);
        k.dev_items = nullptr;
    }
    k.capacity = 0;
    cudaError_t err = cudaMallocHost(&k.host_items, (size_t) cap * sizeof(cf_cuda_copy_item));
    if (err == cudaSuccess) {
        err = cudaMalloc(&k.dev_items, (size_t) cap * sizeof(cf_cuda_copy_item));
    }
    if (err == cudaSuccess) {
        k.capacity = cap;
    }
    return err;
}

int enqueue(int device, const cf_cuda_copy_item * items, int32_t n_items, int32_t kind, bool deferred) {
    if (!valid_device(device) || kind < 0 || kind >= CF_CUDA_COPY_KINDS) {
        GGML_LOG_ERROR("cacheflow copy stream: device %d or kind %d out of range\n", device, (int) kind);
        return -1;
    }
    if (const char * err = cf::cuda::block_copy_check(items, n_items)) {
        GGML_LOG_ERROR("cacheflow copy stream: %s\n", err);
        return -1;
    }
    if (n_items == 0) {
        return 0;
    }
    DeviceState & s = device_state(device);
    std::lock_guard<std::mutex> lock(s.mu);
    ggml_cuda_set_device(device);
    cudaError_t err = init_locked(s);
    if (err != cudaSuccess) {
        return report(err, "creating the side stream");
    }
    KindState & k = s.kinds[kind];
    harvest(k, /*wait=*/true);  // its staging buffers are about to be rewritten
    if (s.probe_kind == kind) {
        resolve_probe(s, /*wait=*/true);  // its events are about to be recorded again
    }
    if ((err = reserve_locked(k, n_items)) != cudaSuccess) {
        return report(err, "allocating the item list");
    }
    std::memcpy(k.host_items, items, (size_t) n_items * sizeof(cf_cuda_copy_item));
    const size_t list_bytes = (size_t) n_items * sizeof(cf_cuda_copy_item);
    if ((err = cudaEventRecord(k.start, s.stream)) != cudaSuccess ||
        (err = cudaMemcpyAsync(k.dev_items, k.host_items, list_bytes, cudaMemcpyHostToDevice, s.stream)) !=
            cudaSuccess) {
        return report(err, "enqueueing the item list");
    }
    cf::cuda::block_copy_launch(k.dev_items, n_items, s.stream);
    if ((err = cudaGetLastError()) != cudaSuccess || (err = cudaEventRecord(k.done, s.stream)) != cudaSuccess) {
        return report(err, "launching the block copies");
    }
    k.timing_pending = true;
    k.deferred = deferred;
    if (deferred) {
        s.last_deferred_done = k.done;
        s.last_deferred_kind = kind;
        s.deferred_unreleased = true;
    } else {
        if ((err = cudaEventRecord(s.due, s.stream)) != cudaSuccess) {
            return report(err, "recording the copies' event");
        }
        s.due_recorded = true;
    }
    s.used.store(true, std::memory_order_release);
    return 0;
}

int copy_async(int device, const cf_cuda_copy_item * items, int32_t n_items, int32_t kind) {
    return enqueue(device, items, n_items, kind, /*deferred=*/false);
}

int copy_async_deferred(int device, const cf_cuda_copy_item * items, int32_t n_items, int32_t kind) {
    return enqueue(device, items, n_items, kind, /*deferred=*/true);
}

int copy_release(int device) {
    if (!valid_device(device)) {
        return -1;
    }
    DeviceState & s = device_state(device);
    if (!s.used.load(std::memory_order_acquire)) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.deferred_unreleased) {
        return 0;  // `due` already marks the latest batch
    }
    ggml_cuda_set_device(device);
    const cudaError_t err = cudaEventRecord(s.due, s.stream);
    if (err != cudaSuccess) {
        return report(err, "releasing the deferred copies");
    }
    s.due_recorded = true;
    s.deferred_unreleased = false;
    return 0;
}

void copy_overlap(int device, int64_t out[4]) {
    out[0] = out[1] = out[2] = out[3] = 0;
    if (!valid_device(device)) {
        return;
    }
    DeviceState & s = device_state(device);
    if (!s.used.load(std::memory_order_acquire)) {
        return;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    for (KindState & k : s.kinds) {
        harvest(k, /*wait=*/false);
        out[0] += k.deferred_ns;
    }
    out[1] = s.num_graphs_beside;
    resolve_probe(s, /*wait=*/false);
    out[2] = s.num_graphs_overlapping;
    out[3] = s.overlap_ns;
}

int copy_fence(int device) {
    if (!valid_device(device)) {
        return -1;
    }
    DeviceState & s = device_state(device);
    if (!s.used.load(std::memory_order_acquire)) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    ggml_cuda_set_device(device);
    const cudaError_t err = cudaStreamSynchronize(s.stream);
    for (KindState & k : s.kinds) {
        harvest(k, /*wait=*/false);
    }
    return err == cudaSuccess ? 0 : report(err, "waiting for the block copies");
}

int pointer_device(const void * ptr) {
    cudaPointerAttributes attr{};
    if (ptr == nullptr || cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void) cudaGetLastError();
        return -1;
    }
    return attr.type == cudaMemoryTypeDevice ? attr.device : -1;
}

void copy_times(int device, int64_t ns[CF_CUDA_COPY_KINDS]) {
    std::fill(ns, ns + CF_CUDA_COPY_KINDS, int64_t{0});
    if (!valid_device(device)) {
        return;
    }
    DeviceState & s = device_state(device);
    if (!s.used.load(std::memory_order_acquire)) {
        return;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    for (int i = 0; i < CF_CUDA_COPY_KINDS; ++i) {
        harvest(s.kinds[i], /*wait=*/false);
        ns[i] = s.kinds[i].ns;
    }
}

}  // namespace

// The compute stream of ctx waits (on the device, not the host) for the copies due so far; deferred batches
// not yet released run on beside the graph (counted when one still runs as the graph is enqueued).
void ggml_cuda_cf_before_graph(ggml_backend_cuda_context & ctx) {
    if (!valid_device(ctx.device)) {
        return;
    }
    DeviceState & s = device_state(ctx.device);
    if (!s.used.load(std::memory_order_acquire)) {
        return;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.due_recorded) {
        CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), s.due, 0));
    }
    if (s.deferred_unreleased) {
        const cudaError_t status = cudaEventQuery(s.last_deferred_done);
        if (status == cudaErrorNotReady) {
            s.num_graphs_beside += 1;
            (void) cudaGetLastError();  // "not ready" is no error for ggml-cuda's later checks
        }
        resolve_probe(s, /*wait=*/false);
        if (s.probe_kind < 0 && s.last_deferred_kind >= 0) {
            // where this graph starts on the device, for the latest deferred batch's end to be compared with
            // (recorded before any capture or launch of the graph, like the wait above)
            CUDA_CHECK(cudaEventRecord(s.graph_begin, ctx.stream()));
            s.probe_kind = s.last_deferred_kind;
        }
    }
}

// The functions of copy_stream_api.h and kv_stream.h by name; nullptr for any other name.
void * ggml_cuda_cf_proc_address(const char * name) {
    if (std::strcmp(name, "ggml_cuda_cf_copy_async") == 0) {
        return (void *) static_cast<cf_cuda_copy_async_fn>(copy_async);
    }
    if (std::strcmp(name, "ggml_cuda_cf_copy_async_deferred") == 0) {
        return (void *) static_cast<cf_cuda_copy_async_deferred_fn>(copy_async_deferred);
    }
    if (std::strcmp(name, "ggml_cuda_cf_copy_release") == 0) {
        return (void *) static_cast<cf_cuda_copy_release_fn>(copy_release);
    }
    if (std::strcmp(name, "ggml_cuda_cf_copy_overlap") == 0) {
        return (void *) static_cast<cf_cuda_copy_overlap_fn>(copy_overlap);
    }
    if (std::strcmp(name, "ggml_cuda_cf_copy_fence") == 0) {
        return (void *) static_cast<cf_cuda_copy_fence_fn>(copy_fence);
    }
    if (std::strcmp(name, "ggml_cuda_cf_pointer_device") == 0) {
        return (void *) static_cast<cf_cuda_pointer_device_fn>(pointer_device);
    }
    if (std::strcmp(name, "ggml_cuda_cf_copy_times") == 0) {
        return (void *) static_cast<cf_cuda_copy_times_fn>(copy_times);
    }
    if (std::strcmp(name, "ggml_cuda_cf_kv_stream_reserve") == 0) {  // kv_stream.h, kv_stream.cu
        return (void *) static_cast<cf_cuda_kv_stream_reserve_fn>(cf::cuda::kv_stream_reserve);
    }
    if (std::strcmp(name, "ggml_cuda_cf_kv_stream_release") == 0) {
        return (void *) static_cast<cf_cuda_kv_stream_release_fn>(cf::cuda::kv_stream_release);
    }
    if (std::strcmp(name, "ggml_cuda_cf_kv_stream_stats") == 0) {
        return (void *) static_cast<cf_cuda_kv_stream_stats_fn>(cf::cuda::kv_stream_stats);
    }
    return nullptr;
}
