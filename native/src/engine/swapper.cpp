// swapper.cpp - see swapper.h.
#include "engine/swapper.h"

#include "core/error.h"
#include "engine/engine.h"
#include "engine/llama_session.h"
#include "ggml-backend.h"
#include "kernels/cuda/copy_stream_api.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>

namespace cf {

// The copy stream's entry points (copy_stream_api.h) and, per layer, where one block of its K and V pools
// starts: block b of layer i is bytes [b * k_bytes, (b + 1) * k_bytes) of pools[i].k (V alike).
struct Swapper::CopyStream {
    cf_cuda_copy_async_fn copy_async = nullptr;
    cf_cuda_copy_async_deferred_fn copy_async_deferred = nullptr;
    cf_cuda_copy_release_fn release = nullptr;
    cf_cuda_copy_overlap_fn overlap = nullptr;
    cf_cuda_copy_fence_fn fence = nullptr;
    cf_cuda_copy_times_fn times = nullptr;
    struct Pool {
        uint8_t * k;
        uint8_t * v;
        int64_t k_bytes;  // one block: block_size rows
        int64_t v_bytes;
        int32_t device_index;  // into devices
    };
    std::vector<Pool> pools;
    std::vector<int> devices;                           // distinct CUDA ordinals holding pools
    std::vector<std::vector<cf_cuda_copy_item>> items;  // per device, scratch of one batch
};

namespace {

bool aligned16(const void * p, int64_t n) {
    return ((uintptr_t) p % 16 == 0) && n % 16 == 0;
}

// The copy stream when every pool of the session is on a CUDA device and the entry points exist, else
// nullptr (CACHEFLOW_SWAP_ASYNC=0 forces nullptr, for A/B runs).
std::unique_ptr<Swapper::CopyStream> make_copy_stream(LlamaSession & session) {
    if (env_int_in("CACHEFLOW_SWAP_ASYNC", 0, 1, 1) == 0) {
        return nullptr;
    }
    auto cs = std::make_unique<Swapper::CopyStream>();
    cs->copy_async = (cf_cuda_copy_async_fn) LlamaSession::cuda_proc("ggml_cuda_cf_copy_async");
    cs->fence = (cf_cuda_copy_fence_fn) LlamaSession::cuda_proc("ggml_cuda_cf_copy_fence");
    cs->times = (cf_cuda_copy_times_fn) LlamaSession::cuda_proc("ggml_cuda_cf_copy_times");
    cs->copy_async_deferred =
        (cf_cuda_copy_async_deferred_fn) LlamaSession::cuda_proc("ggml_cuda_cf_copy_async_deferred");
    cs->release = (cf_cuda_copy_release_fn) LlamaSession::cuda_proc("ggml_cuda_cf_copy_release");
    cs->overlap = (cf_cuda_copy_overlap_fn) LlamaSession::cuda_proc("ggml_cuda_cf_copy_overlap");
    auto pointer_device = (cf_cuda_pointer_device_fn) LlamaSession::cuda_proc("ggml_cuda_cf_pointer_device");
    if (cs->copy_async == nullptr || cs->copy_async_deferred == nullptr || cs->release == nullptr ||
        cs->overlap == nullptr || cs->fence == nullptr || cs->times == nullptr || pointer_device == nullptr) {
        return nullptr;
    }
    const int64_t bs = session.config().block_size;
    const std::vector<LlamaSession::PoolTensors> tensors = session.paged_pool_tensors();
    if (tensors.empty()) {
        return nullptr;
    }
    for (const LlamaSession::PoolTensors & t : tensors) {
        // a pool on an RPC device has a remote address as its data: never hand it to the CUDA runtime
        for (const ggml_tensor * pool : {t.k, t.v}) {
            ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(pool->buffer));
            if (dev == nullptr || std::strncmp(ggml_backend_dev_name(dev), "CUDA", 4) != 0) {
                return nullptr;  // llama copies, through the buffer's backend
            }
        }
        const int dev_k = pointer_device(t.k->data);
        const int dev_v = pointer_device(t.v->data);
        Swapper::CopyStream::Pool p{(uint8_t *) t.k->data, (uint8_t *) t.v->data, (int64_t) t.k->nb[1] * bs,
                                    (int64_t) t.v->nb[1] * bs, -1};
        if (dev_k < 0 || dev_k != dev_v || !aligned16(p.k, p.k_bytes) || !aligned16(p.v, p.v_bytes)) {
            return nullptr;  // a pool on the CPU (partial offload) or an unaligned row: llama copies
        }
        for (size_t d = 0; d < cs->devices.size(); ++d) {
            if (cs->devices[d] == dev_k) {
                p.device_index = (int32_t) d;
            }
        }
        if (p.device_index < 0) {
            p.device_index = (int32_t) cs->devices.size();
            cs->devices.push_back(dev_k);
        }
        cs->pools.push_back(p);
    }
    cs->items.resize(cs->devices.size());
    return cs;
}

}  // namespace

Swapper::Swapper(LlamaSession & session, int32_t num_slots, int64_t block_bytes)
    : session_(session), num_slots_(num_slots), block_bytes_(block_bytes) {
    assert(num_slots >= 0 && block_bytes >= 0);
    copy_stream_ = make_copy_stream(session);
    if (copy_stream_) {
        // The copy stream's counters are per device and process: what earlier engines of this process moved is
        // not this engine's (AUTO's swap rate came out ~25x too slow after a swap-mode engine in the same process).
        const SwapStats earlier = stats();
        measured_out_ns_ = earlier.out_ns;
        measured_in_ns_ = earlier.in_ns;
        measured_deferred_ns_ = earlier.deferred_ns;
        measured_graphs_ = earlier.num_graphs_beside;
        measured_graphs_overlapping_ = earlier.num_graphs_overlapping;
        measured_overlap_ns_ = earlier.compute_overlap_ns;
        stats_ = SwapStats{};
    }
    const size_t n_bytes = (size_t) num_slots * (size_t) block_bytes;
    if (n_bytes == 0) {
        return;
    }
    if (copy_stream_) {
        // pinned memory of the first pool's device, which the copy kernel reads and writes directly
        const std::vector<LlamaSession::PoolTensors> tensors = session.paged_pool_tensors();
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(tensors[0].k->buffer));
        ggml_backend_buffer_type_t host_type = dev != nullptr ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
        if (host_type != nullptr) {
            pinned_ = ggml_backend_buft_alloc_buffer(host_type, n_bytes);
        }
        if (pinned_ != nullptr && ggml_backend_buffer_get_type(pinned_) == host_type) {
            pinned_base_ = (uint8_t *) ggml_backend_buffer_get_base(pinned_);
            return;
        }
        // ggml-cuda hands out a pageable CPU buffer when pinning fails: the kernel cannot reach that memory
        if (pinned_ != nullptr) {
            ggml_backend_buffer_free(pinned_);
            pinned_ = nullptr;
        }
        std::fprintf(stderr, "cacheflow: could not pin %zu bytes of swap space; swaps go through llama.cpp's "
                             "per-block copies from pageable memory (a smaller swap space may be pinned)\n", n_bytes);
        copy_stream_.reset();
    }
    host_.reset((uint8_t *) std::calloc(n_bytes, 1));
    if (!host_) {
        throw Error(CF_STATUS_OUT_OF_MEMORY,
                    "cannot reserve " + std::to_string(n_bytes) + " bytes of swap space (lower swap_space_bytes)");
    }
}

Swapper::~Swapper() {
    try {
        fence();
    } catch (const Error &) {
        // nothing more can be done about a failed copy while the engine goes away
    }
    if (pinned_ != nullptr) {
        ggml_backend_buffer_free(pinned_);
    }
}

uint8_t * Swapper::slot_bytes(int32_t slot) const {
    if (slot < 0 || slot >= num_slots_) {
        throw Error(CF_STATUS_INTERNAL,
                    "swap: host slot " + std::to_string(slot) + " outside [0, " + std::to_string(num_slots_) + ")");
    }
    uint8_t * base = copy_stream_ ? pinned_base_ : host_.get();
    return base + (size_t) slot * (size_t) block_bytes_;
}

const SwapStats & Swapper::stats() {
    if (copy_stream_) {
        int64_t out_ns = 0;
        int64_t in_ns = 0;
        for (int dev : copy_stream_->devices) {
            int64_t ns[CF_CUDA_COPY_KINDS];
            copy_stream_->times(dev, ns);
            out_ns += ns[CF_CUDA_COPY_SWAP_OUT];
            in_ns += ns[CF_CUDA_COPY_SWAP_IN];
        }
        stats_.out_ns = out_ns - measured_out_ns_;
        stats_.in_ns = in_ns - measured_in_ns_;
        int64_t deferred_ns = 0;
        int64_t graphs = 0;
        int64_t graphs_overlapping = 0;
        int64_t overlap_ns = 0;
        for (int dev : copy_stream_->devices) {
            int64_t o[4];
            copy_stream_->overlap(dev, o);
            deferred_ns += o[0];
            graphs += o[1];
            graphs_overlapping += o[2];
            overlap_ns += o[3];
        }
        stats_.deferred_ns = deferred_ns - measured_deferred_ns_;
        stats_.num_graphs_beside = graphs - measured_graphs_;
        stats_.num_graphs_overlapping = graphs_overlapping - measured_graphs_overlapping_;
        stats_.compute_overlap_ns = overlap_ns - measured_overlap_ns_;
    }
    return stats_;
}

double Swapper::measure_ns_per_byte(int32_t num_blocks) {
    const int32_t n = std::min({num_blocks, num_slots_, session_.num_blocks()});
    if (n <= 0 || block_bytes_ <= 0) {
        return 0.0;
    }
    std::vector<BlockSwap> swaps;
    swaps.reserve((size_t) n);
    for (int32_t i = 0; i < n; ++i) {
        swaps.push_back(BlockSwap{i, i});  // device block i <-> host slot i, both ways
    }
    fence();
    const SwapStats before = stats();
    swap_out(swaps);
    swap_in(swaps);
    fence();
    const SwapStats after = stats();
    const int64_t ns = (after.out_ns - before.out_ns) + (after.in_ns - before.in_ns);
    const int64_t bytes = (after.num_out_bytes - before.num_out_bytes) + (after.num_in_bytes - before.num_in_bytes);
    if (copy_stream_) {  // its counters are the device's totals: subtract the measurement from now on
        measured_out_ns_ += after.out_ns - before.out_ns;
        measured_in_ns_ += after.in_ns - before.in_ns;
        measured_deferred_ns_ += after.deferred_ns - before.deferred_ns;
    }
    stats_ = before;
    return ns > 0 && bytes > 0 ? (double) ns / (double) bytes : 0.0;
}

void Swapper::swap_out(const std::vector<BlockSwap> & swaps) {
    const int64_t t0 = clock_ns();
    copy_stream_ ? run_stream(swaps, /*to_host=*/true) : run_llama(swaps, /*to_host=*/true);
    if (!copy_stream_) {
        stats_.out_ns += clock_ns() - t0;
    }
    stats_.num_out_bytes += (int64_t) swaps.size() * block_bytes_;
}

void Swapper::swap_in(const std::vector<BlockSwap> & swaps) {
    const int64_t t0 = clock_ns();
    copy_stream_ ? run_stream(swaps, /*to_host=*/false) : run_llama(swaps, /*to_host=*/false);
    if (!copy_stream_) {
        stats_.in_ns += clock_ns() - t0;
    }
    stats_.num_in_bytes += (int64_t) swaps.size() * block_bytes_;
}

void Swapper::run_llama(const std::vector<BlockSwap> & swaps, bool to_host) {
    block_ids_.clear();
    bufs_.clear();
    for (const BlockSwap & s : swaps) {
        block_ids_.push_back(to_host ? s.src_block_id : s.dst_block_id);
        bufs_.push_back(slot_bytes(to_host ? s.dst_block_id : s.src_block_id));
    }
    session_.swap_blocks(block_ids_, bufs_, to_host);
}

void Swapper::run_stream(const std::vector<BlockSwap> & swaps, bool to_host) {
    CopyStream & cs = *copy_stream_;
    for (auto & v : cs.items) {
        v.clear();
    }
    const int32_t n_blocks = session_.num_blocks();
    for (const BlockSwap & s : swaps) {
        const int32_t block = to_host ? s.src_block_id : s.dst_block_id;
        if (block < 0 || block >= n_blocks) {
            throw Error(CF_STATUS_INTERNAL, "swap: device block " + std::to_string(block) + " outside [0, " +
                                                std::to_string(n_blocks) + ")");
        }
        uint8_t * host = slot_bytes(to_host ? s.dst_block_id : s.src_block_id);
        int64_t off = 0;
        for (const CopyStream::Pool & p : cs.pools) {
            std::vector<cf_cuda_copy_item> & items = cs.items[(size_t) p.device_index];
            uint8_t * k = p.k + (int64_t) block * p.k_bytes;
            uint8_t * v = p.v + (int64_t) block * p.v_bytes;
            items.push_back(to_host ? cf_cuda_copy_item{k, host + off, p.k_bytes} : cf_cuda_copy_item{host + off, k, p.k_bytes});
            off += p.k_bytes;
            items.push_back(to_host ? cf_cuda_copy_item{v, host + off, p.v_bytes} : cf_cuda_copy_item{host + off, v, p.v_bytes});
            off += p.v_bytes;
        }
    }
    session_.synchronize();  // no kernel of the previous step still touches the pools
    const int32_t kind = to_host ? CF_CUDA_COPY_SWAP_OUT : CF_CUDA_COPY_SWAP_IN;
    for (size_t d = 0; d < cs.devices.size(); ++d) {  // deferred: due at the next begin_step()
        if (const int rc = cs.copy_async_deferred(cs.devices[d], cs.items[d].data(), (int32_t) cs.items[d].size(),
                                                  kind)) {
            throw Error(CF_STATUS_INTERNAL, std::string("swap ") + (to_host ? "out" : "in") + ": the CUDA copy stream "
                                                "refused " + std::to_string(swaps.size()) + " blocks (error " +
                                                std::to_string(rc) + ")");
        }
    }
}

void Swapper::copy_blocks(const std::vector<BlockCopy> & copies) {
    if (copies.empty()) {
        return;
    }
    stats_.num_copy_bytes += (int64_t) copies.size() * block_bytes_;
    if (!copy_stream_) {
        session_.copy_blocks(copies);
        return;
    }
    CopyStream & cs = *copy_stream_;
    for (auto & v : cs.items) {
        v.clear();
    }
    const int32_t n_blocks = session_.num_blocks();
    for (const BlockCopy & c : copies) {
        if (c.src_block_id < 0 || c.src_block_id >= n_blocks || c.dst_block_id < 0 || c.dst_block_id >= n_blocks) {
            throw Error(CF_STATUS_INTERNAL, "block copy " + std::to_string(c.src_block_id) + " -> " +
                                                std::to_string(c.dst_block_id) + " outside [0, " +
                                                std::to_string(n_blocks) + ")");
        }
        if (c.src_block_id == c.dst_block_id) {
            continue;
        }
        for (const CopyStream::Pool & p : cs.pools) {
            std::vector<cf_cuda_copy_item> & items = cs.items[(size_t) p.device_index];
            items.push_back({p.k + (int64_t) c.src_block_id * p.k_bytes, p.k + (int64_t) c.dst_block_id * p.k_bytes, p.k_bytes});
            items.push_back({p.v + (int64_t) c.src_block_id * p.v_bytes, p.v + (int64_t) c.dst_block_id * p.v_bytes, p.v_bytes});
        }
    }
    session_.synchronize();
    for (size_t d = 0; d < cs.devices.size(); ++d) {
        if (const int rc = cs.copy_async(cs.devices[d], cs.items[d].data(), (int32_t) cs.items[d].size(),
                                         CF_CUDA_COPY_BLOCKS)) {
            throw Error(CF_STATUS_INTERNAL, "the CUDA copy stream refused " + std::to_string(copies.size()) +
                                                " block copies (error " + std::to_string(rc) + ")");
        }
    }
}

void Swapper::begin_step() {
    if (!copy_stream_) {
        return;
    }
    for (int dev : copy_stream_->devices) {
        if (const int rc = copy_stream_->release(dev)) {
            throw Error(CF_STATUS_INTERNAL, "the CUDA copy stream could not release its swaps (error " +
                                                std::to_string(rc) + ")");
        }
    }
}

void Swapper::fence() {
    if (!copy_stream_) {
        return;
    }
    for (int dev : copy_stream_->devices) {
        if (const int rc = copy_stream_->fence(dev)) {
            throw Error(CF_STATUS_INTERNAL, "a copy of the CUDA copy stream failed (error " + std::to_string(rc) + ")");
        }
    }
}

}  // namespace cf
