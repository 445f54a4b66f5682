// paged_kv.cpp - see paged_kv.h.
#include "kv/paged_kv.h"

#include <algorithm>
#include <cassert>

namespace cf {

PagedKv::PagedKv(int32_t num_blocks, int32_t block_size, bool prefix_caching, int32_t num_host_blocks,
                 int64_t block_bytes, const KvStreamPolicy & stream)
    : blocks_(num_blocks, block_size, prefix_caching),
      host_(num_host_blocks),
      block_bytes_(block_bytes),
      watermark_blocks_(std::max<int64_t>(1, num_blocks / 100)),
      stream_(stream) {
    assert(!stream_.enabled || (stream_.max_staged >= 1 && stream_.max_staged <= num_host_blocks &&
                                stream_.sink_blocks >= 0 && stream_.window_blocks >= 1));
}

void PagedKv::begin_step() {
    planning_ = true;
    blocks_.release_deferred();
    demoted_.clear();
    promoted_.clear();
}

PrefixMatch PagedKv::match(const Sequence & seq) const {
    PrefixMatch m = blocks_.match_prefix(seq.tokens.data(), seq.num_tokens() - 1);
    if (m.copy_src_free && blocks_.num_blocks_needed(m, seq.num_tokens()) > num_blocks_total()) {
        // A sequence that fills the pool alone cannot also pin a free copy source: it would never
        // be admitted. It computes those few rows itself.
        m.copy_src_block_id = CF_BLOCK_ID_NONE;
        m.num_copy_tokens = 0;
        m.copy_src_free = false;
    }
    return m;
}

int64_t PagedKv::num_blocks_to_admit(const Sequence & seq) const {
    if (!uses_cache(seq)) {
        return blocks_.num_blocks_needed(seq.request_id, seq.num_uncomputed_tokens());
    }
    return blocks_.num_blocks_needed(match(seq), seq.num_tokens());
}

int32_t PagedKv::pending_shared_prefix_tokens(const Sequence & seq, const Sequence & other) const {
    if (!uses_cache(seq) || !uses_cache(other)) {
        return 0;
    }
    const int32_t block_size = blocks_.block_size();
    const int32_t computed = other.num_computed_tokens / block_size * block_size;  // its committed full blocks
    const int32_t limit = std::min(seq.num_tokens() - 1, other.num_tokens());
    if (limit - computed < block_size) {
        return 0;  // no full block past other's computed ones could be shared
    }
    const auto a = seq.tokens.begin();
    const int32_t common = (int32_t) (std::mismatch(a, a + limit, other.tokens.begin()).first - a);
    return std::max(0, common / block_size * block_size - computed);
}

bool PagedKv::can_admit(const Sequence & seq, int32_t num_running, bool with_deferred,
                        int64_t num_reserved_blocks) const {
    const int64_t watermark = num_running == 0 ? 0 : std::max<int64_t>(watermark_blocks_, num_running);
    int64_t needed = num_blocks_to_admit(seq);
    if (stream_.enabled) {
        // its older blocks can stream: it needs at most the device part of a table (all but R blocks),
        // and not more than the pool less one block
        needed = std::min<int64_t>(needed, std::max<int64_t>(1, num_blocks_total() - 1));
    }
    return needed + watermark + num_reserved_blocks <= num_free_blocks(with_deferred);
}

int32_t PagedKv::admit(const Sequence & seq) {
    assert(blocks_.find(seq.request_id) == nullptr && seq.num_computed_tokens == 0);
    if (!uses_cache(seq)) {
        return 0;  // blocks come with allocate()
    }
    const PrefixMatch m = match(seq);
    blocks_.allocate_prefix(seq.request_id, m, seq.num_tokens());
    return m.num_tokens();
}

void PagedKv::commit(const Sequence & seq) {
    if (uses_cache(seq)) {
        blocks_.commit(seq.request_id, seq.tokens.data(), seq.num_computed_tokens);
    }
}

bool PagedKv::allocate(const Sequence & seq, int32_t num_new_tokens) {
    assert(num_new_tokens >= 1);
    return blocks_.append_slots(seq.request_id, num_new_tokens, nullptr);
}

void PagedKv::free(const Sequence & seq) {
    if (blocks_.find(seq.request_id) != nullptr) {  // none if it never got a block
        std::vector<int32_t> slots;
        blocks_.host_slots(seq.request_id, &slots);
        for (int32_t h : slots) {
            host_.free(h);  // parked until end_step while planning: a copy of this step may still write it
        }
        blocks_.free(seq.request_id);
        release_host_slots_unless_planning();
    }
}

void PagedKv::fork(const Sequence & parent, const Sequence & child) {
    blocks_.fork(parent.request_id, child.request_id);
}

namespace {

int32_t num_device_entries(const BlockTable & table) {
    return (int32_t) std::count_if(table.block_ids.begin(), table.block_ids.end(),
                                   [](int32_t id) { return !is_host_entry(id); });
}

}  // namespace

bool PagedKv::holds_device_blocks(const Sequence & seq) const {
    const BlockTable * table = blocks_.find(seq.request_id);
    return table != nullptr && num_device_entries(*table) > 0;
}

int64_t PagedKv::num_blocks_to_reserve(const Sequence & seq) const {
    const int64_t needed = num_blocks_to_allocate(seq, seq.num_uncomputed_tokens());
    return stream_.enabled ? std::min<int64_t>(needed, std::max<int64_t>(1, num_blocks_total() - 1)) : needed;
}

// With streaming a table may be longer than the device pool, but swap_in() brings every block back to the
// device: such a sequence could never come back, so it is not swapped (recompute streams it again).
bool PagedKv::can_swap_out(const Sequence & seq) const {
    const BlockTable * table = blocks_.find(seq.request_id);
    if (table == nullptr || table->num_tokens == 0 || num_device_entries(*table) > host_.num_free()) {
        return false;
    }
    const int32_t bs = blocks_.block_size();
    return !stream_.enabled || ((int64_t) table->num_tokens + bs) / bs <= num_blocks_total();  // its blocks + 1 token
}

int64_t PagedKv::swap_bytes(const Sequence & seq) const {
    const BlockTable * table = blocks_.find(seq.request_id);
    return table == nullptr ? 0 : (int64_t) num_device_entries(*table) * block_bytes_;
}

// Every block is copied out, shared or not: a shared block's other holders keep it on the device
// (its ref count drops by one), and seq comes back in private blocks.
void PagedKv::swap_out(const Sequence & seq, std::vector<BlockSwap> * out) {
    assert(can_swap_out(seq) && swapped_.count(seq.request_id) == 0);
    const BlockTable & table = *blocks_.find(seq.request_id);
    SwappedTable & swapped = swapped_[seq.request_id];
    swapped.num_tokens = table.num_tokens;
    std::vector<int32_t> fresh;
    const bool ok = host_.allocate(num_device_entries(table), &fresh);
    assert(ok);
    (void) ok;
    size_t next = 0;
    for (int32_t entry : table.block_ids) {
        if (is_host_entry(entry)) {  // streamed: its rows are on the host already (or go there this step)
            swapped.host_slots.push_back(host_slot_of(entry));
            continue;
        }
        swapped.host_slots.push_back(fresh[next]);
        out->push_back({ entry, fresh[next++] });
    }
    blocks_.free_deferred(seq.request_id);  // the swap-out copy reads them during this step
}

bool PagedKv::can_swap_in(const Sequence & seq, int32_t num_running, int32_t num_new_tokens, bool with_deferred,
                          int64_t num_reserved_blocks) const {
    auto it = swapped_.find(seq.request_id);
    assert(it != swapped_.end() && num_new_tokens >= 0);
    if (stream_.enabled) {
        num_new_tokens = std::min(num_new_tokens, 1);  // the rest of its chunk gets blocks by streaming, later
    }
    const int32_t bs = blocks_.block_size();
    const int64_t total = (int64_t) it->second.num_tokens + num_new_tokens;
    const int64_t needed = (total + bs - 1) / bs;  // its blocks and those of the next tokens
    const int64_t watermark = num_running == 0 ? 0 : std::max<int64_t>(watermark_blocks_, num_running);
    return needed + watermark + num_reserved_blocks <= num_free_blocks(with_deferred);
}

void PagedKv::swap_in(const Sequence & seq, std::vector<BlockSwap> * out) {
    auto it = swapped_.find(seq.request_id);
    assert(it != swapped_.end() && blocks_.find(seq.request_id) == nullptr);
    const BlockTable & table = blocks_.allocate_table(seq.request_id, it->second.num_tokens);
    for (size_t i = 0; i < table.block_ids.size(); ++i) {
        out->push_back({ it->second.host_slots[i], table.block_ids[i] });
        host_.free(it->second.host_slots[i]);
    }
    swapped_.erase(it);
}

void PagedKv::free_swapped(const Sequence & seq) {
    auto it = swapped_.find(seq.request_id);
    assert(it != swapped_.end());
    for (int32_t h : it->second.host_slots) {
        host_.free(h);
    }
    swapped_.erase(it);
    release_host_slots_unless_planning();
}

std::string PagedKv::check_swapped(const std::vector<const Sequence *> & swapped) const {
    if (swapped.size() != swapped_.size()) {
        return "paged: " + std::to_string(swapped_.size()) + " swapped tables but " +
               std::to_string(swapped.size()) + " swapped sequences";
    }
    std::vector<int32_t> held;
    blocks_.all_host_slots(&held);  // host entries of running sequences (KV streaming)
    const int32_t bs = blocks_.block_size();
    for (const Sequence * seq : swapped) {
        auto it = swapped_.find(seq->request_id);
        if (it == swapped_.end() || blocks_.find(seq->request_id) != nullptr) {
            return "paged: swapped request " + std::to_string(seq->request_id) +
                   " has no host table or still holds device blocks";
        }
        const SwappedTable & t = it->second;
        if ((int32_t) t.host_slots.size() != (t.num_tokens + bs - 1) / bs || t.num_tokens != seq->num_computed_tokens) {
            return "paged: swapped request " + std::to_string(seq->request_id) + " holds " +
                   std::to_string(t.host_slots.size()) + " host slots for " + std::to_string(t.num_tokens) +
                   " tokens (" + std::to_string(seq->num_computed_tokens) + " computed)";
        }
        held.insert(held.end(), t.host_slots.begin(), t.host_slots.end());
    }
    const std::string error = host_.check_invariants(held);
    return error.empty() ? "" : "paged: " + error;
}

int64_t PagedKv::kv_tokens_reserved() const {
    return (int64_t) blocks_.pool().num_used() * blocks_.block_size();
}

std::string PagedKv::check_invariants(const std::vector<std::unique_ptr<Sequence>> & running) const {
    std::string error = blocks_.check_invariants();
    if (!error.empty()) {
        return "paged: " + error;
    }
    if (blocks_.num_seqs() > (int32_t) running.size()) {
        return "paged: " + std::to_string(blocks_.num_seqs()) + " block tables but only " +
               std::to_string(running.size()) + " sequences running (only running sequences hold blocks)";
    }
    if (!stream_.enabled && blocks_.num_host_entries() > 0) {
        return "paged: host entries without KV streaming";
    }
    if (blocks_.num_host_entries() + (int32_t) promoted_.size() > std::max(stream_.max_staged, 0)) {
        return "paged: " + std::to_string(blocks_.num_host_entries()) + " host entries and " +
               std::to_string(promoted_.size()) + " promoted this step exceed max_staged " +
               std::to_string(stream_.max_staged);
    }
    for (const auto & seq : running) {
        const BlockTable * table = blocks_.find(seq->request_id);
        if (table != nullptr && table->num_tokens < seq->num_computed_tokens) {
            return "paged: request " + std::to_string(seq->request_id) + " has " +
                   std::to_string(seq->num_computed_tokens) + " computed tokens but " +
                   std::to_string(table->num_tokens) + " slots";
        }
    }
    return "";
}

std::string PagedKv::dump() const {
    std::string res = "PagedKv(watermark=" + std::to_string(watermark_blocks_) + ", host slots " +
                      std::to_string(host_.num_used()) + "/" + std::to_string(host_.num_slots()) + " used, " +
                      std::to_string(blocks_.num_host_entries()) + " host entries, max_staged " +
                      std::to_string(stream_.max_staged) + ")\n";
    for (const auto & kv : swapped_) {
        res += "  swapped req=" + std::to_string(kv.first) + " tokens=" + std::to_string(kv.second.num_tokens) +
               " host slots=" + std::to_string(kv.second.host_slots.size()) + "\n";
    }
    return res + blocks_.dump();
}

// The one place where slots are computed: token pos of a sequence goes to row
// block_ids[pos / block_size] * block_size + pos % block_size (BlockManager's layout).
void PagedKv::fill_plan(StepPlan * plan) {
    if (stream_.enabled && demoted_.empty() && blocks_.num_host_entries() > 0) {
        promote(plan);
    }
    const int32_t bs = blocks_.block_size();
    const size_t n_seqs = plan->seqs.size();
    int32_t max_blocks = 1;
    for (const ScheduledSeq & s : plan->seqs) {
        const BlockTable * table = blocks_.find(s.seq->request_id);
        // Call only after allocate() for every scheduled sequence (the scheduler does).
        assert(table != nullptr && table->num_tokens == s.seq->num_computed_tokens + s.num_new_tokens);
        max_blocks = std::max(max_blocks, table->num_blocks());
    }
    plan->max_blocks = max_blocks;
    plan->slot_mapping.clear();
    plan->context_lens.clear();
    plan->block_tables.assign(n_seqs * (size_t) max_blocks, CF_BLOCK_ID_NONE);
    for (size_t i = 0; i < n_seqs; ++i) {
        const ScheduledSeq & s = plan->seqs[i];
        const BlockTable & table = *blocks_.find(s.seq->request_id);
        const int32_t start = s.seq->num_computed_tokens;
        for (int32_t pos = start; pos < start + s.num_new_tokens; ++pos) {
            assert(!is_host_entry(table.block_ids[(size_t) (pos / bs)]));  // new rows go to device blocks
            plan->slot_mapping.push_back(table.block_ids[(size_t) (pos / bs)] * bs + pos % bs);
        }
        plan->context_lens.push_back(table.num_tokens);
        int32_t * row = plan->block_tables.data() + i * (size_t) max_blocks;
        std::copy(table.block_ids.begin(), table.block_ids.end(), row);
        if (!demoted_.empty() || !promoted_.empty()) {
            for (int32_t b = 0; b < table.num_blocks(); ++b) {
                row[b] = read_entry(s.seq->request_id, b, row[b]);
            }
        }
    }
    blocks_.take_copies(&plan->blocks_to_copy);
    for (const Moved & m : demoted_) {
        plan->streamed_blocks.push_back({ m.seq_id, true });
    }
    for (const Moved & m : promoted_) {
        plan->streamed_blocks.push_back({ m.seq_id, false });
    }
}

int32_t PagedKv::read_entry(int64_t seq_id, int32_t i, int32_t entry) const {
    for (const Moved & m : demoted_) {
        if (m.seq_id == seq_id && m.index == i) {
            return m.read;
        }
    }
    for (const Moved & m : promoted_) {
        if (m.seq_id == seq_id && m.index == i) {
            return m.read;
        }
    }
    return entry;
}

bool PagedKv::demote_one(const Sequence & seq, std::vector<BlockSwap> * out) {
    const BlockTable * table = blocks_.find(seq.request_id);
    if (table == nullptr || seq.status != SequenceStatus::RUNNING || !seq.holds_kv || seq.fork_pending) {
        return false;
    }
    const int32_t bs = blocks_.block_size();
    int32_t end = std::min(seq.num_computed_tokens / bs, table->num_blocks() - stream_.window_blocks);
    if (uses_cache(seq)) {
        end = std::min(end, table->num_hashed_blocks - 1);  // the last indexed block is the next commit's parent
    }
    for (int32_t i = stream_.sink_blocks; i < end; ++i) {
        const int32_t id = table->block_ids[(size_t) i];
        if (is_host_entry(id) || blocks_.pool().ref_count(id) != 1) {
            continue;
        }
        std::vector<int32_t> slot;
        if (!host_.allocate(1, &slot)) {
            return false;
        }
        const int32_t block_id = blocks_.demote(seq.request_id, i, slot[0]);
        out->push_back({ block_id, slot[0] });
        demoted_.push_back({ seq.request_id, i, block_id });
        num_demotions_ += 1;
        return true;
    }
    return false;
}

int32_t PagedKv::demote(const Sequence & needy, int64_t num_blocks,
                        const std::vector<std::unique_ptr<Sequence>> & running, std::vector<BlockSwap> * out) {
    if (!stream_.enabled || num_blocks <= 0 || (stream_.alone_only && running.size() > 1)) {
        return 0;
    }
    (void) needy;  // it is one of `running`, and its own older blocks move like anyone's
    int32_t n = 0;
    for (auto it = running.rbegin(); it != running.rend() && n < num_blocks; ++it) {  // newest first
        while (n < num_blocks && blocks_.num_host_entries() + (int32_t) promoted_.size() < stream_.max_staged &&
               demote_one(**it, out)) {
            n += 1;
        }
    }
    return n;
}

void PagedKv::promote(StepPlan * plan) {
    const int64_t keep_free = 2 * std::max<int64_t>(watermark_blocks_, (int64_t) plan->seqs.size());
    for (const ScheduledSeq & s : plan->seqs) {
        const BlockTable * table = blocks_.find(s.seq->request_id);
        for (int32_t i = 0; i < table->num_blocks(); ++i) {
            const int32_t entry = table->block_ids[(size_t) i];
            if (!is_host_entry(entry)) {
                continue;
            }
            if ((int64_t) blocks_.num_free_blocks() - 1 < keep_free) {
                return;
            }
            const int32_t h = host_slot_of(entry);
            const int32_t block_id = blocks_.promote(s.seq->request_id, i);
            plan->blocks_to_swap_in.push_back({ h, block_id });
            host_.free(h);  // parked until end_step: this step still reads it
            promoted_.push_back({ s.seq->request_id, i, entry });
            num_promotions_ += 1;
        }
    }
}

KvStreamStats PagedKv::kv_stream_stats() const {
    KvStreamStats out;
    out.num_host_resident = blocks_.num_host_entries();
    out.num_demotions = num_demotions_;
    out.num_promotions = num_promotions_;
    return out;
}

// The chunk cap (kv_cache_manager.h): the blocks a lone sequence keeps on the device whatever moves (its
// first sink_blocks, its last window_blocks, among them a partly filled last block) plus the chunk's new
// blocks must fit the pool. At the next step the chunk's blocks are computed and all but the window may
// move in turn, so a prompt of any length within n_ctx_per_seq proceeds one capped chunk per step or two.
int32_t PagedKv::max_chunk_tokens(const Sequence & seq) const {
    if (!stream_.enabled) {
        return INT32_MAX;
    }
    const int32_t bs = blocks_.block_size();
    const int64_t max_new_blocks =
        std::max<int64_t>(1, (int64_t) num_blocks_total() - stream_.sink_blocks - stream_.window_blocks);
    const BlockTable * table = blocks_.find(seq.request_id);
    const int64_t rows_left = table == nullptr ? 0 : (int64_t) table->num_blocks() * bs - table->num_tokens;
    int64_t n = std::min<int64_t>(rows_left + max_new_blocks * bs, INT32_MAX);
    if (blocks_.num_blocks_needed(seq.request_id, (int32_t) n) > max_new_blocks) {
        n -= bs;  // a shared, partly filled last block is copied first: one new block more
    }
    return (int32_t) std::max<int64_t>(1, n);
}

bool PagedKv::fork_fits(const Sequence & parent) const {
    if (!stream_.enabled) {
        return true;
    }
    const int32_t bs = blocks_.block_size();
    const int64_t prompt_blocks = ((int64_t) parent.num_prompt_tokens + bs - 1) / bs;
    return prompt_blocks + 1 <= num_blocks_total();  // + its copy-on-write block
}

std::string PagedKv::out_of_blocks_reason(const Sequence & seq, int32_t num_new_tokens) const {
    if (!stream_.enabled) {
        return "";
    }
    const BlockTable * table = blocks_.find(seq.request_id);
    const int32_t num_blocks = table == nullptr ? 0 : table->num_blocks();
    const int32_t num_host = table == nullptr ? 0 : num_blocks - num_device_entries(*table);
    std::string limit;
    if (blocks_.num_host_entries() >= stream_.max_staged) {
        limit = "the running sequences hold kv_stream_blocks=" + std::to_string(stream_.max_staged) +
                " host-resident blocks already";
    } else if (host_.num_free() == 0) {
        limit = "every host slot of the swap space is taken (swapped-out sequences hold " +
                std::to_string(host_.num_used() - blocks_.num_host_entries()) + " of " +
                std::to_string(host_.num_slots()) + ")";
    } else {
        limit = "none of its device blocks may move to the host (its first " + std::to_string(stream_.sink_blocks) +
                " and last " + std::to_string(stream_.window_blocks) +
                " stay, shared blocks stay, a sequence whose choices wait to fork stays)";
    }
    return "out of KV blocks with KV streaming on: request " + std::to_string(seq.request_id) + " holds " +
           std::to_string(num_blocks) + " blocks (" + std::to_string(num_blocks - num_host) + " of the device pool's " +
           std::to_string(num_blocks_total()) + ", " + std::to_string(num_host) + " host-resident) and its next " +
           std::to_string(num_new_tokens) + " tokens need " +
           std::to_string(blocks_.num_blocks_needed(seq.request_id, num_new_tokens)) + " more, but " + limit +
           "; raise kv_stream_blocks (with swap_space_bytes) or the KV cache size";
}

std::unique_ptr<KvCacheManager> make_paged_kv(int32_t num_blocks, int32_t block_size, bool prefix_caching,
                                              int32_t num_host_blocks, int64_t block_bytes,
                                              const KvStreamPolicy & stream) {
    return std::make_unique<PagedKv>(num_blocks, block_size, prefix_caching, num_host_blocks, block_bytes, stream);
}

}  // namespace cf
