// test_paged_attention_cuda.cu - the CUDA paged attention kernels (two-pass, pipelined, warp; PagedKernel) against
// a float64 reference, their batch invariance (a row's output is bit-identical alone, in any batch, with any table
// width and wherever its blocks sit), and their speed on decode shapes (CUDA events, medians; printed, not
// asserted). The two-pass kernel's load shapes (PagedLoads) and query heads per CTA (PagedHeads) must give bit-identical outputs. `--bench` times both
// kernels (the two-pass one in each load shape) on every shape and, at contexts >= 8K, the pipelined kernel with
// fixed split lengths and without PDL, then prints issue 11's summary (the least share of the copy bandwidth at
// >= 8K). Each kernel's bench line gives its us per layer and its largest difference from the two-pass kernel's,
// then the same call timed inside a captured CUDA graph over copies of the K/V pool past the L2 cache ("graph, cold
// K/V"). Neither figure predicts the engine: at B=1 both rank the two-pass kernel's wide loads ahead of narrow, and in
// the engine's replayed graph narrow is faster (results/h200_gpu/stop38); scripts/h200_gpu_tests.sh's trace stage
// measures kernels in place. `--bench short`: the short-context shapes alone, at B = 1 to 256.
// Then the opt-in tensor-core prefill path (paged_prefill_mma.cuh) on ragged prefill batches against float64
// (asserted: within 2e-3 of the output scale), and with --bench a 2048-token chunk at context 2K / 8K / 32K,
// rows kernel vs MMA path (us per layer, TFLOP/s). --bench-prefill: those three lines alone.
//
// Standalone: nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda
//   native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu
//   native/tests/cuda/test_paged_attention_cuda.cu
// (the CUDA build adds it as a ctest; tests/kernels/test_paged_attention_cuda.py runs it under the gpu marker).
// Exit status 0 = every check passed.
#include "device_helpers.cuh"
#include "paged_attention.cuh"
#include "paged_attention_ring.cuh"  // ring::covers
#include "paged_prefill_mma.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using cf::cuda::PagedAttentionCudaArgs;
using cf_test::copy_bandwidth_gbs;
using cf_test::DeviceBuffer;

namespace {

int g_failures = 0;

void expect(bool ok, const std::string & what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what.c_str());
        ++g_failures;
    }
}

// A K/V pool and the logical content of each sequence (values by position, so that the same sequence
// can be laid out in other blocks).
struct Model {
    int head_dim, n_head, n_head_kv, block_size, num_blocks;
    std::vector<std::vector<float>> k_by_pos;  // [seq][pos * n_head_kv * head_dim + ...] values (f16-exact)
    std::vector<std::vector<float>> v_by_pos;
    std::vector<int> seq_len;
};

struct Layout {
    std::vector<half> k_pool, v_pool;          // [num_blocks * block_size][n_head_kv * head_dim]
    std::vector<std::vector<int32_t>> tables;  // [seq][blocks]
};

float f16_round(float x) { return __half2float(__float2half(x)); }

Model make_model(int head_dim, int n_head, int n_head_kv, int block_size, const std::vector<int> & lens,
                 std::mt19937 & rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Model m{head_dim, n_head, n_head_kv, block_size, 0, {}, {}, lens};
    const int row = n_head_kv * head_dim;
    for (int len : lens) {
        std::vector<float> k((size_t) len * row), v((size_t) len * row);
        for (auto & x : k) x = f16_round(u(rng));
        for (auto & x : v) x = f16_round(u(rng));
        m.k_by_pos.push_back(std::move(k));
        m.v_by_pos.push_back(std::move(v));
        m.num_blocks += (len + block_size - 1) / block_size;
    }
    m.num_blocks += 7;  // spare blocks, so that layouts differ
    return m;
}

// Blocks assigned in a shuffled order determined by `seed`.
Layout make_layout(const Model & m, unsigned seed) {
    const int row = m.n_head_kv * m.head_dim;
    Layout lay;
    lay.k_pool.assign((size_t) m.num_blocks * m.block_size * row, __float2half(0.0f));
    lay.v_pool = lay.k_pool;
    std::vector<int32_t> ids(m.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    size_t next = 0;
    for (size_t s = 0; s < m.seq_len.size(); ++s) {
        std::vector<int32_t> table;
        for (int p = 0; p < m.seq_len[s]; ++p) {
            if (p % m.block_size == 0) {
                table.push_back(ids[next++]);
            }
            const size_t slot = (size_t) table.back() * m.block_size + p % m.block_size;
            for (int j = 0; j < row; ++j) {
                lay.k_pool[slot * row + j] = __float2half(m.k_by_pos[s][(size_t) p * row + j]);
                lay.v_pool[slot * row + j] = __float2half(m.v_by_pos[s][(size_t) p * row + j]);
            }
        }
        lay.tables.push_back(std::move(table));
    }
    return lay;
}

// Arguments over contiguous device buffers: q/out [n_tokens][n_head][head_dim], pools with rows of
// n_head_kv * head_dim halves, block tables [*][table_stride].
struct Shape {
    int head_dim, n_head, n_head_kv, block_size;
};

PagedAttentionCudaArgs make_args(const Shape & s, const float * q, const half * k, const half * v, int64_t kv_size,
                                 const int32_t * tables, int64_t table_stride, const int32_t * seq_idx,
                                 const int32_t * ctx, float * out, int n_tokens) {
    PagedAttentionCudaArgs a{};
    a.q = q;
    a.q_stride_head = s.head_dim;
    a.q_stride_token = (int64_t) s.n_head * s.head_dim;
    a.k_pool = k;
    a.v_pool = v;
    a.k_stride_row = a.v_stride_row = (int64_t) s.n_head_kv * s.head_dim;
    a.kv_size = kv_size;
    a.block_tables = tables;
    a.block_table_stride = table_stride;
    a.token_seq_idx = seq_idx;
    a.token_ctx_len = ctx;
    a.out = out;
    a.n_tokens = n_tokens;
    a.n_head = s.n_head;
    a.n_head_kv = s.n_head_kv;
    a.head_dim = s.head_dim;
    a.block_size = s.block_size;
    a.scale = 1.0f / std::sqrt((float) s.head_dim);
    a.softcap = 0.0f;
    return a;
}

struct Query {
    int seq;
    int ctx;  // attends to positions [0, ctx)
};

// A kernel choice (PagedAttentionCudaArgs::kernel, split_keys, pdl) and its label in the output.
struct Variant {
    const char * label;
    int32_t kernel;
    int32_t split_keys;  // 0 = the kernel's rule
    int32_t pdl;         // -1 = off
    int32_t tile_rows;   // 0 = default (8), 4 = narrow
    int32_t loads;       // a PagedLoads, 0 = the launcher's default (two_pass: narrow; warp: by the grid)
    int32_t cta_warps = 0;  // warp: warps per CTA, 0 = the launcher's default (CACHEFLOW_PA_WARP_CTA, else 4)
    int32_t heads = 0;      // two_pass: a PagedHeads, 0 = the launcher's default (CACHEFLOW_PA_HEADS, else by_grid)
    int32_t ring_spc = 0;   // ring: splits per CTA, 0 = the launcher's default (CACHEFLOW_PA_RING_SPC, else the grid's)
};

constexpr Variant kTwoPass{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, 0};
constexpr Variant kTwoPassNarrow{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsNarrow};
constexpr Variant kTwoPassNarrowPf{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsNarrowPf};
constexpr Variant kTwoPassWide{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsWide};
// Narrow rounds with registers bounded for 8 CTAs per SM (kPagedLoadsNarrow8), whole groups per CTA (the only
// placement that runs it): the same bits as narrow.
constexpr Variant kTwoPassNarrow8{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsNarrow8, 0,
                                  cf::cuda::kPagedHeadsGroup};
// By the grid: a row alone (the invariance check below) runs wide, the batch narrow, and their bits must agree.
constexpr Variant kTwoPassByGrid{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsByGrid};
// Query heads per CTA (PagedHeads): the whole GQA group or one head, in both load shapes; same bits as the others.
constexpr Variant kTwoPassGroup{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsNarrow, 0,
                                cf::cuda::kPagedHeadsGroup};
constexpr Variant kTwoPassOne{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsNarrow, 0,
                              cf::cuda::kPagedHeadsOne};
constexpr Variant kTwoPassOneWide{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 0, 0, cf::cuda::kPagedLoadsWide, 0,
                                  cf::cuda::kPagedHeadsOne};
constexpr Variant kTwoPassOnePdl{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 1, 0, cf::cuda::kPagedLoadsNarrow, 0,
                                 cf::cuda::kPagedHeadsOne};
constexpr Variant kPipelined{"pipelined", cf::cuda::kPagedKernelPipelined, 0, 0, 0, 0};
constexpr Variant kWarp{"warp", cf::cuda::kPagedKernelWarp, 0, 0, 0, 0};  // load shape by the grid
constexpr Variant kWarpNarrow{"warp", cf::cuda::kPagedKernelWarp, 0, 0, 0, cf::cuda::kPagedLoadsNarrow};
constexpr Variant kWarpWide{"warp", cf::cuda::kPagedKernelWarp, 0, 0, 0, cf::cuda::kPagedLoadsWide};
// The warp-split kernel with one-warp or four-warp CTAs, and without PDL.
constexpr Variant kWarp1{"warp", cf::cuda::kPagedKernelWarp, 0, 0, 0, 0, 1};
constexpr Variant kWarp4{"warp", cf::cuda::kPagedKernelWarp, 0, 0, 0, 0, 4};
constexpr Variant kWarpNoPdl{"warp", cf::cuda::kPagedKernelWarp, 0, -1, 0, 0};
constexpr Variant kTwoPassPdl{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 1, 0, cf::cuda::kPagedLoadsByGrid};
constexpr Variant kTwoPassNarrowPdl{"two_pass", cf::cuda::kPagedKernelTwoPass, 0, 1, 0, cf::cuda::kPagedLoadsNarrow};
constexpr Variant kPipelinedNarrow{"pipelined", cf::cuda::kPagedKernelPipelined, 0, 0, 4, 0};
constexpr Variant kPipelinedNoPdl{"pipelined", cf::cuda::kPagedKernelPipelined, 0, -1, 0, 0};

// The ring kernel (paged_attention_ring.cuh), splits per CTA by the grid or fixed: the same bits for every count.
constexpr Variant kRing{"ring", cf::cuda::kPagedKernelRing, 0, 0, 0, 0};
constexpr Variant kRing1{"ring", cf::cuda::kPagedKernelRing, 0, 0, 0, 0, 0, 0, 1};
constexpr Variant kRing2{"ring", cf::cuda::kPagedKernelRing, 0, 0, 0, 0, 0, 0, 2};
constexpr Variant kRing4{"ring", cf::cuda::kPagedKernelRing, 0, 0, 0, 0, 0, 0, 4};
constexpr Variant kRing16{"ring", cf::cuda::kPagedKernelRing, 0, 0, 0, 0, 0, 0, 16};

Variant pipelined_split(int32_t keys) { return {"pipelined", cf::cuda::kPagedKernelPipelined, keys, 0, 0, 0}; }

std::string label_of(const Variant & v) {
    std::string label = v.label;
    if (v.loads == cf::cuda::kPagedLoadsNarrow) label += " narrow";
    if (v.loads == cf::cuda::kPagedLoadsNarrowPf) label += " narrow_pf";
    if (v.loads == cf::cuda::kPagedLoadsWide) label += " wide";
    if (v.loads == cf::cuda::kPagedLoadsByGrid) label += " by_grid";
    if (v.loads == cf::cuda::kPagedLoadsNarrow8) label += " narrow8";
    if (v.tile_rows == 4) label += " rows4";
    if (v.split_keys) label += " S=" + std::to_string(v.split_keys);
    if (v.cta_warps) label += " w" + std::to_string(v.cta_warps);
    if (v.heads == cf::cuda::kPagedHeadsGroup) label += " group";
    if (v.heads == cf::cuda::kPagedHeadsOne) label += " one";
    if (v.heads == cf::cuda::kPagedHeadsByGrid) label += " heads_by_grid";
    if (v.ring_spc) label += " spc=" + std::to_string(v.ring_spc);
    if (v.pdl < 0) label += " no PDL";
    if (v.pdl > 0) label += " PDL";
    return label;
}

void apply(const Variant & v, PagedAttentionCudaArgs & a) {
    a.kernel = v.kernel;
    a.split_keys = v.split_keys;
    a.pdl = v.pdl;
    a.tile_rows = v.tile_rows;
    a.loads = v.loads;
    a.cta_warps = v.cta_warps;
    a.heads = v.heads;
    a.ring_spc = v.ring_spc;
}

// Runs the kernel over `queries` (q values from q_of(query index)); returns [n][n_head][head_dim].
std::vector<float> run(const Variant & v, const Model & m, const Layout & lay, const std::vector<Query> & queries,
                       const std::vector<float> & q_all /* [n][n_head][head_dim] */, int table_stride_extra = 0) {
    const int n = (int) queries.size();
    int stride = 1;
    for (const auto & t : lay.tables) stride = std::max(stride, (int) t.size());
    stride += table_stride_extra;
    std::vector<int32_t> tables(lay.tables.size() * (size_t) stride, -1);
    for (size_t s = 0; s < lay.tables.size(); ++s) {
        std::copy(lay.tables[s].begin(), lay.tables[s].end(), tables.begin() + (ptrdiff_t) (s * stride));
    }
    std::vector<int32_t> seq_idx(n), ctx(n);
    for (int i = 0; i < n; ++i) {
        seq_idx[i] = queries[i].seq;
        ctx[i] = queries[i].ctx;
    }
    DeviceBuffer<float> d_q(q_all);
    DeviceBuffer<half> d_k(lay.k_pool), d_v(lay.v_pool);
    DeviceBuffer<int32_t> d_tables(tables), d_seq(seq_idx), d_ctx(ctx);
    DeviceBuffer<float> d_out((size_t) n * m.n_head * m.head_dim);
    PagedAttentionCudaArgs a =
        make_args({m.head_dim, m.n_head, m.n_head_kv, m.block_size}, d_q.ptr, d_k.ptr, d_v.ptr,
                  (int64_t) m.num_blocks * m.block_size, d_tables.ptr, stride, d_seq.ptr, d_ctx.ptr, d_out.ptr, n);
    apply(v, a);
    // out's F16 copy (patches/0021): asked for every call, written where paged_attention_cuda_writes_f16 says so
    DeviceBuffer<half> d_out_f16(d_out.n);
    a.out_f16 = d_out_f16.ptr;
    CHECK_CUDA(cudaMemset(d_out.ptr, 0xff, d_out.n * sizeof(float)));  // NaN: every element must be written
    CHECK_CUDA(cudaMemset(d_out_f16.ptr, 0xff, d_out_f16.n * sizeof(half)));
    DeviceBuffer<char> ws(cf::cuda::paged_attention_cuda_workspace_bytes(a));
    if (const char * err = cf::cuda::paged_attention_cuda(a, ws.ptr, nullptr)) {
        std::fprintf(stderr, "%s\n", err);
        std::exit(2);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> out = d_out.download();
    const std::vector<half> out_f16 = d_out_f16.download();
    const bool writes = cf::cuda::paged_attention_cuda_writes_f16(a);
    if (v.kernel != cf::cuda::kPagedKernelDefault) {
        expect(writes == (v.kernel == cf::cuda::kPagedKernelTwoPass || v.kernel == cf::cuda::kPagedKernelRing),
               label_of(v) + ": paged_attention_cuda_writes_f16 must be true for the two-pass and ring kernels alone");
    }
    size_t wrong = 0;  // two-pass: out rounded to nearest even, bit for bit; other kernels: untouched (all bits set)
    for (size_t i = 0; i < out.size(); ++i) {
        uint16_t got = 0, want = 0xffff;
        std::memcpy(&got, &out_f16[i], sizeof(got));
        if (writes) {
            const half h = __float2half_rn(out[i]);
            std::memcpy(&want, &h, sizeof(want));
        }
        wrong += got != want;
    }
    expect(wrong == 0, label_of(v) + ": " + std::to_string(wrong) + " elements of the F16 copy of out are wrong");
    return out;
}

std::vector<float> reference(const Model & m, const std::vector<Query> & queries, const std::vector<float> & q_all) {
    const int D = m.head_dim, G = m.n_head / m.n_head_kv, row = m.n_head_kv * D;
    const double scale = 1.0 / std::sqrt((double) D);
    std::vector<float> out(queries.size() * (size_t) m.n_head * D);
    for (size_t i = 0; i < queries.size(); ++i) {
        const Query & qu = queries[i];
        for (int h = 0; h < m.n_head; ++h) {
            const int kvh = h / G;
            const float * q = &q_all[(i * m.n_head + h) * D];
            std::vector<double> s(qu.ctx);
            double mx = -1e300;
            for (int p = 0; p < qu.ctx; ++p) {
                double dot = 0;
                for (int d = 0; d < D; ++d) dot += (double) q[d] * m.k_by_pos[qu.seq][(size_t) p * row + kvh * D + d];
                s[p] = dot * scale;
                mx = std::max(mx, s[p]);
            }
            double l = 0;
            for (auto & x : s) l += (x = std::exp(x - mx));
            for (int d = 0; d < D; ++d) {
                double o = 0;
                for (int p = 0; p < qu.ctx; ++p) o += s[p] * m.v_by_pos[qu.seq][(size_t) p * row + kvh * D + d];
                out[(i * m.n_head + h) * D + d] = (float) (o / l);
            }
        }
    }
    return out;
}

std::vector<float> rows_of(const std::vector<float> & all, const Model & m, size_t i) {
    const size_t w = (size_t) m.n_head * m.head_dim;
    return std::vector<float>(all.begin() + (ptrdiff_t) (i * w), all.begin() + (ptrdiff_t) ((i + 1) * w));
}

// Default lengths: chunks cross 64, 512, 1024. kLongLens: rows around the split rule's thresholds (16 splits of 256
// keys at 4,096; two_pass::kLongFromKeys) and long rows (20,000 keys: 79 splits of 256, 20 of 1,024).
const std::vector<int> kShapeLens = {1, 17, 70, 200, 511, 512, 513, 1030, 1300, 2100};
const std::vector<int> kLongLens = {3, 4096, 4097, 4200, 9000, 20000};

void test_shape(int D, int n_head, int n_head_kv, int block_size, unsigned seed,
                const std::vector<Variant> & variants, const std::vector<int> & lens = kShapeLens) {
    std::mt19937 rng(seed);
    Model m = make_model(D, n_head, n_head_kv, block_size, lens, rng);
    Layout lay = make_layout(m, seed + 1);
    // Each sequence: a prefill chunk of its last min(len, 40) positions, plus a decode row at len - 1.
    std::vector<Query> qs;
    for (int s = 0; s < (int) lens.size(); ++s) {
        for (int p = std::max(0, lens[s] - 40); p < lens[s]; ++p) qs.push_back({s, p + 1});
        qs.push_back({s, lens[s]});
    }
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> q((size_t) qs.size() * n_head * D);
    for (auto & x : q) x = u(rng);
    const std::vector<float> want = reference(m, qs, q);
    Layout other = make_layout(m, seed + 99);

    // the first two_pass / warp / ring variant's outputs: every load shape of that kernel must equal them (the ring
    // kernel runs the two-pass kernel where it does not cover the shape: then its bits are the two-pass kernel's)
    std::vector<float> two_pass_bits, warp_bits, ring_bits;
    for (const Variant & v : variants) {
        const std::vector<float> got = run(v, m, lay, qs, q);
        if (v.kernel == cf::cuda::kPagedKernelTwoPass || v.kernel == cf::cuda::kPagedKernelWarp ||
            v.kernel == cf::cuda::kPagedKernelRing) {
            std::vector<float> & bits = v.kernel == cf::cuda::kPagedKernelWarp ? warp_bits
                                        : v.kernel == cf::cuda::kPagedKernelRing ? ring_bits
                                                                                 : two_pass_bits;
            if (bits.empty()) {
                bits = got;
            } else {
                expect(std::memcmp(got.data(), bits.data(), got.size() * sizeof(float)) == 0,
                       "D=" + std::to_string(D) + " " + label_of(v) + ": outputs differ from its kernel's first load shape's");
            }
        }
        double max_err = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const double e = std::fabs((double) got[i] - want[i]);
            max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
        }
        const std::string shape = "D=" + std::to_string(D) + " heads " + std::to_string(n_head) + "/" +
                                  std::to_string(n_head_kv) + " bs=" + std::to_string(block_size) + " ctx<=" +
                                  std::to_string(*std::max_element(lens.begin(), lens.end())) + " " + label_of(v);
        std::printf("%-60s %zu rows, max |err| vs float64 = %.2e\n", shape.c_str(), qs.size(), max_err);
        expect(max_err < 2e-3, shape + ": max error " + std::to_string(max_err) + " >= 2e-3");

        // Invariance: each row alone, with a wider table (more splits in the grid) and another block layout.
        for (size_t i = 0; i < qs.size(); i += 7) {
            const std::vector<float> q1(q.begin() + (ptrdiff_t) (i * n_head * D),
                                        q.begin() + (ptrdiff_t) ((i + 1) * n_head * D));
            const std::vector<float> alone = run(v, m, other, {qs[i]}, q1, /*table_stride_extra=*/64);
            expect(std::memcmp(alone.data(), rows_of(got, m, i).data(), alone.size() * sizeof(float)) == 0,
                   shape + ": row " + std::to_string(i) + " (ctx " + std::to_string(qs[i].ctx) +
                       ") differs alone/relocated from its batched output");
        }
    }
    // where the ring kernel does not cover the shape (GQA 3, D 256 at GQA 8), the ring setting runs the two-pass kernel
    if (!cf::cuda::ring::covers(D, n_head / n_head_kv) && !ring_bits.empty() && !two_pass_bits.empty()) {
        expect(std::memcmp(ring_bits.data(), two_pass_bits.data(), ring_bits.size() * sizeof(float)) == 0,
               "D=" + std::to_string(D) + " GQA " + std::to_string(n_head / n_head_kv) +
                   ": the ring setting must run the two-pass kernel where the ring kernel does not cover the shape");
    }
}


// ---- the opt-in tensor-core prefill path (paged_prefill_mma.cuh) ------------------------------------------

// Runs `queries` with the MMA path on or off. stage_base_block >= 0: pool rows from that block on are served
// from k_stage / v_stage (copies) and the pool's own rows there become NaN, so a wrong read cannot pass.
std::vector<float> run_mode(const Model & m, const Layout & lay, const std::vector<Query> & queries,
                            const std::vector<float> & q_all, bool mma, int stage_base_block = -1) {
    const int n = (int) queries.size();
    int stride = 1;
    for (const auto & t : lay.tables) stride = std::max(stride, (int) t.size());
    std::vector<int32_t> tables(lay.tables.size() * (size_t) stride, -1);
    for (size_t s = 0; s < lay.tables.size(); ++s) {
        std::copy(lay.tables[s].begin(), lay.tables[s].end(), tables.begin() + (ptrdiff_t) (s * stride));
    }
    std::vector<int32_t> seq_idx(n), ctx(n);
    for (int i = 0; i < n; ++i) {
        seq_idx[i] = queries[i].seq;
        ctx[i] = queries[i].ctx;
    }
    const size_t row = (size_t) m.n_head_kv * m.head_dim;
    std::vector<half> k_pool = lay.k_pool, v_pool = lay.v_pool, k_stage(1), v_stage(1);
    if (stage_base_block >= 0) {
        const size_t first = (size_t) stage_base_block * m.block_size * row;
        k_stage.assign(k_pool.begin() + (ptrdiff_t) first, k_pool.end());
        v_stage.assign(v_pool.begin() + (ptrdiff_t) first, v_pool.end());
        std::fill(k_pool.begin() + (ptrdiff_t) first, k_pool.end(), __ushort_as_half(0x7e00));  // NaN
        std::fill(v_pool.begin() + (ptrdiff_t) first, v_pool.end(), __ushort_as_half(0x7e00));
    }
    DeviceBuffer<float> d_q(q_all);
    DeviceBuffer<half> d_k(k_pool), d_v(v_pool), d_ks(k_stage), d_vs(v_stage);
    DeviceBuffer<int32_t> d_tables(tables), d_seq(seq_idx), d_ctx(ctx);
    DeviceBuffer<float> d_out((size_t) n * m.n_head * m.head_dim);
    PagedAttentionCudaArgs a =
        make_args({m.head_dim, m.n_head, m.n_head_kv, m.block_size}, d_q.ptr, d_k.ptr, d_v.ptr,
                  (int64_t) m.num_blocks * m.block_size, d_tables.ptr, stride, d_seq.ptr, d_ctx.ptr, d_out.ptr, n);
    if (stage_base_block >= 0) {
        a.k_stage = d_ks.ptr;
        a.v_stage = d_vs.ptr;
        a.stage_base_row = (int64_t) stage_base_block * m.block_size;
    }
    cf::cuda::paged_prefill_mma_set_enabled_for_testing(mma);
    DeviceBuffer<char> ws(cf::cuda::paged_attention_cuda_workspace_bytes(a));
    if (const char * err = cf::cuda::paged_attention_cuda(a, ws.ptr, nullptr)) {
        std::fprintf(stderr, "%s\n", err);
        std::exit(2);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    cf::cuda::paged_prefill_mma_set_enabled_for_testing(false);
    return d_out.download();
}

// Which queries the MMA path takes (paged_prefill_mma.cuh): runs of >= kPagedPrefillMinRun consecutive
// tokens of one sequence whose contexts grow by one.
std::vector<bool> mma_tokens(const std::vector<Query> & qs) {
    std::vector<bool> mma(qs.size(), false);
    for (size_t s = 0; s < qs.size();) {
        size_t e = s + 1;
        while (e < qs.size() && qs[e].seq == qs[s].seq && qs[e].ctx == qs[e - 1].ctx + 1) ++e;
        if (e - s >= (size_t) cf::cuda::kPagedPrefillMinRun) std::fill(mma.begin() + (ptrdiff_t) s, mma.begin() + (ptrdiff_t) e, true);
        s = e;
    }
    return mma;
}

// One ragged prefill batch: a decode row, chunks of random length in [1, max_chunk] over contexts up to
// max_ctx (some adjacent, so that one query tile holds the end of a run and the start of the next), a short
// run below the MMA threshold, and one chunk at the largest context. Checks, for the MMA path: sampled rows
// (every row of short runs, 24 of each long one) within 2e-3 of the output scale of a float64 reference;
// rows-kernel tokens bit-identical to the path off; the largest chunk bit-identical alone and with staged
// rows (the MMA path's own outputs do not depend on the batch or on where the rows are read).
void test_prefill_shape(int D, int n_head, int n_head_kv, int block_size, int max_ctx, int max_chunk, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<int> lens, chunks;
    std::uniform_int_distribution<int> chunk_len(1, max_chunk);
    for (int i = 0; i < 5; ++i) {
        const int c = chunk_len(rng);
        lens.push_back(std::uniform_int_distribution<int>(c, std::max(c, max_ctx / 4))(rng));
        chunks.push_back(c);
    }
    lens.push_back(300), chunks.push_back(1);                     // a decode row
    lens.push_back(1000), chunks.push_back(40);                   // a run below the threshold
    lens.push_back(65), chunks.push_back(65);                     // a whole prompt, right after the previous run
    lens.push_back(max_ctx), chunks.push_back(std::min(max_chunk, max_ctx));  // the largest context
    Model m = make_model(D, n_head, n_head_kv, block_size, lens, rng);
    Layout lay = make_layout(m, seed + 1);
    std::vector<Query> qs;
    for (int s = 0; s < (int) lens.size(); ++s) {
        for (int p = lens[s] - chunks[s]; p < lens[s]; ++p) qs.push_back({s, p + 1});
    }
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> q((size_t) qs.size() * n_head * D);
    for (auto & x : q) x = u(rng);
    const std::vector<bool> mma = mma_tokens(qs);

    const std::vector<float> got = run_mode(m, lay, qs, q, true);
    const std::vector<float> rows = run_mode(m, lay, qs, q, false);
    // Sampled rows for the float64 reference.
    std::vector<size_t> pick;
    for (size_t s = 0; s < qs.size();) {
        size_t e = s + 1;
        while (e < qs.size() && qs[e].seq == qs[s].seq) ++e;
        if (e - s <= 24) {
            for (size_t i = s; i < e; ++i) pick.push_back(i);
        } else {
            pick.push_back(s), pick.push_back(e - 1);
            for (int k = 0; k < 22; ++k) pick.push_back(s + std::uniform_int_distribution<size_t>(0, e - s - 1)(rng));
        }
        s = e;
    }
    std::vector<Query> sub;
    std::vector<float> sub_q;
    const size_t w = (size_t) n_head * D;
    for (size_t i : pick) {
        sub.push_back(qs[i]);
        sub_q.insert(sub_q.end(), q.begin() + (ptrdiff_t) (i * w), q.begin() + (ptrdiff_t) ((i + 1) * w));
    }
    const std::vector<float> want = reference(m, sub, sub_q);
    double max_err = 0, scale = 0;
    for (size_t j = 0; j < pick.size(); ++j) {
        for (size_t k = 0; k < w; ++k) {
            max_err = std::max(max_err, (double) std::fabs(got[pick[j] * w + k] - want[j * w + k]));
            scale = std::max(scale, (double) std::fabs(want[j * w + k]));
        }
    }
    size_t n_mma = 0, n_same = 0, n_rows = 0;
    for (size_t i = 0; i < qs.size(); ++i) {
        n_mma += mma[i];
        if (!mma[i]) {
            ++n_rows;
            n_same += std::memcmp(&got[i * w], &rows[i * w], w * sizeof(float)) == 0;
        }
    }
    const std::string shape = "prefill D=" + std::to_string(D) + " heads " + std::to_string(n_head) + "/" +
                              std::to_string(n_head_kv) + " bs=" + std::to_string(block_size) + " ctx<=" +
                              std::to_string(max_ctx);
    std::printf("%-44s %zu tokens (%zu MMA), %zu checked: max |err| vs float64 = %.2e, %.2e of output scale %.3f\n",
                shape.c_str(), qs.size(), n_mma, pick.size(), max_err, max_err / scale, scale);
    expect(n_mma > 0 && n_mma < qs.size(), shape + ": the batch must mix MMA and rows-kernel tokens");
    expect(max_err < 2e-3 * scale, shape + ": max error " + std::to_string(max_err) + " >= 2e-3 of the output scale");
    expect(n_same == n_rows, shape + ": " + std::to_string(n_rows - n_same) + " rows-kernel tokens changed with the MMA path on");

    // The largest chunk alone, and the whole batch with the upper half of the pool staged.
    const size_t first = qs.size() - (size_t) chunks.back();
    const std::vector<Query> last(qs.begin() + (ptrdiff_t) first, qs.end());
    const std::vector<float> last_q(q.begin() + (ptrdiff_t) (first * w), q.end());
    const std::vector<float> alone = run_mode(m, lay, last, last_q, true);
    expect(!mma[first] || std::memcmp(alone.data(), &got[first * w], alone.size() * sizeof(float)) == 0,
           shape + ": the largest chunk alone differs from its batched MMA output");
    const std::vector<float> staged = run_mode(m, lay, qs, q, true, m.num_blocks / 2);
    expect(std::memcmp(staged.data(), got.data(), got.size() * sizeof(float)) == 0,
           shape + ": staged rows change the outputs");
}


// One prefill chunk of `chunk` tokens ending at context `ctx` (one sequence, shuffled blocks of 16): the rows
// kernel and the MMA path, median us per layer and causal attention TFLOP/s (4 D FLOP per query head and key).
void bench_prefill(int chunk, int ctx, int D, int n_head, int n_head_kv) {
    std::mt19937 rng(11);
    const int bs = 16;
    const int num_blocks = (ctx + bs - 1) / bs;
    const int row = n_head_kv * D;
    std::vector<half> pool((size_t) num_blocks * bs * row);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto & x : pool) x = __float2half(u(rng));
    std::vector<int32_t> table(num_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int32_t> seq_idx(chunk, 0), ctxs(chunk);
    double flop = 0;
    for (int i = 0; i < chunk; ++i) {
        ctxs[i] = ctx - chunk + 1 + i;
        flop += 4.0 * D * n_head * ctxs[i];
    }
    std::vector<float> q((size_t) chunk * n_head * D);
    for (auto & x : q) x = u(rng);
    DeviceBuffer<float> d_q(q);
    DeviceBuffer<half> d_k(pool), d_v(pool);
    DeviceBuffer<int32_t> d_table(table), d_seq(seq_idx), d_ctx(ctxs);
    DeviceBuffer<float> d_out((size_t) chunk * n_head * D);
    const PagedAttentionCudaArgs a = make_args({D, n_head, n_head_kv, bs}, d_q.ptr, d_k.ptr, d_v.ptr,
                                               (int64_t) num_blocks * bs, d_table.ptr, num_blocks, d_seq.ptr,
                                               d_ctx.ptr, d_out.ptr, chunk);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    double us[2];
    for (int mode = 0; mode < 2; ++mode) {
        cf::cuda::paged_prefill_mma_set_enabled_for_testing(mode == 1);
        DeviceBuffer<char> ws(cf::cuda::paged_attention_cuda_workspace_bytes(a));
        const int iters = mode == 1 ? 10 : (ctx > 8192 ? 2 : 4);
        cf::cuda::paged_attention_cuda(a, ws.ptr, nullptr);
        std::vector<float> ms;
        for (int r = 0; r < 3; ++r) {
            CHECK_CUDA(cudaEventRecord(e0));
            for (int i = 0; i < iters; ++i) cf::cuda::paged_attention_cuda(a, ws.ptr, nullptr);
            CHECK_CUDA(cudaEventRecord(e1));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float t = 0;
            CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t / iters);
        }
        std::sort(ms.begin(), ms.end());
        us[mode] = ms[1] * 1000.0;
    }
    cf::cuda::paged_prefill_mma_set_enabled_for_testing(false);
    const double tf_rows = flop / (us[0] * 1e6), tf_mma = flop / (us[1] * 1e6);
    std::printf("bench prefill chunk=%d ctx=%-5d D=%d heads %d/%d: rows %9.1f us/layer (%5.1f TFLOP/s), "
                "mma %8.1f us/layer (%5.1f TFLOP/s, %4.1f%% of 990), mma %5.1fx faster\n",
                chunk, ctx, D, n_head, n_head_kv, us[0], tf_rows, us[1], tf_mma, 100.0 * tf_mma / 990.0,
                us[0] / us[1]);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

double g_copy_gbs = 0.0;

// Per-variant least share of the copy bandwidth at contexts >= 8K (issue 11's target: >= 70%).
struct LongShapeMin {
    std::string label;
    double pct;
};
std::vector<LongShapeMin> g_long_min;

void note_long(const std::string & label, double pct) {
    for (auto & e : g_long_min) {
        if (e.label == label) {
            e.pct = std::min(e.pct, pct);
            return;
        }
    }
    g_long_min.push_back({label, pct});
}

// Median us per launch of paged_attention_cuda(a): 20 warm-up launches, then 7 repeats of 100 between events.
double time_layer_us(const PagedAttentionCudaArgs & a, void * ws) {
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < 20; ++i) {
        if (const char * err = cf::cuda::paged_attention_cuda(a, ws, nullptr)) {
            std::fprintf(stderr, "%s\n", err);
            std::exit(2);
        }
    }
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
        const int iters = 100;
        CHECK_CUDA(cudaEventRecord(e0));
        for (int i = 0; i < iters; ++i) cf::cuda::paged_attention_cuda(a, ws, nullptr);
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t / iters);
    }
    CHECK_CUDA(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1000.0;
}

// Median us per call as the engine runs it: `calls` calls captured in one CUDA graph on a stream (PDL edges kept)
// and replayed, call i reading K/V copy i % copies of the pool (each copy kv_bytes apart in k_all / v_all), so that
// a call finds its K/V cold in L2, as each layer does after the weights of the layers before it streamed through.
double time_layer_us_graph(PagedAttentionCudaArgs a, void * ws, const half * k_all, const half * v_all,
                           size_t pool_elems, int copies) {
    const int calls = std::max(64, copies);
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) {
        a.k_pool = k_all + (size_t) (i % copies) * pool_elems;
        a.v_pool = v_all + (size_t) (i % copies) * pool_elems;
        if (const char * err = cf::cuda::paged_attention_cuda(a, ws, st)) {
            std::fprintf(stderr, "%s\n", err);
            std::exit(2);
        }
    }
    CHECK_CUDA(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    CHECK_CUDA(cudaGraphLaunch(exec, st));  // warm-up
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
        CHECK_CUDA(cudaEventRecord(e0, st));
        CHECK_CUDA(cudaGraphLaunch(exec, st));
        CHECK_CUDA(cudaEventRecord(e1, st));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t / calls);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1000.0;
}

// One decode layer (B rows at context ctx, 16-token blocks in a random permutation) timed for each variant; the
// outputs of every variant are compared with the first's (max |diff|, must stay under 1e-3).
void bench_decode(int batch, int ctx, int D, int n_head, int n_head_kv, const std::vector<Variant> & variants) {
    std::mt19937 rng(7);
    const int bs = 16;
    const int blocks_per_seq = (ctx + bs - 1) / bs;
    const int num_blocks = batch * blocks_per_seq;
    const int row = n_head_kv * D;
    std::vector<half> pool((size_t) num_blocks * bs * row);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto & x : pool) x = __float2half(u(rng));
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    int stride = 1;
    while (stride < blocks_per_seq) stride *= 2;  // the engine buckets table widths to powers of two
    std::vector<int32_t> tables((size_t) batch * stride, -1);
    for (int s = 0; s < batch; ++s)
        for (int b = 0; b < blocks_per_seq; ++b) tables[(size_t) s * stride + b] = ids[(size_t) s * blocks_per_seq + b];
    std::vector<int32_t> seq_idx(batch), ctxs(batch, ctx);
    std::iota(seq_idx.begin(), seq_idx.end(), 0);
    std::vector<float> q((size_t) batch * n_head * D);
    for (auto & x : q) x = u(rng);
    DeviceBuffer<float> d_q(q);
    DeviceBuffer<half> d_k(pool), d_v(pool);
    DeviceBuffer<int32_t> d_tables(tables), d_seq(seq_idx), d_ctx(ctxs);
    DeviceBuffer<float> d_out((size_t) batch * n_head * D);
    const double bytes = 2.0 * batch * (double) ctx * row * sizeof(half);
    // Copies of the pool for the graph timing: at least 256 MB of K+V in all (five times the H100's L2), at most 1,024.
    const int copies = (int) std::min<double>(1024.0, std::max(1.0, std::ceil(256e6 / (2.0 * pool.size() * sizeof(half)))));
    DeviceBuffer<half> d_k_all(pool.size() * copies), d_v_all(pool.size() * copies);
    for (int c = 0; c < copies; ++c) {
        CHECK_CUDA(cudaMemcpy(d_k_all.ptr + (size_t) c * pool.size(), d_k.ptr, pool.size() * sizeof(half),
                              cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaMemcpy(d_v_all.ptr + (size_t) c * pool.size(), d_v.ptr, pool.size() * sizeof(half),
                              cudaMemcpyDeviceToDevice));
    }
    std::vector<float> first;
    double best_fixed = 0.0;
    int best_keys = 0;
    for (const Variant & v : variants) {
        PagedAttentionCudaArgs a = make_args({D, n_head, n_head_kv, bs}, d_q.ptr, d_k.ptr, d_v.ptr,
                                             (int64_t) num_blocks * bs, d_tables.ptr, stride, d_seq.ptr, d_ctx.ptr,
                                             d_out.ptr, batch);
        apply(v, a);
        DeviceBuffer<char> ws(cf::cuda::paged_attention_cuda_workspace_bytes(a));
        CHECK_CUDA(cudaMemset(d_out.ptr, 0xff, d_out.n * sizeof(float)));
        const double us = time_layer_us(a, ws.ptr);
        const std::vector<float> out = d_out.download();
        const double us_graph = time_layer_us_graph(a, ws.ptr, d_k_all.ptr, d_v_all.ptr, pool.size(), copies);
        // the graph's replays (PDL included) must leave the bits the launches did (K/V copies of the same values)
        const std::vector<float> out_graph = d_out.download();
        expect(std::memcmp(out_graph.data(), out.data(), out.size() * sizeof(float)) == 0,
               "bench B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx) + " " + label_of(v) +
                   ": the graph's replays give other bits than the launches");
        double diff = 0;
        if (first.empty()) {
            first = out;
        }
        for (size_t i = 0; i < out.size(); ++i) {
            const double e = std::fabs((double) out[i] - first[i]);
            diff = std::isnan(e) ? INFINITY : std::max(diff, e);
        }
        const double gbs = bytes / (us * 1e3);
        const double pct = 100.0 * gbs / g_copy_gbs;
        const std::string label = label_of(v);
        std::printf("bench decode B=%-4d ctx=%-5d D=%-3d heads %d/%d %-22s %8.1f us/layer, %7.1f GB/s of K+V"
                    " (%3.0f%% of copy) max|diff| %.1e | graph, cold K/V: %8.1f us/layer\n",
                    batch, ctx, D, n_head, n_head_kv, label.c_str(), us, gbs, pct, diff, us_graph);
        expect(diff < 1e-3, "bench B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx) + " " + label +
                                ": differs from " + variants[0].label + " by " + std::to_string(diff));
        if (v.split_keys == 0 && ctx >= 8192) {
            note_long(label, pct);
        }
        if (v.split_keys != 0 && pct > best_fixed) {
            best_fixed = pct;
            best_keys = v.split_keys;
        }
    }
    if (best_keys != 0) {
        std::printf("bench decode B=%-4d ctx=%-5d D=%-3d best fixed split: S=%d (%.0f%% of copy)\n", batch, ctx, D,
                    best_keys, best_fixed);
        if (ctx >= 8192) note_long("pipelined best fixed S", best_fixed);
    }
}

// Both kernels on every shape; at contexts >= 8K also the pipelined kernel with fixed split lengths and without PDL.
void bench_shape(int batch, int ctx, int D) {
    // CF_BENCH_ONLY="B,ctx,D": that one shape alone (e.g. under ncu, whose per-kernel durations split a layer's time
    // between the split kernel and the combine kernel)
    if (const char * only = std::getenv("CF_BENCH_ONLY")) {
        int ob = 0, oc = 0, od = 0;
        if (std::sscanf(only, "%d,%d,%d", &ob, &oc, &od) == 3 && (ob != batch || oc != ctx || od != D)) {
            return;
        }
    }
    std::vector<Variant> vs = {kTwoPass,       kTwoPassNarrow, kTwoPassNarrow8,  kTwoPassNarrowPf, kTwoPassWide,
                               kTwoPassByGrid, kTwoPassPdl,    kTwoPassNarrowPdl, kTwoPassGroup,   kTwoPassOne,
                               kTwoPassOneWide, kTwoPassOnePdl, kWarp,           kWarpNarrow,      kWarpWide,
                               kWarp1,         kWarp4,         kWarpNoPdl,       kPipelined,       kPipelinedNarrow,
                               kRing};
    if (std::getenv("CF_BENCH_TWO_PASS_ONLY") != nullptr) {  // the two-pass kernel's variants alone (shorter runs)
        vs.erase(std::remove_if(vs.begin(), vs.end(),
                                [](const Variant & v) { return v.kernel != cf::cuda::kPagedKernelTwoPass; }),
                 vs.end());
    }
    if (std::getenv("CF_BENCH_RING") != nullptr) {  // the default against the ring kernel's splits per CTA
        vs = {kTwoPass, kRing, kRing1, kRing2, kRing4};
    }
    if (std::getenv("CF_BENCH_HEADS_ONLY") != nullptr) {  // the default and the head placements (PagedHeads) alone
        vs = {kTwoPass, kTwoPassGroup, kTwoPassOne, kTwoPassOneWide, kTwoPassOnePdl};
    }
    // CF_BENCH_DEFAULT_ONLY: the default alone; CF_BENCH_NARROW8 (over the others): the default, narrow and narrow8
    // (kPagedLoadsNarrow8). Either leaves out the pipelined kernel's extra variants at contexts >= 8K.
    const bool default_only = std::getenv("CF_BENCH_DEFAULT_ONLY") != nullptr;
    const bool narrow8_only = std::getenv("CF_BENCH_NARROW8") != nullptr;
    if (narrow8_only) {
        vs = {kTwoPass, kTwoPassNarrow, kTwoPassNarrow8};
    } else if (default_only) {
        vs = {kTwoPass};
    }
    if (ctx >= 8192 && !default_only && !narrow8_only && std::getenv("CF_BENCH_RING") == nullptr) {
        vs.push_back(kPipelinedNoPdl);
        for (int keys : {128, 256, 512, 1024, 2048}) {
            vs.push_back(pipelined_split(keys));
        }
    }
    bench_decode(batch, ctx, D, 32, 8, vs);
}

}  // namespace

int main(int argc, char ** argv) {
    const bool bench = argc > 1 && std::strcmp(argv[1], "--bench") == 0;
    if (argc > 1 && std::strcmp(argv[1], "--bench-prefill") == 0) {  // the prefill lines alone (kernel variants)
        for (int c : {2048, 8192, 32768}) bench_prefill(2048, c, 128, 32, 8);
        return 0;
    }
    const bool long_only = bench && argc > 2 && std::strcmp(argv[2], "long") == 0;  // `--bench long`: >= 8K only
    // `--bench short`: the short-context decode shapes alone, at more batch sizes (where a grid rule switches)
    const bool short_only = bench && argc > 2 && std::strcmp(argv[2], "short") == 0;
    const std::vector<Variant> all = {kTwoPass,    kTwoPassNarrowPf, kTwoPassWide,     kTwoPassByGrid,
                                      kTwoPassNarrow8,
                                      kTwoPassGroup, kTwoPassOne,    kTwoPassOneWide,  kTwoPassOnePdl,
                                      kWarp,       kWarpNarrow,      kWarpWide,        kWarp1,
                                      kWarp4,      kWarpNoPdl,       kTwoPassPdl,      kPipelined,
                                      kPipelinedNarrow, kPipelinedNoPdl, pipelined_split(64)};
    // (the ring kernel's variants run in `--ring`, tests/kernels/test_paged_attention_cuda.py's second test)
    // `--ring`: the correctness tests with the two-pass kernel and the ring kernel's variants alone (shorter than all
    // variants), every shape below, long rows included
    if (argc > 1 && std::strcmp(argv[1], "--ring") == 0) {
        const std::vector<Variant> ring = {kTwoPass, kRing, kRing1, kRing2, kRing16};
        test_shape(64, 9, 3, 16, 1, ring);  // GQA 3: the ring kernel does not cover it (two-pass bits)
        test_shape(64, 32, 8, 16, 2, ring);
        test_shape(128, 32, 8, 16, 3, ring);
        test_shape(128, 16, 2, 32, 4, ring);
        test_shape(64, 8, 8, 8, 5, ring);
        test_shape(256, 16, 8, 12, 6, ring);
        test_shape(64, 24, 3, 5, 7, ring);
        test_shape(64, 16, 8, 16, 8, ring);
        test_shape(128, 8, 8, 16, 9, ring);
        test_shape(64, 32, 8, 16, 18, ring, kLongLens);
        test_shape(128, 32, 8, 32, 19, ring, kLongLens);
        std::printf(g_failures ? "%d check(s) failed\n" : "PASS\n", g_failures);
        return g_failures ? 1 : 0;
    }
    // CF_BENCH_SKIP_TESTS (with --bench): the decode timings alone (no correctness checks, no prefill bench), for
    // repeated A/B runs of build-time knobs in one device call
    const bool tests = !(bench && std::getenv("CF_BENCH_SKIP_TESTS") != nullptr);
    if (tests) {
        test_shape(64, 9, 3, 16, 1, all);    // SmolLM2-135M
        test_shape(64, 32, 8, 16, 2, all);   // Llama-3.2-1B
        test_shape(128, 32, 8, 16, 3, all);  // Llama-3.1-8B
        test_shape(128, 16, 2, 32, 4, all);
        test_shape(64, 8, 8, 8, 5, all);
        test_shape(256, 16, 8, 12, 6, all);  // head size 256, a block size that is not a power of two
        test_shape(64, 24, 3, 5, 7, all);    // GQA 8
        // the rest of the GQA 1-4 instantiations at D 64 / 128, for narrow8 against narrow (bounded_ctas applies there)
        test_shape(64, 16, 8, 16, 8, all);    // GQA 2
        test_shape(128, 8, 8, 16, 9, all);    // GQA 1
        test_shape(128, 16, 8, 32, 10, all);  // GQA 2, blocks of 32
        test_shape(128, 24, 8, 16, 17, all);  // GQA 3
        test_shape(64, 32, 8, 16, 18, all, kLongLens);    // long rows, Llama-3.2-1B
        test_shape(128, 32, 8, 32, 19, all, kLongLens);   // long rows, Llama-3.1-8B, blocks of 32
        test_prefill_shape(64, 32, 8, 16, 4096, 700, 11);     // GQA 4, D 64
        test_prefill_shape(128, 32, 8, 32, 6000, 2048, 12);   // GQA 4, D 128, blocks of 32
        test_prefill_shape(128, 8, 8, 16, 3000, 300, 13);     // GQA 1
        test_prefill_shape(64, 16, 2, 32, 5000, 1200, 14);    // GQA 8
        test_prefill_shape(128, 24, 8, 16, 2500, 500, 15);    // GQA 3: 21 tokens per query tile
        test_prefill_shape(128, 8, 1, 16, 32768, 2048, 16);   // GQA 8, a 2048-token chunk at 32K
    }
    if (bench) {
        g_copy_gbs = copy_bandwidth_gbs();
        std::printf("bench device-to-device copy: %.1f GB/s (read + write)\n", g_copy_gbs);
        if (short_only) {
            for (int b : {1, 4, 8, 16, 32, 64, 128, 256}) bench_shape(b, 200, 64);
            for (int b : {1, 16, 64}) bench_shape(b, 2048, 64);
            for (int b : {1, 32, 128}) bench_shape(b, 256, 128);
            return g_failures ? 1 : 0;
        }
        if (!long_only) {
            for (int b : {1, 64, 256}) bench_shape(b, 200, 64);  // Llama-3.2-1B shape
            for (int b : {1, 16, 64}) bench_shape(b, 2048, 64);
        }
        for (int b : {1, 8, 32}) bench_shape(b, 8192, 64);
        for (int b : {1, 4}) bench_shape(b, 32768, 64);
        if (!long_only) {
            for (int b : {1, 32, 128}) bench_shape(b, 256, 128);  // Llama-3.1-8B shape
        }
        for (int b : {8, 32}) bench_shape(b, 8192, 128);
        std::printf("issue 11 (contexts >= 8K, target >= 70%% of copy), least share per kernel:");
        for (const auto & e : g_long_min) std::printf(" %s %.0f%%;", e.label.c_str(), e.pct);
        std::printf("\n");
        if (tests) {
            for (int c : {2048, 8192, 32768}) bench_prefill(2048, c, 128, 32, 8);  // Llama-3.1-8B prefill
        }
    }
    if (g_failures) {
        std::printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}
