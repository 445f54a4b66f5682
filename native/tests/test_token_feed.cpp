// test_token_feed.cpp - the device token feed of patch 0017 (llama_context_params.token_feed,
// llama_set_token_feed_src), end to end through llama.h on the CPU backend.
//
// Model: CACHEFLOW_TEST_TINY_MODEL=tiny.gguf (scripts/make_tiny_gguf.py) or CACHEFLOW_TEST_MODEL; without
// either the test prints "skipped" and passes.
//
// 8 sequences of 12-token prompts decode 24 greedy steps twice: once with every token id from the host (the
// argmax read back, as the engine does today), once with the token ids taken on the device from the last
// decode's argmax through the feed, the host passing a placeholder. The batches change between steps as a
// continuous batcher's do (the row order reversed on odd steps, one sequence leaving at step 10, every even
// sequence fed by the host on steps divisible by 3), and sequence 3 samples without EOG tokens (entry M + j).
// The tokens must be equal, step by step. A third run decodes one step ahead, as async scheduling does: every
// token from the feed, and step N's tokens read (llama_get_argmax_row, back = 1) only after step N+1 was launched,
// from the pinned slot that a feed gives each decode. Then the errors: a context without a feed, an entry past the
// feed, sources that do not match the batch (the decode fails, the next one without sources works), rows out of
// range.
#undef NDEBUG  // the checks must run in Release builds too
#include "llama.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int32_t kNumSeqs = 8;
constexpr int32_t kPromptLen = 12;
constexpr int32_t kNumSteps = 24;
constexpr int32_t kFeedRows = 16;  // M: the feed holds 2 * M entries
constexpr int32_t kNoEogSeq = 3;   // samples without the EOG tokens (llama-server's ignore_eos)
constexpr int32_t kLeavingSeq = 5;
constexpr int32_t kLeaveStep = 10;

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

llama_context * make_context(llama_model * model, int32_t token_feed) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_seq_max = kNumSeqs;
    cp.n_threads = 1;  // a small model: no thread waits at ggml's barriers on a loaded CI machine
    cp.n_threads_batch = 1;
    cp.kv_unified = true;
    cp.no_perf = true;
    cp.greedy_argmax = true;
    cp.token_feed = token_feed;
    llama_context * ctx = llama_init_from_model(model, cp);
    assert(ctx != nullptr);
    for (int32_t s = 0; s < kNumSeqs; ++s) {
        assert(llama_set_seq_greedy(ctx, s, true, s == kNoEogSeq));
    }
    return ctx;
}

llama_token argmax_of(llama_context * ctx, int32_t seq, int32_t i) {
    return seq == kNoEogSeq ? llama_get_argmax_no_eog_ith(ctx, i) : llama_get_argmax_ith(ctx, i);
}

// The prompts in one decode: one output row per sequence (its last token), in sequence order.
void decode_prompts(llama_context * ctx, llama_batch & batch, int32_t n_vocab) {
    batch.n_tokens = 0;
    for (int32_t s = 0; s < kNumSeqs; ++s) {
        for (int32_t p = 0; p < kPromptLen; ++p) {
            const int32_t i = batch.n_tokens++;
            batch.token[i] = (llama_token) ((17 + 131 * s + 7 * p) % n_vocab);
            batch.pos[i] = p;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = s;
            batch.logits[i] = p == kPromptLen - 1;
        }
    }
    assert(llama_decode(ctx, batch) == 0);
}

// The sequences of a decode step in batch order: reversed on odd steps, one leaving at kLeaveStep.
std::vector<int32_t> step_order(int32_t step) {
    std::vector<int32_t> order;
    for (int32_t k = 0; k < kNumSeqs; ++k) {
        const int32_t s = step % 2 == 1 ? kNumSeqs - 1 - k : k;
        if (!(s == kLeavingSeq && step >= kLeaveStep)) {
            order.push_back(s);
        }
    }
    return order;
}

// tokens[step][seq]: the greedy tokens of every sequence, step 0 being the prompt's. feed: take the token ids from
// the device feed (host placeholders) except where the host is meant to give them.
std::vector<std::vector<llama_token>> run(llama_model * model, bool feed) {
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context * ctx = make_context(model, feed ? kFeedRows : 0);
    llama_batch batch = llama_batch_init(256, 0, 1);
    std::vector<std::vector<llama_token>> tokens;
    std::vector<int32_t> row(kNumSeqs, -1);  // each sequence's output row in the last decode

    decode_prompts(ctx, batch, n_vocab);
    tokens.emplace_back(kNumSeqs, -1);
    for (int32_t s = 0; s < kNumSeqs; ++s) {
        tokens.back()[s] = argmax_of(ctx, s, s * kPromptLen + kPromptLen - 1);
        row[s] = s;
    }

    for (int32_t step = 1; step <= kNumSteps; ++step) {
        const std::vector<int32_t> order = step_order(step);
        batch.n_tokens = (int32_t) order.size();
        std::vector<int32_t> src(order.size(), -1);
        for (size_t i = 0; i < order.size(); ++i) {
            const int32_t s = order[i];
            const bool from_host = !feed || (step % 3 == 0 && s % 2 == 0);
            batch.token[i] = from_host ? tokens.back()[s] : 0;  // 0: a valid placeholder the feed replaces
            batch.pos[i] = kPromptLen + step - 1;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = s;
            batch.logits[i] = 1;
            if (!from_host) {
                src[i] = (s == kNoEogSeq ? kFeedRows : 0) + row[s];
            }
        }
        if (feed) {
            assert(llama_set_token_feed_src(ctx, src.data(), (int32_t) src.size()));
        }
        assert(llama_decode(ctx, batch) == 0);
        std::vector<llama_token> next = tokens.back();
        for (size_t i = 0; i < order.size(); ++i) {
            next[order[i]] = argmax_of(ctx, order[i], (int32_t) i);
            row[order[i]] = (int32_t) i;
            if (feed) {  // the slot's row accessor reads the same rows (all rows are outputs: row i = token i)
                assert(llama_get_argmax_row(ctx, 0, (int32_t) i, order[i] == kNoEogSeq) == next[order[i]]);
            }
        }
        tokens.push_back(next);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    return tokens;
}

// The same steps one decode ahead: step N+1 is launched with every token from the feed before step N's tokens are
// read, and those are read from the decode before the last (back = 1); the last step's from the last (back = 0).
std::vector<std::vector<llama_token>> run_one_step_ahead(llama_model * model) {
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context * ctx = make_context(model, kFeedRows);
    llama_batch batch = llama_batch_init(256, 0, 1);
    std::vector<std::vector<llama_token>> tokens;
    std::vector<int32_t> row(kNumSeqs, -1);
    std::vector<int32_t> last_order;  // the sequences of the last decode, in batch order

    decode_prompts(ctx, batch, n_vocab);
    for (int32_t s = 0; s < kNumSeqs; ++s) {
        row[s] = s;
        last_order.push_back(s);
    }

    auto read_previous = [&](int32_t back) {  // the tokens of the decode `back` decodes ago, into tokens
        std::vector<llama_token> got = tokens.empty() ? std::vector<llama_token>(kNumSeqs, -1) : tokens.back();
        for (int32_t s : last_order) {
            got[s] = llama_get_argmax_row(ctx, back, row[s], s == kNoEogSeq);
            assert(got[s] != LLAMA_TOKEN_NULL);
        }
        tokens.push_back(got);
    };
    for (int32_t step = 1; step <= kNumSteps; ++step) {
        const std::vector<int32_t> order = step_order(step);
        batch.n_tokens = (int32_t) order.size();
        std::vector<int32_t> src(order.size());
        for (size_t i = 0; i < order.size(); ++i) {
            const int32_t s = order[i];
            batch.token[i] = 0;
            batch.pos[i] = kPromptLen + step - 1;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = s;
            batch.logits[i] = 1;
            src[i] = (s == kNoEogSeq ? kFeedRows : 0) + row[s];
        }
        assert(llama_set_token_feed_src(ctx, src.data(), (int32_t) src.size()));
        assert(llama_decode(ctx, batch) == 0);
        read_previous(1);  // step N - 1's tokens, after step N was launched
        for (size_t i = 0; i < order.size(); ++i) {
            row[order[i]] = (int32_t) i;
        }
        last_order = order;
    }
    read_previous(0);
    assert(llama_get_argmax_row(ctx, 0, (int32_t) last_order.size(), false) == LLAMA_TOKEN_NULL);  // past the rows
    assert(llama_get_argmax_row(ctx, 2, 0, false) == LLAMA_TOKEN_NULL);                            // two slots only
    llama_batch_free(batch);
    llama_free(ctx);
    return tokens;
}

void check_errors(llama_model * model) {
    llama_context * plain = make_context(model, 0);
    const int32_t zero = 0;
    assert(!llama_set_token_feed_src(plain, &zero, 1));  // no feed in this context
    assert(llama_get_argmax_row(plain, 0, 0, false) == LLAMA_TOKEN_NULL);
    llama_free(plain);

    llama_context * ctx = make_context(model, kFeedRows);
    const int32_t past = 2 * kFeedRows;
    assert(!llama_set_token_feed_src(ctx, &past, 1));  // entries 0 .. 2M - 1 only
    assert(!llama_set_token_feed_src(ctx, &zero, 0));
    llama_batch batch = llama_batch_init(8, 0, 1);
    batch.n_tokens = 2;
    for (int32_t i = 0; i < 2; ++i) {
        batch.token[i] = 1 + i;
        batch.pos[i] = 0;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = i;
        batch.logits[i] = 1;
    }
    assert(llama_set_token_feed_src(ctx, &zero, 1));  // sources for one token, a batch of two
    assert(llama_decode(ctx, batch) == -1);
    assert(llama_decode(ctx, batch) == 0);  // the sources were for that decode alone
    llama_batch_free(batch);
    llama_free(ctx);
}

}  // namespace

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const char * path = std::getenv("CACHEFLOW_TEST_TINY_MODEL");
    if (path == nullptr || path[0] == '\0') {
        path = std::getenv("CACHEFLOW_TEST_MODEL");
    }
    if (path == nullptr || path[0] == '\0') {
        std::printf("test_token_feed: skipped (set CACHEFLOW_TEST_TINY_MODEL or CACHEFLOW_TEST_MODEL to a GGUF)\n");
        return 0;
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    // The feed lives on the token embedding's device and the argmax is written into it inside the graph: on a GPU
    // build the embedding goes to the first GPU with the layers, as CacheFlow's engine places it (llama_session.cpp;
    // the engine turns async decode on only there or on the CPU alone).
    llama_model_params mp = llama_model_default_params();
    ggml_backend_dev_t gpu = nullptr;
    for (size_t i = 0; i < ggml_backend_dev_count() && gpu == nullptr; ++i) {
        if (ggml_backend_dev_type(ggml_backend_dev_get(i)) == GGML_BACKEND_DEVICE_TYPE_GPU) {
            gpu = ggml_backend_dev_get(i);
        }
    }
    const llama_model_tensor_buft_override embd_on_gpu[] = {
        { "^token_embd\\.weight$", gpu != nullptr ? ggml_backend_dev_buffer_type(gpu) : nullptr },
        { nullptr, nullptr },
    };
    if (gpu != nullptr) {
        mp.tensor_buft_overrides = embd_on_gpu;
    }
    llama_model * model = llama_model_load_from_file(path, mp);
    assert(model != nullptr);

    const auto host = run(model, false);
    const auto fed = run(model, true);
    assert(host.size() == fed.size());
    int32_t n_compared = 0;
    for (size_t step = 0; step < host.size(); ++step) {
        for (int32_t s = 0; s < kNumSeqs; ++s) {
            if (host[step][s] != fed[step][s]) {
                std::printf("step %zu seq %d: host-fed token %d, feed %d\n", step, s, host[step][s], fed[step][s]);
                return 1;
            }
            n_compared += 1;
        }
    }
    std::printf("token feed: %d greedy tokens equal to host-fed decoding (%d steps, %d sequences)\n", n_compared,
                kNumSteps, kNumSeqs);
    const auto ahead = run_one_step_ahead(model);
    assert(ahead.size() == host.size());
    for (size_t step = 0; step < host.size(); ++step) {
        for (int32_t s = 0; s < kNumSeqs; ++s) {
            if (host[step][s] != ahead[step][s]) {
                std::printf("one step ahead, step %zu seq %d: host-fed token %d, feed %d\n", step, s, host[step][s],
                            ahead[step][s]);
                return 1;
            }
        }
    }
    std::printf("token feed: one step ahead, the same %d tokens\n", n_compared);
    check_errors(model);
    std::printf("token feed: errors ok\n");
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
