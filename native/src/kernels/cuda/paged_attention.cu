// paged_attention.cu - CUDA paged attention; the contract and the work split are in paged_attention.cuh.
#include "paged_attention.cuh"
#include "paged_attention_pipelined.cuh"
#include "paged_attention_ring.cuh"
#include "paged_attention_two_pass.cuh"
#include "paged_attention_warp_split.cuh"
#include "paged_prefill_mma.cuh"

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cf {
namespace cuda {

namespace {

using namespace two_pass;

#define CF_CUDA_STR2(x) #x
#define CF_CUDA_STR(x) CF_CUDA_STR2(x)
#define CF_CUDA_WHERE __FILE__ ":" CF_CUDA_STR(__LINE__) ": "

// The process's defaults for the A/B knobs of PagedAttentionCudaArgs (read once): CACHEFLOW_PA_KERNEL=two_pass|
// pipelined|warp|ring, CACHEFLOW_PA_RING_SPC=N (ring: N splits per CTA),
// CACHEFLOW_PA_SPLIT_KEYS=N (pipelined: N keys per split), CACHEFLOW_PA_PDL=0|1,
// CACHEFLOW_PA_TILE_ROWS=4|8 (pipelined: the narrow or wide register budget), CACHEFLOW_PA_LOADS=narrow|narrow_pf|
// wide|by_grid|narrow8 (the two-pass and warp kernels' load shapes; the warp kernel takes by_grid when unset, and
// runs narrow8 as narrow),
// CACHEFLOW_PA_HEADS=group|one|by_grid (the two-pass kernel's query heads per CTA, PagedHeads).
// The pipelined kernel stays opt-in until it has passed the standalone test on a GPU (it was written and compiled
// for sm_90 without one); then kPagedKernelPipelined becomes the default here.
struct EnvDefaults {
    int32_t kernel = kPagedKernelTwoPass;
    int32_t split_keys = 0;
    int32_t pdl = 0;
    int32_t tile_rows = 0;
    int32_t loads = kPagedLoadsDefault;
    int32_t heads = kPagedHeadsByGrid;
    int32_t ring_spc = 0;
};

// A named choice of an environment variable: `out` = the value of the name `var` is set to; unset leaves `out`, and a
// name not in `choices` is reported on stderr (with the names it may take) and ignored.
struct EnvChoice {
    const char * name;
    int32_t value;
};
template <size_t N> void env_choice(const char * var, const EnvChoice (&choices)[N], int32_t & out) {
    const char * v = std::getenv(var);
    if (v == nullptr) {
        return;
    }
    for (const EnvChoice & c : choices) {
        if (std::strcmp(v, c.name) == 0) {
            out = c.value;
            return;
        }
    }
    std::fprintf(stderr, "cacheflow: %s=%s is not one of", var, v);
    for (const EnvChoice & c : choices) {
        std::fprintf(stderr, " %s", c.name);
    }
    std::fprintf(stderr, "; ignored\n");
}

const EnvDefaults & env_defaults() {
    static const EnvDefaults d = [] {
        EnvDefaults e;
        env_choice("CACHEFLOW_PA_KERNEL",
                   {{"two_pass", kPagedKernelTwoPass},
                    {"pipelined", kPagedKernelPipelined},
                    {"warp", kPagedKernelWarp},
                    {"ring", kPagedKernelRing}},
                   e.kernel);
        if (const char * v = std::getenv("CACHEFLOW_PA_RING_SPC")) {
            const int n = std::atoi(v);
            e.ring_spc = n >= 1 && n <= ring::kMaxSplitsPerCta ? n : 0;
        }
        if (const char * v = std::getenv("CACHEFLOW_PA_SPLIT_KEYS")) {
            e.split_keys = std::atoi(v) > 0 ? std::atoi(v) : 0;
        }
        if (const char * v = std::getenv("CACHEFLOW_PA_PDL")) {
            e.pdl = std::atoi(v) != 0 ? 1 : -1;
        }
        if (const char * v = std::getenv("CACHEFLOW_PA_TILE_ROWS")) {
            e.tile_rows = std::atoi(v) == pipelined::kTileRowsNarrow ? pipelined::kTileRowsNarrow : 0;
        }
        env_choice("CACHEFLOW_PA_LOADS",
                   {{"narrow", kPagedLoadsNarrow}, {"narrow_pf", kPagedLoadsNarrowPf}, {"wide", kPagedLoadsWide},
                    {"by_grid", kPagedLoadsByGrid}, {"narrow8", kPagedLoadsNarrow8}},
                   e.loads);
        env_choice("CACHEFLOW_PA_HEADS",
                   {{"group", kPagedHeadsGroup}, {"one", kPagedHeadsOne}, {"by_grid", kPagedHeadsByGrid}}, e.heads);
        return e;
    }();
    return d;
}

// Whether the current device takes programmatic dependent launches (sm_90+), cached per device.
bool device_has_pdl() {
    static int cached[64] = {};  // 0 = not asked yet, 1 = yes, -1 = no; racing writers store the same value
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return false;
    }
    if (cached[dev] == 0) {
        int major = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cached[dev] = major >= 9 ? 1 : -1;
    }
    return cached[dev] == 1;
}

// Streaming multiprocessors of the current device, cached per device (132 on the H200 / H100 SXM).
int device_sm_count() {
    static int cached[64] = {};  // 0 = not asked yet; racing writers store the same value
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return 0;
    }
    if (cached[dev] == 0) {
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cached[dev] = sms > 0 ? sms : -1;
    }
    return cached[dev] > 0 ? cached[dev] : 0;
}

// kPagedLoadsByGrid: the two-pass kernel's load shape for a grid of `ctas` CTAs: wide while the grid fills at most
// two CTAs per SM (a B=1 decode step: 8 CTAs per 256-key split of a row at 8 KV heads), where nothing else hides a
// CTA's memory round trips, else narrow (70-72 registers, more CTAs per SM). The grid, not the rows, decides, so the
// choice may follow the batch: both shapes compute the same bits (kRowsInFlightWide). The two-pass kernel's default
// from stop 35 to stop 38 (back to back on an H100 never more than 1% slower than narrow and 6-14% faster on small
// grids, results/h200_gpu/stop35); in the engine's graph at B=1 wide was the slower one (stop38), so the two-pass
// default is narrow since. Still the warp-split kernel's default.
bool small_grid(int64_t ctas) {
    const int sms = device_sm_count();
    return sms > 0 && ctas <= 2 * (int64_t) sms;
}

PagedLoads loads_for_grid(int64_t ctas) {
    return small_grid(ctas) ? kPagedLoadsWide : kPagedLoadsNarrow;
}

// kPagedHeadsByGrid: one query head per CTA while the grid of whole GQA groups (`group_ctas` CTAs) fits in two CTAs
// per SM, else the whole group. At B=1 (8 KV heads, a 200-key row: 8 working CTAs on an H100's 132 SMs) a CTA of four
// heads was 12.5 us of one SM's time under ncu in the engine, against 4.6 us for stock flash attention's vec kernel
// spread over 128 CTAs of one head: the CTA's time is a chain of dependent instructions at one warp per scheduler, most
// of it per-head arithmetic, which G CTAs divide. The standalone bench on an H100 (results/h200_gpu/stop40, us per
// layer back to back / in a graph over cold K/V, D 64, 32/8 heads, 200 keys): B=1 13.6 / 14.8 -> 8.4 / 9.5, B=16
// 13.9 -> 9.6, B=32 14.7 -> 12.7 (256 group CTAs), but B=64 17.0 -> 22.0 (512) and B=16 at 2,048 keys 37.4 -> 54.7
// (1,024), where the group's shared K/V loads win. Both compute the same bits (PagedHeads), so the choice may follow
// the grid.
bool one_head_for_grid(int64_t group_ctas, int G) {
    const int sms = device_sm_count();
    return G > 1 && sms > 0 && group_ctas <= 2 * (int64_t) sms;
}

// CTAs of `kernel` (threads_for(D) threads, static shared memory only) one SM holds at once, 0 if the runtime cannot
// say; a failed query's error is taken off the runtime's last-error slot, so that the launch that follows does not
// report it.
template <typename Kernel> int resident_ctas_per_sm(Kernel kernel, int threads) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess) {
        (void) cudaGetLastError();
        return 0;
    }
    return n;
}

// kPagedLoadsByGrid, past loads_for_grid's narrow: whether the group kernel <D, G> should run narrow8. It must hold
// more CTAs per SM than narrow (the occupancy API, both builds; with nvcc 13.0 only G 4 gains: 72 -> 64 registers, 7
// -> 8 CTAs, while G 1 to 3 keep their count), and the grid of `ctas` CTAs must exceed what the SMs hold of narrow at
// once, so that the extra CTA per SM adds memory round trips in flight (two_pass::bounded_ctas, with the H100
// figures). A grid of one resident wave either way gains nothing and pays narrow8's extra instructions (B=64 at 200
// keys: 16.5 -> 17.3 us per layer). Counts cached per device for each <D, G>; a failed query is asked again later.
template <int D, int G> bool bounded_for_grid(int64_t ctas) {
    constexpr int kBound = bounded_ctas(D, G);
    if (kBound == 1) {
        return false;  // narrow8 is narrow here
    }
    // per device: narrow's resident CTAs per SM in the low 16 bits, narrow8's above; 0 = not known yet
    static std::atomic<int> cached[64] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return false;
    }
    int counts = cached[dev].load(std::memory_order_relaxed);
    if (counts == 0) {
        const int threads = threads_for(D);
        const int narrow = resident_ctas_per_sm(paged_attention_split_kernel<D, G, kRowsInFlight, false>, threads);
        const int bounded =
            resident_ctas_per_sm(paged_attention_split_kernel<D, G, kRowsInFlight, false, G, kBound>, threads);
        if (narrow <= 0 || bounded <= 0) {
            return false;
        }
        counts = narrow | (bounded << 16);
        cached[dev].store(counts, std::memory_order_relaxed);
    }
    const int narrow = counts & 0xffff;
    const int bounded = counts >> 16;
    const int sms = device_sm_count();
    return bounded > narrow && sms > 0 && ctas > (int64_t) narrow * sms;
}

// The warp-split kernel's warps (splits) per CTA: kWarps, or CACHEFLOW_PA_WARP_CTA=1 for one-warp CTAs (same bits,
// paged_attention_warp_split.cuh). One-warp CTAs were meant for small grids (a lone 256-key row: 32 CTAs on 32 SMs
// instead of 8 on 8) and measured slower on an H100 at every batch (results/h200_gpu/stop38: B=1 at 200 keys 17.7
// against 14.6 us per layer, B=256 96.5 against 78.9), so they are an A/B knob, not the grid's choice.
int warps_per_cta() {
    static const int forced = [] {
        const char * v = std::getenv("CACHEFLOW_PA_WARP_CTA");
        return v != nullptr && std::atoi(v) == warp_split::kWarpsOne ? warp_split::kWarpsOne : 0;
    }();
    return forced != 0 ? forced : warp_split::kWarps;
}

// The ring kernel's splits per CTA for a grid of n_splits splits per (token, KV head): the fewest that fit the grid in
// one resident wave of the kernel (the occupancy API; cached per device for each <D, G>), at most
// ring::kMaxSplitsPerCta, then evened out over the CTAs of a row. A CTA streams its splits through one ring, so a
// large batch's grid runs as one wave without a longer split (which would change the sums: batch invariance); the
// count moves work between CTAs only, every split's sums are the same. 1 where the runtime cannot say.
template <int D, int G> int ring_splits_per_cta(int n_splits, const PagedAttentionCudaArgs & a) {
    // resident CTAs per SM of the instance the launch runs (without / with a soft cap: their registers differ),
    // 0 = not known yet
    static std::atomic<int> cached[2][64] = {};
    const bool cap = a.softcap != 0.0f;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return 1;
    }
    int per_sm = cached[cap][dev].load(std::memory_order_relaxed);
    if (per_sm == 0) {
        per_sm = cap ? resident_ctas_per_sm(ring::split_kernel<D, G, true>, ring::kThreads)
                     : resident_ctas_per_sm(ring::split_kernel<D, G, false>, ring::kThreads);
        if (per_sm <= 0) {
            return 1;
        }
        cached[cap][dev].store(per_sm, std::memory_order_relaxed);
    }
    const int64_t slots = (int64_t) per_sm * device_sm_count();
    const int64_t ctas = (int64_t) n_splits * a.n_head_kv * a.n_tokens;
    if (slots <= 0 || ctas <= slots) {
        return 1;
    }
    int64_t spc = (ctas + slots - 1) / slots;
    spc = spc < ring::kMaxSplitsPerCta ? spc : ring::kMaxSplitsPerCta;
    spc = spc < n_splits ? spc : n_splits;
    const int64_t per_row = (n_splits + spc - 1) / spc;  // CTAs per (token, KV head)
    return (int) ((n_splits + per_row - 1) / per_row);
}

// What one call launches: the kernel, its split rule and grid splits, PDL.
struct Plan {
    bool pipelined;
    bool warp;       // the warp-split kernel (paged_attention_warp_split.cuh)
    int split_keys;  // pipelined: fixed keys per split, 0 = the rule
    bool pdl;        // pipelined and warp-split kernels by default, the two-pass kernel when pdl == 1
    bool narrow;     // pipelined: the narrow register budget (tile_rows 4)
    int n_splits;    // splits of the grid
    int warps;       // warp-split: warps (splits) per CTA, kWarps or kWarpsOne
    PagedLoads loads;  // two-pass: rows in flight and V prefetch
    bool loads_by_grid;  // two-pass: loads came from by_grid, so a narrow group grid larger than one resident wave of
                         // the narrow kernel runs narrow8 where that adds a CTA per SM (launch, bounded_for_grid)
    bool one_head;     // two-pass: one query head per CTA (else the whole GQA group)
    bool ring;         // the ring kernel (paged_attention_ring.cuh) where it covers the shape, else two-pass
    int ring_spc;      // ring: splits per CTA, 0 = by the grid (launch, ring_splits_per_cta)
    // Whether some row may write split states for a combine kernel (the workspace is needed). For the warp-split
    // kernel it is sized for one-warp CTAs whatever cta_warps is (every row of more than one split).
    bool partials() const { return n_splits > (warp ? warp_split::kWarpsOne : 1); }
};

Plan plan_for(const PagedAttentionCudaArgs & a) {
    const EnvDefaults & env = env_defaults();
    Plan p{};
    const int32_t kernel = a.kernel != kPagedKernelDefault ? a.kernel : env.kernel;
    p.pipelined = kernel == kPagedKernelPipelined;
    p.warp = kernel == kPagedKernelWarp;
    const int G = a.n_head_kv > 0 ? a.n_head / a.n_head_kv : 1;
    p.ring = kernel == kPagedKernelRing && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0 &&
             ring::covers(a.head_dim, G);
    if (p.ring) {  // the two-pass kernel's splits and combine
        p.n_splits = two_pass_num_splits(a);
        p.ring_spc = a.ring_spc != 0 ? a.ring_spc : env.ring_spc;
        const int32_t pdl = a.pdl != 0 ? a.pdl : env.pdl;
        p.pdl = pdl == 1 && device_has_pdl();
        return p;
    }
    if (p.warp) {  // its round rows: PagedLoads as for the two-pass kernel, by the grid unless set (same bits)
        p.n_splits = warp_split::max_split_count(a.block_table_stride * a.block_size);
        const int32_t loads = a.loads != kPagedLoadsDefault ? a.loads : env.loads;
        const int64_t ctas = (int64_t) ((p.n_splits + warp_split::kWarps - 1) / warp_split::kWarps) * a.n_head_kv *
                             a.n_tokens;
        p.warps = a.cta_warps != 0 ? a.cta_warps : warps_per_cta();
        const int64_t grid_ctas = ctas * warp_split::kWarps / p.warps;  // the launch's CTAs at p.warps per CTA
        p.loads = loads == kPagedLoadsDefault || loads == kPagedLoadsByGrid ? loads_for_grid(grid_ctas)
                  : loads == kPagedLoadsWide                                ? kPagedLoadsWide
                                                                            : kPagedLoadsNarrow;
        const int32_t pdl = a.pdl != 0 ? a.pdl : env.pdl;
        p.pdl = pdl >= 0 && device_has_pdl();
        return p;
    }
    if (!p.pipelined) {
        p.n_splits = two_pass_num_splits(a);
        const int32_t heads = a.heads != kPagedHeadsDefault ? a.heads : env.heads;
        const int64_t group_ctas = (int64_t) p.n_splits * a.n_head_kv * a.n_tokens;
        p.one_head = heads == kPagedHeadsOne || (heads == kPagedHeadsByGrid && one_head_for_grid(group_ctas, G));
        const int64_t launched = group_ctas * (p.one_head ? G : 1);
        // Small grids (at most two CTAs per SM, counting the CTAs launched) take wide loads and PDL by default, larger
        // ones narrow loads and no PDL. Neither changes an output bit. On an H100 (results/h200_gpu/stop41), one head
        // per CTA at B=1, 200 keys, us per layer back to back / in a graph over cold K/V: narrow 8.4 / 9.5, wide 7.7 /
        // 6.8, wide + PDL 6.6 / 6.4, and up to B=8 the same order; from B=16 (512 CTAs) wide loses (9.6 -> 14.0) and
        // at B=32 PDL does (13.0 -> 13.8 in a graph). In place, B=1 128/128 decode: 728 tok/s narrow without PDL, 735
        // wide, 739 with PDL, each alone (within the run's noise of a few percent); together not yet measured in
        // place. Before stop 41 the two-pass default was narrow without PDL: with whole-group CTAs, wide ran slower
        // in place (stop 38) and PDL showed no gain (stop 37).
        const int32_t pdl = a.pdl != 0 ? a.pdl : env.pdl;
        p.pdl = device_has_pdl() && (pdl == 1 || (pdl == 0 && small_grid(launched)));
        const int32_t loads = a.loads != kPagedLoadsDefault ? a.loads : env.loads;
        p.loads_by_grid = loads == kPagedLoadsDefault || loads == kPagedLoadsByGrid;
        p.loads = p.loads_by_grid ? loads_for_grid(launched) : (PagedLoads) loads;
        return p;
    }
    p.split_keys = a.split_keys != 0 ? a.split_keys : env.split_keys;
    const int32_t pdl = a.pdl != 0 ? a.pdl : env.pdl;
    p.pdl = pdl >= 0 && device_has_pdl();
    p.narrow = (a.tile_rows != 0 ? a.tile_rows : env.tile_rows) == pipelined::kTileRowsNarrow;
    p.n_splits = pipelined::max_split_count(a.block_table_stride * a.block_size, p.split_keys);
    return p;
}

// cudaLaunchKernelEx, with the programmatic-stream-serialization attribute when pdl.
template <typename... Params, typename... Args>
cudaError_t launch_ex(void (*kernel)(Params...), dim3 grid, dim3 block, bool pdl, cudaStream_t stream,
                      Args... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <int D, int G>
cudaError_t launch(const PagedAttentionCudaArgs & args, const Plan & plan, void * workspace, cudaStream_t stream) {
    PagedAttentionCudaArgs a = args;
    if (a.k_stage == nullptr) {
        a.stage_base_row = INT32_MAX;  // no row index reaches it: every row is the pool's
    }
    const int n_splits = plan.n_splits;
    float * part_o = nullptr;
    float * part_ml = nullptr;
    if (plan.partials()) {
        part_o = static_cast<float *>(workspace);
        part_ml = part_o + (size_t) a.n_tokens * a.n_head * n_splits * D;
    }
    const dim3 grid((unsigned) n_splits, (unsigned) a.n_head_kv, (unsigned) a.n_tokens);
    const dim3 cgrid((unsigned) a.n_head, (unsigned) a.n_tokens);
    if (plan.warp) {
        const int w = plan.warps;
        const dim3 wgrid((unsigned) ((n_splits + w - 1) / w), (unsigned) a.n_head_kv, (unsigned) a.n_tokens);
        using namespace warp_split;
        const bool wide = plan.loads == kPagedLoadsWide;
        auto kernel = w == kWarpsOne ? (wide ? split_kernel<D, G, kRoundRowsWide, kWarpsOne>
                                                   : split_kernel<D, G, kRoundRowsNarrow, kWarpsOne>)
                                           : (wide ? split_kernel<D, G, kRoundRowsWide, kWarps>
                                                   : split_kernel<D, G, kRoundRowsNarrow, kWarps>);
        cudaError_t err =
            launch_ex(kernel, wgrid, dim3(32 * w), plan.pdl, stream, a, part_o, part_ml, n_splits, plan.pdl);
        if (err == cudaSuccess && n_splits > w) {
            err = launch_ex(combine_kernel<D>, cgrid, dim3(kCombineThreads), plan.pdl, stream, a,
                            (const float *) part_o, (const float *) part_ml, n_splits, w, plan.pdl);
        }
        return err != cudaSuccess ? err : cudaGetLastError();
    }
    if constexpr (ring::covers(D, G)) {
        if (plan.ring) {
            const int spc = plan.ring_spc > 0 ? plan.ring_spc : ring_splits_per_cta<D, G>(n_splits, a);
            const int bs_shift =
                (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz((unsigned) a.block_size) : -1;
            const dim3 rgrid((unsigned) ((n_splits + spc - 1) / spc), (unsigned) a.n_head_kv, (unsigned) a.n_tokens);
            auto kernel = a.softcap != 0.0f ? ring::split_kernel<D, G, true> : ring::split_kernel<D, G, false>;
            cudaError_t err = launch_ex(kernel, rgrid, dim3(ring::kThreads), plan.pdl, stream, a, part_o, part_ml,
                                        n_splits, spc, bs_shift, plan.pdl);
            if (err == cudaSuccess && n_splits > 1) {
                err = launch_ex(paged_attention_combine_kernel<D>, cgrid, dim3(kCombineThreads), plan.pdl, stream, a,
                                (const float *) part_o, (const float *) part_ml, n_splits, plan.pdl);
            }
            return err != cudaSuccess ? err : cudaGetLastError();
        }
    }
    if (plan.pipelined) {
        const int bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __builtin_ctz((unsigned) a.block_size) : -1;
        auto kernel = plan.narrow ? pipelined::split_kernel<D, G, pipelined::kTileRowsNarrow>
                                  : pipelined::split_kernel<D, G, pipelined::kTileRowsWide>;
        cudaError_t err = launch_ex(kernel, grid, dim3(pipelined::kThreads), plan.pdl, stream, a, part_o, part_ml,
                                    n_splits, plan.split_keys, bs_shift, plan.pdl);
        if (err == cudaSuccess && n_splits > 1) {
            err = launch_ex(pipelined::combine_kernel<D>, cgrid, dim3(pipelined::kCombineThreads), plan.pdl, stream, a,
                            (const float *) part_o, (const float *) part_ml, n_splits, plan.split_keys);
        }
        return err != cudaSuccess ? err : cudaGetLastError();
    }
    // one query head per CTA (PagedHeads): G CTAs per KV head, in the narrow or wide load shape (narrow_pf and narrow8
    // run narrow: the same bits); whole groups in any load shape, narrow8 where bounded_ctas allows a bound
    const bool one_head = plan.one_head && G > 1;
    const int64_t group_ctas = (int64_t) n_splits * a.n_head_kv * a.n_tokens;
    const bool narrow8 = !one_head && (plan.loads == kPagedLoadsNarrow8 ||
                                       (plan.loads_by_grid && plan.loads == kPagedLoadsNarrow &&
                                        bounded_for_grid<D, G>(group_ctas)));
    auto kernel = narrow8 ? paged_attention_split_kernel<D, G, kRowsInFlight, false, G, bounded_ctas(D, G)>
                  : one_head
                      ? (plan.loads == kPagedLoadsWide ? paged_attention_split_kernel<D, G, kRowsInFlightWide, true, 1>
                                                       : paged_attention_split_kernel<D, G, kRowsInFlight, false, 1>)
                  : plan.loads == kPagedLoadsWide     ? paged_attention_split_kernel<D, G, kRowsInFlightWide, true>
                  : plan.loads == kPagedLoadsNarrowPf ? paged_attention_split_kernel<D, G, kRowsInFlight, true>
                                                      : paged_attention_split_kernel<D, G, kRowsInFlight, false>;
    const dim3 hgrid((unsigned) n_splits, (unsigned) (a.n_head_kv * (plan.one_head ? G : 1)), (unsigned) a.n_tokens);
    cudaError_t err =
        launch_ex(kernel, hgrid, dim3(threads_for(D)), plan.pdl, stream, a, part_o, part_ml, n_splits, plan.pdl);
    if (err == cudaSuccess && n_splits > 1) {
        err = launch_ex(paged_attention_combine_kernel<D>, cgrid, dim3(kCombineThreads), plan.pdl, stream, a,
                        (const float *) part_o, (const float *) part_ml, n_splits, plan.pdl);
    }
    return err != cudaSuccess ? err : cudaGetLastError();
}

template <int D>
cudaError_t launch_gqa(const PagedAttentionCudaArgs & a, const Plan & p, void * workspace, cudaStream_t stream) {
    switch (a.n_head / a.n_head_kv) {
        case 1: return launch<D, 1>(a, p, workspace, stream);
        case 2: return launch<D, 2>(a, p, workspace, stream);
        case 3: return launch<D, 3>(a, p, workspace, stream);
        case 4: return launch<D, 4>(a, p, workspace, stream);
        case 5: return launch<D, 5>(a, p, workspace, stream);
        case 6: return launch<D, 6>(a, p, workspace, stream);
        case 7: return launch<D, 7>(a, p, workspace, stream);
        case 8: return launch<D, 8>(a, p, workspace, stream);
        default: return cudaErrorInvalidValue;  // excluded by paged_attention_cuda_unsupported
    }
}

}  // namespace

const char * paged_attention_cuda_unsupported(const PagedAttentionCudaArgs & a) {
    if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) {
        return "head size must be 64, 128 or 256";
    }
    if (a.n_head_kv < 1 || a.n_head % a.n_head_kv != 0 || a.n_head / a.n_head_kv > kMaxGqa) {
        return "query heads must be 1 to 8 times the KV heads";
    }
    if (a.k_stride_row % 8 != 0 || a.v_stride_row % 8 != 0 ||
        reinterpret_cast<uintptr_t>(a.k_pool) % 16 != 0 || reinterpret_cast<uintptr_t>(a.v_pool) % 16 != 0) {
        return "K/V pool rows must be 16-byte aligned";
    }
    if (a.k_stage != nullptr &&
        (a.v_stage == nullptr || reinterpret_cast<uintptr_t>(a.k_stage) % 16 != 0 ||
         reinterpret_cast<uintptr_t>(a.v_stage) % 16 != 0 || a.stage_base_row < 0 || a.stage_base_row > INT32_MAX)) {
        return "K/V staging rows must both be set, 16-byte aligned, with a base row in [0, INT32_MAX]";
    }
    if (a.block_size < 1 || a.block_table_stride < 1 || a.n_tokens < 0) {
        return "block size, block table width and token count must be positive";
    }
    if (a.kernel < kPagedKernelDefault || a.kernel > kPagedKernelRing || a.ring_spc < 0 ||
        a.ring_spc > ring::kMaxSplitsPerCta || a.split_keys < 0 || a.pdl < -1 ||
        a.pdl > 1 || (a.tile_rows != 0 && a.tile_rows != 4 && a.tile_rows != 8) || a.loads < kPagedLoadsDefault ||
        a.loads > kPagedLoadsNarrow8 ||
        (a.cta_warps != 0 && a.cta_warps != warp_split::kWarpsOne && a.cta_warps != warp_split::kWarps) ||
        a.heads < kPagedHeadsDefault || a.heads > kPagedHeadsByGrid) {
        return "kernel must be a PagedKernel, split_keys >= 0, pdl -1, 0 or 1, tile_rows 0, 4 or 8, loads a PagedLoads, "
               "cta_warps 0, 1 or 4, heads a PagedHeads, ring_spc 0 to 16";
    }
    return nullptr;
}

static size_t rows_workspace_bytes(const PagedAttentionCudaArgs & a) {
    const Plan plan = plan_for(a);
    if (!plan.partials()) {
        return 0;
    }
    return (size_t) a.n_tokens * a.n_head * plan.n_splits * ((size_t) a.head_dim + 2) * sizeof(float);
}

// Where the prefill path's workspace starts: after the rows kernel's, 256-byte aligned.
static size_t rows_workspace_end(const PagedAttentionCudaArgs & a) {
    return (rows_workspace_bytes(a) + 255) & ~(size_t) 255;
}

static const char * paged_attention_rows_cuda(const PagedAttentionCudaArgs & a, void * workspace, cudaStream_t stream) {
    static thread_local char message[256];
    if (const char * why = paged_attention_cuda_unsupported(a)) {
        std::snprintf(message, sizeof(message), CF_CUDA_WHERE "paged attention: %s (head size %d, %d/%d heads)", why,
                      a.head_dim, a.n_head, a.n_head_kv);
        return message;
    }
    if (a.n_tokens == 0) {
        return nullptr;
    }
    const Plan plan = plan_for(a);
    if (plan.partials() && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0)) {
        std::snprintf(message, sizeof(message),
                      CF_CUDA_WHERE "paged attention: no 16-byte aligned workspace for %d splits", plan.n_splits);
        return message;
    }
    cudaError_t err = cudaSuccess;
    switch (a.head_dim) {
        case 64: err = launch_gqa<64>(a, plan, workspace, stream); break;
        case 128: err = launch_gqa<128>(a, plan, workspace, stream); break;
        case 256: err = launch_gqa<256>(a, plan, workspace, stream); break;
        default: break;
    }
    if (err != cudaSuccess) {
        std::snprintf(message, sizeof(message), CF_CUDA_WHERE "paged attention launch failed: %s",
                      cudaGetErrorString(err));
        return message;
    }
    return nullptr;
}

// Opt-in tensor-core prefill (paged_prefill_mma.cuh): its workspace follows the rows kernel's; the rows
// kernel runs first with the MMA runs' contexts cut to one key, then the MMA kernel overwrites those rows.
size_t paged_attention_cuda_workspace_bytes(const PagedAttentionCudaArgs & a) {
    return rows_workspace_end(a) + paged_prefill_mma_workspace_bytes(a);
}

bool paged_attention_cuda_writes_f16(const PagedAttentionCudaArgs & a) {
    if (paged_attention_cuda_unsupported(a) != nullptr || paged_prefill_mma_applies(a)) {
        return false;
    }
    const Plan plan = plan_for(a);
    return !plan.pipelined && !plan.warp;
}

const char * paged_attention_cuda(const PagedAttentionCudaArgs & args, void * workspace, cudaStream_t stream) {
    PagedAttentionCudaArgs a = args;
    if (a.out_f16 != nullptr && !paged_attention_cuda_writes_f16(a)) {
        a.out_f16 = nullptr;  // not written, as paged_attention_cuda_writes_f16 tells the caller
    }
    if (paged_attention_cuda_unsupported(a) != nullptr || !paged_prefill_mma_applies(a)) {
        return paged_attention_rows_cuda(a, workspace, stream);
    }
    void * prefill_ws = workspace == nullptr ? nullptr : static_cast<char *>(workspace) + rows_workspace_end(a);
    PagedAttentionCudaArgs rows = a;
    if (const char * err = paged_prefill_mma_prepare(a, prefill_ws, stream, &rows.token_ctx_len)) {
        return err;
    }
    if (const char * err = paged_attention_rows_cuda(rows, workspace, stream)) {
        return err;
    }
    return paged_prefill_mma_launch(a, prefill_ws, stream);
}

}  // namespace cuda
}  // namespace cf
