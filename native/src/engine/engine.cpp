// engine.cpp - engine construction, request intake, step thread control, outputs and stats.
// The step itself lives in engine_step.cpp.
#include "engine/engine.h"

#include "core/error.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace cf {

int64_t clock_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

namespace {

// The KV cache manager of the session's KV mode.
// Host slots of the swap space: swap_space_bytes / block bytes (paged mode only).
int32_t num_host_blocks(const LlamaSession & session) {
    const int64_t block_bytes = session.paged_block_bytes();
    if (block_bytes <= 0) {
        return 0;
    }
    return (int32_t) std::min<int64_t>(session.config().swap_space_bytes / block_bytes, INT32_MAX);
}

std::unique_ptr<KvCacheManager> make_kv_manager(const LlamaSession & session) {
    if (session.config().paged()) {
        KvStreamPolicy stream;
        if (session.kv_streaming()) {
            stream.enabled = true;
            stream.alone_only = session.kv_stream_alone_only();
            stream.max_staged = session.kv_stream_blocks();
            session.check_kv_stream_host_slots(session.paged_block_bytes());  // the context's own block bytes
        }
        const int32_t host_blocks = num_host_blocks(session);
        // the notices are in words a library user (swap_space_bytes) and a CLI user (--swap-space, GiB) both read
        const bool swap = session.config().preemption_mode == CF_PREEMPTION_MODE_SWAP;
        if (swap && host_blocks == 0) {
            std::fprintf(stderr, "cacheflow: swap preemption with a swap space of %lld bytes, which holds no KV block "
                                 "(%lld bytes each): preempted sequences are recomputed\n",
                         (long long) session.config().swap_space_bytes, (long long) session.paged_block_bytes());
        } else if (swap && (int64_t) host_blocks * session.config().block_size < session.n_ctx_per_seq()) {
            std::fprintf(stderr, "cacheflow: the swap space holds %d KV blocks (%lld tokens), less than one sequence "
                                 "may fill (%d tokens): a preempted sequence with more blocks than are free there is "
                                 "recomputed instead\n",
                         host_blocks, (long long) host_blocks * session.config().block_size, session.n_ctx_per_seq());
        }
        return make_paged_kv(session.num_blocks(), session.config().block_size, session.config().enable_prefix_caching,
                             host_blocks, session.paged_block_bytes(), stream);
    }
    if (session.config().preemption_mode == CF_PREEMPTION_MODE_SWAP) {
        std::fprintf(stderr, "cacheflow: swap preemption has no effect on the stock KV cache: it reserves "
                             "each sequence's rows at admission and never preempts\n");
    }
    if (session.config().kv_unified()) {
        return make_stock_unified_kv(session.n_ctx(), session.n_ctx_per_seq());
    }
    return make_stock_split_kv(session.n_ctx_per_seq());
}

SchedulerConfig scheduler_config(const LlamaSession & session) {
    SchedulerConfig c;
    c.max_num_seqs = session.config().max_num_seqs;
    c.max_num_batched_tokens = session.n_batch();
    c.n_ctx = session.n_ctx();
    c.n_ctx_per_seq = session.n_ctx_per_seq();
    c.policy = session.config().policy;
    c.preemption_mode = session.config().preemption_mode;
    c.priority_aging_ns = (int64_t) session.config().priority_aging_ms * 1'000'000;
    c.long_prefill_token_threshold = session.config().long_prefill_token_threshold;
    // shared prefixes in flight (scheduler.h): 4 blocks of 16 tokens (SGLang's in-batch check uses 32 tokens);
    // CACHEFLOW_SHARED_PREFIX_WAIT=N sets it (0: off, for A/B runs)
    c.min_pending_shared_prefix = env_int_in("CACHEFLOW_SHARED_PREFIX_WAIT", 0, 1 << 20, 64);
    return c;
}

}  // namespace

Engine::Engine(const EngineConfig & config)
    : session_(LlamaSession::open(config)),
      scheduler_(scheduler_config(*session_), make_kv_manager(*session_)),
      swapper_(*session_, scheduler_.kv().num_host_blocks_total(), session_->paged_block_bytes()),
      batch_(session_->n_batch(), session_->config().paged() ? SlotMode::PER_DECODE : SlotMode::STABLE,
             session_->n_seq_max()),
      sampler_(session_->n_vocab()),
      sampling_pool_(config.sampling_threads, LlamaSession::kTopKCandidates),
      stop_checker_(session_->vocab(), session_->n_ctx_per_seq()),
      profiler_(config.profile_capacity) {
    const size_t max_seqs = (size_t) config.max_num_seqs;
    step_events_.reserve(2 * max_seqs + 64);
    sampled_.reserve(max_seqs);
    candidate_rows_.reserve(max_seqs);
    finished_ids_.reserve(2 * max_seqs + 64);
    for (int32_t slot_id = (int32_t) max_seqs - 1; slot_id >= 0; --slot_id) {
        free_slot_ids_.push_back(slot_id);
    }
    std::make_heap(free_slot_ids_.begin(), free_slot_ids_.end(), std::greater<int32_t>());
    batch_.set_padding(session_->max_padded_tokens());
    stats_.kv_tokens_capacity = session_->n_ctx();
    stats_.kv_blocks_total = session_->num_blocks();
    if (session_->kv_streaming()) {
        if (session_->kv_stream_on_cuda() && !swapper_.on_copy_stream()) {
            throw Error(CF_STATUS_UNSUPPORTED, "KV streaming on CUDA needs the pinned swap space of the copy stream "
                                               "(CACHEFLOW_SWAP_ASYNC=0 turns it off)");
        }
        session_->start_kv_stream(swapper_.host_base());  // before the first decode (CUDA: reserve, warm-up)
    }
    // stats before the first step: whether streaming resolved to on, and the CPU's -1s (cacheflow.h)
    const LlamaSession::KvStreamCounters staging = session_->kv_stream_counters();
    stats_.kv_streaming = session_->kv_streaming() ? 1 : 0;
    stats_.kv_stream_cuda_wait_layers = staging.cuda[2];
    stats_.kv_stream_cuda_copy_ns = staging.cuda[1];
    measure_swap_rate();
}

// AUTO preemption compares bytes to move with tokens to compute again (Scheduler::should_swap):
// its copy rate starts from one measured round trip of up to 64 MiB on this engine's route (the CUDA
// copy stream moves ~50 GB/s on an H200, llama.cpp's per-block copies a few GB/s), not from a guess that
// no swap would ever correct (a rate judged too slow is never tried, so never measured again). Later
// swaps replace it by their own measured rate (update_preemption_costs).
void Engine::measure_swap_rate() {
    if (!session_->config().paged() || session_->config().preemption_mode != CF_PREEMPTION_MODE_AUTO ||
        swapper_.num_slots() == 0 || swapper_.block_bytes() <= 0) {
        return;
    }
    constexpr int64_t kMeasureBytes = 64ll << 20;
    const int32_t num_blocks = (int32_t) std::max<int64_t>(1, kMeasureBytes / swapper_.block_bytes());
    const double ns_per_byte = swapper_.measure_ns_per_byte(num_blocks);
    if (ns_per_byte > 0.0) {
        scheduler_.set_preemption_costs(ns_per_byte, 0.0);
    }
}

Engine::~Engine() {
    {
        std::lock_guard<std::mutex> lock(inbox_mu_);
        shutting_down_ = true;
    }
    stop();
    events_.close();
}

std::unique_ptr<Sequence> Engine::make_sequence(const int32_t * prompt, int32_t num_prompt_tokens,
                                                const cf_sampling_params & params, int32_t priority,
                                                int64_t arrival_ns) {
    validate_prompt(prompt, num_prompt_tokens, session_->n_vocab(), session_->n_ctx_per_seq());
    SamplingParams sp = SamplingParams::from_c(params, session_->n_vocab());
    const int32_t capacity = (int32_t) std::min<int64_t>((int64_t) num_prompt_tokens + sp.max_tokens,
                                                         session_->n_ctx_per_seq());
    if (sp.repeat_last_n < 0) {
        sp.repeat_last_n = session_->n_ctx_per_seq();  // -1: the penalties see the whole context
    }
    if (sp.dry_penalty_last_n < 0) {
        sp.dry_penalty_last_n = session_->n_ctx_per_seq();  // -1: DRY scans the whole context
    }
    OpaqueHandle sampler = make_sampler(sp, session_->vocab(), prompt, num_prompt_tokens);
    auto seq = std::make_unique<Sequence>(0, prompt, num_prompt_tokens, std::move(sp), priority, arrival_ns, capacity);
    seq->sampler = std::move(sampler);
    return seq;
}

void Engine::enqueue(std::vector<std::unique_ptr<Sequence>> & seqs, int64_t * out_ids) {
    {
        std::lock_guard<std::mutex> lock(inbox_mu_);
        if (shutting_down_) {
            throw Error(CF_STATUS_SHUTDOWN, "the engine is shutting down; no new requests");
        }
        for (size_t i = 0; i < seqs.size(); ++i) {
            const int64_t request_id = next_request_id_++;
            seqs[i]->request_id = request_id;
            out_ids[i] = request_id;
            live_ids_.insert(request_id);
        }
        for (size_t i = 0; i < seqs.size(); ++i) {
            if (seqs[i]->fork_parent_id != 0) {  // add_requests stored -(parent's index + 1)
                seqs[i]->fork_parent_id = out_ids[(size_t) (-seqs[i]->fork_parent_id - 1)];
            }
            pending_adds_.push_back(std::move(seqs[i]));
        }
    }
    work_cv_.notify_one();
}

int64_t Engine::add_request(const int32_t * prompt, int32_t num_prompt_tokens, const cf_sampling_params & params,
                            int32_t priority) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    seqs.push_back(make_sequence(prompt, num_prompt_tokens, params, priority, clock_ns()));
    int64_t request_id = 0;
    enqueue(seqs, &request_id);
    return request_id;
}

void Engine::add_requests(const cf_request * requests, int32_t n, int64_t * out_ids) {
    if (n < 0 || (n > 0 && (requests == nullptr || out_ids == nullptr))) {
        fail_invalid("add_requests: num_requests must be >= 0 with non-NULL requests and out_request_ids");
    }
    const int64_t arrival_ns = clock_ns();
    std::vector<std::unique_ptr<Sequence>> seqs;
    seqs.reserve((size_t) n);
    for (int32_t i = 0; i < n; ++i) {
        try {
            if (requests[i].params == nullptr) {
                fail_invalid("params is NULL");
            }
            seqs.push_back(make_sequence(requests[i].prompt_tokens, requests[i].num_prompt_tokens,
                                         *requests[i].params, requests[i].priority, arrival_ns));
        } catch (const Error & e) {
            throw Error(e.status(), "request " + std::to_string(i) + ": " + e.what());
        }
    }
    link_choices(requests, seqs);
    if (n > 0) {
        enqueue(seqs, out_ids);
    }
}

// cf_request.num_forks: check each group of choices and mark parent and choices for the
// scheduler (Scheduler::fork_choices). A choice's fork_parent_id holds -(parent index + 1)
// until enqueue() knows the ids.
void Engine::link_choices(const cf_request * requests, std::vector<std::unique_ptr<Sequence>> & seqs) {
    const auto n = (int32_t) seqs.size();
    for (int32_t i = 0; i < n; ++i) {
        const int32_t num_forks = requests[i].num_forks;
        const std::string where = "request " + std::to_string(i) + ": ";
        if (num_forks < 0 || num_forks > n - 1 - i) {
            fail_invalid(where + "num_forks must be in [0, " + std::to_string(n - 1 - i) + "], got " +
                         std::to_string(num_forks));
        }
        const Sequence & parent = *seqs[(size_t) i];
        for (int32_t k = i + 1; k <= i + num_forks; ++k) {
            Sequence & choice = *seqs[(size_t) k];
            if (requests[k].num_forks != 0 || choice.priority != parent.priority ||
                choice.tokens.size() < (size_t) parent.num_prompt_tokens ||
                choice.num_prompt_tokens != parent.num_prompt_tokens ||
                !std::equal(parent.tokens.begin(), parent.tokens.begin() + parent.num_prompt_tokens, choice.tokens.begin())) {
                fail_invalid("request " + std::to_string(k) + ": a choice of request " + std::to_string(i) +
                             " (num_forks) needs its prompt tokens and priority, and num_forks 0");
            }
            if (parent.num_prompt_tokens >= 2) {  // else there is no prompt KV to share
                choice.fork_parent_id = -(int64_t) i - 1;
            }
        }
        seqs[(size_t) i]->fork_pending = num_forks > 0 && parent.num_prompt_tokens >= 2;
        i += num_forks;
    }
}

void Engine::abort_request(int64_t request_id) {
    {
        std::lock_guard<std::mutex> lock(inbox_mu_);
        if (live_ids_.count(request_id) == 0) {
            throw Error(CF_STATUS_NOT_FOUND, "request " + std::to_string(request_id) + " is unknown or already finished");
        }
        pending_aborts_.push_back(request_id);
    }
    work_cv_.notify_one();
}

StepResult Engine::step() {
    if (thread_running_.load()) {
        fail_invalid("cf_engine_step cannot be called while the step thread runs (cf_engine_start)");
    }
    std::lock_guard<std::mutex> lock(step_mu_);
    return step_guarded();
}

void Engine::start() {
    std::lock_guard<std::mutex> lock(control_mu_);
    if (thread_running_.load()) {
        return;
    }
    {
        std::lock_guard<std::mutex> inbox_lock(inbox_mu_);
        stop_requested_ = false;
    }
    thread_ = std::thread(&Engine::run_loop, this);
    thread_running_.store(true);
}

void Engine::stop() {
    {
        std::lock_guard<std::mutex> lock(control_mu_);
        if (thread_running_.load()) {
            {
                std::lock_guard<std::mutex> inbox_lock(inbox_mu_);
                stop_requested_ = true;
            }
            work_cv_.notify_all();
            thread_.join();
            thread_running_.store(false);
        }
    }
    events_.wake_all();
}

int32_t Engine::drain(cf_output_event * events, int32_t capacity, int32_t timeout_ms,
                      const DrainBuffers & buffers) {
    return events_.drain(events, capacity, timeout_ms, buffers);
}

bool Engine::has_work() const {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    return !live_ids_.empty();
}

int32_t Engine::get_ttft_by_priority(cf_priority_ttft * out, int32_t capacity) const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    const int32_t n = (int32_t) ttft_by_priority_published_.size();
    std::copy_n(ttft_by_priority_published_.begin(), std::min(n, capacity), out);
    return n;
}

cf_engine_stats Engine::get_stats() const {
    // Requests accepted but not in the last snapshot count as waiting: those still in the inbox,
    // and those the step thread took from it since (publish() zeroes that count with the snapshot
    // it puts them in, holding both locks in this order).
    std::lock_guard<std::mutex> lock(stats_mu_);
    cf_engine_stats out = stats_;
    std::lock_guard<std::mutex> inbox_lock(inbox_mu_);
    out.num_waiting += (int32_t) pending_adds_.size() + num_adds_unpublished_;
    return out;
}

}  // namespace cf
