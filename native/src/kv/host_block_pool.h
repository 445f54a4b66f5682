// host_block_pool.h - ids of the host (swap) block slots of the paged KV cache manager.
//
// A host slot holds one swapped-out device block: every layer's K and V rows of block_size tokens
// (llama_paged_block_bytes() bytes; the memory itself belongs to the engine's Swapper, slot h at
// offset h * block_bytes). This class only counts: which slots are free.
//
// Slots freed by a swap-in are not reusable in the same step: the plan runs every swap-out before
// every swap-in (step_plan.h), so a swap-out into a slot that a later swap-in of the same plan
// still reads would overwrite it. free() therefore parks slots until end_step().
//
// Thread-safety: none; the owner serializes all calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cf {

class HostBlockPool {
  public:
    // num_slots >= 0 (0: no swap space, every allocate fails).
    explicit HostBlockPool(int32_t num_slots);

    int32_t num_slots() const { return num_slots_; }
    int32_t num_free() const { return (int32_t) free_.size(); }
    // Slots holding a block or parked until end_step().
    int32_t num_used() const { return num_slots_ - num_free(); }

    // All-or-nothing: append n free slot ids to *out. False, touching nothing, if fewer are free.
    bool allocate(int32_t n, std::vector<int32_t> * out);
    // Give a slot back; it becomes free at the next end_step(). Call only with a used slot.
    void free(int32_t slot_id);
    // The plan that read the parked slots is built: they are free again.
    void end_step();

    // "" if consistent: every slot exactly once among free, parked and `held` (the slots the
    // owner's swapped tables hold), else the first violation.
    std::string check_invariants(const std::vector<int32_t> & held) const;

  private:
    int32_t num_slots_;
    std::vector<int32_t> free_;    // LIFO
    std::vector<int32_t> parked_;  // freed this step
};

}  // namespace cf
