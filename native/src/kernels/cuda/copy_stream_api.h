/* copy_stream_api.h - CacheFlow's KV block copies on a CUDA side stream: the C interface between the engine
 * (libcacheflow, no CUDA headers) and copy_stream.cu (compiled into ggml-cuda, reached through the CUDA
 * backend registry's get_proc_address, patches/0011).
 *
 * What it does: a list of copies (device pool <-> pinned host memory, or device <-> device) runs as one
 * kernel launch on a per-device side stream, not as one synchronous cudaMemcpy per block, layer and
 * tensor; ggml-cuda's compute stream waits for the copies due so far (an event, no host wait) before it
 * evaluates its next graph: a batch is due at once (ggml_cuda_cf_copy_async) or once released
 * (ggml_cuda_cf_copy_async_deferred, then ggml_cuda_cf_copy_release). The host returns as soon as the
 * copies are enqueued.
 *
 * Ownership: the caller owns every buffer an item names and keeps it alive and unchanged until the
 * copies are known to be done (a later fence, or a graph evaluation that waited for them and was
 * synchronized). Host buffers must be pinned (cudaMallocHost / ggml's CUDA host buffer type) and are
 * addressed with their host pointers (unified addressing).
 * Thread-safety: calls for one device are serialized by a mutex; different devices are independent.
 */
#ifndef CF_COPY_STREAM_API_H
#define CF_COPY_STREAM_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One copy: n_bytes from src to dst. Both pointers 16-byte aligned and n_bytes a multiple of 16 (KV rows of
 * f16 heads of 8 or more elements always are); the ranges must not overlap. */
typedef struct cf_cuda_copy_item {
    const void * src;
    void * dst;
    int64_t n_bytes;
} cf_cuda_copy_item;

/* What a batch of copies is for: timing is kept per kind. */
enum {
    CF_CUDA_COPY_SWAP_OUT = 0, /* device pool -> pinned host */
    CF_CUDA_COPY_SWAP_IN = 1,  /* pinned host -> device pool */
    CF_CUDA_COPY_BLOCKS = 2,   /* device -> device (copy-on-write) */
    CF_CUDA_COPY_KINDS = 3
};

/* "ggml_cuda_cf_copy_async": enqueue n_items >= 0 copies of one kind on `device`'s side stream, after
 * every copy enqueued before; the compute stream of every ggml-cuda context of that device waits for them
 * before its next graph evaluation. Returns 0, or a cudaError_t value (nothing enqueued; the message is
 * logged through ggml), or -1 for invalid arguments (alignment, kind, device). */
typedef int (*cf_cuda_copy_async_fn)(int device, const cf_cuda_copy_item * items, int32_t n_items, int32_t kind);

/* "ggml_cuda_cf_copy_async_deferred": like ggml_cuda_cf_copy_async, but graph evaluations do not wait for
 * this batch until the next ggml_cuda_cf_copy_release on `device` (swaps one step ahead: a step's swap-outs
 * and swap-ins run beside that step's graph; the next step's graph waits for them). The caller guarantees
 * that no graph evaluated before that release reads or writes what the batch touches. Later batches still
 * run after it (one in-order stream). Same returns as ggml_cuda_cf_copy_async. */
typedef int (*cf_cuda_copy_async_deferred_fn)(int device, const cf_cuda_copy_item * items, int32_t n_items,
                                              int32_t kind);

/* "ggml_cuda_cf_copy_release": every batch enqueued on `device` so far, deferred or not, is waited for by the
 * graph evaluations from now on (on the device; no host wait). 0, -1 for an invalid device, or a cudaError_t. */
typedef int (*cf_cuda_copy_release_fn)(int device);

/* "ggml_cuda_cf_copy_overlap": overlap counters of `device` since start: out[0] = device time of the completed
 * deferred batches, ns; out[1] = graph evaluations that began (were enqueued) while a deferred batch not yet
 * released was still running on the device (checked with cudaEventQuery when the graph is enqueued);
 * on the device timeline (CUDA events: one on the compute stream where the first graph evaluated beside an
 * unreleased deferred batch starts, compared with the latest such batch's done event): out[2] = graphs that
 * began on the device before the batch beside them had ended, out[3] = the time they ran at once, ns (the
 * batch's end minus the later of its start and the graph's start, summed). Probes still in flight are not
 * counted yet. */
typedef void (*cf_cuda_copy_overlap_fn)(int device, int64_t out[4]);

/* "ggml_cuda_cf_copy_fence": the host waits until every copy enqueued on `device` is done. 0 or a cudaError_t. */
typedef int (*cf_cuda_copy_fence_fn)(int device);

/* "ggml_cuda_cf_pointer_device": the ordinal of the CUDA device whose memory holds ptr, -1 if ptr is not
 * device memory. */
typedef int (*cf_cuda_pointer_device_fn)(const void * ptr);

/* "ggml_cuda_cf_copy_times": device time of the completed batches on `device` since start, per kind, in
 * nanoseconds (CUDA events around each batch; a batch still running is not counted yet). */
typedef void (*cf_cuda_copy_times_fn)(int device, int64_t ns[CF_CUDA_COPY_KINDS]);

#ifdef __cplusplus
}
#endif

#endif /* CF_COPY_STREAM_API_H */
