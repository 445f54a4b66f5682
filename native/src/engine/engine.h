// engine.h - the CacheFlow engine behind cf_engine_t (stock and paged KV modes).
//
// One step: consume the inbox (new requests, aborts) -> Scheduler::schedule returns the StepPlan
// -> the engine executes it in StepPlan's order (swap-out, swap-in, block copies, KV plan, decode)
// -> sample -> stop checks -> events. The scheduler owns the KV cache manager (stock split, stock
// unified or paged, kv/kv_cache_manager.h); the engine sees KV only through the plan and the
// manager's usage numbers.
// Requests and aborts from other threads go through a mutex-protected inbox that the step
// consumes at its start; no lock is held during llama_decode. Events go to an EventQueue that
// drain() reads.
//
// Thread-safety: add_request, abort_request, drain, has_work, info, stats and the text
// functions may be called from any thread. step() is serialized internally and refused while
// the step thread (start/stop) runs.
#pragma once

#include "cacheflow.h"
#include "core/profiler.h"
#include "core/scheduler.h"
#include "engine/batch_builder.h"
#include "engine/config.h"
#include "engine/event_queue.h"
#include "engine/llama_session.h"
#include "engine/logprobs.h"
#include "engine/sampling.h"
#include "engine/sampling_pool.h"
#include "engine/swapper.h"
#include "engine/stop_checker.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace cf {

int64_t clock_ns();

struct StepResult {
    int32_t num_scheduled_tokens = 0;
    cf_status status = CF_STATUS_OK;  // CF_STATUS_DECODE_FAILED when llama_decode failed
    std::string message;
};

class Engine {
  public:
    // Loads the model; throws cf::Error (see cf_engine_init).
    explicit Engine(const EngineConfig & config);
    // Stops the step thread, wakes and waits out drainers, frees everything.
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    // Validate and queue; returns the new request id. Throws INVALID_ARGUMENT, PROMPT_TOO_LONG, SHUTDOWN.
    int64_t add_request(const int32_t * prompt, int32_t num_prompt_tokens, const cf_sampling_params & params,
                        int32_t priority);
    // Validate all, then queue all under one inbox lock (one step admits them together); request
    // ids go to out_ids[n]. Errors as add_request, prefixed "request i: "; on error nothing is queued.
    void add_requests(const cf_request * requests, int32_t n, int64_t * out_ids);
    // Throws NOT_FOUND for unknown or finished ids.
    void abort_request(int64_t request_id);

    // Throws INVALID_ARGUMENT while the step thread runs.
    StepResult step();
    void start();
    void stop();
    // See EventQueue::drain (no buffers: the events' text and probabilities are not returned).
    int32_t drain(cf_output_event * events, int32_t capacity, int32_t timeout_ms,
                  const DrainBuffers & buffers = {});
    bool has_work() const;

    void get_info(cf_model_info * info) const { session_->fill_info(info); }
    cf_engine_stats get_stats() const;
    // See cf_engine_get_ttft_by_priority: copies min(capacity, n) entries, returns n.
    int32_t get_ttft_by_priority(cf_priority_ttft * out, int32_t capacity) const;
    const LlamaSession & session() const { return *session_; }
    Profiler & profiler() { return profiler_; }  // drain is thread-safe; see profiler.h

  private:
    // engine_step.cpp
    StepResult step_guarded();
    StepResult step_locked();
    void consume_inbox();
    // A validated Sequence for a request (throws as add_request); its id is set by enqueue.
    std::unique_ptr<Sequence> make_sequence(const int32_t * prompt, int32_t num_prompt_tokens,
                                            const cf_sampling_params & params, int32_t priority, int64_t arrival_ns);
    // Give seqs ids (out_ids[i]) and queue them under one inbox lock; throws SHUTDOWN (nothing queued).
    void link_choices(const cf_request * requests, std::vector<std::unique_ptr<Sequence>> & seqs);
    void enqueue(std::vector<std::unique_ptr<Sequence>> & seqs, int64_t * out_ids);
    void run_decoded_step(const StepPlan & out);
    void sample_group(const StepPlan & plan, size_t begin, size_t end);
    int32_t sample_host(Sequence & seq, int32_t batch_index);
    void collect_logprobs(Sequence & seq, const float * logits, int32_t token_id);
    void handle_block_shortage(const StepPlan & out);
    void record_kv_stream_events(const StepPlan & out);
    void execute_block_ops(const StepPlan & plan);
    void update_preemption_costs(const StepPlan & plan, int64_t decode_ns);
    void measure_swap_rate();
    int32_t decode_groups(const StepPlan & plan);
    void set_padding_sampling();
    bool lookahead_eligible(const StepPlan & plan) const;
    void launch_lookahead(const StepPlan & plan, const std::vector<int32_t> * fed_rows);
    void settle_lookahead(const StepPlan & plan);
    bool match_lookahead(const StepPlan & plan);
    void release_slot(Sequence & seq);
    void take_slot_id(Sequence & seq);
    void fail_step(const StepPlan & out);
    void finish(Sequence * seq, cf_finish_reason reason, int32_t token_id, int64_t now_ns);
    void emit_final(Sequence & seq, int32_t token_id, int64_t now_ns);
    void publish_progress_start(const StepPlan & plan);
    void emit_progress(Sequence & seq);
    void emit_token(Sequence & seq, int32_t token_id, int64_t now_ns);
    void record_ttft(const Sequence & seq);
    void fail_everything(const std::string & why);
    // kv_tokens_used: scheduler_.kv_tokens_used() of the current state, when the caller already has it (an
    // O(block-table entries) walk in paged mode); publish() computes it.
    void publish(int64_t kv_tokens_used);
    void publish() { publish(scheduler_.kv_tokens_used()); }
    void run_loop();

    // Stepping thread only (guarded by step_mu_).
    std::unique_ptr<LlamaSession> session_;
    Scheduler scheduler_;
    Swapper swapper_;  // host memory of the paged manager's swap slots
    BatchBuilder batch_;
    TokenSampler sampler_;
    SamplingPool sampling_pool_;  // top-k candidate rows (sampling_threads of the config)
    StopChecker stop_checker_;
    std::vector<std::unique_ptr<Sequence>> inbox_adds_;  // swapped with pending_adds_
    std::vector<int64_t> inbox_aborts_;                   // swapped with pending_aborts_
    std::vector<cf_output_event> step_events_;
    std::vector<cf_output_event> progress_events_;  // publish_progress_start's, queued before the decode
    std::string step_text_;               // text of step_events_ (their text_offset points here)
    std::vector<cf_token_logprob> step_logprobs_;  // probabilities of step_events_ (logprobs_offset)
    LogprobsCollector logprobs_;
    std::vector<int32_t> free_slot_ids_;  // min-heap of the slot ids no running request holds
    std::vector<int64_t> finished_ids_;
    std::vector<int32_t> sampled_;  // [plan.seqs.size()] token sampled for each scheduled sequence
    std::vector<CandidateRow> candidate_rows_;  // a decode group's top-k candidate rows (sample_group)
    int64_t step_start_ns_ = 0;
    double recompute_ns_per_token_ = 0.0;  // measured (update_preemption_costs); 0 = none yet
    // sampled_ entry of a row whose samplers refused (sample_host): the request ends with an error
    static constexpr int32_t kSampleFailed = -2;
    bool step_waited_for_device_ = false;  // decode_groups synchronized this step (a group sampled)
    // Async decode (LlamaSession::async_decode; engine_step.cpp, "Lookahead"): the next step's decode, launched from
    // this step's plan before this step's tokens are read. lookahead_plan_: the plan it ran (the step's plan with
    // every sequence one position on); lookahead_active_: it is in flight and not yet adopted or dropped;
    // lookahead_adopted_: this step is that decode (decode_groups launches nothing); read_previous_decode_:
    // sample_group reads the decode before the last (a lookahead went out after this step's decode);
    // lookahead_rows_: plan index i of the plan that adopted it is its row lookahead_rows_[i] (ascending; fewer rows
    // than lookahead_plan_ has sequences where the others ended after the last step).
    StepPlan lookahead_plan_;
    bool lookahead_active_ = false;
    bool lookahead_adopted_ = false;
    std::vector<int32_t> lookahead_rows_;
    std::vector<int64_t> lookahead_ids_;  // [lookahead_plan_.seqs.size()] request ids (its Sequence may be gone)
    bool read_previous_decode_ = false;
    cf_engine_stats totals_{};  // cumulative counters (num_steps, num_finished, token counts)
    std::vector<cf_priority_ttft> ttft_by_priority_;  // ascending priority, <= CF_TTFT_PRIORITIES_MAX
    std::mutex step_mu_;

    // Inbox, guarded by inbox_mu_; work_cv_ wakes the step thread.
    mutable std::mutex inbox_mu_;
    std::condition_variable work_cv_;
    std::vector<std::unique_ptr<Sequence>> pending_adds_;
    // Adds consume_inbox() moved into the scheduler since the last stats snapshot: get_stats()
    // counts them as waiting, publish() zeroes it (under stats_mu_ then inbox_mu_).
    int32_t num_adds_unpublished_ = 0;
    std::vector<int64_t> pending_aborts_;
    std::unordered_set<int64_t> live_ids_;  // accepted and not yet finished
    int64_t next_request_id_ = 1;
    bool sched_has_work_ = false;
    bool stop_requested_ = false;
    bool shutting_down_ = false;

    // Step thread control, guarded by control_mu_.
    std::mutex control_mu_;
    std::thread thread_;
    std::atomic<bool> thread_running_{false};

    EventQueue events_;
    Profiler profiler_;  // records from the stepping thread only

    mutable std::mutex stats_mu_;
    cf_engine_stats stats_{};  // snapshot published at the end of each step
    std::vector<cf_priority_ttft> ttft_by_priority_published_;  // ttft_by_priority_'s, with stats_
};

}  // namespace cf
