// capi.cpp - the C ABI (cacheflow.h): thin shims that check arguments, call into cf::Engine,
// catch every exception and turn it into a cf_status plus the thread's last error message.
#include "cacheflow.h"
#include "capi_internal.h"
#include "core/error.h"
#include "engine/config.h"
#include "engine/devices.h"
#include "engine/engine.h"
#include "engine/kv_budget.h"
#include "engine/llama_session.h"
#include "engine/text.h"
#include "llama.h"

#include <algorithm>
#include <new>
#include <string>
#include <thread>

#ifndef CACHEFLOW_VERSION
#define CACHEFLOW_VERSION "0.1.0"
#endif
#ifndef CACHEFLOW_GIT_COMMIT
#define CACHEFLOW_GIT_COMMIT ""
#endif
#ifndef CACHEFLOW_BUILD_TYPE
#define CACHEFLOW_BUILD_TYPE ""
#endif
#ifndef CACHEFLOW_LLAMA_COMMIT
#define CACHEFLOW_LLAMA_COMMIT "0c1e570"
#endif

namespace {

// The one last-error slot of the library; the other shim files reach it through
// cf::capi::set_error (capi_internal.h).
thread_local std::string g_last_error;

}  // namespace

cf_status cf::capi::set_error(cf_status status, const std::string & message) {
    g_last_error = message;
    return status;
}

using cf::capi::guarded;
using cf::capi::require;
using cf::capi::set_error;

extern "C" {

const char * cf_last_error(void) {
    return g_last_error.c_str();
}

const char * cf_version(void) {
    // "0.1.0+1a2b3c4 (llama.cpp 0c1e570, Release)": built once (function-local static: thread-safe in C++11)
    static const std::string version = [] {
        std::string v = CACHEFLOW_VERSION;
        if (sizeof(CACHEFLOW_GIT_COMMIT) > 1) {
            v += "+" CACHEFLOW_GIT_COMMIT;
        }
        v += " (llama.cpp " CACHEFLOW_LLAMA_COMMIT;
        if (sizeof(CACHEFLOW_BUILD_TYPE) > 1) {
            v += ", " CACHEFLOW_BUILD_TYPE;
        }
        return v + ")";
    }();
    return version.c_str();
}

int32_t cf_default_threads(void) {
    try {
        return cf::default_thread_count();
    } catch (...) {  // std::bad_alloc of the topology reads: nothing crosses the C ABI as an exception
        return (int32_t) std::max(1u, std::thread::hardware_concurrency());
    }
}

int64_t cf_clock_ns(void) {
    return cf::clock_ns();
}

cf_engine_config cf_engine_default_config(void) {
    return cf::default_engine_config();
}

cf_sampling_params cf_sampling_params_default(void) {
    return cf::default_sampling_params();
}

cf_status cf_sampling_params_check(const cf_sampling_params * params) {
    return guarded("cf_sampling_params_check", [&] {
        require(params != nullptr, "params is NULL");
        (void) cf::SamplingParams::from_c(*params, 0);  // 0: token ids are checked against a vocabulary on add
    });
}

cf_status cf_kv_cache_rows_for_budget(int64_t kv_cache_bytes, int64_t kv_bytes_per_token, int32_t kv_mode,
                                      int32_t max_num_seqs, int64_t * out_n_ctx, int64_t * out_min_rows) {
    if (out_n_ctx != nullptr) {
        *out_n_ctx = 0;
    }
    if (out_min_rows != nullptr) {
        *out_min_rows = 0;
    }
    return guarded("cf_kv_cache_rows_for_budget", [&] {
        require(kv_cache_bytes >= 0, "kv_cache_bytes must be >= 0");
        require(kv_bytes_per_token >= 1, "kv_bytes_per_token must be >= 1");
        require(max_num_seqs >= 1, "max_num_seqs must be >= 1");
        const cf::KvBudget b = cf::kv_budget(kv_cache_bytes, kv_bytes_per_token, kv_mode, max_num_seqs);
        if (out_min_rows != nullptr) {
            *out_min_rows = b.min_rows;
        }
        if (b.n_ctx == 0) {
            throw cf::Error(CF_STATUS_INVALID_ARGUMENT,
                            std::to_string(kv_cache_bytes) + " bytes hold " + std::to_string(b.rows) + " KV rows of " +
                                std::to_string(kv_bytes_per_token) + " bytes; " + std::to_string(max_num_seqs) +
                                " sequences need at least " + std::to_string(b.min_rows));
        }
        if (out_n_ctx != nullptr) {
            *out_n_ctx = b.n_ctx;
        }
    });
}

cf_status cf_engine_init(const cf_engine_config * config, cf_engine_t * out_engine) {
    if (out_engine != nullptr) {
        *out_engine = nullptr;
    }
    return guarded("cf_engine_init", [&] {
        require(out_engine != nullptr, "out_engine is NULL");
        require(config != nullptr, "config is NULL");
        const cf::EngineConfig resolved = cf::EngineConfig::from_c(*config);
        *out_engine = new cf_engine(resolved);
    });
}

cf_status cf_device_list(const char * rpc_servers, cf_device_info * out, int32_t capacity, int32_t * out_count) {
    return guarded("cf_device_list", [&] {
        require(out_count != nullptr, "out_count is NULL");
        require(capacity >= 0 && (out != nullptr || capacity == 0), "out is NULL or capacity < 0");
        const std::vector<cf_device_info> devices = cf::list_devices(rpc_servers != nullptr ? rpc_servers : "");
        *out_count = (int32_t) devices.size();
        std::copy_n(devices.begin(), std::min<size_t>(devices.size(), (size_t) capacity), out);
        if ((size_t) capacity < devices.size()) {
            throw cf::Error(CF_STATUS_BUFFER_TOO_SMALL, "out holds " + std::to_string(capacity) + " devices but there are " +
                                                            std::to_string(devices.size()));
        }
    });
}

void cf_engine_free(cf_engine_t engine) {
    try {
        delete engine;
    } catch (...) {
        // destructors do not throw; nothing may cross the ABI regardless
    }
}

cf_status cf_engine_get_info(cf_engine_t engine, cf_model_info * out_info) {
    return guarded("cf_engine_get_info", [&] {
        require(engine != nullptr && out_info != nullptr, "engine and out_info must be non-NULL");
        engine->engine.get_info(out_info);
    });
}

cf_status cf_engine_get_stats(cf_engine_t engine, cf_engine_stats * out_stats) {
    return guarded("cf_engine_get_stats", [&] {
        require(engine != nullptr && out_stats != nullptr, "engine and out_stats must be non-NULL");
        *out_stats = engine->engine.get_stats();
    });
}

cf_status cf_engine_get_ttft_by_priority(cf_engine_t engine, cf_priority_ttft * out, int32_t capacity,
                                         int32_t * out_num_priorities) {
    return guarded("cf_engine_get_ttft_by_priority", [&] {
        require(engine != nullptr && out_num_priorities != nullptr, "engine and out_num_priorities must be non-NULL");
        require(capacity >= 0, "capacity must be >= 0");
        require(out != nullptr || capacity == 0, "out is NULL but capacity is > 0");
        *out_num_priorities = engine->engine.get_ttft_by_priority(out, capacity);
    });
}

cf_status cf_engine_add_request(cf_engine_t engine, const int32_t * prompt_tokens, int32_t num_prompt_tokens,
                                const cf_sampling_params * params, int32_t priority, int64_t * out_request_id) {
    return guarded("cf_engine_add_request", [&] {
        require(engine != nullptr, "engine is NULL");
        require(params != nullptr, "params is NULL");
        require(out_request_id != nullptr, "out_request_id is NULL");
        *out_request_id = engine->engine.add_request(prompt_tokens, num_prompt_tokens, *params, priority);
    });
}

cf_status cf_engine_add_requests(cf_engine_t engine, const cf_request * requests, int32_t num_requests,
                                 int64_t * out_request_ids) {
    return guarded("cf_engine_add_requests", [&] {
        require(engine != nullptr, "engine is NULL");
        engine->engine.add_requests(requests, num_requests, out_request_ids);
    });
}

cf_status cf_engine_abort_request(cf_engine_t engine, int64_t request_id) {
    return guarded("cf_engine_abort_request", [&] {
        require(engine != nullptr, "engine is NULL");
        engine->engine.abort_request(request_id);
    });
}

cf_status cf_engine_step(cf_engine_t engine, int32_t * out_num_scheduled_tokens) {
    if (out_num_scheduled_tokens != nullptr) {
        *out_num_scheduled_tokens = 0;
    }
    cf_status status = CF_STATUS_OK;
    const cf_status rc = guarded("cf_engine_step", [&] {
        require(engine != nullptr, "engine is NULL");
        const cf::StepResult result = engine->engine.step();
        if (out_num_scheduled_tokens != nullptr) {
            *out_num_scheduled_tokens = result.num_scheduled_tokens;
        }
        if (result.status != CF_STATUS_OK) {
            status = set_error(result.status, result.message);
        }
    });
    return rc != CF_STATUS_OK ? rc : status;
}

cf_status cf_engine_start(cf_engine_t engine) {
    return guarded("cf_engine_start", [&] {
        require(engine != nullptr, "engine is NULL");
        engine->engine.start();
    });
}

cf_status cf_engine_stop(cf_engine_t engine) {
    return guarded("cf_engine_stop", [&] {
        require(engine != nullptr, "engine is NULL");
        engine->engine.stop();
    });
}

cf_status cf_engine_drain(cf_engine_t engine, cf_output_event * events, int32_t capacity, int32_t timeout_ms,
                          int32_t * out_num_events) {
    if (out_num_events != nullptr) {
        *out_num_events = 0;
    }
    return guarded("cf_engine_drain", [&] {
        require(engine != nullptr, "engine is NULL");
        require(out_num_events != nullptr, "out_num_events is NULL");
        require(events != nullptr && capacity >= 1, "events must be non-NULL with capacity >= 1");
        *out_num_events = engine->engine.drain(events, capacity, timeout_ms);
    });
}

cf_status cf_engine_drain_outputs(cf_engine_t engine, cf_output_event * events, int32_t capacity, char * text,
                                  int32_t text_capacity, cf_token_logprob * logprobs, int32_t logprobs_capacity,
                                  int32_t timeout_ms, int32_t * out_num_events, int32_t * out_text_len,
                                  int32_t * out_num_logprobs) {
    for (int32_t * out : {out_num_events, out_text_len, out_num_logprobs}) {
        if (out != nullptr) {
            *out = 0;
        }
    }
    return guarded("cf_engine_drain_outputs", [&] {
        require(engine != nullptr, "engine is NULL");
        require(out_num_events != nullptr && out_text_len != nullptr && out_num_logprobs != nullptr,
                "out_num_events, out_text_len and out_num_logprobs must be non-NULL");
        require(events != nullptr && capacity >= 1, "events must be non-NULL with capacity >= 1");
        require(text_capacity >= 0 && (text != nullptr || text_capacity == 0),
                "text must be non-NULL with text_capacity >= 0");
        require(logprobs_capacity >= 0 && (logprobs != nullptr || logprobs_capacity == 0),
                "logprobs must be non-NULL with logprobs_capacity >= 0, or NULL with 0");
        char empty = 0;
        cf::DrainBuffers buffers;
        buffers.text = text != nullptr ? text : &empty;
        buffers.text_capacity = text_capacity;
        buffers.text_len = out_text_len;
        buffers.logprobs = logprobs;
        buffers.logprobs_capacity = logprobs_capacity;
        buffers.num_logprobs = out_num_logprobs;
        const int32_t n = engine->engine.drain(events, capacity, timeout_ms, buffers);
        if (n == 0 && (*out_text_len > 0 || *out_num_logprobs > 0)) {
            throw cf::Error(CF_STATUS_BUFFER_TOO_SMALL,
                            "the oldest event has " + std::to_string(*out_text_len) + " bytes of text and " +
                                std::to_string(*out_num_logprobs) + " token probabilities but the buffers hold " +
                                std::to_string(text_capacity) + " and " + std::to_string(logprobs_capacity));
        }
        *out_num_events = n;
    });
}

int32_t cf_engine_has_work(cf_engine_t engine) {
    if (engine == nullptr) {
        return 0;
    }
    try {
        return engine->engine.has_work() ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

cf_status cf_engine_tokenize(cf_engine_t engine, const char * text, int32_t text_len, int32_t add_special,
                             int32_t parse_special, int32_t * tokens, int32_t capacity, int32_t * out_num_tokens) {
    return guarded("cf_engine_tokenize", [&] {
        require(engine != nullptr && out_num_tokens != nullptr, "engine and out_num_tokens must be non-NULL");
        *out_num_tokens = 0;
        *out_num_tokens = cf::tokenize(engine->engine.session().vocab(), text, text_len, add_special != 0,
                                       parse_special != 0, tokens, capacity, out_num_tokens);
    });
}

cf_status cf_engine_detokenize(cf_engine_t engine, const int32_t * tokens, int32_t num_tokens, int32_t remove_special,
                               int32_t unparse_special, char * buf, int32_t capacity, int32_t * out_len) {
    return guarded("cf_engine_detokenize", [&] {
        require(engine != nullptr && out_len != nullptr, "engine and out_len must be non-NULL");
        *out_len = 0;
        *out_len = cf::detokenize(engine->engine.session().vocab(), tokens, num_tokens, remove_special != 0,
                                  unparse_special != 0, buf, capacity, out_len);
    });
}

cf_status cf_engine_apply_chat_template(cf_engine_t engine, const char * tmpl, const char * const * roles,
                                        const char * const * contents, int32_t num_messages, int32_t add_assistant,
                                        char * buf, int32_t capacity, int32_t * out_len) {
    return guarded("cf_engine_apply_chat_template", [&] {
        require(engine != nullptr && out_len != nullptr, "engine and out_len must be non-NULL");
        *out_len = 0;
        *out_len = cf::apply_chat_template(engine->engine.session().model(), tmpl, roles, contents, num_messages,
                                           add_assistant != 0, buf, capacity, out_len);
    });
}

cf_status cf_engine_eog_tokens(cf_engine_t engine, int32_t * tokens, int32_t capacity, int32_t * out_num_tokens) {
    return guarded("cf_engine_eog_tokens", [&] {
        require(engine != nullptr && out_num_tokens != nullptr, "engine and out_num_tokens must be non-NULL");
        require(capacity >= 0 && (tokens != nullptr || capacity == 0), "tokens must hold capacity >= 0 ids");
        const cf::LlamaSession & session = engine->engine.session();
        int32_t num = 0;
        for (int32_t id = 0; id < session.n_vocab(); ++id) {
            if (llama_vocab_is_eog(session.vocab(), id)) {
                if (num < capacity) {
                    tokens[num] = id;
                }
                ++num;
            }
        }
        *out_num_tokens = num;
        if (num > capacity) {
            throw cf::Error(CF_STATUS_BUFFER_TOO_SMALL, "tokens holds " + std::to_string(capacity) + " ids but " +
                                                            std::to_string(num) + " are needed");
        }
    });
}

}  // extern "C"
