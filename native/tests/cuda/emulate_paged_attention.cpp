// emulate_paged_attention.cpp - the CUDA paged attention kernels run on the CPU: the two-pass kernels of
// paged_attention_two_pass.cuh in every load shape (PagedLoads: narrow, narrow with the V prefetch, wide) and with one
// query head per CTA (PagedHeads), the
// warp-split kernels of paged_attention_warp_split.cuh in both load shapes and with one-warp CTAs, and the pipelined
// kernels of paged_attention_pipelined.cuh in both register budgets, with their split rule or fixed splits. The headers are
// compiled by g++ with __device__/__global__ erased,
// 128 host threads per CTA (one CTA at a time, __shared__ = static), __shfl_xor_sync, __syncwarp and __syncthreads
// as barriers. Checks, where no GPU
// is at hand: each kernel against a float64 reference; the two-pass shapes and head placements bit-identical to each other (what
// lets the launcher pick a shape by the grid); each row alone, with a wider table and relocated blocks bit-identical
// to its batched output (batch invariance); the grids' split counts against brute-force maxima. (The pipelined
// kernel's tile size is part of its arithmetic, so its two budgets are not bit-identical to each other.)
// Not a substitute for test_paged_attention_cuda.cu on a GPU (host expf, no memory model). Not a ctest. From the
// repository root:
//   g++ -std=c++20 -O1 -pthread -w -I /usr/local/cuda/include -I native/src/kernels/cuda \
//     native/tests/cuda/emulate_paged_attention.cpp -o /tmp/emu && /tmp/emu
// Exit status 0 = PASS. `--quick`: two of the cases for every kernel but the ring one, a third for the ring kernel
// (tests/kernels/test_paged_attention_emulated.py runs it on CI). `--ring`: the ring kernel alone on 12 shapes.
#define __device__
#define __global__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>
using std::max;
using std::min;
thread_local uint3 threadIdx, blockIdx;
static std::barrier<> * g_cta_bar;
static std::barrier<> * g_warp_bar[4];
static uint32_t g_slot[4][32];
inline void __syncthreads() { g_cta_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
// Lane l reads lane l ^ off of its warp (off < width keeps it inside its width-lane segment, as on the GPU).
template <class T> T __shfl_xor_sync(unsigned, T v, int off, int = 32) {
    static_assert(sizeof(T) == 4);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    std::memcpy(&g_slot[w][l], &v, 4);
    g_warp_bar[w]->arrive_and_wait();
    T r;
    std::memcpy(&r, &g_slot[w][l ^ off], 4);
    g_warp_bar[w]->arrive_and_wait();
    return r;
}
template <class T> T __ldg(const T * p) { return *p; }
inline int __ffs(int x) { return __builtin_ffs(x); }
#include "paged_attention_pipelined.cuh"
#include "paged_attention_ring.cuh"
#include "paged_attention_two_pass.cuh"
#include "paged_attention_warp_split.cuh"
using namespace cf::cuda;

// The kernels under test: the two-pass kernel in a load shape, the warp-split kernel in a load shape, or the
// pipelined kernel in a register budget (tile rows 8 or 4).
// warp1: the warp-split kernel's one-warp CTAs (small grids), wide rounds. one / one_wide: the two-pass kernel with
// one query head per CTA (PagedHeads), narrow or wide loads.
// ring / ring2 / ring16: the ring kernel (paged_attention_ring.cuh) with 1, 2 or 16 splits per CTA (the same bits).
enum class Kern { narrow, narrow_pf, wide, one, one_wide, warp, warp_narrow, warp1, pipelined, pipelined_narrow,
                  ring, ring2, ring16 };
const std::vector<Kern> kAll = {Kern::narrow,      Kern::narrow_pf, Kern::wide,        Kern::one,
                                Kern::one_wide,    Kern::warp,      Kern::warp_narrow, Kern::warp1,
                                Kern::pipelined,   Kern::pipelined_narrow, Kern::ring, Kern::ring2, Kern::ring16};

static_assert(two_pass::threads_for(64) == 128 && two_pass::threads_for(256) == 128, "the pool runs 128 lanes");

// 128 persistent workers run one CTA per dispatch; a CTA of fewer threads (the warp-split kernel's one-warp CTAs)
// runs on the first `threads` of them, with a barrier of that many.
struct Pool {
    std::vector<std::thread> th;
    std::barrier<> start{129}, done{129};
    std::barrier<> * bar[2] = {new std::barrier<>(128), new std::barrier<>(32)};
    std::function<void()> job;
    bool stop = false;
    uint3 blk;
    int threads = 128;
    Pool() {
        g_cta_bar = bar[0];
        for (auto & b : g_warp_bar) b = new std::barrier<>(32);
        for (int i = 0; i < 128; ++i) th.emplace_back([this, i] {
            threadIdx = make_uint3(i, 0, 0);
            for (;;) {
                start.arrive_and_wait();
                if (stop) return;
                blockIdx = blk;
                if (i < threads) job();
                done.arrive_and_wait();
            }
        });
    }
    void run(uint3 b, std::function<void()> f, int n = 128) {
        blk = b; job = f; threads = n; g_cta_bar = n == 32 ? bar[1] : bar[0];
        start.arrive_and_wait(); done.arrive_and_wait();
    }
    ~Pool() { stop = true; start.arrive_and_wait(); for (auto & t : th) t.join(); }
};
Pool * g_pool;

// fixed: the pipelined kernel's split length (0 = its rule); the other kernels ignore it.
struct Case { int D, nh, nkv, bs; float softcap; bool stage; int fixed = 0; };

// The split states' workspace of the kernels: part_o [n_tokens][n_head][n_splits][D] then part_ml [..][2], NaN-filled.
template <int D>
std::pair<float *, float *> partials(std::vector<float> & ws, const PagedAttentionCudaArgs & a, int n_splits) {
    ws.assign((size_t) a.n_tokens * a.n_head * n_splits * (D + 2), NAN);
    return {ws.data(), ws.data() + (size_t) a.n_tokens * a.n_head * n_splits * D};
}

// fn as CTA (x, y, z) for every x < nx, y < ny, z < nz, one CTA at a time.
void run_grid(int nx, int ny, int nz, const std::function<void()> & fn, int threads = 128) {
    for (int z = 0; z < nz; ++z)
        for (int y = 0; y < ny; ++y)
            for (int x = 0; x < nx; ++x) g_pool->run(make_uint3(x, y, z), fn, threads);
}

int g_fail = 0;

// The combine kernels (two_pass::combine_splits) against the serial merge they claim to equal bit for bit: for each
// (token, head) whose row has ns of at least `first_ns` splits (per split_count), out must be the loop
// w = exp(m_s - max m), l = fmaf(w, l_s, l), o = fmaf(w, o_s[d], o) over s = 0, 1, ... and o / l.
template <int D>
void check_serial_merge(const PagedAttentionCudaArgs & a, const float * po, const float * pml, int n_splits,
                        int (*split_count)(int), int first_ns) {
    int bad = 0;
    for (int t = 0; t < a.n_tokens; ++t) {
        const int ns = split_count(a.token_ctx_len[t]);
        if (ns < first_ns) continue;
        for (int h = 0; h < a.n_head; ++h) {
            const int64_t base = ((int64_t) t * a.n_head + h) * n_splits;
            float mx = -INFINITY;
            for (int s = 0; s < ns; ++s) mx = fmaxf(mx, pml[2 * (base + s)]);
            for (int d = 0; d < D; ++d) {
                float l = 0.0f, o = 0.0f;
                for (int s = 0; s < ns; ++s) {
                    const float w = expf(pml[2 * (base + s)] - mx);
                    l = fmaf(w, pml[2 * (base + s) + 1], l);
                    o = fmaf(w, po[(base + s) * D + d], o);
                }
                const float r = o / l;
                bad += std::memcmp(&r, a.out + ((int64_t) t * a.n_head + h) * D + d, 4) != 0;
            }
        }
    }
    if (bad != 0) {
        std::printf("combine: %d outputs differ from the serial merge FAIL\n", bad);
        ++g_fail;
    }
}

template <int D, int G, int R, bool kPf, int HG = G>
void launch(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int n_splits) {
    const auto [po, pml] = partials<D>(ws, a, n_splits);
    run_grid(n_splits, a.n_head_kv * (G / HG), a.n_tokens,
             [&] { two_pass::paged_attention_split_kernel<D, G, R, kPf, HG>(a, po, pml, n_splits, false); });
    if (n_splits > 1) {
        run_grid(a.n_head, a.n_tokens, 1,
                 [&] { two_pass::paged_attention_combine_kernel<D>(a, po, pml, n_splits, false); });
        check_serial_merge<D>(a, po, pml, n_splits, [](int c) { return two_pass::split_count(c); }, 2);
    }
}

template <int D, int G, int kRows, int W = warp_split::kWarps>
void launch_warp(const PagedAttentionCudaArgs & a, std::vector<float> & ws) {
    const int n_splits = warp_split::max_split_count(a.block_table_stride * a.block_size);
    const auto [po, pml] = partials<D>(ws, a, n_splits);
    const int ctas = (n_splits + W - 1) / W;
    run_grid(ctas, a.n_head_kv, a.n_tokens, [&] { warp_split::split_kernel<D, G, kRows, W>(a, po, pml, n_splits, false); },
             32 * W);
    if (n_splits > W) {
        run_grid(a.n_head, a.n_tokens, 1, [&] { warp_split::combine_kernel<D>(a, po, pml, n_splits, W, false); });
        check_serial_merge<D>(a, po, pml, n_splits, [](int c) { return warp_split::split_count(c); }, W + 1);
    }
}

template <int D, int G, int kTileRows>
void launch_pipelined(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int fixed) {
    const int n_splits = pipelined::max_split_count(a.block_table_stride * a.block_size, fixed);
    const int bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz(a.block_size) : -1;
    const auto [po, pml] = partials<D>(ws, a, n_splits);
    run_grid(n_splits, a.n_head_kv, a.n_tokens,
             [&] { pipelined::split_kernel<D, G, kTileRows>(a, po, pml, n_splits, fixed, bs_shift, false); });
    if (n_splits > 1) {
        run_grid(a.n_head, a.n_tokens, 1, [&] { pipelined::combine_kernel<D>(a, po, pml, n_splits, fixed); });
    }
}

// The ring kernel where it covers <D, G> (else the two-pass kernel, as the launcher does), spc splits per CTA, then
// the two-pass combine.
template <int D, int G>
void launch_ring(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int n_splits, int spc) {
    if constexpr (ring::covers(D, G)) {
        const int bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz(a.block_size) : -1;
        const auto [po, pml] = partials<D>(ws, a, n_splits);
        run_grid((n_splits + spc - 1) / spc, a.n_head_kv, a.n_tokens,
                 [&] {
                     if (a.softcap != 0.0f) {
                         ring::split_kernel<D, G, true>(a, po, pml, n_splits, spc, bs_shift, false);
                     } else {
                         ring::split_kernel<D, G, false>(a, po, pml, n_splits, spc, bs_shift, false);
                     }
                 });
        if (n_splits > 1) {
            run_grid(a.n_head, a.n_tokens, 1,
                     [&] { two_pass::paged_attention_combine_kernel<D>(a, po, pml, n_splits, false); });
        }
    } else {
        launch<D, G, two_pass::kRowsInFlight, false>(a, ws, n_splits);
    }
}

template <int D, int G>
void launch_loads(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int n, Kern k, int fixed) {
    switch (k) {
        case Kern::pipelined: launch_pipelined<D, G, pipelined::kTileRowsWide>(a, ws, fixed); break;
        case Kern::pipelined_narrow: launch_pipelined<D, G, pipelined::kTileRowsNarrow>(a, ws, fixed); break;
        case Kern::wide: launch<D, G, two_pass::kRowsInFlightWide, true>(a, ws, n); break;
        case Kern::narrow_pf: launch<D, G, two_pass::kRowsInFlight, true>(a, ws, n); break;
        case Kern::one: launch<D, G, two_pass::kRowsInFlight, false, 1>(a, ws, n); break;
        case Kern::one_wide: launch<D, G, two_pass::kRowsInFlightWide, true, 1>(a, ws, n); break;
        case Kern::warp: launch_warp<D, G, warp_split::kRoundRowsWide>(a, ws); break;
        case Kern::warp_narrow: launch_warp<D, G, warp_split::kRoundRowsNarrow>(a, ws); break;
        case Kern::warp1: launch_warp<D, G, warp_split::kRoundRowsWide, warp_split::kWarpsOne>(a, ws); break;
        case Kern::ring: launch_ring<D, G>(a, ws, n, 1); break;
        case Kern::ring2: launch_ring<D, G>(a, ws, n, 2); break;
        case Kern::ring16: launch_ring<D, G>(a, ws, n, 16); break;
        default: launch<D, G, two_pass::kRowsInFlight, false>(a, ws, n); break;
    }
}
template <int D>
void launch_g(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int n, Kern loads, int fixed) {
    switch (a.n_head / a.n_head_kv) {
        case 1: launch_loads<D, 1>(a, ws, n, loads, fixed); break;
        case 2: launch_loads<D, 2>(a, ws, n, loads, fixed); break;
        case 3: launch_loads<D, 3>(a, ws, n, loads, fixed); break;
        case 4: launch_loads<D, 4>(a, ws, n, loads, fixed); break;
        case 8: launch_loads<D, 8>(a, ws, n, loads, fixed); break;
        default: std::abort();
    }
}

// The two-pass combine kernel alone on synthetic split states of one token's row of `ctx` keys (with 256-key splits,
// 640,000 keys are 2,500 splits: three chunks of kCombineChunk), two query heads, against the serial merge.
template <int D>
void test_combine_chunks(int ctx, unsigned seed) {
    const int ns = two_pass::split_count(ctx);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> out(2 * D, NAN);
    std::vector<int32_t> ctx_len = {ctx};
    PagedAttentionCudaArgs a{};
    a.n_tokens = 1; a.n_head = 2; a.n_head_kv = 1; a.head_dim = D; a.token_ctx_len = ctx_len.data(); a.out = out.data();
    std::vector<float> ws;
    const auto [po, pml] = partials<D>(ws, a, ns);
    for (int i = 0; i < 2 * ns; ++i) {
        pml[2 * i] = 5 * u(rng);                // the split's max score
        pml[2 * i + 1] = 1 + 9 * (u(rng) + 1);  // its sum of exp, in [1, 19]
        for (int d = 0; d < D; ++d) po[(size_t) i * D + d] = u(rng);
    }
    const int before = g_fail;
    run_grid(a.n_head, 1, 1, [&] { two_pass::paged_attention_combine_kernel<D>(a, po, pml, ns, false); });
    check_serial_merge<D>(a, po, pml, ns, [](int c) { return two_pass::split_count(c); }, 2);
    std::printf("combine alone: D=%d, %d splits (chunks of %d): %s\n", D, ns, two_pass::kCombineChunk,
                g_fail == before ? "bits of the serial merge ok" : "FAIL");
}

// qs: (seq, ctx) queries; returns out [n][nh][D].
std::vector<float> run_case(const Case & c, Kern loads, const std::vector<int> & lens,
                            const std::vector<std::pair<int, int>> & qs, const std::vector<float> & q,
                            const std::vector<std::vector<float>> & kv_k, const std::vector<std::vector<float>> & kv_v,
                            unsigned layout_seed, int extra_width) {
    const int row = c.nkv * c.D;
    int nb = 0;
    for (int L : lens) nb += (L + c.bs - 1) / c.bs;
    nb += 5;
    std::vector<int> ids(nb);
    for (int i = 0; i < nb; ++i) ids[i] = i;
    std::mt19937 rng(layout_seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    int width = 1;
    for (int L : lens) width = max(width, (L + c.bs - 1) / c.bs);
    width += extra_width;
    std::vector<half> kp((size_t) nb * c.bs * row, __float2half(0.f)), vp = kp;
    std::vector<int32_t> tables(lens.size() * width, -1);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s)
        for (int p = 0; p < lens[s]; ++p) {
            if (p % c.bs == 0) tables[s * width + p / c.bs] = ids[next++];
            const size_t slot = (size_t) tables[s * width + p / c.bs] * c.bs + p % c.bs;
            for (int j = 0; j < row; ++j) {
                kp[slot * row + j] = __float2half(kv_k[s][(size_t) p * row + j]);
                vp[slot * row + j] = __float2half(kv_v[s][(size_t) p * row + j]);
            }
        }
    // streaming: rows >= stage_base come from a separate buffer holding those rows; the pool's are NaN there
    std::vector<half> ks, vs;
    int64_t stage_base = INT32_MAX;
    if (c.stage) {
        stage_base = (int64_t) (nb / 2) * c.bs;
        ks.assign(kp.begin() + stage_base * row, kp.end());
        vs.assign(vp.begin() + stage_base * row, vp.end());
        std::fill(kp.begin() + stage_base * row, kp.end(), __float2half(NAN));
        std::fill(vp.begin() + stage_base * row, vp.end(), __float2half(NAN));
    }
    std::vector<int32_t> seq(qs.size()), ctx(qs.size());
    for (size_t i = 0; i < qs.size(); ++i) { seq[i] = qs[i].first; ctx[i] = qs[i].second; }
    std::vector<float> out(qs.size() * c.nh * c.D, NAN);
    PagedAttentionCudaArgs a{};
    a.q = q.data(); a.q_stride_head = c.D; a.q_stride_token = (int64_t) c.nh * c.D;
    a.k_pool = kp.data(); a.v_pool = vp.data(); a.k_stride_row = a.v_stride_row = row; a.kv_size = (int64_t) nb * c.bs;
    a.block_tables = tables.data(); a.block_table_stride = width; a.token_seq_idx = seq.data(); a.token_ctx_len = ctx.data();
    a.out = out.data(); a.n_tokens = (int) qs.size(); a.n_head = c.nh; a.n_head_kv = c.nkv; a.head_dim = c.D;
    a.block_size = c.bs; a.scale = 1.0f / std::sqrt((float) c.D); a.softcap = c.softcap;
    a.k_stage = c.stage ? ks.data() : nullptr; a.v_stage = c.stage ? vs.data() : nullptr; a.stage_base_row = stage_base;
    const int n_splits = two_pass::two_pass_num_splits(a);
    std::vector<float> ws;
    switch (c.D) {
        case 64: launch_g<64>(a, ws, n_splits, loads, c.fixed); break;
        case 128: launch_g<128>(a, ws, n_splits, loads, c.fixed); break;
        case 256: launch_g<256>(a, ws, n_splits, loads, c.fixed); break;
    }
    return out;
}

const char * name_of(Kern k) {
    return k == Kern::wide ? "wide" : k == Kern::narrow_pf ? "narrow_pf" : k == Kern::one ? "one" : k == Kern::one_wide ? "one_wide"
           : k == Kern::warp ? "warp"
           : k == Kern::warp_narrow ? "warp_nrw" : k == Kern::warp1 ? "warp1" : k == Kern::pipelined ? "pipe" : k == Kern::pipelined_narrow ? "pipe_nrw"
           : k == Kern::ring ? "ring" : k == Kern::ring2 ? "ring2" : k == Kern::ring16 ? "ring16"
           : "narrow";
}

void test(const Case & c, const std::vector<int> & lens, unsigned seed, const std::vector<Kern> & kernels = kAll) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    const int row = c.nkv * c.D, G = c.nh / c.nkv;
    std::vector<std::vector<float>> K, V;
    for (int L : lens) {
        std::vector<float> k((size_t) L * row), v(k.size());
        for (auto & x : k) x = __half2float(__float2half(u(rng)));
        for (auto & x : v) x = __half2float(__float2half(u(rng)));
        K.push_back(k); V.push_back(v);
    }
    std::vector<std::pair<int, int>> qs;
    for (int s = 0; s < (int) lens.size(); ++s) { qs.push_back({s, lens[s]}); if (lens[s] > 3) qs.push_back({s, lens[s] / 2 + 1}); }
    std::vector<float> q(qs.size() * c.nh * c.D);
    for (auto & x : q) x = 2 * u(rng);
    std::vector<float> first, first_warp, first_ring;
    for (Kern loads : kernels) {
        auto got = run_case(c, loads, lens, qs, q, K, V, seed + 1, 0);
        double max_err = 0;
        for (size_t i = 0; i < qs.size(); ++i)
            for (int h = 0; h < c.nh; ++h) {
                const int kvh = h / G, L = qs[i].second, s = qs[i].first;
                std::vector<double> sc(L);
                double mx = -1e300;
                for (int p = 0; p < L; ++p) {
                    double d = 0;
                    for (int j = 0; j < c.D; ++j) d += (double) q[(i * c.nh + h) * c.D + j] * K[s][(size_t) p * row + kvh * c.D + j];
                    d /= std::sqrt((double) c.D);
                    if (c.softcap != 0) d = c.softcap * std::tanh(d / c.softcap);
                    sc[p] = d; mx = max(mx, d);
                }
                double l = 0;
                for (auto & x : sc) l += (x = std::exp(x - mx));
                for (int j = 0; j < c.D; ++j) {
                    double o = 0;
                    for (int p = 0; p < L; ++p) o += sc[p] * V[s][(size_t) p * row + kvh * c.D + j];
                    const double e = std::fabs(o / l - got[(i * c.nh + h) * c.D + j]);
                    max_err = std::isnan(e) ? INFINITY : max(max_err, e);
                }
            }
        // the two-pass shapes must equal narrow's bits, the warp kernel's narrow rounds its wide rounds' (the two
        // kernels sum in different orders)
        const bool is_warp = loads == Kern::warp || loads == Kern::warp_narrow || loads == Kern::warp1;
        const bool is_pipe = loads == Kern::pipelined || loads == Kern::pipelined_narrow;
        const bool is_ring = loads == Kern::ring || loads == Kern::ring2 || loads == Kern::ring16;
        std::vector<float> & ref = is_warp ? first_warp : is_ring ? first_ring : first;
        const bool same = is_pipe || ref.empty() || std::memcmp(ref.data(), got.data(), got.size() * 4) == 0;
        if (ref.empty() && !is_pipe) ref = got;
        // invariance: each query alone, wider table (more splits in the grid), another layout; in the other shapes
        // too (alone runs wide where the launcher's by_grid rule would send it)
        bool inv = true;
        for (size_t i = 0; i < qs.size(); i += 3) {
            std::vector<float> q1(q.begin() + i * c.nh * c.D, q.begin() + (i + 1) * c.nh * c.D);
            const Kern other = is_pipe                      ? loads
                               : loads == Kern::ring        ? Kern::ring16
                               : is_ring                    ? Kern::ring
                               : loads == Kern::warp        ? Kern::warp_narrow
                               : loads == Kern::warp_narrow ? Kern::warp1
                               : loads == Kern::warp1       ? Kern::warp_narrow
                               : loads == Kern::wide        ? Kern::narrow
                               : loads == Kern::one_wide    ? Kern::narrow
                                                            : Kern::wide;
            auto alone = run_case(c, other, lens, {qs[i]}, q1, K, V, seed + 77, 300);
            inv &= std::memcmp(alone.data(), got.data() + i * c.nh * c.D, alone.size() * 4) == 0;
        }
        const bool ok = max_err < 1e-5 && inv && same;
        g_fail += !ok;
        // FNV-1a of the output bits: equal across builds of the same arithmetic (kernel changes that move work only
        // print the same hashes)
        uint64_t hash = 1469598103934665603ull;
        for (float x : got) {
            uint32_t u;
            std::memcpy(&u, &x, 4);
            hash = (hash ^ u) * 1099511628211ull;
        }
        std::printf("D=%d heads %d/%d bs=%d softcap %.0f stage %d split %d %-9s: max err %.2e, bits %016llx, same "
                    "bits as its kernel's first shape %s, invariant %s %s\n", c.D, c.nh, c.nkv, c.bs, c.softcap,
                    (int) c.stage, c.fixed, name_of(loads), max_err, (unsigned long long) hash,
                    is_pipe ? "-" : same ? "yes" : "NO", inv ? "yes" : "NO", ok ? "ok" : "FAIL");
        std::fflush(stdout);
    }
}

int main(int argc, char ** argv) {
    // --quick: two cases for every kernel but the ring one (short rows merged in one CTA or split, a long row through
    // the combine kernels), a third for the ring kernel (GQA 4: four key groups merged; soft cap; staging), for CI
    // (tests/kernels/test_paged_attention_emulated.py, about 4 minutes on 2 cores)
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    Pool pool;
    g_pool = &pool;
    for (int64_t mc : {16LL, 200LL, 2048LL, 2064LL, 4096LL, 4104LL, 8192LL, 8200LL, 20000LL, 70000LL}) {
        int brute = 0;
        for (int c = 1; c <= mc; ++c) brute = max(brute, two_pass::split_count(c));
        PagedAttentionCudaArgs a{};
        a.block_size = 8;
        a.block_table_stride = (mc + 7) / 8;
        const int grid = two_pass::two_pass_num_splits(a);
        const bool ok = grid >= brute;
        g_fail += !ok;
        std::printf("max_ctx %5lld: grid splits %d, most any row needs %d %s\n", (long long) (a.block_table_stride * 8),
                    grid, brute, ok ? "ok" : "FAIL");
    }
    // the warp kernel's split rule and grid split count
    for (int ctx : {1, 64, 65, 256, 257, 4096, 4097, 8192, 16384, 16385, 65536}) {
        std::printf("warp: ctx %6d: S=%3d splits %4d\n", ctx, warp_split::split_keys_for(ctx), warp_split::split_count(ctx));
    }
    for (int64_t mc : {16LL, 256LL, 300LL, 4096LL, 4100LL, 8192LL, 9000LL, 20000LL, 70000LL}) {
        int brute = 0;
        for (int c = 1; c <= mc; ++c) brute = max(brute, warp_split::split_count(c));
        const bool ok = brute == warp_split::max_split_count(mc);
        g_fail += !ok;
        std::printf("warp: max_ctx %6lld: grid splits %d (brute %d) %s\n", (long long) mc, warp_split::max_split_count(mc),
                    brute, ok ? "ok" : "FAIL");
    }
    // the pipelined kernel's split rule (and a fixed split) and grid split count
    for (int ctx : {1, 255, 256, 257, 4096, 8192, 8193, 16384, 32768, 100000}) {
        std::printf("pipelined: ctx %6d: rule S=%5d n=%3d | fixed 128: S=%5d n=%4d\n", ctx,
                    pipelined::split_keys_for(ctx, 0), pipelined::split_count(ctx, 0),
                    pipelined::split_keys_for(ctx, 128), pipelined::split_count(ctx, 128));
    }
    for (int64_t mc : {200LL, 8192LL, 8200LL, 32768LL, 131072LL}) {
        int brute0 = 0, brute1 = 0;
        for (int c = 1; c <= mc; ++c) {
            brute0 = max(brute0, pipelined::split_count(c, 0));
            brute1 = max(brute1, pipelined::split_count(c, 100));
        }
        const bool ok = brute0 == pipelined::max_split_count(mc, 0) && brute1 == pipelined::max_split_count(mc, 100);
        g_fail += !ok;
        std::printf("pipelined: max_ctx %6lld: grid splits %d (brute %d), fixed 100: %d (brute %d) %s\n",
                    (long long) mc, pipelined::max_split_count(mc, 0), brute0, pipelined::max_split_count(mc, 100),
                    brute1, ok ? "ok" : "FAIL");
    }
    if (argc > 1 && std::strcmp(argv[1], "--ring") == 0) {  // the ring kernel alone, on every shape it covers
        const std::vector<Kern> kRing = {Kern::ring, Kern::ring2, Kern::ring16};
        const std::vector<int> lens = {1, 5, 33, 200, 256, 257, 700, 1300};
        test({64, 32, 8, 16, 0, false}, lens, 1, kRing);    // GQA 4, D 64
        test({64, 8, 8, 16, 0, true}, lens, 2, kRing);      // GQA 1, staging
        test({64, 16, 8, 5, 0, false}, lens, 3, kRing);     // GQA 2, block size 5
        test({64, 16, 2, 32, 0, false}, lens, 4, kRing);    // GQA 8
        test({128, 32, 8, 16, 30, false}, lens, 5, kRing);  // D 128, soft cap
        test({128, 8, 1, 16, 0, false}, lens, 6, kRing);    // D 128, GQA 8 (one key group)
        test({256, 8, 2, 12, 0, true}, lens, 7, kRing);     // D 256, GQA 4, staging
        test({256, 4, 4, 16, 0, false}, lens, 8, kRing);    // D 256, GQA 1
        test({64, 8, 2, 16, 0, false}, {5000}, 9, kRing);   // one long row: 20 splits
        test({128, 16, 8, 16, 0, false}, lens, 10, kRing);  // D 128, GQA 2
        test({128, 4, 4, 32, 0, true}, lens, 11, kRing);    // D 128, GQA 1, staging
        test({256, 8, 4, 16, 30, false}, lens, 12, kRing);  // D 256, GQA 2, soft cap
        std::printf(g_fail ? "%d FAILED\n" : "PASS\n", g_fail);
        return g_fail != 0;
    }
    test_combine_chunks<64>(640000, 21);
    test_combine_chunks<256>(300000, 22);
    if (quick) {  // every kernel but the ring one on two cases, the ring kernel on a third
        std::vector<Kern> no_ring = kAll;
        no_ring.erase(std::remove_if(no_ring.begin(), no_ring.end(),
                                     [](Kern k) { return k == Kern::ring || k == Kern::ring2 || k == Kern::ring16; }),
                      no_ring.end());
        test({64, 32, 8, 16, 0, false}, {1, 33, 200, 257, 1300}, 1, no_ring);
        test({64, 16, 4, 16, 30, true}, {1, 300, 2100}, 8, {Kern::ring, Kern::ring2});
        test({64, 8, 2, 16, 0, true}, {5000}, 7, no_ring);
        std::printf(g_fail ? "%d FAILED\n" : "PASS\n", g_fail);
        return g_fail != 0;
    }
    const std::vector<int> lens = {1, 5, 33, 200, 256, 257, 700, 1300};
    test({64, 32, 8, 16, 0, false}, lens, 1);    // Llama-3.2-1B
    test({64, 9, 3, 16, 0, false}, lens, 2);     // SmolLM2-135M (GQA 3)
    test({128, 32, 8, 16, 30, false}, lens, 3);  // Llama-3.1-8B, soft cap
    test({128, 8, 8, 32, 0, true}, lens, 4);     // GQA 1, KV staging
    test({256, 8, 1, 5, 0, true}, lens, 5);      // head size 256, GQA 8, block size 5
    test({64, 24, 3, 12, 0, false}, {2100}, 6);  // one long row: 9 splits of 256 (two-pass), 33 of 64 (warp)
    test({64, 8, 2, 16, 0, false}, {5000}, 7);   // warp: 128-key splits, 40 of them
    // the pipelined kernel with fixed splits, in one register budget each
    const std::vector<Kern> kPipe = {Kern::pipelined};
    const std::vector<Kern> kPipeNarrow = {Kern::pipelined_narrow};
    test({64, 32, 8, 16, 0, false, 64}, lens, 13, kPipe);
    test({64, 32, 8, 12, 0, false, 100}, lens, 14, kPipeNarrow);
    test({128, 32, 8, 16, 30, false, 64}, lens, 15, kPipe);
    test({256, 6, 2, 5, 0, true, 96}, lens, 16, kPipe);        // head size 256, GQA 3, staging
    test({64, 24, 3, 32, 0, false, 128}, lens, 17, kPipeNarrow);
    std::printf(g_fail ? "%d FAILED\n" : "PASS\n", g_fail);
    return g_fail != 0;
}
