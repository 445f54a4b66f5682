// test_batch_builder.cpp - llama.cpp slots and batches without a model: stable slots (stock
// modes: lowest free first, kept until release, reused), per-decode rows (paged mode: decode
// groups of at most num_slots sequences, nothing kept), batch order and sample indices, rows selected for a decode
// launched ahead that fewer sequences adopt.
#undef NDEBUG  // the checks must run in Release builds too
#include "engine/batch_builder.h"

#include <cassert>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

using namespace cf;

namespace {

std::unique_ptr<Sequence> make_seq(int64_t request_id, int32_t prompt_len) {
    SamplingParams p;
    std::vector<int32_t> prompt((size_t) prompt_len);
    std::iota(prompt.begin(), prompt.end(), 100);
    return std::make_unique<Sequence>(request_id, prompt.data(), prompt_len, p, 0, 0, prompt_len + 16);
}

// A plan computing each sequence's whole prompt (needs_sample), in the given order.
StepPlan plan_of(const std::vector<Sequence *> & seqs) {
    StepPlan plan;
    for (Sequence * seq : seqs) {
        plan.seqs.push_back({seq, seq->num_prompt_tokens, true});
        plan.num_scheduled_tokens += seq->num_prompt_tokens;
    }
    return plan;
}

// Stock: request 1 and 2 take slots 0 and 1 and keep them; once 2 is released (its slot is
// returned for KV clearing), request 4 takes slot 1, the lowest free one. The batch goes by slot.
void test_stable_slots() {
    BatchBuilder builder(64, SlotMode::STABLE, 3);
    std::unique_ptr<Sequence> r1 = make_seq(1, 2);
    std::unique_ptr<Sequence> r2 = make_seq(2, 3);
    std::unique_ptr<Sequence> r4 = make_seq(4, 1);
    StepPlan plan = plan_of({r1.get(), r2.get()});
    assert(builder.num_groups(plan) == 1);
    const llama_batch & batch = builder.build(plan, 0, 2);
    assert(builder.slot(0) == 0 && builder.slot(1) == 1 && batch.n_tokens == 5);
    assert(batch.seq_id[0][0] == 0 && batch.seq_id[2][0] == 1 && batch.pos[2] == 0 && batch.token[4] == 102);
    assert(builder.sample_index(0) == 1 && builder.sample_index(1) == 4 && batch.logits[1] && !batch.logits[0]);
    assert(builder.release(2) == 1 && builder.release(2) == CF_SLOT_NONE);

    // Request 1 keeps slot 0; 4 gets slot 1. In plan order 4 comes first, in the batch slot 0 does.
    StepPlan next = plan_of({r4.get(), r1.get()});
    const llama_batch & b2 = builder.build(next, 0, 2);
    assert(builder.slot(0) == 1 && builder.slot(1) == 0);
    assert(b2.seq_id[0][0] == 0 && b2.seq_id[2][0] == 1);  // r1's two tokens, then r4's one
    assert(builder.sample_index(1) == 1 && builder.sample_index(0) == 2);
    assert(builder.release(1) == 0 && builder.release(4) == 1 && builder.release(99) == CF_SLOT_NONE);
}

// Paged: 5 sequences over 2 slots run as 3 decode groups; in each the slots are the rows 0, 1.
void test_per_decode_rows() {
    BatchBuilder builder(64, SlotMode::PER_DECODE, 2);
    std::vector<std::unique_ptr<Sequence>> owned;
    std::vector<Sequence *> seqs;
    for (int64_t id = 10; id < 15; ++id) {
        owned.push_back(make_seq(id, 2));
        seqs.push_back(owned.back().get());
    }
    StepPlan plan = plan_of(seqs);
    assert(builder.num_groups(plan) == 3);
    assert(builder.group_begin(plan, 0) == 0 && builder.group_begin(plan, 1) == 2);
    assert(builder.group_begin(plan, 2) == 4 && builder.group_begin(plan, 3) == 5);
    const llama_batch & batch = builder.build(plan, 2, 4);
    assert(builder.slot(2) == 0 && builder.slot(3) == 1 && batch.n_tokens == 4);
    assert(batch.seq_id[0][0] == 0 && batch.seq_id[3][0] == 1);
    assert(builder.sample_index(2) == 1 && builder.sample_index(3) == 3);
    assert(builder.sample_index(0) == CF_BATCH_INDEX_NONE);  // not in this group
    const llama_batch & last = builder.build(plan, 4, 5);
    assert(builder.slot(4) == 0 && last.n_tokens == 2);
    assert(builder.release(12) == CF_SLOT_NONE);  // nothing is kept between decodes
}

// Async decode adopted by fewer sequences: after select_rows({1, 3}) plan index 0 is the last build's row 1 and
// index 1 its row 3 (slots and sample indices); the batch is untouched.
void test_select_rows() {
    BatchBuilder builder(64, SlotMode::PER_DECODE, 8);
    std::vector<std::unique_ptr<Sequence>> owned;
    std::vector<Sequence *> seqs;
    for (int64_t id = 20; id < 24; ++id) {
        owned.push_back(make_seq(id, 1 + (int32_t) (id % 2)));  // 1, 2, 1, 2 tokens
        seqs.push_back(owned.back().get());
    }
    StepPlan plan = plan_of(seqs);
    const llama_batch & batch = builder.build(plan, 0, 4);
    assert(batch.n_tokens == 6 && builder.sample_index(1) == 2 && builder.sample_index(3) == 5);
    builder.select_rows({1, 3});
    assert(builder.slot(0) == 1 && builder.slot(1) == 3);
    assert(builder.sample_index(0) == 2 && builder.sample_index(1) == 5);
    assert(batch.n_tokens == 6 && batch.seq_id[5][0] == 3);
}

// Async decode after an adoption for fewer sequences: 9 decode rows padded to 16 (padding slot 9), one position on,
// reduced to rows 0, 2, 3, 5 and 8: those rows move to 0..4 with their slots and positions, all output rows, padded
// again to 8 in slot 9; the sample indices stay the adopted decode's until reset. Without a padding slot before
// (8 rows, a bucket, in all 8 slots), the new padding takes the lowest slot no row left holds: that of row 0.
void test_compact_rows() {
    BatchBuilder builder(64, SlotMode::PER_DECODE, 16);
    builder.set_padding(64);
    std::vector<std::unique_ptr<Sequence>> owned;
    std::vector<Sequence *> seqs;
    for (int64_t id = 30; id < 39; ++id) {
        owned.push_back(make_seq(id, 1));
        seqs.push_back(owned.back().get());
    }
    const StepPlan plan = plan_of(seqs);
    const llama_batch & batch = builder.build(plan, 0, 9);
    assert(batch.n_tokens == 16 && builder.num_padding_tokens() == 7 && builder.padding_slot() == 9);
    builder.advance_one_position(9);
    const std::vector<int32_t> rows = {0, 2, 3, 5, 8};
    builder.select_rows(rows);
    builder.compact_rows(rows);
    assert(batch.n_tokens == 8 && builder.num_padding_tokens() == 3 && builder.padding_slot() == 9);
    for (int32_t i = 0; i < 5; ++i) {
        assert(batch.seq_id[i][0] == rows[(size_t) i] && builder.slot((size_t) i) == rows[(size_t) i]);
        assert(batch.pos[i] == 1 && batch.logits[i] && batch.n_seq_id[i] == 1);
        assert(builder.sample_index((size_t) i) == rows[(size_t) i]);  // the adopted decode's rows, still
    }
    for (int32_t p = 0; p < 3; ++p) {
        assert(batch.seq_id[5 + p][0] == 9 && batch.pos[5 + p] == p && batch.logits[5 + p]);
    }
    builder.reset_sample_rows();
    assert(builder.sample_index(0) == 0 && builder.sample_index(4) == 4);
    builder.advance_one_position(5);
    assert(batch.pos[0] == 2 && batch.pos[4] == 2 && batch.pos[5] == 0);

    BatchBuilder full(64, SlotMode::PER_DECODE, 8);
    full.set_padding(64);
    const StepPlan eight = plan_of(std::vector<Sequence *>(seqs.begin(), seqs.begin() + 8));
    const llama_batch & b8 = full.build(eight, 0, 8);
    assert(b8.n_tokens == 8 && full.padding_slot() == CF_SLOT_NONE);
    full.select_rows({1, 2, 6});
    full.compact_rows({1, 2, 6});
    assert(b8.n_tokens == 4 && full.padding_slot() == 0 && b8.seq_id[2][0] == 6 && b8.seq_id[3][0] == 0);
}

// The buckets: 1, 2, 4, 8, multiples of 8 to 256, of 16 to 512, none past it.
void test_padded_step_tokens() {
    const int32_t cases[][2] = {{1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8}, {9, 16}, {57, 64}, {64, 64},
                                {65, 72}, {255, 256}, {256, 256}, {257, 272}, {500, 512}, {512, 512},
                                {513, 513}, {2048, 2048}};
    for (const auto & c : cases) {
        assert(padded_step_tokens(c[0]) == c[1]);
    }
}

// Paged, padding on: 4 decode rows and a 6-token prompt (10 tokens, 5 outputs) become 16 tokens:
// 6 padding tokens in slot 5 at positions 0..5, of which 3 ask for logits (8 outputs in all).
// A step already at a bucket, a step past max_padded_tokens and a group filling every slot stay
// as they are.
void test_padding() {
    BatchBuilder builder(64, SlotMode::PER_DECODE, 6);
    builder.set_padding(12);  // 10 -> 16 is past 12: nothing
    std::vector<std::unique_ptr<Sequence>> owned;
    std::vector<Sequence *> seqs;
    for (int64_t id = 1; id <= 4; ++id) {
        owned.push_back(make_seq(id, 1));
        seqs.push_back(owned.back().get());
    }
    owned.push_back(make_seq(5, 6));
    seqs.push_back(owned.back().get());
    StepPlan plan = plan_of(seqs);
    assert(builder.build(plan, 0, 5).n_tokens == 10 && builder.num_padding_tokens() == 0);

    builder.set_padding(64);
    const llama_batch & batch = builder.build(plan, 0, 5);
    assert(batch.n_tokens == 16 && builder.num_padding_tokens() == 6 && builder.padding_slot() == 5);
    int32_t outputs = 0;
    for (int32_t t = 0; t < batch.n_tokens; ++t) {
        outputs += batch.logits[t] != 0;
    }
    assert(outputs == 8);
    for (int32_t p = 0; p < 6; ++p) {
        assert(batch.seq_id[10 + p][0] == 5 && batch.pos[10 + p] == p && (batch.logits[10 + p] != 0) == (p < 3));
    }
    assert(builder.sample_index(4) == 9);  // the real rows are where they were

    StepPlan four = plan_of({seqs[0], seqs[1], seqs[2], seqs[3]});  // 4 tokens: a bucket
    assert(builder.build(four, 0, 4).n_tokens == 4 && builder.num_padding_tokens() == 0);
    StepPlan six = plan_of({seqs[0], seqs[1], seqs[2], seqs[3], seqs[0], seqs[1]});  // 6 tokens, every slot taken
    assert(builder.build(six, 0, 6).n_tokens == 6 && builder.num_padding_tokens() == 0);

    BatchBuilder stable(64, SlotMode::STABLE, 6);
    stable.set_padding(64);  // stock modes keep their slots: never padded
    assert(stable.build(plan, 0, 5).n_tokens == 10 && stable.num_padding_tokens() == 0);
}

}  // namespace

int main() {
    test_stable_slots();
    test_per_decode_rows();
    test_select_rows();
    test_compact_rows();
    test_padded_step_tokens();
    test_padding();
    std::printf("test_batch_builder: ok\n");
    return 0;
}
