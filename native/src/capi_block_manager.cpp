// capi_block_manager.cpp - C shims of the block manager section of cacheflow.h: check arguments,
// call cf::BlockManager, turn failures into a cf_status plus the thread's last error (shared with
// capi.cpp through capi_internal.h). No exception crosses the ABI.
#include "cacheflow.h"
#include "capi_internal.h"
#include "core/block_manager.h"
#include "core/error.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

using cf::capi::guarded;
using cf::capi::require;

struct cf_block_manager {
    cf_block_manager(int32_t num_blocks, int32_t block_size) : manager(num_blocks, block_size) {}

    cf::BlockManager manager;
    std::vector<int32_t> slot_mapping;  // scratch of append_slots, reused between calls
    std::vector<cf::BlockCopy> copies;  // scratch of take_copies
};

namespace {

void require_seq_id(int64_t seq_id, const char * name) {
    if (seq_id < 0) {
        cf::fail_invalid(std::string(name) + " must be >= 0, got " + std::to_string(seq_id));
    }
}

void require_count(int32_t count, const char * name) {
    if (count < 0) {
        cf::fail_invalid(std::string(name) + " must be >= 0, got " + std::to_string(count));
    }
}

[[noreturn]] void fail_buffer_too_small(const char * name, int32_t capacity, int64_t needed) {
    throw cf::Error(CF_STATUS_BUFFER_TOO_SMALL,
                    std::string(name) + ": capacity " + std::to_string(capacity) + " < " + std::to_string(needed));
}

const cf::BlockTable & require_table(const cf::BlockManager & manager, int64_t seq_id) {
    const cf::BlockTable * table = manager.find(seq_id);
    if (table == nullptr) {
        throw cf::Error(CF_STATUS_NOT_FOUND, "unknown seq_id " + std::to_string(seq_id));
    }
    return *table;
}

}  // namespace

extern "C" {

cf_status cf_block_manager_init(int32_t num_blocks, int32_t block_size, cf_block_manager_t * out_mgr) {
    if (out_mgr != nullptr) {
        *out_mgr = nullptr;
    }
    return guarded("cf_block_manager_init", [&] {
        require(out_mgr != nullptr, "out_mgr is NULL");
        if (num_blocks < 1 || block_size < 1 || (int64_t) num_blocks * block_size > INT32_MAX) {
            cf::fail_invalid("num_blocks (" + std::to_string(num_blocks) + ") and block_size (" +
                             std::to_string(block_size) + ") must be >= 1 with a product that fits int32");
        }
        *out_mgr = new cf_block_manager(num_blocks, block_size);
    });
}

void cf_block_manager_free(cf_block_manager_t mgr) {
    delete mgr;  // destructors of std containers do not throw
}

cf_status cf_block_manager_num_free_blocks(cf_block_manager_t mgr, int32_t * out_num_free_blocks) {
    return guarded("cf_block_manager_num_free_blocks", [&] {
        require(mgr != nullptr && out_num_free_blocks != nullptr, "mgr and out_num_free_blocks must be non-NULL");
        *out_num_free_blocks = mgr->manager.num_free_blocks();
    });
}

cf_status cf_block_manager_can_allocate(cf_block_manager_t mgr, int64_t seq_id, int32_t num_new_tokens,
                                        int32_t * out_can_allocate) {
    return guarded("cf_block_manager_can_allocate", [&] {
        require(mgr != nullptr && out_can_allocate != nullptr, "mgr and out_can_allocate must be non-NULL");
        require_seq_id(seq_id, "seq_id");
        require_count(num_new_tokens, "num_new_tokens");
        *out_can_allocate = mgr->manager.can_allocate(seq_id, num_new_tokens) ? 1 : 0;
    });
}

cf_status cf_block_manager_append_slots(cf_block_manager_t mgr, int64_t seq_id, int32_t num_new_tokens,
                                        int32_t * slot_mapping, int32_t capacity, int32_t * out_num_cow) {
    return guarded("cf_block_manager_append_slots", [&] {
        require(mgr != nullptr, "mgr is NULL");
        require(slot_mapping != nullptr || capacity == 0, "slot_mapping is NULL");
        require_seq_id(seq_id, "seq_id");
        require_count(num_new_tokens, "num_new_tokens");
        if (capacity < num_new_tokens) {
            fail_buffer_too_small("slot_mapping", capacity, num_new_tokens);
        }
        cf::BlockManager & manager = mgr->manager;
        const size_t num_copies_before = manager.pending_copies().size();
        mgr->slot_mapping.clear();
        if (!manager.append_slots(seq_id, num_new_tokens, &mgr->slot_mapping)) {
            throw cf::Error(CF_STATUS_OUT_OF_MEMORY,
                            "out of KV blocks: seq " + std::to_string(seq_id) + " needs " +
                                std::to_string(manager.num_blocks_needed(seq_id, num_new_tokens)) + " blocks for " +
                                std::to_string(num_new_tokens) + " new tokens, " +
                                std::to_string(manager.num_free_blocks()) + " free");
        }
        std::copy(mgr->slot_mapping.begin(), mgr->slot_mapping.end(), slot_mapping);
        if (out_num_cow != nullptr) {
            *out_num_cow = (int32_t) (manager.pending_copies().size() - num_copies_before);
        }
    });
}

cf_status cf_block_manager_take_copies(cf_block_manager_t mgr, int32_t * src_block_ids, int32_t * dst_block_ids,
                                       int32_t capacity, int32_t * out_num_copies) {
    return guarded("cf_block_manager_take_copies", [&] {
        require(mgr != nullptr && out_num_copies != nullptr, "mgr and out_num_copies must be non-NULL");
        require(capacity == 0 || (src_block_ids != nullptr && dst_block_ids != nullptr),
                "src_block_ids and dst_block_ids must be non-NULL");
        require_count(capacity, "capacity");
        const int32_t num_pending = (int32_t) mgr->manager.pending_copies().size();
        *out_num_copies = num_pending;
        if (capacity < num_pending) {
            fail_buffer_too_small("copies", capacity, num_pending);
        }
        mgr->copies.clear();
        mgr->manager.take_copies(&mgr->copies);
        for (size_t i = 0; i < mgr->copies.size(); ++i) {
            src_block_ids[i] = mgr->copies[i].src_block_id;
            dst_block_ids[i] = mgr->copies[i].dst_block_id;
        }
    });
}

cf_status cf_block_manager_fork(cf_block_manager_t mgr, int64_t parent_seq_id, int64_t child_seq_id) {
    return guarded("cf_block_manager_fork", [&] {
        require(mgr != nullptr, "mgr is NULL");
        require_seq_id(parent_seq_id, "parent_seq_id");
        require_seq_id(child_seq_id, "child_seq_id");
        require(child_seq_id != parent_seq_id, "child_seq_id must differ from parent_seq_id");
        require_table(mgr->manager, parent_seq_id);
        if (mgr->manager.find(child_seq_id) != nullptr) {
            cf::fail_invalid("child_seq_id " + std::to_string(child_seq_id) + " already exists");
        }
        mgr->manager.fork(parent_seq_id, child_seq_id);
    });
}

cf_status cf_block_manager_free_seq(cf_block_manager_t mgr, int64_t seq_id) {
    return guarded("cf_block_manager_free_seq", [&] {
        require(mgr != nullptr, "mgr is NULL");
        require_table(mgr->manager, seq_id);
        mgr->manager.free(seq_id);
    });
}

cf_status cf_block_manager_block_table(cf_block_manager_t mgr, int64_t seq_id, int32_t * block_ids, int32_t capacity,
                                       int32_t * out_num_blocks) {
    return guarded("cf_block_manager_block_table", [&] {
        require(mgr != nullptr && out_num_blocks != nullptr, "mgr and out_num_blocks must be non-NULL");
        require(block_ids != nullptr || capacity == 0, "block_ids is NULL");
        require_count(capacity, "capacity");
        const cf::BlockTable & table = require_table(mgr->manager, seq_id);
        *out_num_blocks = table.num_blocks();
        if (capacity < table.num_blocks()) {
            fail_buffer_too_small("block_ids", capacity, table.num_blocks());
        }
        mgr->manager.write_block_table(seq_id, block_ids, capacity);
    });
}

cf_status cf_block_manager_ref_count(cf_block_manager_t mgr, int32_t block_id, int32_t * out_ref_count) {
    return guarded("cf_block_manager_ref_count", [&] {
        require(mgr != nullptr && out_ref_count != nullptr, "mgr and out_ref_count must be non-NULL");
        const cf::BlockPool & pool = mgr->manager.pool();
        if (!pool.is_valid(block_id)) {
            cf::fail_invalid("block_id " + std::to_string(block_id) + " outside [0, " +
                             std::to_string(pool.num_blocks()) + ")");
        }
        *out_ref_count = pool.ref_count(block_id);
    });
}

cf_status cf_block_manager_check_invariants(cf_block_manager_t mgr) {
    return guarded("cf_block_manager_check_invariants", [&] {
        require(mgr != nullptr, "mgr is NULL");
        const std::string violation = mgr->manager.check_invariants();
        if (!violation.empty()) {
            throw cf::Error(CF_STATUS_INTERNAL, "block manager invariant broken: " + violation);
        }
    });
}

cf_status cf_block_manager_dump(cf_block_manager_t mgr, char * buf, int32_t capacity, int32_t * out_len) {
    return guarded("cf_block_manager_dump", [&] {
        require(mgr != nullptr && out_len != nullptr, "mgr and out_len must be non-NULL");
        require(buf != nullptr || capacity == 0, "buf is NULL");
        require_count(capacity, "capacity");
        const std::string text = mgr->manager.dump();
        *out_len = (int32_t) std::min<size_t>(text.size(), INT32_MAX);
        if ((size_t) capacity < text.size()) {
            fail_buffer_too_small("buf", capacity, (int64_t) text.size());
        }
        std::memcpy(buf, text.data(), text.size());
    });
}

}  // extern "C"
