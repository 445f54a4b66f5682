/* test_c_abi.c - the public header compiles as C and the model-free calls behave.
 * Only cacheflow.h is included; no model file is needed. */
#include "cacheflow.h"

#undef NDEBUG /* the checks must run in Release builds too */
#include <assert.h>
#include <stdio.h>
#include <string.h>

static void test_defaults(void) {
    cf_engine_config c = cf_engine_default_config();
    assert(c.model_path == NULL);
    assert(c.n_ctx == 0);
    assert(c.max_num_seqs == 16);
    assert(c.max_num_batched_tokens == 512);
    assert(c.kv_mode == CF_KV_MODE_AUTO);
    assert(c.block_size == 16);
    assert(c.policy == CF_SCHED_POLICY_FCFS);
    assert(c.flash_attn == -1);
    assert(c.log_level == CF_LOG_LEVEL_ERROR);
    assert(c.profile_capacity == 0);

    cf_sampling_params p = cf_sampling_params_default();
    assert(p.max_tokens == 16);
    assert(p.temperature == 0.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    assert(p.seed == CF_SEED_RANDOM);
    assert(p.num_stop_token_ids == 0 && p.num_stop_strings == 0 && p.ignore_eos == 0);
}

static void test_errors_without_model(void) {
    cf_engine_t engine = (cf_engine_t) 0x1;
    cf_engine_config c = cf_engine_default_config();
    c.log_level = CF_LOG_LEVEL_NONE;

    assert(strcmp(cf_last_error(), "") == 0);
    assert(cf_engine_init(&c, &engine) == CF_STATUS_INVALID_ARGUMENT);
    assert(engine == NULL);
    assert(strstr(cf_last_error(), "model_path") != NULL);

    c.model_path = "/nonexistent/cacheflow-test-model.gguf";
    assert(cf_engine_init(&c, &engine) == CF_STATUS_MODEL_LOAD_FAILED);
    assert(engine == NULL);
    assert(strcmp(cf_last_error(), "model file not found: /nonexistent/cacheflow-test-model.gguf") == 0);

    c.kv_mode = CF_KV_MODE_PAGED + 1;
    assert(cf_engine_init(&c, &engine) == CF_STATUS_INVALID_ARGUMENT);
    assert(strstr(cf_last_error(), "kv_mode") != NULL);

    c.kv_mode = CF_KV_MODE_STOCK;
    c.max_num_seqs = 0;
    assert(cf_engine_init(&c, &engine) == CF_STATUS_INVALID_ARGUMENT);
    assert(strstr(cf_last_error(), "max_num_seqs") != NULL);

    assert(cf_engine_init(NULL, &engine) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_engine_init(&c, NULL) == CF_STATUS_INVALID_ARGUMENT);
}

static void test_null_engine(void) {
    int64_t id = 0;
    int32_t n = 0;
    cf_sampling_params p = cf_sampling_params_default();
    int32_t prompt[1] = {1};
    cf_output_event ev[1];
    cf_engine_free(NULL);
    assert(cf_engine_add_request(NULL, prompt, 1, &p, 0, &id) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_engine_step(NULL, &n) == CF_STATUS_INVALID_ARGUMENT);
    assert(cf_engine_drain(NULL, ev, 1, 0, &n) == CF_STATUS_INVALID_ARGUMENT);
    {
        char text[8];
        int32_t text_len = 7;
        cf_token_logprob logprobs[2];
        int32_t num_logprobs = 5;
        assert(cf_engine_drain_outputs(NULL, ev, 1, text, 8, logprobs, 2, 0, &n, &text_len, &num_logprobs) ==
               CF_STATUS_INVALID_ARGUMENT);
        assert(n == 0 && text_len == 0 && num_logprobs == 0);
        assert(CF_SLOT_ID_NONE == -1);
    }
    assert(cf_engine_has_work(NULL) == 0);
    {
        cf_profile_event pev[1];
        int64_t dropped = 0;
        assert(cf_engine_profile_drain(NULL, pev, 1, &n, &dropped) == CF_STATUS_INVALID_ARGUMENT);
        assert(n == 0);
    }
}

static void test_clock_and_version(void) {
    int64_t t0 = cf_clock_ns();
    int64_t t1 = cf_clock_ns();
    assert(t0 > 0 && t1 >= t0);
    assert(strstr(cf_version(), "llama.cpp") != NULL);
}

/* llama-server's other samplers: its defaults, all off; and their checks (after the tests that
 * expect no error set yet) */
static void test_other_sampler_defaults_and_checks(void) {
    cf_sampling_params p = cf_sampling_params_default();
    assert(p.dry_multiplier == 0.0f && p.dry_base == 1.75f && p.dry_allowed_length == 2);
    assert(p.dry_penalty_last_n == 64 && p.num_dry_sequence_breakers == 4);
    assert(strcmp(p.dry_sequence_breakers[0], "\n") == 0 && strcmp(p.dry_sequence_breakers[1], ":") == 0);
    assert(strcmp(p.dry_sequence_breakers[2], "\"") == 0 && strcmp(p.dry_sequence_breakers[3], "*") == 0);
    assert(p.xtc_probability == 0.0f && p.xtc_threshold == 0.1f && p.typical_p == 1.0f);
    assert(p.mirostat == 0 && p.mirostat_tau == 5.0f && p.mirostat_eta == 0.1f);
    assert(p.dynatemp_range == 0.0f && p.dynatemp_exponent == 1.0f && p.top_n_sigma == -1.0f && p.min_keep == 0);
    assert(cf_sampling_params_check(&p) == CF_STATUS_OK);
    p.mirostat = 3;
    assert(cf_sampling_params_check(&p) == CF_STATUS_INVALID_ARGUMENT);
    assert(strcmp(cf_last_error(), "mirostat must be 0, 1 or 2, got 3") == 0);
    p.mirostat = 0;
    p.num_dry_sequence_breakers = 1;
    p.dry_sequence_breakers = NULL;
    assert(cf_sampling_params_check(&p) == CF_STATUS_INVALID_ARGUMENT);
    assert(strcmp(cf_last_error(),
                  "num_dry_sequence_breakers must be >= 0 with dry_sequence_breakers non-NULL, got 1") == 0);
    p.num_dry_sequence_breakers = 0;  /* no breakers */
    assert(cf_sampling_params_check(&p) == CF_STATUS_OK);
}

int main(void) {
    test_defaults();
    test_errors_without_model();
    test_null_engine();
    test_clock_and_version();
    test_other_sampler_defaults_and_checks();
    printf("test_c_abi: ok (%s)\n", cf_version());
    return 0;
}
