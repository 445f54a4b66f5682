// engine_step.cpp - one engine step and the step thread loop.
//
//   consume inbox (adds, aborts) -> schedule (one StepPlan) -> clear preempted slots, finish
//   sequences out of blocks
//   -> execute the plan: block copies (due now), swap-outs and swap-ins (beside the step's compute on a
//      CUDA copy stream; the next step waits for them), then per decode group
//      (batch_builder.h): KV plan, llama_decode, read sampled tokens
//     ok:     commit computed tokens -> sample where a chunk reached the last token -> stop checks
//     failed: finish every scheduled request with CF_FINISH_REASON_ERROR, free its KV
//   -> publish events (one lock) and a stats snapshot
#include "core/error.h"
#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <functional>

namespace cf {

namespace {

// Moves the sequence's released text into `text` (the step's buffer).
cf_output_event make_event(Sequence & seq, int32_t token_id, cf_finish_reason reason, int64_t now_ns,
                           std::string & text) {
    cf_output_event ev{};
    ev.request_id = seq.request_id;
    ev.token_id = token_id;
    ev.finish_reason = reason;
    ev.time_ns = now_ns;
    ev.slot_id = seq.slot_id;
    ev.text_offset = (int64_t) text.size();
    ev.text_len = (int32_t) seq.text_ready.size();
    text += seq.text_ready;
    seq.text_ready.clear();
    if (reason == CF_FINISH_REASON_ERROR && !seq.error_message.empty()) {  // right after the text
        ev.error_len = (int32_t) seq.error_message.size();
        text += seq.error_message;
    }
    if (token_id != CF_TOKEN_NONE) {  // a failed step's final event carries no token, nor its probabilities
        ev.logprobs_offset = seq.logprobs_ready_offset;
        ev.num_logprobs = seq.num_logprobs_ready;
    }
    seq.num_logprobs_ready = 0;
    if (reason != CF_FINISH_REASON_NONE) {
        ev.arrival_ns = seq.arrival_ns;
        ev.first_scheduled_ns = seq.first_scheduled_ns;
        ev.num_prompt_tokens = seq.num_prompt_tokens;
        ev.num_cached_tokens = seq.num_cached_tokens;
        ev.num_output_tokens = seq.num_output_tokens();
        ev.num_preemptions = seq.num_preemptions;
        ev.stop_string_index = seq.stop_string_index;
    }
    return ev;
}

// A prompt progress event (cacheflow.h): no token, no text; the prompt's counts so far.
cf_output_event make_progress_event(const Sequence & seq, int32_t num_processed, int64_t first_scheduled_ns,
                                    int64_t now_ns) {
    cf_output_event ev{};
    ev.request_id = seq.request_id;
    ev.token_id = CF_TOKEN_NONE;
    ev.finish_reason = CF_FINISH_REASON_NONE;
    ev.time_ns = now_ns;
    ev.arrival_ns = seq.arrival_ns;
    ev.first_scheduled_ns = first_scheduled_ns;
    ev.num_prompt_tokens = seq.num_prompt_tokens;
    ev.num_cached_tokens = seq.num_cached_tokens;
    ev.slot_id = seq.slot_id;
    ev.stop_string_index = -1;
    ev.prompt_progress = 1;
    ev.num_prompt_processed = num_processed;
    return ev;
}

}  // namespace

StepResult Engine::step_guarded() {
    try {
        return step_locked();
    } catch (const std::exception & e) {
        // State may be half-updated: end every request instead of failing the same way forever.
        fail_everything(e.what());
        throw Error(CF_STATUS_INTERNAL, std::string("engine step failed: ") + e.what() +
                                            "; every request was finished with CF_FINISH_REASON_ERROR");
    }
}

StepResult Engine::step_locked() {
    step_events_.clear();
    step_text_.clear();
    step_logprobs_.clear();
    finished_ids_.clear();
    step_start_ns_ = clock_ns();
    // With a decode launched ahead in flight, requests that came in since wait one step: a prompt in this step's plan
    // would drop that decode ("Lookahead"). Aborts wait with them (one may name a request still in the inbox).
    if (!lookahead_active_) {
        consume_inbox();
    }
    const StepPlan & out = scheduler_.schedule(step_start_ns_);
    settle_lookahead(out);  // adopt the decode launched ahead for this step, or wait for it and drop it
    handle_block_shortage(out);
    record_kv_stream_events(out);
    StepResult result;
    result.num_scheduled_tokens = out.num_scheduled_tokens;
    // Block operations run even in a step that computes nothing (a swap-out's victim left the batch, a
    // swapped-in sequence joins the next one).
    execute_block_ops(out);
    if (!out.seqs.empty()) {
        totals_.num_steps += 1;
        profiler_.step_begin(totals_.num_steps, step_start_ns_, (int32_t) out.seqs.size(), out.num_decode_tokens,
                             out.num_prefill_tokens);
        publish_progress_start(out);
        const int64_t decode_start_ns = clock_ns();
        const int32_t rc = decode_groups(out);
        update_preemption_costs(out, clock_ns() - decode_start_ns);
        if (rc == 0) {
            run_decoded_step(out);
        } else {
            result.status = CF_STATUS_DECODE_FAILED;
            result.message = "llama_decode returned " + std::to_string(rc) + " for a batch of " +
                             std::to_string(out.num_scheduled_tokens) + " tokens over " +
                             std::to_string(out.seqs.size()) + " sequences; they were finished with "
                             "CF_FINISH_REASON_ERROR";
            fail_step(out);
        }
    }
    // O(block-table entries) in paged mode: computed once, for the profiler and the stats snapshot
    const int64_t kv_tokens_used = scheduler_.kv_tokens_used();
    if (profiler_.enabled() && !out.seqs.empty()) {  // before publish: recorded once outputs are seen
        const int32_t kv_free = session_->n_ctx() - (int32_t) scheduler_.kv_tokens_reserved();
        profiler_.step_end(totals_.num_steps, clock_ns(), scheduler_.num_waiting(), (int32_t) kv_tokens_used,
                           kv_free, scheduler_.kv().num_blocks_used(), (int32_t) scheduler_.kv_tokens_attended());
    }
    if (!out.seqs.empty()) {
        totals_.step_ns += clock_ns() - step_start_ns_;  // before publish: the step's stats count it
    }
    publish(kv_tokens_used);
#ifndef NDEBUG
    scheduler_.check_invariants();  // debug builds: every step ends in a consistent state
#endif
    return result;
}

void Engine::consume_inbox() {
    {
        std::lock_guard<std::mutex> lock(inbox_mu_);
        num_adds_unpublished_ += (int32_t) pending_adds_.size();  // waiting, until the next snapshot
        inbox_adds_.swap(pending_adds_);
        inbox_aborts_.swap(pending_aborts_);
    }
    for (auto & seq : inbox_adds_) {
        profiler_.request(CF_PROFILE_EVENT_REQUEST_ARRIVAL, totals_.num_steps, seq->arrival_ns, seq->request_id,
                          seq->num_prompt_tokens);
        scheduler_.add(std::move(seq));
    }
    inbox_adds_.clear();
    for (const int64_t request_id : inbox_aborts_) {
        std::unique_ptr<Sequence> seq = scheduler_.remove(request_id, CF_FINISH_REASON_ABORT);
        if (!seq) {
            continue;  // finished in the meantime, or aborted twice
        }
        release_slot(*seq);
        seq->finish_ns = step_start_ns_;
        emit_final(*seq, CF_TOKEN_NONE, step_start_ns_);
    }
    inbox_aborts_.clear();
}

void Engine::run_decoded_step(const StepPlan & out) {
    scheduler_.commit_step(out);
    totals_.num_prompt_tokens += out.num_prefill_tokens;
    for (size_t i = 0; i < out.seqs.size(); ++i) {
        const ScheduledSeq & s = out.seqs[i];
        Sequence * seq = s.seq;
        take_slot_id(*seq);
        if (seq->first_scheduled_ns == 0) {
            seq->first_scheduled_ns = step_start_ns_;
            profiler_.request(CF_PROFILE_EVENT_REQUEST_FIRST_SCHEDULED, totals_.num_steps, step_start_ns_,
                              seq->request_id, s.num_new_tokens);
            if (seq->num_cached_tokens > 0) {
                profiler_.request(CF_PROFILE_EVENT_REQUEST_PREFIX_HIT, totals_.num_steps, step_start_ns_,
                                  seq->request_id, seq->num_cached_tokens);
            }
        }
        if (seq->params.return_progress) {
            emit_progress(*seq);  // before the token this step sampled, if any
        }
        if (!s.needs_sample) {
            continue;  // a prompt chunk that does not reach the end of the prompt
        }
        const int32_t token_id = sampled_[i];
        if (token_id == kSampleFailed) {
            finish(seq, CF_FINISH_REASON_ERROR, CF_TOKEN_NONE, clock_ns());
            continue;
        }
        seq->append_token(token_id);
        totals_.num_generated_tokens += 1;
        const int64_t now_ns = clock_ns();
        if (seq->first_token_ns == 0) {
            seq->first_token_ns = now_ns;
            record_ttft(*seq);
            profiler_.request(CF_PROFILE_EVENT_REQUEST_FIRST_TOKEN, totals_.num_steps, now_ns, seq->request_id, 1);
        }
        const cf_finish_reason reason = stop_checker_.check(*seq, token_id);
        if (reason == CF_FINISH_REASON_NONE) {
            emit_token(*seq, token_id, now_ns);
        } else {
            finish(seq, reason, token_id, now_ns);
        }
    }
}

// The tokens of the group's sampled rows [begin, end) into sampled_. Rows whose slot has an
// in-graph chain (greedy, or stochastic with a random seed) come back sampled; rows reduced to their
// top-k candidates in-graph (stochastic, or greedy with a lowering logit bias) are gathered, then
// sampled together on the sampling pool from those (their own chains: the same tokens as one after
// the other); the others (seeded ones the candidates do not serve, a slot whose chain could not be
// offloaded, rows with token probabilities) are sampled on the CPU from their logits row, one after
// the other (sample_host).
void Engine::sample_group(const StepPlan & plan, size_t begin, size_t end) {
    candidate_rows_.clear();
    for (size_t i = begin; i < end; ++i) {
        if (!plan.seqs[i].needs_sample) {
            continue;
        }
        Sequence & seq = *plan.seqs[i].seq;
        const int32_t batch_index = batch_.sample_index(i);
        const int32_t slot = batch_.slot(i);
        const int32_t token_id = read_previous_decode_ ? session_->previous_sampled_token(batch_index, slot)
                                                       : session_->sampled_token(batch_index, slot);  // in-graph
        if (token_id != CF_TOKEN_NONE) {
            if (seq.params.logprobs) {  // needs_host_samplers() keeps such rows out of the graph
                throw Error(CF_STATUS_INTERNAL, "request " + std::to_string(seq.request_id) +
                                                    " asked for token probabilities but was sampled in-graph");
            }
            ++totals_.num_rows_sampled_in_graph;
            sampled_[i] = token_id;
            continue;
        }
        CandidateRow row;
        row.n = session_->top_k_candidates(batch_index, slot, &row.ids, &row.logits);
        if (row.n > 0) {  // never a row with logprobs (needs_host_samplers keeps it on the host)
            row.seq = &seq;
            row.index = i;
            candidate_rows_.push_back(row);  // reserved for max_num_seqs rows: no allocation
            continue;
        }
        sampled_[i] = sample_host(seq, batch_index);
    }
    if (candidate_rows_.empty()) {
        return;
    }
    sampling_pool_.sample(candidate_rows_.data(), candidate_rows_.size());
    totals_.num_rows_sampled_top_k += (int64_t) candidate_rows_.size();
    for (const CandidateRow & row : candidate_rows_) {
        sampled_[row.index] = row.token;
    }
}

// seq's token from its logits row [n_vocab] on the CPU, and its probabilities if it asked.
int32_t Engine::sample_host(Sequence & seq, int32_t batch_index) {
    ++totals_.num_rows_sampled_host;
    const float * logits = session_->logits(batch_index);
    int32_t sampled = CF_TOKEN_NONE;
    try {
        sampled = sampler_.sample(seq, logits);
    } catch (const Error & e) {  // this request's samplers refused (a grammar with no token left): it alone ends
        if (e.status() != CF_STATUS_INVALID_ARGUMENT) {
            throw;
        }
        if (session_->config().log_level >= CF_LOG_LEVEL_ERROR) {
            std::fprintf(stderr, "cacheflow: request %lld ended with an error: %s\n", (long long) seq.request_id,
                         e.what());
        }
        seq.error_message = e.what();  // its final event carries it (cf_output_event.error_len)
        return kSampleFailed;
    }
    if (seq.params.logprobs) {
        collect_logprobs(seq, logits, sampled);
    }
    return sampled;
}

// Right after the CPU sampled seq's token from logits [n_vocab]: its probabilities go to the
// step's buffer, for its next event (make_event).
void Engine::collect_logprobs(Sequence & seq, const float * logits, int32_t token_id) {
    const SamplingParams & p = seq.params;
    seq.logprobs_ready_offset = (int32_t) step_logprobs_.size();
    seq.num_logprobs_ready =
        p.post_sampling_probs
            ? logprobs_.append_post_sampling(sampler_.last_candidates(), token_id, p.top_logprobs, step_logprobs_)
            : logprobs_.append_raw(logits, session_->n_vocab(), token_id, p.top_logprobs, step_logprobs_);
}

// Forget the llama.cpp slots of sequences preempted while scheduling (their KV is free already)
// and finish the ones that cannot grow even alone (only the paged KV manager runs out).
void Engine::handle_block_shortage(const StepPlan & out) {
    for (const StepPlan::Preempted & p : out.preempted) {
        release_slot(*p.seq);
        if (p.unstarted) {
            continue;  // back in the queue with nothing computed: no preemption
        }
        profiler_.request(p.swapped ? CF_PROFILE_EVENT_REQUEST_SWAP_OUT : CF_PROFILE_EVENT_REQUEST_PREEMPT,
                          totals_.num_steps, step_start_ns_, p.seq->request_id, p.seq->num_tokens());
        if (p.for_priority) {
            profiler_.request(CF_PROFILE_EVENT_REQUEST_PRIORITY_PREEMPT, totals_.num_steps, step_start_ns_,
                              p.seq->request_id, p.seq->num_tokens());
        }
    }
    for (const Sequence * seq : out.swapped_in) {
        profiler_.request(CF_PROFILE_EVENT_REQUEST_SWAP_IN, totals_.num_steps, step_start_ns_, seq->request_id,
                          seq->num_tokens());
    }
    totals_.num_preemptions = scheduler_.num_preemptions();
    for (Sequence * seq : out.out_of_blocks) {  // its context is full, or KV streaming's limits (the reason)
        finish(seq, seq->error_message.empty() ? CF_FINISH_REASON_LENGTH : CF_FINISH_REASON_ERROR, CF_TOKEN_NONE,
               step_start_ns_);
    }
}

// One KV_DEMOTE / KV_PROMOTE profiler event per request and direction of the plan's streamed blocks
// (PagedKv lists each direction request by request, so a run of equal entries is one request's share).
void Engine::record_kv_stream_events(const StepPlan & out) {
    if (!profiler_.enabled() || out.streamed_blocks.empty()) {
        return;
    }
    const int32_t block_size = session_->config().block_size;
    const int64_t block_bytes = session_->paged_block_bytes();
    size_t begin = 0;
    for (size_t i = 1; i <= out.streamed_blocks.size(); ++i) {
        const StepPlan::StreamedBlock & first = out.streamed_blocks[begin];
        if (i < out.streamed_blocks.size() && out.streamed_blocks[i].request_id == first.request_id &&
            out.streamed_blocks[i].to_host == first.to_host) {
            continue;
        }
        const int32_t num_blocks = (int32_t) (i - begin);
        profiler_.request_copy(first.to_host ? CF_PROFILE_EVENT_REQUEST_KV_DEMOTE : CF_PROFILE_EVENT_REQUEST_KV_PROMOTE,
                               totals_.num_steps, step_start_ns_, first.request_id, num_blocks * block_size,
                               num_blocks * block_bytes);
        begin = i;
    }
}

// The last batch's padding rows, if any, sample a plain argmax, never read (batch_builder.h).
void Engine::set_padding_sampling() {
    if (batch_.num_padding_tokens() > 0) {
        static const SamplingParams padding_params;
        session_->set_seq_sampling(batch_.padding_slot(), &padding_params);
    }
}

// Steps 4-5 of the plan, once per decode group (one group unless a paged step holds more
// sequences than llama.cpp has slots, see batch_builder.h): the group's batch and KV plan, decode,
// then the group's sampled tokens (in-graph, or on the CPU from logits), read before the next
// decode overwrites them. Returns llama_decode's error code, 0 when every group decoded.
int32_t Engine::decode_groups(const StepPlan & plan) {
    sampled_.assign(plan.seqs.size(), CF_TOKEN_NONE);
    step_waited_for_device_ = false;
    read_previous_decode_ = false;
    int32_t first_token = 0;
    bool adopted_subset = false;
    for (int32_t g = 0; g < batch_.num_groups(plan); ++g) {
        const size_t begin = batch_.group_begin(plan, g);
        const size_t end = batch_.group_begin(plan, g + 1);
        const int64_t decode_start_ns = clock_ns();
        int32_t num_padding = batch_.num_padding_tokens();
        if (lookahead_adopted_) {  // one group (lookahead_eligible): its decode is in flight already
            lookahead_adopted_ = false;
            if (plan.seqs.size() < lookahead_plan_.seqs.size()) {  // fewer sequences than it ran, in the rows it gave
                batch_.select_rows(lookahead_rows_);
                adopted_subset = true;
            }
            totals_.prepare_ns += decode_start_ns - step_start_ns_;
            totals_.num_padding_tokens += num_padding;
        } else {
            const llama_batch & batch = batch_.build(plan, begin, end);
            for (size_t i = begin; i < end; ++i) {
                session_->set_seq_sampling(batch_.slot(i), &plan.seqs[i].seq->params);
            }
            num_padding = batch_.num_padding_tokens();
            set_padding_sampling();
            totals_.num_padding_tokens += num_padding;
            session_->set_kv_plan(plan, begin, end, first_token, num_padding);
            const int64_t launch_start_ns = clock_ns();
            if (g == 0) {
                totals_.prepare_ns += launch_start_ns - step_start_ns_;
            }
            const int32_t rc = session_->decode(batch);
            totals_.launch_ns += clock_ns() - launch_start_ns;
            if (rc != 0) {
                return rc;
            }
        }
        for (size_t i = begin; i < end; ++i) {  // this group's tokens
            first_token += plan.seqs[i].num_new_tokens;
        }
        const bool samples = std::any_of(plan.seqs.begin() + (std::ptrdiff_t) begin,
                                         plan.seqs.begin() + (std::ptrdiff_t) end,
                                         [](const ScheduledSeq & s) { return s.needs_sample; });
        if (!samples) {
            continue;  // a prompt chunk only: its device work overlaps the next step's host work
        }
        // the next step's decode, before this one's tokens are read. After an adoption for fewer sequences, from the
        // batch reduced to their rows (BatchBuilder::compact_rows), each row's token from its row in the decode
        // adopted; that decode's rows are still read below, so its sample indices are reset only after.
        bool compacted = false;
        if (lookahead_eligible(plan)) {
            if (adopted_subset) {
                batch_.compact_rows(lookahead_rows_);
                compacted = true;
                set_padding_sampling();
            }
            launch_lookahead(plan, compacted ? &lookahead_rows_ : nullptr);
        }
        if (!read_previous_decode_) {
            session_->synchronize();  // the first read would wait here anyway; this splits the step's time
        }
        step_waited_for_device_ = true;
        const int64_t sample_start_ns = clock_ns();
        totals_.decode_ns += sample_start_ns - decode_start_ns;
        sample_group(plan, begin, end);
        if (compacted) {
            batch_.reset_sample_rows();
        }
        totals_.sample_ns += clock_ns() - sample_start_ns;
    }
    return 0;
}

// Lookahead (async decode, LlamaSession::async_decode). After launching step N's decode and before reading its
// tokens, the engine launches the decode it expects step N+1 to be: the same sequences in the same rows, each one
// position on, token ids taken on the device from step N's argmax (patch 0017), KV rows one slot on. A sequence
// whose next row starts a new block gets that block now (BlockManager::reserve_next_block: the table holds it
// beside its entries, and the allocate() of step N+1 makes it the next entry), so the guess holds at block
// boundaries too. At step N+1 the scheduler plans as always; settle_lookahead compares its plan with the one
// launched: equal (the steady state of a decode batch) adopts the decode in flight; so does the same plan less some
// of its sequences (match_lookahead: they ended after step N on an EOS or a stop string, which the launch
// cannot foresee, or at max_tokens, which it runs anyway while any sequence goes on), whose rows in it are then never
// read, and the decode launched ahead of that step runs just the sequences left (BatchBuilder::compact_rows, the token
// feed reading each one's row of the decode adopted); anything else waits for it and drops it.
// Requests that arrive (or are aborted) while a decode ahead is in flight enter the scheduler one step later
// (step_locked), so that they do not make the plan differ, and the step that adopts it admits nothing
// (Scheduler::hold_admissions). With requests waiting (queued, swapped out or in the inbox), a decode is launched
// ahead only while their admission is not due at the next step anyway: every slot taken (max_num_seqs), no sequence
// ending there by max_tokens, FCFS or shortest-job-first (PRIORITY may preempt for a waiting request), no abort in
// the inbox. A sequence that ends on EOS or a stop string in such a step delays the admission that its slot allows
// by one step. So a server whose slots are all taken keeps decoding ahead. The idea is
// vLLM's async scheduling and SGLang's overlap scheduler; here the scheduler is left as it is and the guess is
// checked, not assumed.
//
// Why a dropped lookahead is harmless: it wrote one KV row per sequence, at the position after step N's, either in
// the block that holds step N's row, which that sequence owns alone (lookahead_eligible), or in row 0 of the block
// reserved for it. A sequence that goes on computes the same row again with the same token; one that stopped frees
// both blocks, the partly filled one and the reserved one, and no prefix cache entry covers either row. Every later
// device operation (block copies and swaps included) is issued after the wait. Adopted for fewer sequences, the
// decode still writes the rows of those that ended, into blocks they have given back: the plan that adopts it moves
// no block and gives out none but the reserved ones (match_lookahead), and its tokens are read, so the decode
// has finished, before any later step's block operations. The one decode queued before that read is the next one
// launched ahead for the requests left, on the same stream after it: a block it reserves that an ended request gave
// back gets the ended row first, then its own row 0, and a sequence writes each later row of a block before it reads
// it. Outputs are the scheduler's, so greedy outputs equal those without lookahead (tests/e2e).
bool Engine::lookahead_eligible(const StepPlan & plan) const {
    if (!session_->async_decode() || session_->kv_streaming() || plan.seqs.empty() || batch_.num_groups(plan) != 1 ||
        plan.num_prefill_tokens != 0 || !plan.blocks_to_copy.empty() || !plan.blocks_to_swap_in.empty() ||
        !plan.blocks_to_swap_out.empty()) {
        return false;
    }
    const BlockManager * blocks = scheduler_.kv().block_manager();
    const int32_t block_size = session_->config().block_size;
    if (blocks == nullptr || (int32_t) plan.slot_mapping.size() != (int32_t) plan.seqs.size()) {
        return false;
    }
    bool waiters = scheduler_.num_waiting() != 0 || scheduler_.num_swapped() != 0;
    {
        std::lock_guard<std::mutex> lock(inbox_mu_);
        if (!pending_aborts_.empty()) {
            return false;  // the inbox waits for a step without a decode ahead in flight (step_locked)
        }
        waiters = waiters || !pending_adds_.empty();
    }
    if (waiters && (scheduler_.num_free_slots() > 0 || scheduler_.config().policy == CF_SCHED_POLICY_PRIORITY)) {
        return false;  // an admission may be due at the next step: it goes first
    }
    int32_t num_blocks_to_reserve = 0;
    bool any_goes_on = false;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
        const ScheduledSeq & s = plan.seqs[i];
        const Sequence & seq = *s.seq;
        if (s.num_new_tokens != 1 || !s.needs_sample || !session_->slot_samples_argmax(batch_.slot(i)) ||
            seq.params.logprobs) {
            return false;  // not one argmax-sampled token
        }
        // A sequence whose token of this step is its last (max_tokens) still gets its row: the requests left adopt
        // the decode ahead without it (match_lookahead), as after a stop. Requests prefilled at different steps end
        // at different steps, and refusing whenever one ends launched almost nothing ahead there (2 of 44 steps on
        // an H100, results/h200_gpu/stop45).
        const bool goes_on = seq.num_output_tokens() + 1 < seq.params.max_tokens;
        if (waiters && !goes_on) {
            return false;  // its slot frees at this step: the waiting request's admission is due at the next
        }
        any_goes_on = any_goes_on || goes_on;
        const int32_t slot = plan.slot_mapping[i];
        if (slot % block_size == block_size - 1) {
            const BlockTable * table = blocks->find(seq.request_id);
            num_blocks_to_reserve += table != nullptr && table->next_block != CF_BLOCK_ID_NONE ? 0 : 1;
        } else if (blocks->pool().ref_count(slot / block_size) != 1) {
            return false;  // the next row is in a shared block
        }
    }
    return any_goes_on && num_blocks_to_reserve <= blocks->num_free_blocks();  // none going on: no step would adopt it
}

void Engine::launch_lookahead(const StepPlan & plan, const std::vector<int32_t> * fed_rows) {
    const int32_t block_size = session_->config().block_size;
    StepPlan & ahead = lookahead_plan_;
    ahead = plan;  // vectors keep their capacity from earlier steps
    // A sequence whose next row starts a block gets one more table entry: block index context_lens[i] / block_size
    // (context_lens[i] % block_size == 0 there). The table widens by one when that is the widest sequence.
    int32_t width = plan.max_blocks;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
        if (plan.slot_mapping[i] % block_size == block_size - 1) {
            width = std::max(width, plan.context_lens[i] / block_size + 1);
        }
    }
    if (width != plan.max_blocks) {
        ahead.max_blocks = width;
        ahead.block_tables.assign(plan.seqs.size() * (size_t) width, CF_BLOCK_ID_NONE);
        for (size_t i = 0; i < plan.seqs.size(); ++i) {
            std::copy_n(plan.block_tables.data() + i * (size_t) plan.max_blocks, plan.max_blocks,
                        ahead.block_tables.data() + i * (size_t) width);
        }
    }
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
        ahead.context_lens[i] += 1;
        if (plan.slot_mapping[i] % block_size != block_size - 1) {
            ahead.slot_mapping[i] += 1;
            continue;
        }
        const int32_t block_id = scheduler_.kv().reserve_next_block(*plan.seqs[i].seq);
        if (block_id == CF_BLOCK_ID_NONE) {  // lookahead_eligible counted the free blocks
            throw Error(CF_STATUS_INTERNAL, "no block to reserve for the decode launched ahead");
        }
        ahead.slot_mapping[i] = block_id * block_size;
        ahead.block_tables[i * (size_t) width + (size_t) (plan.context_lens[i] / block_size)] = block_id;
    }
    const int32_t n_real = (int32_t) plan.seqs.size();
    const int32_t num_padding = batch_.num_padding_tokens();
    const llama_batch & batch = batch_.advance_one_position(n_real);
    session_->set_kv_plan(ahead, 0, plan.seqs.size(), 0, num_padding);
    const int64_t launch_start_ns = clock_ns();
    const int32_t rc = session_->decode_fed(batch, n_real, fed_rows != nullptr ? fed_rows->data() : nullptr);
    totals_.launch_ns += clock_ns() - launch_start_ns;
    if (rc != 0) {  // which decode's rows the accessors would read is then unknown: an internal error
        throw Error(CF_STATUS_INTERNAL, "the decode launched ahead failed: llama_decode returned " +
                                            std::to_string(rc) + " for " + std::to_string(batch.n_tokens) + " tokens");
    }
    lookahead_ids_.clear();
    for (const ScheduledSeq & s : plan.seqs) {
        lookahead_ids_.push_back(s.seq->request_id);
    }
    lookahead_active_ = true;
    scheduler_.hold_admissions();  // the next plan is this decode's, or fewer of its sequences
    read_previous_decode_ = true;
    totals_.num_lookahead_decodes += 1;
}

void Engine::settle_lookahead(const StepPlan & plan) {
    lookahead_adopted_ = false;
    if (!lookahead_active_) {
        return;
    }
    lookahead_active_ = false;
    if (match_lookahead(plan)) {
        lookahead_adopted_ = true;
        totals_.num_lookahead_adopted += 1;
        return;
    }
    session_->synchronize();  // before this step's block operations and decode
}

// Whether plan is the decode launched ahead, or it less some of its sequences: each of plan's sequences ran in it, in
// the same order (both ascend by request id), with the same KV row and context length, and the step does nothing else
// (no prompt tokens, block operations, preemptions or swaps). Sequences are matched by request id: a Sequence that
// ended is gone. Fills lookahead_rows_ (plan index -> row of the decode ahead).
// Block table entries before the one holding the new row may differ: with the prefix cache, a block that filled at
// the last step moves to a cached block holding the same tokens after the same prefix
// (BlockManager::commit_full_block), so the same KV; the decode ahead read the block given back, which nothing writes
// before that decode has finished (the adopting plan gives out no block but the reserved ones, and its tokens are
// read before any later step's work).
// The entry that holds the new row is the one slot_mapping names, compared below.
bool Engine::match_lookahead(const StepPlan & plan) {
    const StepPlan & ahead = lookahead_plan_;
    if (plan.seqs.empty() || plan.seqs.size() > ahead.seqs.size() || plan.num_prefill_tokens != 0 ||
        plan.num_scheduled_tokens != (int32_t) plan.seqs.size() || !plan.blocks_to_copy.empty() ||
        !plan.blocks_to_swap_in.empty() || !plan.blocks_to_swap_out.empty() || !plan.preempted.empty() ||
        !plan.swapped_in.empty() || !plan.resumed.empty() || !plan.deferred.empty() || !plan.out_of_blocks.empty() ||
        lookahead_ids_.size() != ahead.seqs.size()) {
        return false;
    }
    const int32_t block_size = session_->config().block_size;
    lookahead_rows_.clear();
    size_t r = 0;
    for (size_t i = 0; i < plan.seqs.size(); ++i, ++r) {
        const ScheduledSeq & s = plan.seqs[i];
        while (r < ahead.seqs.size() && lookahead_ids_[r] != s.seq->request_id) {
            ++r;
        }
        if (r == ahead.seqs.size()) {
            return false;
        }
        const ScheduledSeq & a = ahead.seqs[r];
        if (s.num_new_tokens != 1 || a.num_new_tokens != 1 || s.needs_sample != a.needs_sample ||
            plan.token_seq_idx[i] != (int32_t) i || plan.slot_mapping[i] != ahead.slot_mapping[r] ||
            plan.context_lens[i] != ahead.context_lens[r]) {
            return false;
        }
        const int32_t last = (plan.context_lens[i] - 1) / block_size;  // the entry of the new row
        if (last >= plan.max_blocks || last >= ahead.max_blocks ||
            plan.block_tables[i * (size_t) plan.max_blocks + (size_t) last] !=
                ahead.block_tables[r * (size_t) ahead.max_blocks + (size_t) last]) {
            return false;
        }
        lookahead_rows_.push_back((int32_t) r);
    }
    return true;
}

// The request left the running set: clear llama.cpp's record of its stable slot, if it held one,
// and give back its slot id.
void Engine::release_slot(Sequence & seq) {
    const int32_t slot = batch_.release(seq.request_id);
    if (slot != CF_SLOT_NONE) {
        session_->clear_seq(slot);
    }
    if (seq.slot_id != CF_SLOT_ID_NONE) {
        free_slot_ids_.push_back(seq.slot_id);
        std::push_heap(free_slot_ids_.begin(), free_slot_ids_.end(), std::greater<int32_t>());
        seq.slot_id = CF_SLOT_ID_NONE;
    }
}

// A scheduled sequence holds the lowest free slot id until release_slot (at most max_num_seqs run).
void Engine::take_slot_id(Sequence & seq) {
    if (seq.slot_id != CF_SLOT_ID_NONE) {
        return;
    }
    if (free_slot_ids_.empty()) {
        throw Error(CF_STATUS_INTERNAL, "more sequences scheduled than max_num_seqs slot ids");
    }
    std::pop_heap(free_slot_ids_.begin(), free_slot_ids_.end(), std::greater<int32_t>());
    seq.slot_id = free_slot_ids_.back();
    seq.last_slot_id = seq.slot_id;
    free_slot_ids_.pop_back();
}

// Steps 1-3 of the plan (they touch disjoint blocks, step_plan.h): the previous step's swaps become due,
// then this step's copy-on-write copies (due now: the step writes those blocks), then its swap-outs and
// swap-ins (deferred on a copy stream: no sequence of this step touches their blocks, so they run beside
// its graph and the next step's graph waits for them).
void Engine::execute_block_ops(const StepPlan & plan) {
    swapper_.begin_step();
    if (!plan.blocks_to_copy.empty()) {
        swapper_.copy_blocks(plan.blocks_to_copy);
    }
    if (!plan.blocks_to_swap_out.empty()) {
        swapper_.swap_out(plan.blocks_to_swap_out);
    }
    if (!plan.blocks_to_swap_in.empty()) {
        swapper_.swap_in(plan.blocks_to_swap_in);
    }
    totals_.num_swapped_in += (int64_t) plan.swapped_in.size();
    totals_.num_resumed += (int64_t) plan.resumed.size();
    totals_.num_deferred_seq_steps += (int64_t) plan.deferred.size();
    if (swapper_.on_copy_stream() && !plan.seqs.empty()) {  // this step's graph runs beside them
        totals_.num_swaps_overlapped += (plan.blocks_to_swap_out.empty() ? 0 : 1) +
                                        (plan.blocks_to_swap_in.empty() ? 0 : 1);
    }
}

// AUTO preemption's cost model from what this engine measures: the swap copy rate (ns per byte,
// both directions so far) and the compute rate of steps that recompute enough tokens to be
// representative (ns per token of a step with >= 32 prefill tokens), each smoothed (1/4 new). Only
// a step that waited for its device work counts: on a GPU a prompt-chunk-only step returns once its
// kernels are queued, and its host time alone made recomputing look ~50x cheaper than it is (auto
// recomputed every victim on the H200, 4-6.5% below swap).
void Engine::update_preemption_costs(const StepPlan & plan, int64_t decode_ns) {
    const SwapStats & s = swapper_.stats();
    const int64_t swap_bytes = s.num_out_bytes + s.num_in_bytes;
    const double swap_ns_per_byte = swap_bytes > 0 ? (double) (s.out_ns + s.in_ns) / (double) swap_bytes : 0.0;
    if (plan.num_prefill_tokens >= 32 && step_waited_for_device_) {
        const double ns = (double) decode_ns / (double) plan.num_scheduled_tokens;
        recompute_ns_per_token_ = recompute_ns_per_token_ > 0.0 ? 0.75 * recompute_ns_per_token_ + 0.25 * ns : ns;
    }
    scheduler_.set_preemption_costs(swap_ns_per_byte, recompute_ns_per_token_);
}

void Engine::fail_step(const StepPlan & out) {
    const int64_t now_ns = clock_ns();
    for (const ScheduledSeq & s : out.seqs) {
        finish(s.seq, CF_FINISH_REASON_ERROR, CF_TOKEN_NONE, now_ns);
    }
}

// Call only with a running sequence: frees its slot and KV, queues its final event.
void Engine::finish(Sequence * seq, cf_finish_reason reason, int32_t token_id, int64_t now_ns) {
    std::unique_ptr<Sequence> done = scheduler_.finish(seq, reason);
    release_slot(*done);
    done->finish_ns = now_ns;
    emit_final(*done, token_id, now_ns);
}

// llama-server's first progress report, before any prompt token of the request is decoded: queued
// (one push, only when a request asked) before this step's decode, not with the step's outputs.
void Engine::publish_progress_start(const StepPlan & plan) {
    progress_events_.clear();
    for (const ScheduledSeq & s : plan.seqs) {
        Sequence & seq = *s.seq;
        if (!seq.params.return_progress || seq.prompt_progress_reported >= 0) {
            continue;
        }
        take_slot_id(seq);  // the slot it runs in from this step on (run_decoded_step keeps it)
        const int32_t processed = std::min(seq.num_computed_tokens, seq.num_prompt_tokens);
        const int64_t scheduled_ns = seq.first_scheduled_ns != 0 ? seq.first_scheduled_ns : step_start_ns_;
        progress_events_.push_back(make_progress_event(seq, processed, scheduled_ns, step_start_ns_));
        seq.prompt_progress_reported = processed;
    }
    if (!progress_events_.empty()) {
        events_.push(progress_events_, std::string());
    }
}

// After a step computed some of seq's tokens: a progress event if its prompt got further than the
// last one reported (never again once the whole prompt was reported, e.g. recomputed output).
void Engine::emit_progress(Sequence & seq) {
    const int32_t processed = std::min(seq.num_computed_tokens, seq.num_prompt_tokens);
    if (processed <= seq.prompt_progress_reported) {
        return;
    }
    step_events_.push_back(make_progress_event(seq, processed, seq.first_scheduled_ns, clock_ns()));
    seq.prompt_progress_reported = processed;
}

// seq just got its first token: add its TTFT (first_token_ns - arrival_ns) to its priority's entry,
// created in priority order while fewer than CF_TTFT_PRIORITIES_MAX exist.
void Engine::record_ttft(const Sequence & seq) {
    auto it = std::lower_bound(ttft_by_priority_.begin(), ttft_by_priority_.end(), seq.priority,
                               [](const cf_priority_ttft & e, int32_t priority) { return e.priority < priority; });
    if (it == ttft_by_priority_.end() || it->priority != seq.priority) {
        if (ttft_by_priority_.size() >= (size_t) CF_TTFT_PRIORITIES_MAX) {
            return;
        }
        cf_priority_ttft entry{};
        entry.priority = seq.priority;
        it = ttft_by_priority_.insert(it, entry);
    }
    const int64_t ttft_ns = std::max<int64_t>(0, seq.first_token_ns - seq.arrival_ns);
    it->num_requests += 1;
    it->ttft_sum_ns += ttft_ns;
    it->ttft_max_ns = std::max(it->ttft_max_ns, ttft_ns);
}

void Engine::emit_token(Sequence & seq, int32_t token_id, int64_t now_ns) {
    step_events_.push_back(make_event(seq, token_id, CF_FINISH_REASON_NONE, now_ns, step_text_));
}

// The final event keeps the slot id the request ran in (release_slot came first) and releases the
// text still held.
void Engine::emit_final(Sequence & seq, int32_t token_id, int64_t now_ns) {
    StopChecker::flush(seq);
    step_events_.push_back(make_event(seq, token_id, seq.finish_reason, now_ns, step_text_));
    step_events_.back().slot_id = seq.last_slot_id;
    finished_ids_.push_back(seq.request_id);
    totals_.num_finished += 1;
    profiler_.request(CF_PROFILE_EVENT_REQUEST_FINISH, totals_.num_steps, now_ns, seq.request_id,
                      seq.num_output_tokens(), seq.finish_reason);
}

void Engine::fail_everything(const std::string & why) {
    if (session_->config().log_level >= CF_LOG_LEVEL_ERROR) {
        std::fprintf(stderr, "cacheflow: engine step failed: %s\n", why.c_str());
    }
    const int64_t now_ns = clock_ns();
    for (const int64_t request_id : scheduler_.request_ids()) {
        std::unique_ptr<Sequence> seq = scheduler_.remove(request_id, CF_FINISH_REASON_ERROR);
        release_slot(*seq);
        seq->finish_ns = now_ns;
        emit_final(*seq, CF_TOKEN_NONE, now_ns);
    }
    publish();
}

// Make this step's results visible: live ids first (so that an abort after the final event
// reports NOT_FOUND), then events, then the stats snapshot.
void Engine::publish(int64_t kv_tokens_used) {
    {
        std::lock_guard<std::mutex> lock(inbox_mu_);
        for (const int64_t request_id : finished_ids_) {
            live_ids_.erase(request_id);
        }
        sched_has_work_ = scheduler_.has_work();
    }
    finished_ids_.clear();
    // Stats before events: whoever sees a request's final event must also see stats that
    // count it as finished.
    {
        const int64_t bytes_per_token = session_->kv_bytes_per_token();
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_ = totals_;
        stats_.num_running = scheduler_.num_running();
        stats_.num_waiting = scheduler_.num_waiting();
        stats_.kv_tokens_used = (int32_t) kv_tokens_used;
        stats_.kv_tokens_capacity = session_->n_ctx();
        stats_.kv_blocks_total = scheduler_.kv().num_blocks_total();
        stats_.kv_blocks_used = scheduler_.kv().num_blocks_used();
        stats_.kv_bytes_reserved = scheduler_.kv_tokens_reserved() * bytes_per_token;
        stats_.kv_bytes_used = kv_tokens_used * bytes_per_token;
        const PrefixCacheStats cache = scheduler_.kv().prefix_cache_stats();
        stats_.prefix_cache_queried_tokens = cache.num_queried_tokens;
        stats_.prefix_cache_hit_tokens = cache.num_hit_tokens;
        stats_.prefix_cache_evictions = cache.num_evictions;
        stats_.prefix_cache_blocks = cache.num_cached_blocks;
        const PreemptionStats & pre = scheduler_.preemption_stats();
        stats_.num_preemptions_swap = pre.num_swap;
        stats_.num_preemptions_recompute = pre.num_recompute;
        stats_.num_recomputed_tokens = pre.num_recomputed_tokens;
        stats_.num_preemptions_priority = pre.num_priority;
        ttft_by_priority_published_ = ttft_by_priority_;  // no allocation once it stopped growing
        stats_.num_swapped = scheduler_.num_swapped();
        stats_.swap_blocks_total = scheduler_.kv().num_host_blocks_total();
        stats_.swap_blocks_used = scheduler_.kv().num_host_blocks_used();
        const SwapStats & swap = swapper_.stats();
        stats_.swap_out_bytes = swap.num_out_bytes;
        stats_.swap_in_bytes = swap.num_in_bytes;
        stats_.swap_out_ns = swap.out_ns;
        stats_.swap_in_ns = swap.in_ns;
        stats_.swap_on_copy_stream = swapper_.on_copy_stream() ? 1 : 0;
        stats_.block_copy_bytes = swap.num_copy_bytes;
        stats_.swap_overlapped_ns = swap.deferred_ns;
        stats_.num_graphs_beside_copies = swap.num_graphs_beside;
        stats_.num_graphs_overlapping_copies = swap.num_graphs_overlapping;
        stats_.swap_compute_overlap_ns = swap.compute_overlap_ns;
        int64_t graphs[3];
        LlamaSession::cuda_graph_counts(graphs);
        stats_.cuda_graphs_captured = graphs[0];
        stats_.cuda_graphs_replayed = graphs[1];
        stats_.cuda_graphs_direct = graphs[2];
        stats_.num_llama_decodes = session_->num_decodes();
        stats_.num_llama_graphs_reused = session_->num_graphs_reused();
        const KvStreamStats placement = scheduler_.kv().kv_stream_stats();
        const LlamaSession::KvStreamCounters staging = session_->kv_stream_counters();
        stats_.kv_streaming = session_->kv_streaming() ? 1 : 0;
        stats_.kv_streamed_blocks = placement.num_host_resident;
        stats_.kv_stream_demotions = placement.num_demotions;
        stats_.kv_stream_promotions = placement.num_promotions;
        stats_.kv_staged_blocks = staging.num_staged_blocks;
        stats_.kv_staged_bytes = staging.num_staged_bytes;
        stats_.kv_staging_decodes = staging.num_staging_decodes;
        stats_.kv_stream_cuda_wait_layers = staging.cuda[2];
        stats_.kv_stream_cuda_copy_ns = staging.cuda[1];
        // The adds consume_inbox() took are in this snapshot now (lock order: stats_mu_, then inbox_mu_).
        std::lock_guard<std::mutex> inbox_lock(inbox_mu_);
        num_adds_unpublished_ = 0;
    }
    events_.push(step_events_, step_text_, step_logprobs_);
    step_events_.clear();
    step_text_.clear();
    step_logprobs_.clear();
}

void Engine::run_loop() {
    while (true) {
        {
            std::unique_lock<std::mutex> lock(inbox_mu_);
            work_cv_.wait(lock, [this] {
                return stop_requested_ || sched_has_work_ || !pending_adds_.empty() || !pending_aborts_.empty();
            });
            if (stop_requested_) {
                return;
            }
        }
        std::lock_guard<std::mutex> lock(step_mu_);
        try {
            step_guarded();
        } catch (const std::exception &) {
            // step_guarded already finished every request and logged; keep serving new ones.
        }
    }
}

}  // namespace cf
