// test_kv_stream_cuda.cu - KV streaming on CUDA (issue 16; kv_stream.h, kernels/cuda/kv_stream.cu): paged attention
// over n_layer layers whose staged blocks come from a pinned host tier through the layer-ahead hooks must be
// bit-identical to the same rows all in the pools, eagerly and in a CUDA graph of the whole layer loop replayed
// after the staged list changed (other host slots, other blocks, none), for depth 1, 2, 4 and n_layer; the stats
// must count exactly the bytes staged. Then (printed, not asserted) the gather kernel's host->device GB/s against one
// pinned cudaMemcpyAsync of the same bytes, and per-layer decode time with a fake compute kernel of T us between
// layers, with and without streaming, for depth 1, 2, 4: whether the copy hides.
//
// Standalone (from the repository root):
//   nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90 -I native/src/kernels/cuda -I native/src/kernels
//     native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu native/src/kernels/cuda/kv_stream.cu
//     native/tests/cuda/test_kv_stream_cuda.cu -o test_kv_stream_cuda
//   ./test_kv_stream_cuda [--bench]
// (tests/kernels/test_kv_stream_cuda.py runs it under the gpu marker, with --bench). Exit 0 = every check passed;
// a failure names the depth, the phase (eager / graph / replay N), the layer, and the first differing output with
// whether its token's sequence has staged blocks.
#include "device_helpers.cuh"
#include "kv_stream.cuh"
#include "paged_attention.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using cf::cuda::PagedAttentionCudaArgs;
using cf_test::DeviceBuffer;

namespace {

int g_failures = 0;

void expect(bool ok, const std::string & what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what.c_str());
        ++g_failures;
    }
}

__global__ void spin_kernel(long long ns) {  // fake "compute" of a layer: every CTA spins ns nanoseconds
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while ((long long) (t - t0) < ns);
}

template <typename T>
struct Pinned {  // n elements of pinned host memory
    T * ptr = nullptr;
    explicit Pinned(size_t n) { CHECK_CUDA(cudaMallocHost(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
    ~Pinned() { cudaFreeHost(ptr); }
    Pinned(const Pinned &) = delete;
    Pinned & operator=(const Pinned &) = delete;
};

constexpr int kD = 128, kHeads = 32, kHeadsKv = 8, kBs = 16, kRow = kHeadsKv * kD;  // Llama-3.1-8B layer shape
constexpr int64_t kRowBytes = kRow * sizeof(half);

// n_layer layers of random K/V for sequences of `lens`, in reference pools where every block is resident.
struct Problem {
    int n_layer, num_blocks, n_tokens, table_stride;
    std::vector<int> lens;
    std::vector<std::vector<half>> k_ref, v_ref;  // [layer][num_blocks * kBs * kRow]
    std::vector<std::vector<int32_t>> blocks;     // [seq] reference block ids in position order
    std::vector<int32_t> tok_seq, tok_ctx;        // [n_tokens]
    std::vector<std::vector<float>> q;            // [layer][n_tokens * kHeads * kD]
};

Problem make_problem(int n_layer, const std::vector<int> & lens, std::mt19937 & rng) {
    Problem p{n_layer, 0, 0, 1, lens, {}, {}, {}, {}, {}, {}};
    for (int len : lens) p.num_blocks += (len + kBs - 1) / kBs;
    p.num_blocks += 3;
    std::vector<int32_t> ids(p.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
        std::vector<int32_t> b((lens[s] + kBs - 1) / kBs);
        for (auto & x : b) x = ids[next++];
        p.table_stride = std::max(p.table_stride, (int) b.size());
        p.blocks.push_back(b);
        for (int t = std::max(1, lens[s] - 3); t <= lens[s]; ++t) {  // 3 prefill rows and the decode row
            p.tok_seq.push_back((int32_t) s);
            p.tok_ctx.push_back(t);
        }
    }
    p.n_tokens = (int) p.tok_seq.size();
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int l = 0; l < n_layer; ++l) {
        std::vector<half> k((size_t) p.num_blocks * kBs * kRow), v(k.size());
        for (auto & x : k) x = __float2half(u(rng));
        for (auto & x : v) x = __float2half(u(rng));
        p.k_ref.push_back(std::move(k));
        p.v_ref.push_back(std::move(v));
        std::vector<float> q((size_t) p.n_tokens * kHeads * kD);
        for (auto & x : q) x = 2.0f * u(rng);
        p.q.push_back(std::move(q));
    }
    return p;
}

// Device state of one run: per-layer pools and queries, the block tables, outputs, and the streaming desc.
struct Device {
    std::vector<DeviceBuffer<half> *> k, v;
    std::vector<DeviceBuffer<float> *> q, out;
    DeviceBuffer<int32_t> * tables = nullptr, * tok_seq = nullptr, * tok_ctx = nullptr;
    DeviceBuffer<char> * ws = nullptr;
    ~Device() {
        for (auto * b : k) delete b;
        for (auto * b : v) delete b;
        for (auto * b : q) delete b;
        for (auto * b : out) delete b;
        delete tables; delete tok_seq; delete tok_ctx; delete ws;
    }
};

PagedAttentionCudaArgs layer_args(const Problem & p, Device & d, int l) {
    PagedAttentionCudaArgs a{};
    a.q = d.q[l]->ptr;
    a.q_stride_head = kD;
    a.q_stride_token = (int64_t) kHeads * kD;
    a.k_pool = d.k[l]->ptr;
    a.v_pool = d.v[l]->ptr;
    a.k_stride_row = a.v_stride_row = kRow;
    a.kv_size = (int64_t) p.num_blocks * kBs;
    a.block_tables = d.tables->ptr;
    a.block_table_stride = p.table_stride;
    a.token_seq_idx = d.tok_seq->ptr;
    a.token_ctx_len = d.tok_ctx->ptr;
    a.out = d.out[l]->ptr;
    a.n_tokens = p.n_tokens;
    a.n_head = kHeads;
    a.n_head_kv = kHeadsKv;
    a.head_dim = kD;
    a.block_size = kBs;
    a.scale = 1.0f / std::sqrt((float) kD);
    return a;
}

void make_device(const Problem & p, Device & d) {
    for (int l = 0; l < p.n_layer; ++l) {
        d.k.push_back(new DeviceBuffer<half>(p.k_ref[l]));
        d.v.push_back(new DeviceBuffer<half>(p.v_ref[l]));
        d.q.push_back(new DeviceBuffer<float>(p.q[l]));
        d.out.push_back(new DeviceBuffer<float>((size_t) p.n_tokens * kHeads * kD));
    }
    d.tables = new DeviceBuffer<int32_t>((size_t) p.lens.size() * p.table_stride);
    d.tok_seq = new DeviceBuffer<int32_t>(p.tok_seq);
    d.tok_ctx = new DeviceBuffer<int32_t>(p.tok_ctx);
    d.ws = new DeviceBuffer<char>(cf::cuda::paged_attention_cuda_workspace_bytes(layer_args(p, d, 0)));
}

std::vector<int32_t> flat_tables(const Problem & p, const std::vector<std::vector<int32_t>> & t) {
    std::vector<int32_t> f((size_t) t.size() * p.table_stride, -1);
    for (size_t s = 0; s < t.size(); ++s) std::copy(t[s].begin(), t[s].end(), f.begin() + (ptrdiff_t) (s * p.table_stride));
    return f;
}

// One decode over every layer on `stream`: hooks (desc != nullptr), attention, fake compute.
void decode(const Problem & p, Device & d, const cf_kv_stream_desc * desc, cudaStream_t stream, long long spin_ns,
            int spin_ctas) {
    for (int l = 0; l < p.n_layer; ++l) {
        PagedAttentionCudaArgs a = layer_args(p, d, l);
        if (desc != nullptr) {
            cf::cuda::KvStreamStage st{};
            if (const char * err = cf::cuda::kv_stream_before_layer(stream, desc, l, &st)) {
                std::fprintf(stderr, "before layer %d: %s\n", l, err);
                std::exit(2);
            }
            a.k_stage = st.k;
            a.v_stage = st.v;
            a.stage_base_row = st.base_row;
        }
        if (const char * err = cf::cuda::paged_attention_cuda(a, d.ws->ptr, stream)) {
            std::fprintf(stderr, "layer %d: %s\n", l, err);
            std::exit(2);
        }
        if (desc != nullptr) {
            if (const char * err = cf::cuda::kv_stream_after_layer(stream, desc, l)) {
                std::fprintf(stderr, "after layer %d: %s\n", l, err);
                std::exit(2);
            }
        }
        if (spin_ns > 0) spin_kernel<<<spin_ctas, 128, 0, stream>>>(spin_ns);
    }
    CHECK_CUDA(cudaGetLastError());
}

// The host tier and lists of one streaming layout: staged = the (seq, block index) pairs that live on the host.
struct Tier {
    Pinned<uint8_t> host;
    Pinned<int32_t> slots, num;
    int num_slots;
    Tier(int num_slots_, int64_t host_block_bytes, int max_staged)
        : host((size_t) num_slots_ * host_block_bytes), slots(max_staged), num(1), num_slots(num_slots_) {}
};

// Writes layout `staged` into the tier (staged block j in a shuffled host slot), the streaming tables into
// d.tables, and NaN into the pools' rows of staged blocks (a wrong read cannot pass); returns staged count.
int apply_layout(const Problem & p, Device & d, Tier & tier, const cf_kv_stream_desc & desc,
                 const std::vector<std::pair<int, int>> & staged, unsigned seed) {
    std::vector<int32_t> hs(tier.num_slots);
    std::iota(hs.begin(), hs.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(hs.begin(), hs.end(), rng);
    std::vector<std::vector<int32_t>> t = p.blocks;
    const int64_t kb = kBs * kRowBytes, vb = kBs * kRowBytes;
    std::vector<int32_t> nan_blocks;
    for (size_t j = 0; j < staged.size(); ++j) {
        const int32_t ref = p.blocks[staged[j].first][staged[j].second];
        t[staged[j].first][staged[j].second] = desc.stage_base_block + (int32_t) j;
        tier.slots.ptr[j] = hs[j];
        for (int l = 0; l < p.n_layer; ++l) {
            uint8_t * dst = tier.host.ptr + (int64_t) hs[j] * desc.host_block_bytes + (int64_t) l * (kb + vb);
            std::memcpy(dst, &p.k_ref[l][(size_t) ref * kBs * kRow], kb);
            std::memcpy(dst + kb, &p.v_ref[l][(size_t) ref * kBs * kRow], vb);
        }
        nan_blocks.push_back(ref);
    }
    *tier.num.ptr = (int32_t) staged.size();
    d.tables->upload(flat_tables(p, t));
    const half nan = __float2half(NAN);
    for (int l = 0; l < p.n_layer; ++l) {
        std::vector<half> k = p.k_ref[l], v = p.v_ref[l];
        for (int32_t b : nan_blocks) {
            std::fill(k.begin() + (ptrdiff_t) b * kBs * kRow, k.begin() + (ptrdiff_t) (b + 1) * kBs * kRow, nan);
            std::fill(v.begin() + (ptrdiff_t) b * kBs * kRow, v.begin() + (ptrdiff_t) (b + 1) * kBs * kRow, nan);
        }
        d.k[l]->upload(k);
        d.v[l]->upload(v);
    }
    return (int) staged.size();
}

std::vector<std::pair<int, int>> pick(const Problem & p, int mod, int rem, int cap) {
    std::vector<std::pair<int, int>> s;
    for (size_t q = 0; q < p.blocks.size(); ++q)
        for (int b = 0; b < (int) p.blocks[q].size(); ++b)
            if (b % mod == rem && (int) s.size() < cap) s.push_back({(int) q, b});
    return s;
}

void compare(const Problem & p, Device & d, const std::vector<std::vector<float>> & want, const std::string & what,
             const std::vector<std::pair<int, int>> & staged) {
    for (int l = 0; l < p.n_layer; ++l) {
        const std::vector<float> got = d.out[l]->download();
        size_t i = 0;
        while (i < got.size() && std::memcmp(&got[i], &want[l][i], sizeof(float)) == 0) ++i;
        if (i == got.size()) continue;
        const int tok = (int) (i / (kHeads * kD));
        const int seq = p.tok_seq[tok];
        int n_seq_staged = 0;
        for (auto & s : staged) n_seq_staged += s.first == seq;
        expect(false, what + ": layer " + std::to_string(l) + " first difference at token " + std::to_string(tok) +
                          " head " + std::to_string((i / kD) % kHeads) + ": " + std::to_string(got[i]) + " vs " +
                          std::to_string(want[l][i]) + " (sequence " + std::to_string(seq) + " has " +
                          std::to_string(n_seq_staged) + " staged blocks; NaN = a staged row read from the pool or "
                          "a copy not yet done; other values = a stale or wrong slot)");
        return;
    }
}

void test_depth(const Problem & p, const std::vector<std::vector<float>> & want, int depth) {
    const int max_staged = 48;
    Device d;
    make_device(p, d);
    const int64_t host_block_bytes = (int64_t) p.n_layer * kBs * 2 * kRowBytes;
    Tier tier(max_staged + 9, host_block_bytes, max_staged);
    cf_kv_stream_desc desc{p.n_layer, kBs, p.num_blocks, max_staged, depth, 0, kRowBytes, kRowBytes,
                           tier.host.ptr, host_block_bytes, tier.slots.ptr, tier.num.ptr};
    const std::string tag = "depth " + std::to_string(depth);
    expect(cf::cuda::kv_stream_reserve(&desc) == 0, tag + ": reserve failed");
    expect(cf::cuda::kv_stream_reserve(&desc) == 0, tag + ": second reserve is not a no-op");
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int64_t per_block = 2 * kBs * kRowBytes * p.n_layer;  // bytes one staged block moves per decode
    int64_t want_bytes = 0, want_decodes = 0;

    auto s1 = pick(p, 3, 1, max_staged);
    int n = apply_layout(p, d, tier, desc, s1, 11);
    decode(p, d, &desc, stream, 20000, 132);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    compare(p, d, want, tag + " eager", s1);
    want_bytes += n * per_block; want_decodes += n > 0;
    decode(p, d, &desc, stream, 0, 0);  // no compute between layers: copies race the attention
    CHECK_CUDA(cudaStreamSynchronize(stream));
    compare(p, d, want, tag + " eager, no compute", s1);
    want_bytes += n * per_block; want_decodes += n > 0;

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));  // stricter than ggml's relaxed mode
    decode(p, d, &desc, stream, 20000, 132);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));  // cudaErrorStreamCaptureUnjoined = the side stream not joined
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const std::vector<std::vector<std::pair<int, int>>> layouts = {s1, pick(p, 3, 1, max_staged),
                                                                    pick(p, 4, 2, max_staged / 2),
                                                                    pick(p, 1, 0, max_staged), {}};
    for (size_t r = 0; r < layouts.size(); ++r) {
        n = apply_layout(p, d, tier, desc, layouts[r], 100 + (unsigned) r);  // r = 1: same blocks, other host slots
        for (int l = 0; l < p.n_layer; ++l) CHECK_CUDA(cudaMemset(d.out[l]->ptr, 0xff, d.out[l]->n * sizeof(float)));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        compare(p, d, want, tag + " graph replay " + std::to_string(r) + " (" + std::to_string(n) + " staged)",
                layouts[r]);
        want_bytes += n * per_block; want_decodes += n > 0;
    }
    n = apply_layout(p, d, tier, desc, s1, 7);  // eager again after the graph
    decode(p, d, &desc, stream, 5000, 132);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    compare(p, d, want, tag + " eager after graph", s1);
    want_bytes += n * per_block; want_decodes += n > 0;

    int64_t st[4];
    cf::cuda::kv_stream_stats(&desc, st);
    std::printf("%-8s stats: %lld bytes staged (want %lld), %.1f us of copies, %lld eager layers waited, %lld decodes\n",
                tag.c_str(), (long long) st[0], (long long) want_bytes, st[1] / 1e3, (long long) st[2],
                (long long) st[3]);
    expect(st[0] == want_bytes, tag + ": stats bytes " + std::to_string(st[0]) + " != " + std::to_string(want_bytes));
    expect(st[3] == want_decodes, tag + ": stats decodes " + std::to_string(st[3]) + " != " + std::to_string(want_decodes));
    expect(st[1] > 0 && st[2] >= 0, tag + ": stats time / waits missing");
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaStreamDestroy(stream));
    cf::cuda::kv_stream_release(&desc);
}

float time_ms(cudaStream_t s, const std::function<void()> & f, int reps) {
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    f();
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
        CHECK_CUDA(cudaEventRecord(e0, s));
        f();
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

void bench_gather() {
    const int blocks = 1024;
    const int64_t kb = kBs * kRowBytes, bytes = (int64_t) blocks * 2 * kb;  // 64 MiB
    Pinned<uint8_t> host((size_t) bytes);
    Pinned<int32_t> slots(blocks), num(1);
    std::memset(host.ptr, 1, (size_t) bytes);
    for (int j = 0; j < blocks; ++j) slots.ptr[j] = (j * 7) % blocks;
    *num.ptr = blocks;
    DeviceBuffer<uint8_t> dst((size_t) bytes);
    cf::cuda::KvGatherArgs g{host.ptr, 2 * kb, 0, slots.ptr, num.ptr, blocks, kb, kb, dst.ptr, dst.ptr + blocks * kb,
                             nullptr, 0};
    int sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int grid = cf::cuda::kv_gather_grid(g, sms);
    const float g_ms = time_ms(s, [&] { CHECK_CUDA(cf::cuda::kv_gather_launch(g, grid, s)); }, 7);
    const float m_ms = time_ms(s, [&] { CHECK_CUDA(cudaMemcpyAsync(dst.ptr, host.ptr, bytes, cudaMemcpyHostToDevice, s)); }, 7);
    std::printf("bench gather host->device, %d blocks of %lld KiB (64 MiB): gather kernel %.1f GB/s (grid %d), "
                "pinned cudaMemcpyAsync %.1f GB/s\n", blocks, (long long) (2 * kb / 1024), bytes / (g_ms * 1e6), grid,
                bytes / (m_ms * 1e6));
    std::printf("bench gather grid sweep (GB/s):");
    for (int per_sm : {1, 2, 4, 8}) {
        const float ms = time_ms(s, [&] { CHECK_CUDA(cf::cuda::kv_gather_launch(g, per_sm * sms, s)); }, 7);
        std::printf(" %d/SM %.1f", per_sm, bytes / (ms * 1e6));
    }
    // an empty launch (nothing staged): what each layer of a decode that streams nothing pays on the side stream
    *num.ptr = 0;
    for (int per_sm : {2, 8}) {
        const float ms = time_ms(s, [&] { CHECK_CUDA(cf::cuda::kv_gather_launch(g, per_sm * sms, s)); }, 50);
        std::printf("; empty launch %d/SM %.2f us", per_sm, ms * 1e3);
    }
    std::printf("\n");
    *num.ptr = blocks;
    CHECK_CUDA(cudaStreamDestroy(s));
}

// Per-layer decode time: 16 layers, B=1 at ctx 4K with `staged` of its 256 blocks on the host, fake compute of
// spin_us per layer (one light CTA per SM, so the gather's CTAs can run beside it; a GEMM that fills every SM
// would leave them less room, which this does not show).
void bench_overlap(const Problem & p, int staged, long long spin_us) {
    Device d;
    make_device(p, d);
    const int64_t hbb = (int64_t) p.n_layer * kBs * 2 * kRowBytes;
    Tier tier(staged, hbb, staged);
    int sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    d.tables->upload(flat_tables(p, p.blocks));
    const float base = time_ms(s, [&] { decode(p, d, nullptr, s, spin_us * 1000, sms); }, 5) / p.n_layer;
    const double mb = staged * 2.0 * kBs * kRowBytes / 1e6;
    std::printf("bench overlap: %d staged blocks = %.2f MB/layer, compute %lld us/layer: no streaming %.1f us/layer",
                staged, mb, spin_us, base * 1e3);
    for (int depth : {1, 2, 4}) {
        cf_kv_stream_desc desc{p.n_layer, kBs, p.num_blocks, staged, depth, 0, kRowBytes, kRowBytes, tier.host.ptr,
                               hbb, tier.slots.ptr, tier.num.ptr};
        CHECK_CUDA((cudaError_t) cf::cuda::kv_stream_reserve(&desc));
        apply_layout(p, d, tier, desc, pick(p, 1, 0, staged), 3);
        const float t = time_ms(s, [&] { decode(p, d, &desc, s, spin_us * 1000, sms); }, 5) / p.n_layer;
        int64_t st[4];
        cf::cuda::kv_stream_stats(&desc, st);
        std::printf(", depth %d %.1f us (+%.0f%%, copy %.1f us/layer, %.1f GB/s)", depth, t * 1e3,
                    100.0 * (t - base) / base, st[1] / 1e3 / (st[0] / (mb * 1e6)), st[0] / (double) st[1]);
        cf::cuda::kv_stream_release(&desc);
    }
    std::printf("\n");
    CHECK_CUDA(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char ** argv) {
    const bool bench = argc > 1 && std::strcmp(argv[1], "--bench") == 0;
    std::mt19937 rng(1);
    const Problem p = make_problem(6, {200, 700, 1300, 33}, rng);
    std::vector<std::vector<float>> want;  // every block in the pools, no streaming
    {
        Device d;
        make_device(p, d);
        d.tables->upload(flat_tables(p, p.blocks));
        decode(p, d, nullptr, nullptr, 0, 0);
        CHECK_CUDA(cudaDeviceSynchronize());
        for (int l = 0; l < p.n_layer; ++l) want.push_back(d.out[l]->download());
    }
    for (int depth : {1, 2, 4, 6}) test_depth(p, want, depth);
    if (bench) {
        bench_gather();
        std::mt19937 rng2(5);
        const Problem pb = make_problem(16, {4096}, rng2);
        for (int staged : {64, 256})
            for (long long us : {20LL, 100LL}) bench_overlap(pb, staged, us);
    }
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}
