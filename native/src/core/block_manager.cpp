#include "core/block_manager.h"

#include <algorithm>
#include <cassert>
#include <sstream>

namespace cf {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

}  // namespace

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, bool prefix_caching, BlockHashFn hash)
    : pool_(num_blocks, block_size),
      cache_(prefix_caching ? std::make_unique<PrefixCache>(num_blocks, block_size, hash) : nullptr) {}

void BlockManager::take_blocks(int32_t n, std::vector<int32_t> * out) {
    const size_t first = out->size();
    const bool ok = pool_.allocate(n, out);
    assert(ok);  // call only within a checked budget
    (void) ok;
    if (cache_) {
        for (size_t i = first; i < out->size(); ++i) {
            stats_.num_evictions += cache_->on_allocate((*out)[i]) ? 1 : 0;
        }
    }
}

FreePos BlockManager::free_pos(int32_t block_id) const {
    return cache_ == nullptr || cache_->contains(block_id) ? FreePos::BACK : FreePos::FRONT;
}

void BlockManager::share(int32_t block_id) {
    if (pool_.ref_count(block_id) == 0) {
        pool_.revive(block_id);
    } else {
        pool_.incref(block_id);
    }
}

const BlockTable * BlockManager::find(int64_t seq_id) const {
    auto it = tables_.find(seq_id);
    return it == tables_.end() ? nullptr : &it->second;
}

BlockTable * BlockManager::find_mut(int64_t seq_id) {
    auto it = tables_.find(seq_id);
    return it == tables_.end() ? nullptr : &it->second;
}

int32_t BlockManager::rows_filled(const BlockTable & table, int32_t i) const {
    assert(i >= 0 && i < table.num_blocks());
    return i + 1 < table.num_blocks() ? block_size() : table.num_tokens - i * block_size();
}

bool BlockManager::needs_copy_on_write(const BlockTable & table) const {
    const bool partial = table.num_tokens % block_size() != 0;
    return partial && pool_.ref_count(table.block_ids.back()) > 1;
}

int64_t BlockManager::num_blocks_needed(int64_t seq_id, int32_t num_new_tokens) const {
    assert(num_new_tokens >= 0);
    const BlockTable * table = find(seq_id);
    if (table == nullptr) {
        return ceil_div(num_new_tokens, block_size());
    }
    const int64_t num_tokens_after = (int64_t) table->num_tokens + num_new_tokens;
    int64_t needed = ceil_div(num_tokens_after, block_size()) - table->num_blocks();
    if (needed > 0 && table->next_block != CF_BLOCK_ID_NONE) {
        needed -= 1;  // the first new block is the one reserved (reserve_next_block)
    }
    if (num_new_tokens > 0 && needs_copy_on_write(*table)) {
        needed += 1;
    }
    return needed;
}

// See the diagram above the declaration in block_manager.h.
bool BlockManager::append_slots(int64_t seq_id, int32_t num_new_tokens, std::vector<int32_t> * slot_mapping) {
    // Call only with a valid id and count; running short of blocks is a result, not a bug.
    assert(seq_id >= 0 && num_new_tokens >= 0);
    int64_t needed = num_blocks_needed(seq_id, num_new_tokens);
    if (!pool_.can_allocate(needed)) {
        return false;  // nothing touched yet: all-or-nothing
    }
    // From here on nothing can fail. Within the budget checked above, num_tokens stays
    // <= num_blocks * block_size, which fits int32 (BlockPool's constructor).
    BlockTable & table = tables_[seq_id];  // creates the table of a new sequence
    if (num_new_tokens > 0 && needs_copy_on_write(table)) {
        // The copy's block is taken before the growth blocks (the reference model relies on it).
        std::vector<int32_t> fresh;
        take_blocks(1, &fresh);
        const int32_t src_block_id = table.block_ids.back();
        copies_.push_back({ src_block_id, fresh[0] });
        table.block_ids.back() = fresh[0];
        pool_.decref(src_block_id);  // other holders remain: its ref count was > 1
        needed -= 1;
    }
    const int32_t bs = block_size();
    const int32_t end = table.num_tokens + num_new_tokens;
    if (table.next_block != CF_BLOCK_ID_NONE && ceil_div(end, bs) > table.num_blocks()) {
        table.block_ids.push_back(table.next_block);  // reserved ahead: the first block of the growth
        table.next_block = CF_BLOCK_ID_NONE;
    }
    take_blocks((int32_t) needed, &table.block_ids);

    if (slot_mapping != nullptr) {
        slot_mapping->reserve(slot_mapping->size() + (size_t) num_new_tokens);
        for (int32_t pos = table.num_tokens; pos < end; ++pos) {
            slot_mapping->push_back(table.block_ids[(size_t) (pos / bs)] * bs + pos % bs);
        }
    }
    table.num_tokens = end;
    return true;
}

int32_t BlockManager::reserve_next_block(int64_t seq_id) {
    BlockTable * table = find_mut(seq_id);
    assert(table != nullptr && table->num_tokens % block_size() == 0);
    if (table->next_block == CF_BLOCK_ID_NONE && pool_.can_allocate(1)) {
        std::vector<int32_t> fresh;
        take_blocks(1, &fresh);
        table->next_block = fresh[0];
    }
    return table->next_block;
}

void BlockManager::fork(int64_t parent_seq_id, int64_t child_seq_id) {
    // Call only when the parent exists and the child id is free.
    assert(child_seq_id >= 0 && child_seq_id != parent_seq_id);
    assert(find(parent_seq_id) != nullptr && find(child_seq_id) == nullptr);
    BlockTable child = *find(parent_seq_id);  // copied before emplace can rehash the map
    child.next_block = CF_BLOCK_ID_NONE;      // the reserved block stays the parent's
    for (int32_t block_id : child.block_ids) {
        assert(!is_host_entry(block_id));  // a host slot has one holder: sequences that fork are never streamed
        pool_.incref(block_id);
    }
    tables_.emplace(child_seq_id, std::move(child));
}

const BlockTable & BlockManager::allocate_table(int64_t seq_id, int32_t num_tokens) {
    assert(seq_id >= 0 && num_tokens >= 1 && find(seq_id) == nullptr);
    BlockTable & table = tables_[seq_id];
    take_blocks((num_tokens + block_size() - 1) / block_size(), &table.block_ids);
    table.num_tokens = num_tokens;
    return table;
}

void BlockManager::free(int64_t seq_id) {
    // Call only when the sequence exists.
    auto it = tables_.find(seq_id);
    assert(it != tables_.end());
    const int32_t next_block = it->second.next_block;
    if (next_block != CF_BLOCK_ID_NONE) {  // reserved ahead, unused: it goes first, before the last block
        pool_.decref(next_block, free_pos(next_block));
    }
    const std::vector<int32_t> & block_ids = it->second.block_ids;
    for (auto rit = block_ids.rbegin(); rit != block_ids.rend(); ++rit) {
        if (is_host_entry(*rit)) {
            num_host_entries_ -= 1;  // its host slot is the caller's
            continue;
        }
        pool_.decref(*rit, free_pos(*rit));
    }
    tables_.erase(it);
}

void BlockManager::free_deferred(int64_t seq_id) {
    // Call only when the sequence exists.
    auto it = tables_.find(seq_id);
    assert(it != tables_.end());
    if (it->second.next_block != CF_BLOCK_ID_NONE) {
        deferred_.push_back(it->second.next_block);  // a decode launched ahead may still write it
    }
    const std::vector<int32_t> & block_ids = it->second.block_ids;
    for (auto rit = block_ids.rbegin(); rit != block_ids.rend(); ++rit) {
        if (is_host_entry(*rit)) {
            num_host_entries_ -= 1;
        } else {
            deferred_.push_back(*rit);
        }
    }
    tables_.erase(it);
}

int32_t BlockManager::demote(int64_t seq_id, int32_t i, int32_t host_slot) {
    BlockTable * table = find_mut(seq_id);
    assert(table != nullptr && i >= 0 && i + 1 < table->num_blocks() && host_slot >= 0);
    const int32_t block_id = table->block_ids[(size_t) i];
    assert(!is_host_entry(block_id) && pool_.ref_count(block_id) == 1 && rows_filled(*table, i) == block_size());
    table->block_ids[(size_t) i] = host_entry(host_slot);
    deferred_.push_back(block_id);  // the copy to the host reads it during this step
    num_host_entries_ += 1;
    return block_id;
}

int32_t BlockManager::promote(int64_t seq_id, int32_t i) {
    BlockTable * table = find_mut(seq_id);
    assert(table != nullptr && i >= 0 && i < table->num_blocks() && is_host_entry(table->block_ids[(size_t) i]));
    std::vector<int32_t> fresh;
    take_blocks(1, &fresh);
    table->block_ids[(size_t) i] = fresh[0];
    num_host_entries_ -= 1;
    return fresh[0];
}

void BlockManager::host_slots(int64_t seq_id, std::vector<int32_t> * out) const {
    const BlockTable * table = find(seq_id);
    if (table == nullptr) {
        return;
    }
    for (int32_t entry : table->block_ids) {
        if (is_host_entry(entry)) {
            out->push_back(host_slot_of(entry));
        }
    }
}

void BlockManager::all_host_slots(std::vector<int32_t> * out) const {
    for (const auto & entry : tables_) {
        host_slots(entry.first, out);
    }
}

int32_t BlockManager::num_blocks_freed_by_release() const {
    std::unordered_map<int32_t, int32_t> held;  // deferred holds per block
    for (int32_t block_id : deferred_) {
        held[block_id] += 1;
    }
    int32_t n = 0;
    for (const auto & [block_id, count] : held) {
        n += pool_.ref_count(block_id) == count ? 1 : 0;
    }
    return n;
}

void BlockManager::release_deferred() {
    for (int32_t block_id : deferred_) {
        pool_.decref(block_id, free_pos(block_id));
    }
    deferred_.clear();
}

void BlockManager::write_block_table(int64_t seq_id, int32_t * row, int32_t max_blocks) const {
    const BlockTable * table = find(seq_id);
    assert(table != nullptr && row != nullptr && max_blocks >= table->num_blocks());
    std::copy(table->block_ids.begin(), table->block_ids.end(), row);
    std::fill(row + table->num_blocks(), row + max_blocks, CF_BLOCK_ID_NONE);
}

void BlockManager::take_copies(std::vector<BlockCopy> * out) {
    assert(out != nullptr);
    out->insert(out->end(), copies_.begin(), copies_.end());
    copies_.clear();
    for (int32_t block_id : pinned_) {
        pool_.decref(block_id, free_pos(block_id));
    }
    pinned_.clear();
}

int64_t BlockManager::num_rows_filled() const {
    int64_t rows = 0;
    std::vector<int32_t> & shared = shared_blocks_;  // blocks with several holders: once, at the fullest fill
    shared.clear();
    for (const auto & [seq_id, table] : tables_) {
        (void) seq_id;
        for (int32_t i = 0; i < table.num_blocks(); ++i) {
            const int32_t block_id = table.block_ids[(size_t) i];
            if (is_host_entry(block_id)) {
                continue;
            }
            if (pool_.ref_count(block_id) == 1) {
                rows += rows_filled(table, i);
                continue;
            }
            if (shared_fill_.empty()) {
                shared_fill_.assign((size_t) pool_.num_blocks(), 0);
            }
            int32_t & fill = shared_fill_[(size_t) block_id];
            if (fill == 0) {
                shared.push_back(block_id);
            }
            fill = std::max(fill, rows_filled(table, i));
        }
    }
    for (int32_t block_id : shared) {
        rows += shared_fill_[(size_t) block_id];
        shared_fill_[(size_t) block_id] = 0;
    }
    return rows;
}

std::string BlockManager::check_invariants() const {
    std::string error = pool_.check_invariants();
    if (!error.empty()) {
        return error;
    }
    const size_t num_blocks = (size_t) pool_.num_blocks();
    std::vector<int32_t> holders(num_blocks, 0);
    std::vector<int32_t> fill(num_blocks, 0);     // rows filled as holders see it; 0 = no holder yet
    std::vector<int32_t> stamp(num_blocks, 0);    // 1 + index of the last table seen holding it
    int32_t table_index = 0;
    int32_t num_host_entries = 0;
    for (const auto & [seq_id, table] : tables_) {
        table_index += 1;
        const std::string seq = "seq " + std::to_string(seq_id);
        if (seq_id < 0 || table.num_tokens < 0) {
            return seq + ": negative seq id or num_tokens " + std::to_string(table.num_tokens);
        }
        if (table.num_blocks() != ceil_div(table.num_tokens, block_size())) {
            return seq + ": " + std::to_string(table.num_blocks()) + " blocks for " +
                   std::to_string(table.num_tokens) + " tokens (block_size " + std::to_string(block_size()) + ")";
        }
        for (int32_t i = 0; i < table.num_blocks(); ++i) {
            const int32_t block_id = table.block_ids[(size_t) i];
            if (is_host_entry(block_id)) {
                num_host_entries += 1;
                if (i + 1 == table.num_blocks() || rows_filled(table, i) != block_size()) {
                    return seq + ": host entry " + std::to_string(i) + " is the last or a partial block";
                }
                continue;
            }
            const std::string block = seq + ": block " + std::to_string(block_id);
            if (!pool_.is_valid(block_id)) {
                return block + " is not a valid block id";
            }
            if (stamp[(size_t) block_id] == table_index) {
                return block + " appears twice in the table";
            }
            stamp[(size_t) block_id] = table_index;
            holders[(size_t) block_id] += 1;
            const int32_t rows = rows_filled(table, i);
            if (fill[(size_t) block_id] != 0 && fill[(size_t) block_id] != rows) {
                return block + " has " + std::to_string(rows) + " rows filled, another holder sees " +
                       std::to_string(fill[(size_t) block_id]) + " (a shared block was written)";
            }
            fill[(size_t) block_id] = rows;
        }
        if (table.next_block != CF_BLOCK_ID_NONE) {
            const std::string block = seq + ": next block " + std::to_string(table.next_block);
            if (!pool_.is_valid(table.next_block) || table.num_tokens % block_size() != 0) {
                return block + " is not a valid block id, or the last block is not full";
            }
            if (stamp[(size_t) table.next_block] == table_index) {
                return block + " is also in the table";
            }
            stamp[(size_t) table.next_block] = table_index;
            holders[(size_t) table.next_block] += 1;
        }
    }
    if (num_host_entries != num_host_entries_) {
        return std::to_string(num_host_entries) + " host entries in the tables, " + std::to_string(num_host_entries_) +
               " counted";
    }
    for (int32_t block_id : pinned_) {
        if (!pool_.is_valid(block_id)) {
            return "pinned block " + std::to_string(block_id) + " is not a valid block id";
        }
        holders[(size_t) block_id] += 1;
    }
    for (int32_t block_id : deferred_) {
        if (!pool_.is_valid(block_id)) {
            return "deferred block " + std::to_string(block_id) + " is not a valid block id";
        }
        holders[(size_t) block_id] += 1;
    }
    for (size_t block_id = 0; block_id < num_blocks; ++block_id) {
        if (holders[block_id] != pool_.ref_count((int32_t) block_id)) {
            return "block " + std::to_string(block_id) + " has ref count " +
                   std::to_string(pool_.ref_count((int32_t) block_id)) + " but " + std::to_string(holders[block_id]) +
                   " tables, pins and deferred frees hold it";
        }
    }
    for (const BlockCopy & copy : copies_) {
        if (!pool_.is_valid(copy.src_block_id) || !pool_.is_valid(copy.dst_block_id) ||
            copy.src_block_id == copy.dst_block_id) {
            return "bad pending copy " + std::to_string(copy.src_block_id) + " -> " +
                   std::to_string(copy.dst_block_id);
        }
    }
    return cache_ ? check_cache_invariants(holders, fill) : "";
}

std::string BlockManager::dump() const {
    std::vector<int64_t> seq_ids;
    seq_ids.reserve(tables_.size());
    for (const auto & entry : tables_) {
        seq_ids.push_back(entry.first);
    }
    std::sort(seq_ids.begin(), seq_ids.end());
    std::ostringstream os;
    os << "BlockManager(num_seqs=" << seq_ids.size() << ", pending_copies=" << copies_.size() << ")\n"
       << pool_.dump();
    for (int64_t seq_id : seq_ids) {
        const BlockTable & table = tables_.at(seq_id);
        os << "  seq " << seq_id << ": num_tokens=" << table.num_tokens << " blocks=[";
        for (int32_t i = 0; i < table.num_blocks(); ++i) {
            const int32_t entry = table.block_ids[(size_t) i];
            os << (i ? " " : "");
            if (is_host_entry(entry)) {
                os << "h" << host_slot_of(entry);
            } else {
                os << entry;
            }
        }
        os << "]";
        if (table.next_block != CF_BLOCK_ID_NONE) {
            os << " next=" << table.next_block;
        }
        os << "\n";
    }
    for (const BlockCopy & copy : copies_) {
        os << "  copy " << copy.src_block_id << " -> " << copy.dst_block_id << "\n";
    }
    if (!deferred_.empty()) {  // held for a swap-out's copy until release_deferred()
        os << "  deferred free:";
        for (int32_t block_id : deferred_) {
            os << " " << block_id;
        }
        os << "\n";
    }
    if (cache_) {
        os << cache_->dump();
    }
    return os.str();
}

}  // namespace cf
