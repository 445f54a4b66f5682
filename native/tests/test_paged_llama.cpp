// test_paged_llama.cpp - paged KV mode of the patched llama.cpp, end to end through llama.h.
//
// Models: CACHEFLOW_TEST_MODEL=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf and/or
// CACHEFLOW_TEST_TINY_MODEL=tiny.gguf (scripts/make_tiny_gguf.py OUT --tokenizer-from REAL, f32
// weights); without either the test prints "skipped" and passes. A toy block allocator (shuffled free
// list) stands in for the engine's block manager, so this covers the llama.cpp side alone. 8 prompts of
// 64 tokens, 32 greedy tokens each:
//
//   1. f16 KV (the defaults) vs stock (unified cache, flash attention). The ggml-numerics kernel with
//      paged block size 16 and the same batches as stock: logits bit-identical, greedy tokens equal.
//      Block size 8 with prefill chunks of 24 mixed with decode steps (other batches), and the
//      invariant kernel (the engine's default, whose arithmetic differs from stock's by design: it
//      keeps one reduction order per position whatever the batch, which stock does not): teacher-
//      forced logits of every sampled position within a stated tolerance, and free-running greedy
//      tokens equal (a sequence may only part at a near tie of stock's logits). On the real model the
//      invariant kernel's logits are also bit-identical between those two batchings.
//   2. f32 KV, invariant kernel vs stock without flash attention (f32 attention on both sides):
//      logits within a tight tolerance where the weights allow it (f32 fixture).
//   3. fork with copy-on-write: a child sharing its parent's blocks copies the partially filled last
//      block (llama_paged_copy_blocks) before writing; parent and child generate the same tokens.
//   4. errors: a block id out of range, decode without a plan, a slot that disagrees with its block table.
#undef NDEBUG  // the checks must run in Release builds too
#include "llama.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int32_t kNumSeqs = 8;
constexpr int32_t kPromptLen = 64;
constexpr int32_t kNumGen = 32;        // greedy tokens per sequence
constexpr int32_t kNumCtx = 2048;      // KV rows in both modes
// Max |paged logit - stock logit| over the vocabulary at every sampled position (teacher forced).
// fa: vs stock with flash attention (which rounds K, V and Q to f16); exact: f32 KV cache vs stock
// without flash attention. Q4_1 weights re-quantize activations to 8 bits in every matmul, which turns
// last-bit differences into logit differences of ~1: batching alone (whole prompts vs chunked) moves
// the real model's logits that much, so its tolerances are the same loose 2.0.
// batching: the invariant kernel's logits under two batchings of the same tokens. Its attention is
// bit-identical either way (test_paged_attention_invariance); so is the rest of the real model's
// graph on the CPU (Q4_1 matmuls compute each row alone), so 0 there. The f32 fixture's graph is not
// (measured: differences of a few 1e-6 between the two batchings, from outside the attention op).
struct Tolerances {
    float fa;
    float exact;
    float batching;
};
constexpr Tolerances kTolQ4 = { 2.0f, 2.0f, 0.0f };     // the real model, Q4_1
constexpr Tolerances kTolF32 = { 0.1f, 1e-4f, 1e-4f };  // the tiny fixture, f32 weights

llama_model * g_model = nullptr;
int32_t g_n_vocab = 0;

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

// op: the paged attention kernel (ggml numerics, or the invariant one, the engine's default).
llama_context * make_ctx(bool paged, int32_t block_size, bool flash_attn, ggml_type kv_type,
                         ggml_paged_attn_kernel kernel = GGML_PAGED_ATTN_KERNEL_GGML) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = kNumCtx;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_seq_max = kNumSeqs;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.kv_unified = true;
    cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = kv_type;
    cp.type_v = kv_type;
    if (paged) {
        cp.kv_block_size = (uint32_t) block_size;
        cp.paged_attn_kernel = kernel;
    }
    llama_context * ctx = llama_init_from_model(g_model, cp);
    assert(ctx != nullptr);
    assert(llama_paged_n_blocks(ctx) == (paged ? kNumCtx / block_size : 0));
    return ctx;
}

// 8 distinct natural-text prompts cut to exactly 64 tokens.
std::vector<std::vector<llama_token>> make_prompts() {
    const char * topics[kNumSeqs] = { "the history of the printing press", "how bees make honey",
                                      "the rules of chess", "why the sky is blue",
                                      "a recipe for bread", "the life of a lighthouse keeper",
                                      "how compilers work", "the migration of whales" };
    const llama_vocab * vocab = llama_model_get_vocab(g_model);
    std::vector<std::vector<llama_token>> prompts;
    for (const char * topic : topics) {
        std::string text = std::string("Write a long, detailed essay about ") + topic + ". ";
        while (text.size() < 1024) {
            text += std::string("Consider ") + topic + " from every angle, with examples and dates. ";
        }
        std::vector<llama_token> toks(2048);
        const int32_t n = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), toks.data(), 2048, true, false);
        assert(n >= kPromptLen);
        toks.resize(kPromptLen);
        prompts.push_back(toks);
    }
    return prompts;
}

llama_token argmax(const float * logits) {
    return (llama_token) (std::max_element(logits, logits + g_n_vocab) - logits);
}

// Generated tokens and the logits row of every sampled position, per sequence.
struct Result {
    std::vector<std::vector<llama_token>> tokens;
    std::vector<std::vector<std::vector<float>>> logits;
};

// The token sequence s feeds after its step-th sampled position: its own greedy choice, or with
// teacher forcing the reference run's token (keeps two runs aligned to compare every position).
llama_token next_token(const Result & res, const Result * force, size_t s, size_t step) {
    return force ? force->tokens[s][step] : res.tokens[s][step];
}

// Stock mode: all prompts in one batch, then one decode token per sequence per step.
Result run_stock(const std::vector<std::vector<llama_token>> & prompts, bool flash_attn, ggml_type kv_type,
                 const Result * force) {
    llama_context * ctx = make_ctx(false, 0, flash_attn, kv_type);
    const int32_t n_seqs = (int32_t) prompts.size();
    Result res;
    res.tokens.resize((size_t) n_seqs);
    res.logits.resize((size_t) n_seqs);
    llama_batch batch = llama_batch_init(512, 0, 1);
    std::vector<int32_t> pos((size_t) n_seqs, 0);
    for (int32_t step = 0; step <= kNumGen - 1; ++step) {
        batch.n_tokens = 0;
        std::vector<int32_t> out_idx;
        for (int32_t s = 0; s < n_seqs; ++s) {
            const std::vector<llama_token> feed = step == 0
                ? prompts[(size_t) s]
                : std::vector<llama_token>{ next_token(res, force, (size_t) s, (size_t) step - 1) };
            for (llama_token t : feed) {
                const int32_t i = batch.n_tokens++;
                batch.token[i] = t;
                batch.pos[i] = pos[(size_t) s]++;
                batch.n_seq_id[i] = 1;
                batch.seq_id[i][0] = s;
                batch.logits[i] = 0;
            }
            batch.logits[batch.n_tokens - 1] = 1;
            out_idx.push_back(batch.n_tokens - 1);
        }
        const int rc = llama_decode(ctx, batch);
        assert(rc == 0);
        for (int32_t s = 0; s < n_seqs; ++s) {
            const float * row = llama_get_logits_ith(ctx, out_idx[(size_t) s]);
            res.tokens[(size_t) s].push_back(argmax(row));
            res.logits[(size_t) s].emplace_back(row, row + g_n_vocab);
        }
    }
    llama_batch_free(batch);
    llama_free(ctx);
    return res;
}

// A toy stand-in for the block manager: a shuffled free list and one block table per sequence.
struct ToyBlocks {
    int32_t block_size;
    std::vector<int32_t> free_ids;
    std::vector<std::vector<int32_t>> tables;
    std::vector<int32_t> lens;  // tokens stored per sequence

    ToyBlocks(int32_t num_blocks, int32_t block_size_, int32_t n_seqs, uint32_t seed)
        : block_size(block_size_), tables((size_t) n_seqs), lens((size_t) n_seqs, 0) {
        free_ids.resize((size_t) num_blocks);
        std::iota(free_ids.begin(), free_ids.end(), 0);
        std::mt19937 rng(seed);
        std::shuffle(free_ids.begin(), free_ids.end(), rng);
    }

    // Slot of the next token of seq s (allocating a block when the last one is full).
    int32_t append(int32_t s) {
        std::vector<int32_t> & table = tables[(size_t) s];
        const int32_t pos = lens[(size_t) s]++;
        if (pos / block_size == (int32_t) table.size()) {
            assert(!free_ids.empty());
            table.push_back(free_ids.back());
            free_ids.pop_back();
        }
        return table[(size_t) (pos / block_size)] * block_size + pos % block_size;
    }
};

// One step's work: n tokens of sequence s starting at its current length.
struct Work {
    int32_t seq;
    std::vector<llama_token> tokens;
    bool sample;  // the chunk ends at the last known token
};

// Decode one batch in paged mode: fill batch and plan from the toy block tables, then llama_decode.
// Returns llama_decode's code; logits rows of sampled work items go to *out_rows (batch indices).
int decode_paged(llama_context * ctx, ToyBlocks & blocks, const std::vector<Work> & work, llama_batch & batch,
                 std::vector<int32_t> * out_rows) {
    std::vector<int32_t> slots, tok_seq, seq_lens, tables;
    int32_t max_blocks = 1;
    batch.n_tokens = 0;
    out_rows->clear();
    for (size_t w = 0; w < work.size(); ++w) {
        const int32_t s = work[w].seq;
        for (llama_token t : work[w].tokens) {
            const int32_t i = batch.n_tokens++;
            batch.pos[i] = blocks.lens[(size_t) s];
            slots.push_back(blocks.append(s));
            tok_seq.push_back((int32_t) w);
            batch.token[i] = t;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = s;
            batch.logits[i] = 0;
        }
        if (work[w].sample) {
            batch.logits[batch.n_tokens - 1] = 1;
        }
        out_rows->push_back(work[w].sample ? batch.n_tokens - 1 : -1);
        seq_lens.push_back(blocks.lens[(size_t) s]);
        max_blocks = std::max(max_blocks, (int32_t) blocks.tables[(size_t) s].size());
    }
    tables.assign(work.size() * (size_t) max_blocks, -1);
    for (size_t w = 0; w < work.size(); ++w) {
        const std::vector<int32_t> & table = blocks.tables[(size_t) work[w].seq];
        std::copy(table.begin(), table.end(), tables.begin() + (long) (w * (size_t) max_blocks));
    }
    llama_paged_plan plan = { slots.data(), tok_seq.data(), tables.data(), seq_lens.data(),
                              batch.n_tokens, (int32_t) work.size(), max_blocks };
    const int32_t rc_plan = llama_set_paged_plan(ctx, &plan);
    assert(rc_plan == 0);
    return llama_decode(ctx, batch);
}

// Paged mode: prompts in chunks of `chunk` tokens (whole prompts if chunk >= kPromptLen), decode
// tokens of sequences whose prompt is done in the same steps, until every sequence has kNumGen tokens.
Result run_paged(const std::vector<std::vector<llama_token>> & prompts, int32_t block_size, int32_t chunk,
                 uint32_t seed, ggml_type kv_type, const Result * force,
                 ggml_paged_attn_kernel kernel = GGML_PAGED_ATTN_KERNEL_GGML) {
    llama_context * ctx = make_ctx(true, block_size, true, kv_type, kernel);
    const int32_t n_seqs = (int32_t) prompts.size();
    ToyBlocks blocks(llama_paged_n_blocks(ctx), block_size, n_seqs, seed);
    Result res;
    res.tokens.resize((size_t) n_seqs);
    res.logits.resize((size_t) n_seqs);
    llama_batch batch = llama_batch_init(512, 0, 1);
    std::vector<int32_t> fed((size_t) n_seqs, 0);  // prompt tokens computed
    std::vector<int32_t> rows;
    while (true) {
        std::vector<Work> work;
        for (int32_t s = 0; s < n_seqs; ++s) {
            auto & out = res.tokens[(size_t) s];
            if ((int32_t) out.size() == kNumGen) {
                continue;
            }
            if (fed[(size_t) s] < kPromptLen) {
                // stagger the starts so that prefill chunks and decode tokens share steps
                if (chunk < kPromptLen && s > 0 && fed[(size_t) (s - 1)] < kPromptLen && fed[(size_t) s] == 0) {
                    continue;
                }
                const int32_t n = std::min(chunk, kPromptLen - fed[(size_t) s]);
                const auto & p = prompts[(size_t) s];
                work.push_back({ s, { p.begin() + fed[(size_t) s], p.begin() + fed[(size_t) s] + n },
                                 fed[(size_t) s] + n == kPromptLen });
                fed[(size_t) s] += n;
            } else {
                work.push_back({ s, { next_token(res, force, (size_t) s, out.size() - 1) }, true });
            }
        }
        if (work.empty()) {
            break;
        }
        const int rc = decode_paged(ctx, blocks, work, batch, &rows);
        assert(rc == 0);
        for (size_t w = 0; w < work.size(); ++w) {
            if (rows[w] < 0) {
                continue;
            }
            const float * row = llama_get_logits_ith(ctx, rows[w]);
            res.tokens[(size_t) work[w].seq].push_back(argmax(row));
            res.logits[(size_t) work[w].seq].emplace_back(row, row + g_n_vocab);
        }
    }
    llama_batch_free(batch);
    llama_free(ctx);
    return res;
}

float max_logit_diff(const Result & a, const Result & b) {
    float worst = 0.0f;
    for (size_t s = 0; s < a.logits.size(); ++s) {
        for (size_t step = 0; step < a.logits[s].size(); ++step) {
            for (int32_t v = 0; v < g_n_vocab; ++v) {
                worst = std::max(worst, std::fabs(a.logits[s][step][(size_t) v] - b.logits[s][step][(size_t) v]));
            }
        }
    }
    return worst;
}

// Top-1 minus top-2 logit of a row: a difference of at most tol per logit can change the argmax only
// where this margin is below 2*tol.
float top2_margin(const std::vector<float> & row) {
    std::vector<float> top(2);
    std::partial_sort_copy(row.begin(), row.end(), top.begin(), top.end(), std::greater<float>());
    return top[0] - top[1];
}

// Greedy tokens of `got` equal `want`'s, except that a sequence may part at a near tie of want's
// logits (margin < 2*tol), after which it is no longer compared. Returns the sequences equal throughout.
int32_t check_greedy(const Result & want, const Result & got, float tol, const char * what) {
    int32_t n_equal = 0;
    for (size_t s = 0; s < want.tokens.size(); ++s) {
        size_t i = 0;
        while (i < want.tokens[s].size() && want.tokens[s][i] == got.tokens[s][i]) {
            ++i;
        }
        if (i == want.tokens[s].size()) {
            ++n_equal;
            continue;
        }
        const float margin = top2_margin(want.logits[s][i]);
        std::printf("    %s: sequence %zu parts from stock at generated token %zu (%d vs %d), stock's top-2 margin "
                    "there %.3f\n", what, s, i, want.tokens[s][i], got.tokens[s][i], margin);
        if (!(margin < 2 * tol)) {
            std::fprintf(stderr, "%s: not a near tie (margin %.3f >= 2 * tolerance %.3f)\n", what, margin, tol);
            assert(false);
        }
    }
    return n_equal;
}

// f16 KV cache (the engine's default), stock with flash attention:
//   - the ggml-numerics kernel, the same batches as stock (all prompts in one batch, then one token
//     per sequence per step): every logit of every sampled position is bit-identical, so greedy
//     tokens are equal throughout;
//   - the ggml-numerics kernel, different batches (block size 8, prefill chunks of 24 next to decode
//     tokens): its arithmetic follows the batch, as stock's does, so teacher-forced logits within
//     tol.fa and greedy tokens equal up to a near tie;
//   - the invariant kernel (the engine's default), same batches: its rounding is not stock's (by
//     design: stock's arithmetic changes with the batch, the invariant kernel's does not), so
//     within tol.fa, greedy up to a near tie; with block size 8 and chunks of 24 its teacher-forced
//     logits are its own with whole prompts within tol.batching (0 on the real model: bit-identical).
// Returns stock's run.
Result test_greedy_vs_stock(const std::vector<std::vector<llama_token>> & prompts, const Tolerances & tol) {
    const Result stock = run_stock(prompts, /*flash_attn =*/ true, GGML_TYPE_F16, nullptr);
    const Result paged = run_paged(prompts, 16, kPromptLen, 1, GGML_TYPE_F16, nullptr);
    const float d_same = max_logit_diff(stock, paged);
    int32_t n_same = 0;
    for (size_t s = 0; s < stock.tokens.size(); ++s) {
        n_same += stock.tokens[s] == paged.tokens[s];
    }
    std::printf("  f16 KV, vs stock with flash attention (%d prompts of %d tokens, %d greedy tokens each):\n"
                "    paged block 16, same batches, ggml numerics: max |logit diff| %.4f, sequences equal %d/%d\n",
                kNumSeqs, kPromptLen, kNumGen, d_same, n_same, kNumSeqs);
    assert(d_same == 0.0f && n_same == kNumSeqs);

    const Result chunked_forced = run_paged(prompts, 8, 24, 2, GGML_TYPE_F16, &stock);
    const Result inv_forced = run_paged(prompts, 16, kPromptLen, 1, GGML_TYPE_F16, &stock, GGML_PAGED_ATTN_KERNEL_INVARIANT);
    const float d_chunked = max_logit_diff(stock, chunked_forced);
    const float d_inv = max_logit_diff(stock, inv_forced);
    std::printf("    teacher-forced max |logit diff|: block 8 with prefill chunks of 24 %.4f, invariant kernel %.4f "
                "(tolerance %.3g)\n", d_chunked, d_inv, tol.fa);
    assert(d_chunked <= tol.fa && d_inv <= tol.fa);
    const Result inv_chunked = run_paged(prompts, 8, 24, 2, GGML_TYPE_F16, &stock, GGML_PAGED_ATTN_KERNEL_INVARIANT);
    const float d_inv_chunked = max_logit_diff(inv_forced, inv_chunked);
    std::printf("    invariant kernel, block 8 with prefill chunks of 24 vs block 16 whole prompts: max |logit diff| "
                "%.2g (tolerance %.2g)\n", d_inv_chunked, tol.batching);
    assert(d_inv_chunked <= tol.batching);
    const int32_t n_chunked = check_greedy(stock, run_paged(prompts, 8, 24, 2, GGML_TYPE_F16, nullptr), tol.fa,
                                           "block 8 chunked");
    const int32_t n_inv = check_greedy(
        stock, run_paged(prompts, 16, kPromptLen, 1, GGML_TYPE_F16, nullptr, GGML_PAGED_ATTN_KERNEL_INVARIANT), tol.fa,
        "invariant kernel");
    std::printf("    greedy sequences equal to stock: block 8 chunked %d/%d, invariant kernel %d/%d\n", n_chunked,
                kNumSeqs, n_inv, kNumSeqs);
    return stock;
}

// f32 KV cache against stock without flash attention, whose attention is then f32 end to end like
// the invariant kernel's (stock's flash attention casts K/V to f16): teacher-forced logits within tol.exact.
void test_logits_vs_f32_stock(const std::vector<std::vector<llama_token>> & prompts, const Tolerances & tol,
                              const Result & tokens) {
    const Result stock = run_stock(prompts, /*flash_attn =*/ false, GGML_TYPE_F32, &tokens);
    const Result chunked = run_paged(prompts, 8, 24, 2, GGML_TYPE_F32, &tokens, GGML_PAGED_ATTN_KERNEL_INVARIANT);
    const float diff = max_logit_diff(stock, chunked);
    std::printf("  f32 KV, vs stock without flash attention: max |logit diff|: paged block 8 chunked %.2g "
                "(tolerance %.2g)\n", diff, tol.exact);
    assert(diff <= tol.exact);
}

// Parent prefills prompt 0 plus 5 tokens (69 tokens, block 16: 4 full blocks + 5 rows); a child forks
// sharing all 5 blocks. Before the child writes position 69 into the shared last block, it gets its own
// copy of it (llama_paged_copy_blocks). Parent and child then decode side by side: identical tokens.
void test_fork_copy_on_write(const std::vector<std::vector<llama_token>> & prompts) {
    llama_context * ctx = make_ctx(true, 16, true, GGML_TYPE_F16);
    ToyBlocks blocks(llama_paged_n_blocks(ctx), 16, 2, 3);
    llama_batch batch = llama_batch_init(512, 0, 1);
    std::vector<int32_t> rows;

    std::vector<llama_token> prompt = prompts[0];
    prompt.insert(prompt.end(), prompts[1].begin(), prompts[1].begin() + 5);
    int rc = decode_paged(ctx, blocks, { { 0, prompt, true } }, batch, &rows);
    assert(rc == 0);
    const llama_token first = argmax(llama_get_logits_ith(ctx, rows[0]));

    // fork: the child shares the parent's blocks and length (and llama.cpp's position record)
    blocks.tables[1] = blocks.tables[0];
    blocks.lens[1] = blocks.lens[0];
    llama_memory_seq_cp(llama_get_memory(ctx), 0, 1, -1, -1);

    // copy-on-write of the shared, partially filled last block
    const int32_t src = blocks.tables[1].back();
    const int32_t dst = blocks.free_ids.back();
    blocks.free_ids.pop_back();
    blocks.tables[1].back() = dst;
    assert(llama_paged_copy_blocks(ctx, &src, &dst, 1) == 0);

    // decode steps of the same shape reuse the graph (block tables bucketed, op params in the nodes):
    // only the first one, after the prefill, builds it
    std::vector<llama_token> out[2] = { { first }, { first } };
    const int32_t n_reused_before = llama_perf_context(ctx).n_reused;
    for (int32_t step = 0; step < 16; ++step) {
        rc = decode_paged(ctx, blocks, { { 0, { out[0].back() }, true }, { 1, { out[1].back() }, true } }, batch, &rows);
        assert(rc == 0);
        for (int s = 0; s < 2; ++s) {
            out[s].push_back(argmax(llama_get_logits_ith(ctx, rows[(size_t) s])));
        }
    }
    assert(out[0] == out[1]);
    const int32_t n_reused = llama_perf_context(ctx).n_reused - n_reused_before;
    std::printf("  fork + copy-on-write of a shared partial block: parent and child generate the same %zu tokens; "
                "graph reused in %d of 16 decode steps\n", out[0].size(), n_reused);
    assert(n_reused == 15);

    // errors: out of range copy, decode without a plan, a slot that disagrees with the block table
    const int32_t bad = llama_paged_n_blocks(ctx);
    assert(llama_paged_copy_blocks(ctx, &src, &bad, 1) == -2);
    batch.n_tokens = 1;
    batch.token[0] = out[0].back();
    batch.pos[0] = blocks.lens[0];
    batch.seq_id[0][0] = 0;
    assert(llama_decode(ctx, batch) < 0);
    const int32_t slot = blocks.append(0) + 1;  // off by one (the row after the right one, same block or next)
    const int32_t tok_seq = 0;
    const int32_t len = blocks.lens[0];
    llama_paged_plan plan = { &slot, &tok_seq, blocks.tables[0].data(), &len, 1, 1, (int32_t) blocks.tables[0].size() };
    assert(llama_set_paged_plan(ctx, &plan) == 0);
    assert(llama_decode(ctx, batch) < 0);
    std::printf("  errors: bad block id, missing plan, inconsistent slot are refused\n");

    llama_batch_free(batch);
    llama_free(ctx);
}

// All tests on one model.
void run_model(const char * path, const Tolerances & tol) {
    g_model = llama_model_load_from_file(path, llama_model_default_params());
    assert(g_model != nullptr);
    g_n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(g_model));
    std::printf("%s:\n", path);
    const std::vector<std::vector<llama_token>> prompts = make_prompts();
    const Result stock = test_greedy_vs_stock(prompts, tol);
    test_logits_vs_f32_stock(prompts, tol, stock);
    test_fork_copy_on_write(prompts);
    llama_model_free(g_model);
    g_model = nullptr;
}

}  // namespace

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines survive a failed assert
    // the real model (Q4_1 weights: activations are re-quantized to 8 bits in every matmul, so any
    // change in attention rounding moves logits by up to ~1; stock's own two attention paths differ as
    // much), and optionally the tiny f32 fixture of scripts/make_tiny_gguf.py (no such amplification)
    const char * path = std::getenv("CACHEFLOW_TEST_MODEL");
    const char * tiny = std::getenv("CACHEFLOW_TEST_TINY_MODEL");
    if ((path == nullptr || path[0] == '\0') && (tiny == nullptr || tiny[0] == '\0')) {
        std::printf("test_paged_llama: skipped (set CACHEFLOW_TEST_MODEL to a small llama-family GGUF)\n");
        return 0;
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    if (path != nullptr && path[0] != '\0') {
        run_model(path, kTolQ4);
    }
    if (tiny != nullptr && tiny[0] != '\0') {
        run_model(tiny, kTolF32);
    }
    llama_backend_free();
    std::printf("test_paged_llama: ok\n");
    return 0;
}
