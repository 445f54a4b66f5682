// kv_stream.cu - KV streaming on CUDA (issue 16): the staging pool, side stream and events of each descriptor, the
// gather kernel, and the per-layer orchestration the paged attention op calls (contracts: ../kv_stream.h,
// kv_stream.cuh). Layer-ahead prefetch after FastFlowLM's KV streaming.
//
// Ordering of one decode (n = n_layer, d = depth, slot s(L) = L % d, compute = the op's stream):
//   layer 0 before:  record fork on compute; side waits fork (so the copies come after the previous decode's
//                    reads of every slot); side: gather(l), record copied[s(l)] for l in [0, min(d, n));
//   layer L before:  compute waits copied[s(L)];
//   layer L after:   if L + d < n: record read[s(L)] on compute; side waits it; gather(L + d); record copied[s(L)].
// The side stream's last work is gather(n - 1), which layer n - 1's wait joins back into compute, so a capture of
// the whole decode on compute is joined (cudaStreamEndCapture accepts it). While compute is capturing nothing here
// queries, synchronizes or allocates.
// Counters (device, written by the last CTA of each gather, so they count graph replays too): [0] CTA ticket,
// [1] bytes staged, [2] ns (%globaltimer, first CTA's start to last CTA's end), [3] decodes that staged, [4] start.
#include "kv_stream.cuh"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace cf {
namespace cuda {

namespace {

#define CF_KVS_STR2(x) #x
#define CF_KVS_STR(x) CF_KVS_STR2(x)
#define CF_KVS_WHERE __FILE__ ":" CF_KVS_STR(__LINE__) ": "

constexpr int kGatherThreads = 256;
constexpr int kGatherUnroll = 4;  // 16-byte loads in flight per thread
constexpr int kUnitChunks = kGatherThreads * kGatherUnroll;  // 16-byte chunks per CTA work unit (16 KiB)
enum { kTicket = 0, kBytes = 1, kNs = 2, kDecodes = 3, kStart = 4 };

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Work unit u = (staged block j = u / units_per_block, piece u % units_per_block) of kUnitChunks 16-byte chunks of
// the block's K bytes then V bytes; CTAs take units u = blockIdx.x, + gridDim.x, ...
__global__ void __launch_bounds__(kGatherThreads) kv_gather_kernel(const KvGatherArgs a) {
    __shared__ int n_s;
    __shared__ const uint8_t * src_s;
    const int tid = threadIdx.x;
    if (tid == 0) {
        n_s = min(max(*a.num_staged, 0), a.max_staged);
        if (blockIdx.x == 0 && a.counters != nullptr) {
            a.counters[kStart] = global_ns();
        }
    }
    __syncthreads();
    const int n = n_s;
    const int64_t k_chunks = a.k_block_bytes / 16;
    const int64_t block_chunks = k_chunks + a.v_block_bytes / 16;
    const int64_t units_per_block = (block_chunks + kUnitChunks - 1) / kUnitChunks;
    for (int64_t u = blockIdx.x; u < (int64_t) n * units_per_block; u += gridDim.x) {
        const int64_t j = u / units_per_block;
        const int64_t c0 = (u - j * units_per_block) * kUnitChunks;
        if (tid == 0) {
            src_s = a.host_base + (int64_t) a.staged_slots[j] * a.host_block_bytes + a.layer_offset_bytes;
        }
        __syncthreads();
        const uint8_t * src = src_s;
        uint4 v[kGatherUnroll];
#pragma unroll
        for (int r = 0; r < kGatherUnroll; ++r) {
            const int64_t c = c0 + r * kGatherThreads + tid;
            if (c < block_chunks) {
                v[r] = *reinterpret_cast<const uint4 *>(src + c * 16);
            }
        }
#pragma unroll
        for (int r = 0; r < kGatherUnroll; ++r) {
            const int64_t c = c0 + r * kGatherThreads + tid;
            if (c < k_chunks) {
                *reinterpret_cast<uint4 *>(a.k_dst + j * a.k_block_bytes + c * 16) = v[r];
            } else if (c < block_chunks) {
                *reinterpret_cast<uint4 *>(a.v_dst + j * a.v_block_bytes + (c - k_chunks) * 16) = v[r];
            }
        }
        __syncthreads();  // src_s is rewritten by the next unit
    }
    // nothing staged (every CTA read the same *num_staged, which changes only between decodes): no counter work,
    // so an empty launch in a decode that streams nothing is as short as a launch can be; the ticket stays 0
    if (a.counters == nullptr || n == 0) {
        return;
    }
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        const unsigned long long ticket = atomicAdd(&a.counters[kTicket], 1ull);
        if (ticket == gridDim.x - 1) {  // the last CTA: every other CTA's writes (and CTA 0's start) are visible
            __threadfence();
            volatile unsigned long long * c = a.counters;
            const unsigned long long end = global_ns();
            c[kNs] = c[kNs] + (end > c[kStart] ? end - c[kStart] : 0ull);
            c[kBytes] = c[kBytes] + (unsigned long long) n * (unsigned long long) (block_chunks * 16);
            c[kDecodes] = c[kDecodes] + (a.count_decode && n > 0 ? 1ull : 0ull);
            c[kTicket] = 0ull;  // the next launch on this stream starts from 0
        }
    }
}

struct State {
    int device = -1;
    int n_layer = 0, depth = 0, max_staged = 0;
    int64_t k_block_bytes = 0, v_block_bytes = 0, base_row = 0;
    cudaStream_t side = nullptr;
    uint8_t * stage = nullptr;                 // [depth][max_staged][k_block] K, then [depth][max_staged][v_block] V
    unsigned long long * counters = nullptr;   // [kKvCounters] device
    cudaEvent_t fork = nullptr;
    std::vector<cudaEvent_t> copied, read;     // [depth]
    KvGatherArgs gather{};                     // layer-independent fields
    int grid = 1;
    int next_layer = 0;                        // the layer the next before-hook expects (0 starts a decode)
    int64_t waited = 0;
    bool waited_known = false;
    int64_t last_stats[4] = {0, 0, -1, 0};
};

std::mutex g_mu;
std::unordered_map<const cf_kv_stream_desc *, State *> g_states;

const char * fail(const char * where, const char * what, cudaError_t err) {
    static thread_local char message[320];
    std::snprintf(message, sizeof(message), "%skv stream: %s%s%s", where, what, err == cudaSuccess ? "" : ": ",
                  err == cudaSuccess ? "" : cudaGetErrorString(err));
    return message;
}

// Device-usable alias of pinned host memory p (unified addressing: usually p itself), nullptr if not pinned.
const void * device_alias(const void * p) {
    cudaPointerAttributes attr{};
    if (p == nullptr || cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void) cudaGetLastError();
        return nullptr;
    }
    return attr.type == cudaMemoryTypeHost ? attr.devicePointer : nullptr;
}

bool fields_valid(const cf_kv_stream_desc * d) {
    return d->n_layer >= 1 && d->block_size >= 1 && d->stage_base_block >= 0 && d->max_staged >= 1 &&
           d->depth >= 1 && d->depth <= d->n_layer && d->device >= 0 && d->k_row_bytes > 0 && d->k_row_bytes % 16 == 0 &&
           d->v_row_bytes > 0 && d->v_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(d->host_base) % 16 == 0 &&
           d->host_block_bytes == (int64_t) d->n_layer * d->block_size * (d->k_row_bytes + d->v_row_bytes) &&
           (int64_t) d->stage_base_block * d->block_size + (int64_t) d->max_staged * d->block_size <= INT32_MAX &&
           d->staged_slots != nullptr && d->num_staged != nullptr;
}

void destroy(State * s) {
    if (s->side != nullptr) {
        cudaStreamSynchronize(s->side);
        cudaStreamDestroy(s->side);
    }
    for (cudaEvent_t e : s->copied) cudaEventDestroy(e);
    for (cudaEvent_t e : s->read) cudaEventDestroy(e);
    if (s->fork != nullptr) cudaEventDestroy(s->fork);
    cudaFree(s->stage);
    cudaFree(s->counters);
    (void) cudaGetLastError();
    delete s;
}

cudaError_t create(const cf_kv_stream_desc * d, State * s) {
    s->device = d->device;
    s->n_layer = d->n_layer;
    s->depth = d->depth;
    s->max_staged = d->max_staged;
    s->k_block_bytes = (int64_t) d->block_size * d->k_row_bytes;
    s->v_block_bytes = (int64_t) d->block_size * d->v_row_bytes;
    s->base_row = (int64_t) d->stage_base_block * d->block_size;
    const size_t slot_bytes = (size_t) d->max_staged * (size_t) (s->k_block_bytes + s->v_block_bytes);
    cudaError_t err = cudaMalloc(&s->stage, slot_bytes * (size_t) d->depth);
    if (err == cudaSuccess) err = cudaMalloc(&s->counters, kKvCounters * sizeof(unsigned long long));
    if (err == cudaSuccess) err = cudaMemset(s->counters, 0, kKvCounters * sizeof(unsigned long long));
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming);
    s->copied.assign(d->depth, nullptr);
    s->read.assign(d->depth, nullptr);
    for (int i = 0; i < d->depth && err == cudaSuccess; ++i) {
        err = cudaEventCreateWithFlags(&s->copied[i], cudaEventDisableTiming);
        if (err == cudaSuccess) err = cudaEventCreateWithFlags(&s->read[i], cudaEventDisableTiming);
    }
    int num_sms = 0;
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, d->device);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();  // the memset is done before any stream uses counters
    KvGatherArgs & g = s->gather;
    g.host_base = static_cast<const uint8_t *>(device_alias(d->host_base));
    g.host_block_bytes = d->host_block_bytes;
    g.staged_slots = static_cast<const int32_t *>(device_alias(d->staged_slots));
    g.num_staged = static_cast<const int32_t *>(device_alias(d->num_staged));
    g.max_staged = d->max_staged;
    g.k_block_bytes = s->k_block_bytes;
    g.v_block_bytes = s->v_block_bytes;
    g.counters = s->counters;
    s->grid = kv_gather_grid(g, num_sms);
    if (err == cudaSuccess && (g.host_base == nullptr || g.staged_slots == nullptr || g.num_staged == nullptr)) {
        err = cudaErrorInvalidHostPointer;
    }
    return err;
}

// gather(l) into slot l % depth on the side stream, then copied[slot].
cudaError_t issue(State * s, int l) {
    const int slot = l % s->depth;
    KvGatherArgs g = s->gather;
    g.layer_offset_bytes = (int64_t) l * (s->k_block_bytes + s->v_block_bytes);
    g.k_dst = s->stage + (size_t) slot * s->max_staged * s->k_block_bytes;
    g.v_dst = s->stage + (size_t) s->depth * s->max_staged * s->k_block_bytes +
              (size_t) slot * s->max_staged * s->v_block_bytes;
    g.count_decode = l == 0;
    cudaError_t err = kv_gather_launch(g, s->grid, s->side);
    return err != cudaSuccess ? err : cudaEventRecord(s->copied[slot], s->side);
}

State * find_locked(const cf_kv_stream_desc * desc) {
    const auto it = g_states.find(desc);
    return it == g_states.end() ? nullptr : it->second;
}

}  // namespace

int kv_gather_grid(const KvGatherArgs & a, int num_sms) {
    const int64_t block_chunks = (a.k_block_bytes + a.v_block_bytes) / 16;
    const int64_t units = (int64_t) a.max_staged * ((block_chunks + kUnitChunks - 1) / kUnitChunks);
    // 2 CTAs per SM keep 2 x 16 KiB of host reads in flight per SM (about 4 MiB on an H200), far more than the host
    // link's bandwidth-delay product (~55 GB/s x ~2 us): on the H200 1, 2, 4 and 8 CTAs per SM all gather at 49.5-50 GB/s
    // and an empty launch takes 16.5 us at 2 or 8 per SM (results/h200_gpu/stop31; test_kv_stream_cuda --bench sweeps
    // the grid)
    return (int) std::max<int64_t>(1, std::min<int64_t>(units, 2 * (int64_t) std::max(num_sms, 1)));
}

cudaError_t kv_gather_launch(const KvGatherArgs & a, int grid, cudaStream_t stream) {
    kv_gather_kernel<<<grid, kGatherThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

int kv_stream_reserve(const cf_kv_stream_desc * desc) {
    if (desc == nullptr || !fields_valid(desc)) {
        std::fprintf(stderr, "cacheflow kv stream: invalid descriptor fields (kv_stream.h)\n");
        return -1;
    }
    std::lock_guard<std::mutex> lock(g_mu);
    if (find_locked(desc) != nullptr) {
        return 0;
    }
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t err = cudaSetDevice(desc->device);
    State * s = new State;
    if (err == cudaSuccess) err = create(desc, s);
    if (err != cudaSuccess) {
        std::fprintf(stderr, "cacheflow kv stream: reserve on device %d: %s (host_base, staged_slots and num_staged "
                     "must be pinned host memory)\n", desc->device, cudaGetErrorString(err));
        destroy(s);
        cudaSetDevice(prev);
        return (int) err;
    }
    g_states[desc] = s;
    cudaSetDevice(prev);
    return 0;
}

void kv_stream_release(const cf_kv_stream_desc * desc) {
    std::lock_guard<std::mutex> lock(g_mu);
    State * s = find_locked(desc);
    if (s == nullptr) {
        return;
    }
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(s->device);
    destroy(s);
    g_states.erase(desc);
    cudaSetDevice(prev);
}

void kv_stream_stats(const cf_kv_stream_desc * desc, int64_t out[4]) {
    std::lock_guard<std::mutex> lock(g_mu);
    State * s = find_locked(desc);
    out[0] = out[1] = out[3] = 0;
    out[2] = -1;
    if (s == nullptr) {
        return;
    }
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(s->device);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    unsigned long long c[kKvCounters] = {};
    if (cudaStreamIsCapturing(s->side, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone &&
        cudaMemcpyAsync(c, s->counters, sizeof(c), cudaMemcpyDeviceToHost, s->side) == cudaSuccess &&
        cudaStreamSynchronize(s->side) == cudaSuccess) {
        s->last_stats[0] = (int64_t) c[kBytes];
        s->last_stats[1] = (int64_t) c[kNs];
        s->last_stats[3] = (int64_t) c[kDecodes];
    }
    (void) cudaGetLastError();
    s->last_stats[2] = s->waited_known ? s->waited : -1;
    std::copy(s->last_stats, s->last_stats + 4, out);
    cudaSetDevice(prev);
}

const char * kv_stream_before_layer(cudaStream_t compute, const cf_kv_stream_desc * desc, int layer,
                                    KvStreamStage * stage) {
    std::lock_guard<std::mutex> lock(g_mu);
    State * s = find_locked(desc);
    if (s == nullptr) {
        return fail(CF_KVS_WHERE, "descriptor not reserved (ggml_cuda_cf_kv_stream_reserve before the first decode)",
                    cudaSuccess);
    }
    if (layer < 0 || layer >= s->n_layer || (layer != 0 && layer != s->next_layer)) {
        return fail(CF_KVS_WHERE, "layers of a decode must run in order 0..n_layer-1 (op params [6])", cudaSuccess);
    }
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(compute, &cs);
    if (err != cudaSuccess) {
        return fail(CF_KVS_WHERE, "cudaStreamIsCapturing", err);
    }
    const int slot = layer % s->depth;
    if (layer == 0) {
        err = cudaEventRecord(s->fork, compute);
        if (err == cudaSuccess) err = cudaStreamWaitEvent(s->side, s->fork, 0);
        for (int l = 0; l < s->depth && err == cudaSuccess; ++l) {
            err = issue(s, l);
        }
        if (err != cudaSuccess) {
            return fail(CF_KVS_WHERE, "forking the side stream / first copies", err);
        }
    }
    if (cs == cudaStreamCaptureStatusNone) {  // eager: would this layer wait for its copy?
        s->waited += cudaEventQuery(s->copied[slot]) == cudaErrorNotReady ? 1 : 0;
        s->waited_known = true;
        (void) cudaGetLastError();
    }
    if ((err = cudaStreamWaitEvent(compute, s->copied[slot], 0)) != cudaSuccess) {
        return fail(CF_KVS_WHERE, "waiting for the layer's copy", err);
    }
    s->next_layer = layer + 1;
    stage->k = reinterpret_cast<const half *>(s->stage + (size_t) slot * s->max_staged * s->k_block_bytes);
    stage->v = reinterpret_cast<const half *>(s->stage + (size_t) s->depth * s->max_staged * s->k_block_bytes +
                                              (size_t) slot * s->max_staged * s->v_block_bytes);
    stage->base_row = s->base_row;
    return nullptr;
}

const char * kv_stream_after_layer(cudaStream_t compute, const cf_kv_stream_desc * desc, int layer) {
    std::lock_guard<std::mutex> lock(g_mu);
    State * s = find_locked(desc);
    if (s == nullptr || layer != s->next_layer - 1) {
        return fail(CF_KVS_WHERE, "after-layer hook without its before-layer hook", cudaSuccess);
    }
    if (layer + s->depth >= s->n_layer) {
        return nullptr;
    }
    const int slot = layer % s->depth;
    cudaError_t err = cudaEventRecord(s->read[slot], compute);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(s->side, s->read[slot], 0);
    if (err == cudaSuccess) err = issue(s, layer + s->depth);
    return err == cudaSuccess ? nullptr : fail(CF_KVS_WHERE, "prefetching the next layer", err);
}

}  // namespace cuda
}  // namespace cf
