// block_manager_prefix.cpp - BlockManager's prefix cache half: matching a prompt against the
// index, sharing the matched blocks, indexing committed blocks. See block_manager.h and
// prefix_cache.h for the contracts.
#include "core/block_manager.h"

#include <algorithm>
#include <cassert>

namespace cf {

PrefixMatch BlockManager::match_prefix(const int32_t * tokens, int32_t max_tokens) const {
    assert(cache_ != nullptr && max_tokens >= 0);
    const int32_t bs = block_size();
    PrefixMatch m;
    m.block_size = bs;
    int32_t parent = CF_BLOCK_ID_NONE;
    while (m.num_full_tokens() + bs <= max_tokens) {
        const int32_t block_id = cache_->find_full(m.last_hash, parent, tokens + m.num_full_tokens());
        if (block_id == CF_BLOCK_ID_NONE) {
            break;
        }
        m.block_ids.push_back(block_id);
        m.num_revived += pool_.ref_count(block_id) == 0 ? 1 : 0;
        m.last_hash = cache_->key(block_id);
        parent = block_id;
    }
    const int32_t rest = std::min(max_tokens - m.num_full_tokens(), bs);
    if (rest > 0) {
        const PartialHit hit = cache_->find_partial(m.last_hash, parent, tokens + m.num_full_tokens(), rest);
        if (hit.num_tokens > 0) {
            m.copy_src_block_id = hit.block_id;
            m.num_copy_tokens = hit.num_tokens;
            m.copy_src_free = pool_.ref_count(hit.block_id) == 0;
        }
    }
    return m;
}

int64_t BlockManager::num_blocks_needed(const PrefixMatch & m, int32_t num_tokens) const {
    assert(num_tokens >= m.num_tokens());
    const int64_t own = ((int64_t) num_tokens + block_size() - 1) / block_size() - (int64_t) m.block_ids.size();
    return own + m.num_revived + (m.copy_src_free ? 1 : 0);
}

void BlockManager::allocate_prefix(int64_t seq_id, const PrefixMatch & m, int32_t num_queried_tokens) {
    // Call only for a new sequence, with a match of this manager, within the free blocks.
    assert(cache_ != nullptr && seq_id >= 0 && find(seq_id) == nullptr);
    assert(pool_.can_allocate(num_blocks_needed(m, m.num_tokens())));
    stats_.num_queried_tokens += num_queried_tokens;
    stats_.num_hit_tokens += m.num_tokens();
    BlockTable & table = tables_[seq_id];
    // Shared blocks and the copy source are held before anything is allocated, so that the
    // allocation cannot evict them.
    for (int32_t block_id : m.block_ids) {
        share(block_id);
        table.block_ids.push_back(block_id);
    }
    table.num_tokens = m.num_full_tokens();
    table.num_hashed_blocks = (int32_t) m.block_ids.size();
    table.last_hash = m.last_hash;
    if (m.num_copy_tokens > 0) {
        share(m.copy_src_block_id);
        pinned_.push_back(m.copy_src_block_id);
        take_blocks(1, &table.block_ids);
        copies_.push_back({ m.copy_src_block_id, table.block_ids.back() });
        table.num_tokens += m.num_copy_tokens;
    }
}

void BlockManager::commit(int64_t seq_id, const int32_t * tokens, int32_t num_computed_tokens) {
    BlockTable * table = find_mut(seq_id);
    // Call only for a sequence that holds slots for every computed token.
    assert(cache_ != nullptr && table != nullptr && num_computed_tokens <= table->num_tokens);
    const int32_t bs = block_size();
    for (int32_t i = table->num_hashed_blocks; i < num_computed_tokens / bs; ++i) {
        commit_full_block(*table, i, tokens + (size_t) i * (size_t) bs);
    }
    const int32_t rows = num_computed_tokens - table->num_hashed_blocks * bs;
    if (rows > 0) {
        commit_partial_block(*table, tokens + (size_t) table->num_hashed_blocks * (size_t) bs, rows);
    }
}

// Block i of `table` is full and computed: index it under the chain, or, when another block holds
// the same tokens after the same prefix, move the table onto that block.
void BlockManager::commit_full_block(BlockTable & table, int32_t i, const int32_t * block_tokens) {
    const int32_t own = table.block_ids[(size_t) i];
    const int32_t parent = i > 0 ? table.block_ids[(size_t) i - 1] : CF_BLOCK_ID_NONE;
    const uint64_t parent_hash = table.last_hash;
    const uint64_t key = cache_->key_of(parent_hash, block_tokens);
    table.last_hash = key;
    table.num_hashed_blocks = i + 1;
    if (parent != CF_BLOCK_ID_NONE && !cache_->contains(parent)) {
        cache_->drop(own);  // its prefix is not indexed (a hash collision above): neither is it
        return;
    }
    const int32_t found = cache_->find_full(parent_hash, parent, block_tokens);
    if (found == own) {
        return;  // shared from the cache, or indexed by another holder
    }
    if (found != CF_BLOCK_ID_NONE) {
        // Same prefix, same tokens, hence the same KV (the attention is invariant): keep one copy.
        share(found);
        table.block_ids[(size_t) i] = found;
        cache_->drop(own);
        pool_.decref(own, free_pos(own));
        return;
    }
    if (cache_->key_taken(key)) {
        cache_->drop(own);  // a hash collision with another prefix: this block stays out
        return;
    }
    if (cache_->contains(own) && cache_->num_rows(own) == block_size()) {
        return;  // indexed under another chain position: cannot happen, see check_invariants
    }
    cache_->put(own, parent_hash, parent, block_tokens, block_size());
}

void BlockManager::commit_partial_block(BlockTable & table, const int32_t * block_tokens, int32_t num_rows) {
    const int32_t i = table.num_hashed_blocks;
    const int32_t own = table.block_ids[(size_t) i];
    const int32_t parent = i > 0 ? table.block_ids[(size_t) i - 1] : CF_BLOCK_ID_NONE;
    if (parent != CF_BLOCK_ID_NONE && !cache_->contains(parent)) {
        return;
    }
    if (cache_->num_rows(own) >= num_rows) {
        return;  // indexed already (by another holder of a forked block)
    }
    cache_->put(own, table.last_hash, parent, block_tokens, num_rows);
}

PrefixCacheStats BlockManager::prefix_cache_stats() const {
    PrefixCacheStats out = stats_;
    out.num_cached_blocks = cache_ ? cache_->num_entries() : 0;
    return out;
}

std::string BlockManager::check_cache_invariants(const std::vector<int32_t> & holders,
                                                 const std::vector<int32_t> & fill) const {
    std::string error = cache_->check_invariants();
    if (!error.empty()) {
        return error;
    }
    for (const auto & [seq_id, table] : tables_) {
        if (table.num_hashed_blocks > table.num_tokens / block_size()) {
            return "seq " + std::to_string(seq_id) + ": " + std::to_string(table.num_hashed_blocks) +
                   " hashed blocks but " + std::to_string(table.num_tokens) + " tokens";
        }
    }
    for (int32_t block_id = 0; block_id < pool_.num_blocks(); ++block_id) {
        const size_t b = (size_t) block_id;
        if (holders[b] > 0 && fill[b] > 0 && fill[b] < cache_->num_rows(block_id)) {
            return "block " + std::to_string(block_id) + " is indexed with " + std::to_string(cache_->num_rows(block_id)) +
                   " rows but its holders fill " + std::to_string(fill[b]);
        }
    }
    bool seen_cached = false;
    for (int32_t block_id : pool_.free_list()) {
        if (seen_cached && !cache_->contains(block_id)) {
            return "free list: uncached block " + std::to_string(block_id) +
                   " behind a cached one (it would outlive cached blocks)";
        }
        seen_cached = seen_cached || cache_->contains(block_id);
    }
    return "";
}

}  // namespace cf
