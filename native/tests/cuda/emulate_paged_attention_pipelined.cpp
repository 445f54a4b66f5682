// emulate_paged_attention_pipelined.cpp - the pipelined CUDA kernels of paged_attention_pipelined.cuh run on the
// CPU: the header is compiled by g++ with __device__/__global__ erased, 128 host threads per CTA (one CTA at a
// time, __shared__ = static), __shfl_xor_sync and __syncthreads as barriers. It checks the kernels' logic (tiles,
// masks, online softmax, the lane/warp/split merges, the split rule and the grid's split count) against a float64
// reference and batch invariance (each row alone, with a wider table and relocated blocks: bit-identical), where no
// GPU is at hand. Not a substitute for test_paged_attention_cuda.cu on a GPU (host expf, no PDL, no memory model).
// Not a ctest (a few minutes). From the repository root:
//   g++ -std=c++20 -O1 -pthread -w -I /usr/local/cuda/include -I native/src/kernels/cuda \
//     native/tests/cuda/emulate_paged_attention_pipelined.cpp -o /tmp/emu && /tmp/emu
// Exit status 0 = PASS.
#define __device__
#define __global__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#include <cuda_fp16.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>
using std::min;
thread_local uint3 threadIdx, blockIdx;
static std::barrier<> * g_cta_bar;
static std::barrier<> * g_warp_bar[4];
static uint32_t g_slot[4][32];
inline void __syncthreads() { g_cta_bar->arrive_and_wait(); }
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
#include "paged_attention_pipelined.cuh"
using namespace cf::cuda;

// 128 persistent workers run one CTA per dispatch.
struct Pool {
    std::vector<std::thread> th;
    std::barrier<> start{129}, done{129};
    std::function<void()> job;
    bool stop = false;
    uint3 blk;
    Pool() {
        g_cta_bar = new std::barrier<>(128);
        for (auto & b : g_warp_bar) b = new std::barrier<>(32);
        for (int i = 0; i < 128; ++i) th.emplace_back([this, i] {
            threadIdx = make_uint3(i, 0, 0);
            for (;;) {
                start.arrive_and_wait();
                if (stop) return;
                blockIdx = blk;
                job();
                done.arrive_and_wait();
            }
        });
    }
    void run(uint3 b, std::function<void()> f) { blk = b; job = f; start.arrive_and_wait(); done.arrive_and_wait(); }
    ~Pool() { stop = true; start.arrive_and_wait(); for (auto & t : th) t.join(); }
};
Pool * g_pool;

struct Case { int D, nh, nkv, bs; float softcap; int fixed; int rows; bool stage; };

template <int D, int G, int R>
void launch(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int n_splits, int fixed) {
    const int bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz(a.block_size) : -1;
    ws.assign((size_t) a.n_tokens * a.n_head * n_splits * (D + 2), NAN);
    float * po = ws.data();
    float * pml = po + (size_t) a.n_tokens * a.n_head * n_splits * D;
    for (int t = 0; t < a.n_tokens; ++t)
        for (int h = 0; h < a.n_head_kv; ++h)
            for (int s = 0; s < n_splits; ++s)
                g_pool->run(make_uint3(s, h, t), [&] { pipelined::split_kernel<D, G, R>(a, po, pml, n_splits, fixed, bs_shift); });
    if (n_splits > 1)
        for (int t = 0; t < a.n_tokens; ++t)
            for (int h = 0; h < a.n_head; ++h)
                g_pool->run(make_uint3(h, t, 0), [&] { pipelined::combine_kernel<D>(a, po, pml, n_splits, fixed); });
}

template <int D, int G>
void launch_r(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int n, int fixed, int rows) {
    if (rows == 4) launch<D, G, 4>(a, ws, n, fixed); else launch<D, G, 8>(a, ws, n, fixed);
}
template <int D>
void launch_g(const PagedAttentionCudaArgs & a, std::vector<float> & ws, int n, int fixed, int rows) {
    switch (a.n_head / a.n_head_kv) {
        case 1: launch_r<D, 1>(a, ws, n, fixed, rows); break;
        case 3: launch_r<D, 3>(a, ws, n, fixed, rows); break;
        case 4: launch_r<D, 4>(a, ws, n, fixed, rows); break;
        case 8: launch_r<D, 8>(a, ws, n, fixed, rows); break;
        default: std::abort();
    }
}

int g_fail = 0;

// rows: (seq, ctx) queries; returns out [n][nh][D]
std::vector<float> run_case(const Case & c, const std::vector<int> & lens, const std::vector<std::pair<int, int>> & qs,
                            const std::vector<float> & q, const std::vector<std::vector<float>> & kv_k,
                            const std::vector<std::vector<float>> & kv_v, unsigned layout_seed, int extra_width) {
    const int row = c.nkv * c.D;
    int nb = 0;
    for (int L : lens) nb += (L + c.bs - 1) / c.bs;
    nb += 5;
    std::vector<int> ids(nb);
    for (int i = 0; i < nb; ++i) ids[i] = i;
    std::mt19937 rng(layout_seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    int width = 1;
    for (int L : lens) width = std::max(width, (L + c.bs - 1) / c.bs);
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
    // streaming: rows >= stage_base come from a separate buffer holding those rows
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
    const int n_splits = pipelined::max_split_count((int64_t) width * c.bs, c.fixed);
    std::vector<float> ws;
    switch (c.D) {
        case 64: launch_g<64>(a, ws, n_splits, c.fixed, c.rows); break;
        case 128: launch_g<128>(a, ws, n_splits, c.fixed, c.rows); break;
        case 256: launch_g<256>(a, ws, n_splits, c.fixed, c.rows); break;
    }
    return out;
}

void test(const Case & c, const std::vector<int> & lens, unsigned seed) {
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
    auto got = run_case(c, lens, qs, q, K, V, seed + 1, 0);
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
                sc[p] = d; mx = std::max(mx, d);
            }
            double l = 0;
            for (auto & x : sc) l += (x = std::exp(x - mx));
            for (int j = 0; j < c.D; ++j) {
                double o = 0;
                for (int p = 0; p < L; ++p) o += sc[p] * V[s][(size_t) p * row + kvh * c.D + j];
                const double e = std::fabs(o / l - got[(i * c.nh + h) * c.D + j]);
                max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
            }
        }
    // invariance: each query alone, wider table, another layout
    bool inv = true;
    for (size_t i = 0; i < qs.size(); i += 2) {
        std::vector<float> q1(q.begin() + i * c.nh * c.D, q.begin() + (i + 1) * c.nh * c.D);
        auto alone = run_case(c, lens, {qs[i]}, q1, K, V, seed + 77, 300);
        inv &= std::memcmp(alone.data(), got.data() + i * c.nh * c.D, alone.size() * 4) == 0;
    }
    const bool ok = max_err < 1e-5 && inv;
    g_fail += !ok;
    std::printf("D=%d heads %d/%d bs=%d softcap %.0f split %d rows %d stage %d: max err %.2e, invariant %s %s\n", c.D, c.nh,
                c.nkv, c.bs, c.softcap, c.fixed, c.rows, (int) c.stage, max_err, inv ? "yes" : "NO", ok ? "ok" : "FAIL");
}

int main() {
    Pool pool;
    g_pool = &pool;
    // the split rule and the grid's split count
    for (int ctx : {1, 255, 256, 257, 4096, 8192, 8193, 16384, 32768, 100000}) {
        std::printf("ctx %6d: rule S=%5d n=%3d | fixed 128: S=%5d n=%4d\n", ctx, pipelined::split_keys_for(ctx, 0),
                    pipelined::split_count(ctx, 0), pipelined::split_keys_for(ctx, 128), pipelined::split_count(ctx, 128));
    }
    for (int64_t mc : {200LL, 8192LL, 8200LL, 32768LL, 131072LL}) {
        int brute0 = 0, brute1 = 0;
        for (int c = 1; c <= mc; ++c) { brute0 = std::max(brute0, pipelined::split_count(c, 0)); brute1 = std::max(brute1, pipelined::split_count(c, 100)); }
        const bool ok = brute0 == pipelined::max_split_count(mc, 0) && brute1 == pipelined::max_split_count(mc, 100);
        g_fail += !ok;
        std::printf("max_ctx %6lld: grid splits %d (brute %d), fixed 100: %d (brute %d) %s\n", (long long) mc,
                    pipelined::max_split_count(mc, 0), brute0, pipelined::max_split_count(mc, 100), brute1, ok ? "ok" : "FAIL");
    }
    const std::vector<int> lens = {1, 5, 33, 200, 256, 257, 700, 1300};
    test({64, 32, 8, 16, 0, 0, 8, false}, lens, 1);
    test({64, 32, 8, 16, 0, 0, 4, false}, lens, 2);
    test({64, 32, 8, 16, 0, 64, 8, false}, lens, 3);
    test({64, 32, 8, 12, 0, 100, 4, false}, lens, 4);
    test({128, 32, 8, 16, 30, 64, 8, false}, lens, 5);
    test({128, 8, 8, 16, 0, 0, 8, true}, lens, 6);
    test({256, 6, 2, 5, 0, 96, 8, true}, lens, 7);
    test({64, 24, 3, 32, 0, 128, 4, false}, lens, 8);
    test({64, 16, 2, 16, 0, 0, 8, false}, {3000}, 9);
    std::printf(g_fail ? "%d FAILED\n" : "PASS\n", g_fail);
    return g_fail != 0;
}
