// test_engine.cpp - the engine through the C ABI on a real GGUF model.
//
// Needs CACHEFLOW_TEST_MODEL=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf (or any small llama-family
// GGUF); without it the test prints "skipped" and passes. Covers: info, text functions, greedy
// batched == alone in both stock KV modes, stop conditions, abort, the step thread, errors.
#undef NDEBUG  // the checks must run in Release builds too
#include "cacheflow.h"

#include <cassert>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

const char * g_model = nullptr;

cf_engine_t make_engine(int32_t kv_mode, int32_t max_num_seqs = 4, int32_t budget = 64) {
    cf_engine_config c = cf_engine_default_config();
    c.model_path = g_model;
    c.kv_mode = kv_mode;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = budget;
    c.n_ctx = 512 * max_num_seqs;
    c.n_threads = 2;
    c.log_level = CF_LOG_LEVEL_NONE;
    cf_engine_t engine = nullptr;
    const cf_status rc = cf_engine_init(&c, &engine);
    if (rc != CF_STATUS_OK) {
        std::fprintf(stderr, "cf_engine_init: %d %s\n", rc, cf_last_error());
    }
    assert(rc == CF_STATUS_OK && engine != nullptr);
    return engine;
}

std::vector<int32_t> tokenize(cf_engine_t engine, const std::string & text) {
    std::vector<int32_t> tokens(256);
    int32_t n = 0;
    assert(cf_engine_tokenize(engine, text.data(), (int32_t) text.size(), 1, 1, tokens.data(), 256, &n) == CF_STATUS_OK);
    tokens.resize((size_t) n);
    return tokens;
}

struct Result {
    std::vector<int32_t> tokens;
    std::string text;  // the events' text, concatenated
    int32_t finish_reason = CF_FINISH_REASON_NONE;
    cf_output_event final_event{};
};

// Step synchronously until no work is left; collect events and their text per request.
std::map<int64_t, Result> run_to_completion(cf_engine_t engine) {
    std::map<int64_t, Result> results;
    cf_output_event events[64];
    char text[4096];
    while (cf_engine_has_work(engine)) {
        int32_t n_sched = 0;
        assert(cf_engine_step(engine, &n_sched) == CF_STATUS_OK);
        int32_t n = 0;
        do {
            int32_t text_len = 0;
            int32_t num_logprobs = 0;
            assert(cf_engine_drain_outputs(engine, events, 64, text, sizeof text, nullptr, 0, 0, &n, &text_len,
                                           &num_logprobs) == CF_STATUS_OK);
            for (int32_t i = 0; i < n; ++i) {
                Result & r = results[events[i].request_id];
                assert(r.finish_reason == CF_FINISH_REASON_NONE);  // nothing after the final event
                assert(events[i].text_offset + events[i].text_len <= text_len);
                r.text.append(text + events[i].text_offset, (size_t) events[i].text_len);
                if (events[i].token_id != CF_TOKEN_NONE) {
                    r.tokens.push_back(events[i].token_id);
                }
                if (events[i].finish_reason != CF_FINISH_REASON_NONE) {
                    r.finish_reason = events[i].finish_reason;
                    r.final_event = events[i];
                }
            }
        } while (n > 0);
    }
    return results;
}

int64_t add(cf_engine_t engine, const std::vector<int32_t> & prompt, const cf_sampling_params & p) {
    int64_t id = 0;
    const cf_status rc = cf_engine_add_request(engine, prompt.data(), (int32_t) prompt.size(), &p, 0, &id);
    if (rc != CF_STATUS_OK) {
        std::fprintf(stderr, "add_request: %d %s\n", rc, cf_last_error());
    }
    assert(rc == CF_STATUS_OK && id > 0);
    return id;
}

const char * kPrompts[] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):",
    "List three colors:",
};

void test_info_and_text() {
    cf_engine_t engine = make_engine(CF_KV_MODE_AUTO);
    cf_model_info info;
    assert(cf_engine_get_info(engine, &info) == CF_STATUS_OK);
    // AUTO is paged for a llama-family model: one pool, any sequence may grow over all of it
    assert(info.n_vocab > 0 && info.kv_mode == CF_KV_MODE_PAGED && info.block_size == 16);
    assert(info.n_ctx_per_seq == 2048);
    assert(info.n_ctx == 2048 && info.max_num_seqs == 4 && std::strlen(info.arch) > 0);
    const std::vector<int32_t> tokens = tokenize(engine, "Hello world");
    char buf[64];
    int32_t len = 0;
    assert(cf_engine_detokenize(engine, tokens.data(), (int32_t) tokens.size(), 1, 0, buf, 64, &len) == CF_STATUS_OK);
    assert(std::string(buf, (size_t) len).find("Hello world") != std::string::npos);
    assert(cf_engine_detokenize(engine, tokens.data(), (int32_t) tokens.size(), 1, 0, buf, 2, &len) ==
           CF_STATUS_BUFFER_TOO_SMALL);
    assert(len >= 11);
    const int32_t bad = info.n_vocab;
    assert(cf_engine_detokenize(engine, &bad, 1, 0, 0, buf, 64, &len) == CF_STATUS_INVALID_ARGUMENT);
    const char * roles[] = {"user"};
    const char * contents[] = {"Hi"};
    char chat[512];
    assert(cf_engine_apply_chat_template(engine, nullptr, roles, contents, 1, 1, chat, 512, &len) == CF_STATUS_OK);
    assert(std::string(chat, (size_t) len).find("Hi") != std::string::npos);
    assert(cf_engine_apply_chat_template(engine, "no-such-template", roles, contents, 1, 1, chat, 512, &len) ==
           CF_STATUS_UNSUPPORTED);
    cf_engine_free(engine);
}

void test_request_errors() {
    cf_engine_t engine = make_engine(CF_KV_MODE_STOCK);
    cf_sampling_params p = cf_sampling_params_default();
    int64_t id = 0;
    const int32_t one = 1;
    assert(cf_engine_add_request(engine, &one, 0, &p, 0, &id) == CF_STATUS_INVALID_ARGUMENT);
    assert(std::strcmp(cf_last_error(), "prompt is empty") == 0);
    const int32_t bad[2] = {1, -5};
    assert(cf_engine_add_request(engine, bad, 2, &p, 0, &id) == CF_STATUS_INVALID_ARGUMENT);
    assert(std::strstr(cf_last_error(), "prompt_tokens[1] = -5") != nullptr);
    std::vector<int32_t> long_prompt(600, 1);
    assert(cf_engine_add_request(engine, long_prompt.data(), 600, &p, 0, &id) == CF_STATUS_PROMPT_TOO_LONG);
    assert(std::strstr(cf_last_error(), "prompt has 600 tokens but the context holds at most 512 per sequence"));
    p.temperature = -1.0f;
    assert(cf_engine_add_request(engine, &one, 1, &p, 0, &id) == CF_STATUS_INVALID_ARGUMENT);
    assert(std::strcmp(cf_last_error(), "temperature must be finite and >= 0, got -1") == 0);
    assert(cf_engine_abort_request(engine, 12345) == CF_STATUS_NOT_FOUND);
    assert(!cf_engine_has_work(engine));

    // a batch with one bad request queues none of them, and says which one failed
    p.temperature = 0.0f;
    const int32_t two[2] = {1, 2};
    cf_request batch[3] = {{two, 2, &p, 0}, {two, 0, &p, 0}, {two, 1, &p, 0}};
    int64_t ids[3] = {0, 0, 0};
    assert(cf_engine_add_requests(engine, batch, 3, ids) == CF_STATUS_INVALID_ARGUMENT);
    assert(std::strcmp(cf_last_error(), "request 1: prompt is empty") == 0);
    assert(!cf_engine_has_work(engine) && ids[0] == 0);
    batch[1].params = nullptr;
    assert(cf_engine_add_requests(engine, batch, 3, ids) == CF_STATUS_INVALID_ARGUMENT);
    assert(std::strcmp(cf_last_error(), "request 1: params is NULL") == 0);
    assert(cf_engine_add_requests(engine, batch, 0, nullptr) == CF_STATUS_OK && !cf_engine_has_work(engine));
    // a good batch: consecutive ids, and the first step admits all of it (3 + 2 + 1 prompt tokens)
    batch[1] = {two, 2, &p, 0};
    batch[0].num_prompt_tokens = 1;
    assert(cf_engine_add_requests(engine, batch, 3, ids) == CF_STATUS_OK);
    assert(ids[1] == ids[0] + 1 && ids[2] == ids[1] + 1);
    int32_t n_sched = 0;
    assert(cf_engine_step(engine, &n_sched) == CF_STATUS_OK && n_sched == 1 + 2 + 1);
    cf_engine_free(engine);

    const char * path = "/tmp/cacheflow_test_corrupt.gguf";
    FILE * f = std::fopen(path, "wb");
    std::fputs("this is not a gguf file", f);
    std::fclose(f);
    cf_engine_config c = cf_engine_default_config();
    c.model_path = path;
    c.log_level = CF_LOG_LEVEL_NONE;
    assert(cf_engine_init(&c, &engine) == CF_STATUS_MODEL_LOAD_FAILED && engine == nullptr);
    assert(std::string(cf_last_error()) ==
           "failed to load model from /tmp/cacheflow_test_corrupt.gguf (corrupt or unsupported GGUF?): llama.cpp: "
           "gguf_init_from_reader: invalid magic characters: 'this', expected 'GGUF'");
    std::remove(path);

    // A KV cache beyond the host's memory (2**31 - 1 rows, 512 GiB on the tiny model): OUT_OF_MEMORY
    // that says so and what to lower, in the paged mode (where it used to be UNSUPPORTED) and in a
    // stock mode.
    for (const int32_t kv_mode : {CF_KV_MODE_PAGED, CF_KV_MODE_STOCK_UNIFIED}) {
        cf_engine_config huge = cf_engine_default_config();
        huge.model_path = g_model;
        huge.kv_mode = kv_mode;
        huge.max_num_seqs = 1;
        huge.n_ctx = INT32_MAX;
        huge.log_level = CF_LOG_LEVEL_NONE;
        assert(cf_engine_init(&huge, &engine) == CF_STATUS_OUT_OF_MEMORY && engine == nullptr);
        assert(std::strstr(cf_last_error(), "the KV cache of 2147483647 tokens alone needs") != nullptr);
        assert(std::strstr(cf_last_error(), "lower n_ctx or kv_cache_bytes") != nullptr);
    }
}

std::vector<std::vector<int32_t>> greedy_outputs(int32_t kv_mode, bool together, int32_t budget) {
    cf_sampling_params p = cf_sampling_params_default();
    p.max_tokens = 24;
    p.ignore_eos = 1;
    std::vector<std::vector<int32_t>> outputs;
    cf_engine_t engine = make_engine(kv_mode, 4, budget);
    std::vector<int64_t> ids;
    for (const char * prompt : kPrompts) {
        ids.push_back(add(engine, tokenize(engine, prompt), p));
        if (!together) {
            outputs.push_back(run_to_completion(engine)[ids.back()].tokens);
        }
    }
    if (together) {
        std::map<int64_t, Result> results = run_to_completion(engine);
        for (int64_t id : ids) {
            assert(results[id].finish_reason == CF_FINISH_REASON_LENGTH);
            assert(results[id].final_event.num_output_tokens == 24);
            outputs.push_back(results[id].tokens);
        }
    }
    cf_engine_stats stats;
    assert(cf_engine_get_stats(engine, &stats) == CF_STATUS_OK);
    assert(stats.num_finished == 4 && stats.num_running == 0 && stats.kv_tokens_used == 0);
    assert(stats.kv_blocks_used == 0 && stats.kv_bytes_reserved == 0);
    assert(stats.num_generated_tokens == 4 * 24);
    cf_engine_free(engine);
    return outputs;
}

void test_greedy_batched_equals_alone() {
    const auto alone = greedy_outputs(CF_KV_MODE_STOCK, false, 512);
    for (const auto & tokens : alone) {
        assert(tokens.size() == 24);
    }
    assert(greedy_outputs(CF_KV_MODE_STOCK, true, 512) == alone);
    assert(greedy_outputs(CF_KV_MODE_STOCK_UNIFIED, true, 512) == alone);
    assert(greedy_outputs(CF_KV_MODE_STOCK, true, 16) == alone);  // chunked prefill

    // Paged mode too; its default attention kernel does llama.cpp's flash attention arithmetic, so
    // it equals stock token for token.
    assert(greedy_outputs(CF_KV_MODE_PAGED, false, 512) == alone);
    assert(greedy_outputs(CF_KV_MODE_PAGED, true, 512) == alone);
    assert(greedy_outputs(CF_KV_MODE_PAGED, true, 16) == alone);
}

void test_stops_and_abort() {
    cf_engine_t engine = make_engine(CF_KV_MODE_STOCK);
    const std::vector<int32_t> prompt = tokenize(engine, kPrompts[0]);
    cf_sampling_params p = cf_sampling_params_default();
    p.max_tokens = 16;
    p.ignore_eos = 1;
    const int64_t ref = add(engine, prompt, p);
    const Result ref_result = run_to_completion(engine)[ref];
    const std::vector<int32_t> reference = ref_result.tokens;
    assert(reference.size() == 16);
    {  // the events' text is the output detokenized (ASCII here: no character is cut)
        std::vector<char> whole(4096);
        int32_t whole_len = 0;
        assert(cf_engine_detokenize(engine, reference.data(), 16, 0, 0, whole.data(), 4096, &whole_len) == CF_STATUS_OK);
        assert(ref_result.text == std::string(whole.data(), (size_t) whole_len));
        assert(ref_result.final_event.stop_string_index == -1);
    }

    p.stop_token_ids = &reference[3];
    p.num_stop_token_ids = 1;
    const int64_t by_token = add(engine, prompt, p);
    p.num_stop_token_ids = 0;
    char piece[64];
    int32_t len = 0;
    assert(cf_engine_detokenize(engine, &reference[2], 1, 0, 0, piece, 64, &len) == CF_STATUS_OK && len > 0);
    const std::string stop(piece, (size_t) len);
    const char * stops[] = {stop.c_str()};
    p.stop_strings = stops;
    p.num_stop_strings = 1;
    const int64_t by_string = add(engine, prompt, p);
    p.num_stop_strings = 0;
    p.max_tokens = 200;
    const int64_t aborted = add(engine, prompt, p);
    int32_t n_sched = 0;
    assert(cf_engine_step(engine, &n_sched) == CF_STATUS_OK && n_sched > 0);
    assert(cf_engine_abort_request(engine, aborted) == CF_STATUS_OK);
    std::map<int64_t, Result> results = run_to_completion(engine);
    assert(results[by_token].finish_reason == CF_FINISH_REASON_STOP);
    assert(results[by_token].tokens.size() <= 4);
    assert(results[by_string].finish_reason == CF_FINISH_REASON_STOP && results[by_string].tokens.size() <= 3);
    assert(results[by_string].final_event.stop_string_index == 0);
    assert(results[by_string].text.find(stop) == std::string::npos);  // never released
    assert(ref_result.text.compare(0, results[by_string].text.size(), results[by_string].text) == 0);
    assert(results[aborted].finish_reason == CF_FINISH_REASON_ABORT);
    assert(results[aborted].final_event.token_id == CF_TOKEN_NONE && results[aborted].final_event.arrival_ns > 0);
    assert(cf_engine_abort_request(engine, aborted) == CF_STATUS_NOT_FOUND);
    cf_engine_free(engine);
}

void test_step_thread() {
    cf_engine_t engine = make_engine(CF_KV_MODE_STOCK_UNIFIED, 4, 64);
    assert(cf_engine_start(engine) == CF_STATUS_OK);
    assert(cf_engine_start(engine) == CF_STATUS_OK);
    int32_t n_sched = 0;
    assert(cf_engine_step(engine, &n_sched) == CF_STATUS_INVALID_ARGUMENT);
    cf_sampling_params p = cf_sampling_params_default();
    p.max_tokens = 8;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.seed = 42;
    const int num_requests = 10;
    std::thread producer([&] {
        for (int i = 0; i < num_requests; ++i) {
            add(engine, tokenize(engine, kPrompts[i % 4]), p);
        }
    });
    int finished = 0;
    cf_output_event events[16];
    while (finished < num_requests) {
        int32_t n = 0;
        assert(cf_engine_drain(engine, events, 16, 5000, &n) == CF_STATUS_OK);
        assert(n > 0);
        for (int32_t i = 0; i < n; ++i) {
            finished += events[i].finish_reason != CF_FINISH_REASON_NONE;
            if (events[i].finish_reason != CF_FINISH_REASON_NONE) {
                assert(events[i].first_scheduled_ns >= events[i].arrival_ns && events[i].time_ns >= events[i].first_scheduled_ns);
            }
        }
    }
    producer.join();
    assert(cf_engine_stop(engine) == CF_STATUS_OK);
    assert(!cf_engine_has_work(engine));
    cf_engine_free(engine);
}

}  // namespace

int main() {
    g_model = std::getenv("CACHEFLOW_TEST_MODEL");
    if (g_model == nullptr || g_model[0] == '\0') {
        std::printf("test_engine: skipped (set CACHEFLOW_TEST_MODEL to a GGUF model)\n");
        return 0;
    }
    test_info_and_text();
    test_request_errors();
    test_greedy_batched_equals_alone();
    test_stops_and_abort();
    test_step_thread();
    std::printf("test_engine: ok\n");
    return 0;
}
