/*
 * fake_cacheflow.c - a toy implementation of cacheflow.h for testing pycacheflow without
 * llama.cpp. Compiled at test time by tests/unit/conftest.py (never shipped).
 *
 * The "model": token ids 0..255 are bytes, 256 is EOS, 257 is BOS; tokenize maps bytes to
 * tokens; each request "generates" its prompt over and over (token i = prompt[i % len]).
 * A request stops at EOS, a stop token id, a stop string in its output bytes (STOP), at
 * max_tokens or when prompt + output reach FAKE_CTX_PER_SEQ (LENGTH). Every step emits one
 * token per active request; the step thread steps every 1 ms. Events release text as the real
 * engine does: an incomplete UTF-8 character or a possible stop-string start is held back, a stop
 * string and what follows it are never released; the final event releases the rest. Chat template:
 * "<role>content|" per message, then "A:" with add_assistant.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include "cacheflow.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    FAKE_MAX_REQUESTS = 4096,
    FAKE_MAX_EVENTS = 1 << 16,
    FAKE_EOS = 256,
    FAKE_BOS = 257,
    FAKE_N_VOCAB = 258,
    FAKE_CTX_PER_SEQ = 256,
    FAKE_MAX_STOPS = 4,
    FAKE_STOP_LEN = 64,
};

typedef struct fake_request {
    int64_t id;
    int active;
    int32_t prompt[FAKE_CTX_PER_SEQ];
    int32_t num_prompt_tokens;
    int32_t num_output_tokens;
    int32_t max_tokens;
    char text[FAKE_CTX_PER_SEQ + 1]; /* output bytes so far, NUL-terminated */
    int32_t text_len;
    int32_t released; /* bytes of text already carried by events */
    char stops[FAKE_MAX_STOPS][FAKE_STOP_LEN];
    int32_t num_stops;
    int32_t stop_ids[FAKE_MAX_STOPS];
    int32_t num_stop_ids;
    int64_t arrival_ns, first_scheduled_ns;
} fake_request;

struct cf_engine {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, quit;
    fake_request requests[FAKE_MAX_REQUESTS];
    int32_t num_requests;
    int64_t next_id;
    cf_output_event events[FAKE_MAX_EVENTS]; /* ring buffer */
    char event_text[FAKE_MAX_EVENTS][FAKE_STOP_LEN + 8]; /* text of events[i] */
    int32_t event_head, num_events;
    int64_t num_steps, num_finished, num_generated;
};

static _Thread_local char g_error[256];

static cf_status fail(cf_status status, const char * message) {
    snprintf(g_error, sizeof g_error, "%s", message);
    return status;
}

const char * cf_last_error(void) { return g_error; }
const char * cf_version(void) { return "fake"; }
int32_t cf_default_threads(void) { return 1; }

int64_t cf_clock_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t) t.tv_sec * 1000000000 + t.tv_nsec;
}

cf_engine_config cf_engine_default_config(void) {
    cf_engine_config c;
    memset(&c, 0, sizeof c);
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 512;
    c.block_size = 16;
    c.flash_attn = -1;
    c.log_level = CF_LOG_LEVEL_ERROR;
    c.enable_prefix_caching = 1;
    return c;
}

cf_sampling_params cf_sampling_params_default(void) {
    cf_sampling_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 16;
    p.top_p = 1.0f;
    p.seed = CF_SEED_RANDOM;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.grammar = NULL;
    p.cache_prompt = 1;
    return p;
}

cf_status cf_engine_init(const cf_engine_config * config, cf_engine_t * out_engine) {
    *out_engine = NULL;
    if (config->model_path == NULL) return fail(CF_STATUS_INVALID_ARGUMENT, "model_path is NULL");
    FILE * f = fopen(config->model_path, "rb");
    if (f == NULL) return fail(CF_STATUS_MODEL_LOAD_FAILED, "cannot open model file");
    fclose(f);
    cf_engine_t e = calloc(1, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->next_id = 1;
    *out_engine = e;
    return CF_STATUS_OK;
}

/* Earliest position of a stop string in r's text, or -1; *index = which one (may be NULL). */
static int32_t stop_position_of(const fake_request * r, int32_t * index) {
    int32_t best = -1;
    for (int32_t i = 0; i < r->num_stops; i++) {
        const char * hit = strstr(r->text, r->stops[i]);
        if (hit != NULL && (best < 0 || hit - r->text < best)) {
            best = (int32_t) (hit - r->text);
            if (index != NULL) *index = i;
        }
    }
    return best;
}

static int32_t stop_position(const fake_request * r) { return stop_position_of(r, NULL); }

/* End of the text that can be released now (see the header comment). */
static int32_t releasable_end(const fake_request * r, int final) {
    int32_t stop = stop_position(r);
    if (stop >= 0) return stop;
    int32_t end = r->text_len;
    if (final) return end;
    for (int32_t back = 1; back <= 3 && end - back >= r->released; back++) {
        unsigned char c = (unsigned char) r->text[end - back];
        if ((c & 0xC0) == 0x80) continue;
        int32_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back) end -= back;
        break;
    }
    for (int32_t i = 0; i < r->num_stops; i++) {
        int32_t k = (int32_t) strlen(r->stops[i]) - 1;
        if (k > r->text_len - r->released) k = r->text_len - r->released;
        for (; k > 0; k--) {
            if (memcmp(r->text + r->text_len - k, r->stops[i], (size_t) k) == 0) {
                if (r->text_len - k < end) end = r->text_len - k;
                break;
            }
        }
    }
    return end;
}

/* Call with e->mu held. */
static void push_event(cf_engine_t e, fake_request * r, int32_t token_id, int32_t finish_reason) {
    const int32_t index = (e->event_head + e->num_events) % FAKE_MAX_EVENTS;
    cf_output_event * v = &e->events[index];
    memset(v, 0, sizeof *v);
    e->num_events++;
    v->request_id = r->id;
    v->token_id = token_id;
    v->finish_reason = finish_reason;
    v->time_ns = cf_clock_ns();
    v->slot_id = (int32_t) ((r->id - 1) % 16);
    int32_t end = releasable_end(r, finish_reason != CF_FINISH_REASON_NONE);
    if (end < r->released) end = r->released;
    v->text_len = end - r->released;
    memcpy(e->event_text[index], r->text + r->released, (size_t) v->text_len);
    r->released = end;
    if (finish_reason != CF_FINISH_REASON_NONE) {
        v->arrival_ns = r->arrival_ns;
        v->first_scheduled_ns = r->first_scheduled_ns;
        v->num_prompt_tokens = r->num_prompt_tokens;
        v->num_output_tokens = r->num_output_tokens;
        v->stop_string_index = -1;
        stop_position_of(r, &v->stop_string_index);
        r->active = 0;
        e->num_finished++;
    }
    pthread_cond_broadcast(&e->cv);
}

static int32_t finish_reason_of(const fake_request * r, int32_t token_id) {
    if (stop_position(r) >= 0) return CF_FINISH_REASON_STOP;
    for (int32_t i = 0; i < r->num_stop_ids; i++) {
        if (token_id == r->stop_ids[i]) return CF_FINISH_REASON_STOP;
    }
    if (token_id == FAKE_EOS) return CF_FINISH_REASON_STOP;
    if (r->num_output_tokens >= r->max_tokens ||
        r->num_prompt_tokens + r->num_output_tokens >= FAKE_CTX_PER_SEQ) {
        return CF_FINISH_REASON_LENGTH;
    }
    return CF_FINISH_REASON_NONE;
}

/* One token for every active request. Call with e->mu held. Returns tokens computed. */
static int32_t step_locked(cf_engine_t e) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->num_requests; i++) {
        fake_request * r = &e->requests[i];
        if (!r->active) continue;
        n++;
        if (r->first_scheduled_ns == 0) r->first_scheduled_ns = cf_clock_ns();
        int32_t token_id = r->prompt[r->num_output_tokens % r->num_prompt_tokens];
        r->num_output_tokens++;
        if (token_id < 256) {
            r->text[r->text_len++] = (char) token_id;
            r->text[r->text_len] = '\0';
        }
        push_event(e, r, token_id, finish_reason_of(r, token_id));
    }
    if (n > 0) e->num_steps++;
    e->num_generated += n;
    return n;
}

static void * step_loop(void * arg) {
    cf_engine_t e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int quit = e->quit;
        if (!quit) step_locked(e);
        pthread_mutex_unlock(&e->mu);
        if (quit) return NULL;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

cf_status cf_engine_start(cf_engine_t e) {
    if (e->running) return CF_STATUS_OK;
    e->quit = 0;
    e->running = 1;
    pthread_create(&e->thread, NULL, step_loop, e);
    return CF_STATUS_OK;
}

cf_status cf_engine_stop(cf_engine_t e) {
    if (!e->running) return CF_STATUS_OK;
    pthread_mutex_lock(&e->mu);
    e->quit = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->running = 0;
    return CF_STATUS_OK;
}

void cf_engine_free(cf_engine_t e) {
    if (e == NULL) return;
    cf_engine_stop(e);
    free(e);
}

cf_status cf_engine_step(cf_engine_t e, int32_t * out_num_scheduled_tokens) {
    if (e->running) return fail(CF_STATUS_INVALID_ARGUMENT, "step thread is running");
    pthread_mutex_lock(&e->mu);
    *out_num_scheduled_tokens = step_locked(e);
    pthread_mutex_unlock(&e->mu);
    return CF_STATUS_OK;
}

int32_t cf_engine_has_work(cf_engine_t e) {
    int32_t work = 0;
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->num_requests; i++) work |= e->requests[i].active;
    pthread_mutex_unlock(&e->mu);
    return work;
}

cf_status cf_engine_get_info(cf_engine_t e, cf_model_info * out) {
    (void) e;
    memset(out, 0, sizeof *out);
    out->n_vocab = FAKE_N_VOCAB;
    out->n_ctx_train = FAKE_CTX_PER_SEQ;
    out->n_ctx = 16 * FAKE_CTX_PER_SEQ;
    out->n_ctx_per_seq = FAKE_CTX_PER_SEQ;
    out->max_num_seqs = 16;
    out->kv_mode = CF_KV_MODE_STOCK;
    out->token_bos = FAKE_BOS;
    out->token_eos = FAKE_EOS;
    snprintf(out->description, sizeof out->description, "fake bytes");
    snprintf(out->arch, sizeof out->arch, "fake");
    return CF_STATUS_OK;
}

cf_status cf_engine_get_stats(cf_engine_t e, cf_engine_stats * out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&e->mu);
    out->num_steps = e->num_steps;
    out->num_finished = e->num_finished;
    out->num_generated_tokens = e->num_generated;
    pthread_mutex_unlock(&e->mu);
    return CF_STATUS_OK;
}

cf_status cf_engine_get_ttft_by_priority(cf_engine_t e, cf_priority_ttft * out, int32_t capacity,
                                         int32_t * out_num_priorities) {
    (void) e;
    (void) out;
    (void) capacity;
    *out_num_priorities = 0;  /* the fake keeps no per-priority table */
    return CF_STATUS_OK;
}

cf_status cf_sampling_params_check(const cf_sampling_params * params) {
    if (params->max_tokens < 1) return fail(CF_STATUS_INVALID_ARGUMENT, "max_tokens must be >= 1");
    return CF_STATUS_OK;  /* the real engine checks every range; the fake only this one */
}

cf_status cf_engine_add_request(cf_engine_t e, const int32_t * prompt_tokens, int32_t num_prompt_tokens,
                                const cf_sampling_params * params, int32_t priority,
                                int64_t * out_request_id) {
    (void) priority;
    if (num_prompt_tokens <= 0) return fail(CF_STATUS_INVALID_ARGUMENT, "empty prompt");
    if (num_prompt_tokens >= FAKE_CTX_PER_SEQ) return fail(CF_STATUS_PROMPT_TOO_LONG, "prompt too long");
    if (params->max_tokens < 1) return fail(CF_STATUS_INVALID_ARGUMENT, "max_tokens must be >= 1");
    pthread_mutex_lock(&e->mu);
    if (e->num_requests >= FAKE_MAX_REQUESTS) {
        pthread_mutex_unlock(&e->mu);
        return fail(CF_STATUS_OUT_OF_MEMORY, "fake engine is full");
    }
    fake_request * r = &e->requests[e->num_requests++];
    memset(r, 0, sizeof *r);
    r->id = e->next_id++;
    r->active = 1;
    memcpy(r->prompt, prompt_tokens, sizeof(int32_t) * (size_t) num_prompt_tokens);
    r->num_prompt_tokens = num_prompt_tokens;
    r->max_tokens = params->max_tokens;
    r->arrival_ns = cf_clock_ns();
    for (int32_t i = 0; i < params->num_stop_strings && i < FAKE_MAX_STOPS; i++) {
        snprintf(r->stops[r->num_stops++], FAKE_STOP_LEN, "%s", params->stop_strings[i]);
    }
    for (int32_t i = 0; i < params->num_stop_token_ids && i < FAKE_MAX_STOPS; i++) {
        r->stop_ids[r->num_stop_ids++] = params->stop_token_ids[i];
    }
    *out_request_id = r->id;
    pthread_mutex_unlock(&e->mu);
    return CF_STATUS_OK;
}

cf_status cf_engine_add_requests(cf_engine_t e, const cf_request * requests, int32_t num_requests,
                                 int64_t * out_request_ids) {
    /* validate all first (as the real engine: a failure queues none), then queue each */
    for (int32_t i = 0; i < num_requests; i++) {
        const cf_request * q = &requests[i];
        const char * why = q->num_prompt_tokens <= 0                    ? "empty prompt"
                           : q->num_prompt_tokens >= FAKE_CTX_PER_SEQ   ? "prompt too long"
                           : q->params->max_tokens < 1                  ? "max_tokens must be >= 1"
                                                                        : NULL;
        if (why != NULL) {
            char message[128];
            snprintf(message, sizeof message, "request %d: %s", (int) i, why);
            return fail(q->num_prompt_tokens >= FAKE_CTX_PER_SEQ ? CF_STATUS_PROMPT_TOO_LONG
                                                                 : CF_STATUS_INVALID_ARGUMENT, message);
        }
    }
    for (int32_t i = 0; i < num_requests; i++) {
        const cf_request * q = &requests[i];
        cf_status rc = cf_engine_add_request(e, q->prompt_tokens, q->num_prompt_tokens, q->params, q->priority,
                                             &out_request_ids[i]);
        if (rc != CF_STATUS_OK) return rc;
    }
    return CF_STATUS_OK;
}

cf_status cf_engine_abort_request(cf_engine_t e, int64_t request_id) {
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->num_requests; i++) {
        fake_request * r = &e->requests[i];
        if (r->id == request_id && r->active) {
            push_event(e, r, CF_TOKEN_NONE, CF_FINISH_REASON_ABORT);
            pthread_mutex_unlock(&e->mu);
            return CF_STATUS_OK;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return fail(CF_STATUS_NOT_FOUND, "unknown or finished request id");
}

cf_status cf_engine_drain(cf_engine_t e, cf_output_event * events, int32_t capacity,
                          int32_t timeout_ms, int32_t * out_num_events) {
    pthread_mutex_lock(&e->mu);
    if (e->num_events == 0 && timeout_ms != 0) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        int64_t ns = deadline.tv_nsec + (int64_t) (timeout_ms < 0 ? 1000 : timeout_ms) * 1000000;
        deadline.tv_sec += ns / 1000000000;
        deadline.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&e->cv, &e->mu, &deadline);
    }
    int32_t n = 0;
    while (e->num_events > 0 && n < capacity) {
        events[n++] = e->events[e->event_head];
        e->event_head = (e->event_head + 1) % FAKE_MAX_EVENTS;
        e->num_events--;
    }
    *out_num_events = n;
    pthread_mutex_unlock(&e->mu);
    return CF_STATUS_OK;
}

cf_status cf_engine_drain_outputs(cf_engine_t e, cf_output_event * events, int32_t capacity, char * text,
                                  int32_t text_capacity, cf_token_logprob * logprobs, int32_t logprobs_capacity,
                                  int32_t timeout_ms, int32_t * out_num_events, int32_t * out_text_len,
                                  int32_t * out_num_logprobs) {
    (void) logprobs;
    (void) logprobs_capacity;
    *out_num_logprobs = 0; /* the toy engine has no logits */
    int32_t n = 0, k = 0;
    cf_status rc = CF_STATUS_OK;
    pthread_mutex_lock(&e->mu);
    if (e->num_events == 0 && timeout_ms != 0) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        int64_t ns = deadline.tv_nsec + (int64_t) (timeout_ms < 0 ? 1000 : timeout_ms) * 1000000;
        deadline.tv_sec += ns / 1000000000;
        deadline.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&e->cv, &e->mu, &deadline);
    }
    while (e->num_events > 0 && n < capacity) {
        cf_output_event ev = e->events[e->event_head];
        if (k + ev.text_len > text_capacity) {
            if (n == 0) {
                k = ev.text_len;
                rc = fail(CF_STATUS_BUFFER_TOO_SMALL, "text buffer too small");
            }
            break;
        }
        memcpy(text + k, e->event_text[e->event_head], (size_t) ev.text_len);
        ev.text_offset = k;
        k += ev.text_len;
        events[n++] = ev;
        e->event_head = (e->event_head + 1) % FAKE_MAX_EVENTS;
        e->num_events--;
    }
    *out_num_events = rc == CF_STATUS_OK ? n : 0;
    *out_text_len = k;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

cf_status cf_engine_tokenize(cf_engine_t e, const char * text, int32_t text_len, int32_t add_special,
                             int32_t parse_special, int32_t * tokens, int32_t capacity,
                             int32_t * out_num_tokens) {
    (void) e, (void) add_special, (void) parse_special;
    *out_num_tokens = text_len;
    if (text_len > capacity) return fail(CF_STATUS_BUFFER_TOO_SMALL, "tokens buffer too small");
    for (int32_t i = 0; i < text_len; i++) tokens[i] = (unsigned char) text[i];
    return CF_STATUS_OK;
}

cf_status cf_engine_detokenize(cf_engine_t e, const int32_t * tokens, int32_t num_tokens,
                               int32_t remove_special, int32_t unparse_special, char * buf,
                               int32_t capacity, int32_t * out_len) {
    (void) e, (void) remove_special;
    int32_t need = 0;
    for (int32_t i = 0; i < num_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= FAKE_N_VOCAB) {
            return fail(CF_STATUS_INVALID_ARGUMENT, "token id out of range");
        }
        need += tokens[i] < 256 ? 1 : (unparse_special ? 5 : 0);
    }
    *out_len = need;
    if (need > capacity) return fail(CF_STATUS_BUFFER_TOO_SMALL, "text buffer too small");
    int32_t k = 0;
    for (int32_t i = 0; i < num_tokens; i++) {
        if (tokens[i] < 256) {
            buf[k++] = (char) tokens[i];
        } else if (unparse_special) {
            memcpy(buf + k, tokens[i] == FAKE_EOS ? "<eos>" : "<bos>", 5);
            k += 5;
        }
    }
    return CF_STATUS_OK;
}

cf_status cf_engine_eog_tokens(cf_engine_t e, int32_t * tokens, int32_t capacity,
                               int32_t * out_num_tokens) {
    (void) e;
    *out_num_tokens = 1;
    if (capacity < 1) return fail(CF_STATUS_BUFFER_TOO_SMALL, "tokens buffer too small");
    tokens[0] = FAKE_EOS;
    return CF_STATUS_OK;
}

cf_status cf_engine_apply_chat_template(cf_engine_t e, const char * tmpl, const char * const * roles,
                                        const char * const * contents, int32_t num_messages,
                                        int32_t add_assistant, char * buf, int32_t capacity,
                                        int32_t * out_len) {
    (void) e, (void) tmpl;
    char text[8192];
    int32_t k = 0;
    for (int32_t i = 0; i < num_messages; i++) {
        k += snprintf(text + k, sizeof text - (size_t) k, "<%s>%s|", roles[i], contents[i]);
    }
    if (add_assistant) k += snprintf(text + k, sizeof text - (size_t) k, "A:");
    *out_len = k;
    if (k > capacity) return fail(CF_STATUS_BUFFER_TOO_SMALL, "text buffer too small");
    memcpy(buf, text, (size_t) k);
    return CF_STATUS_OK;
}
