"""Pure-Python reference of the native block manager: the test oracle, never shipped.

Same rules as native/src/core/block_manager.cpp, written for obviousness, not speed:
  - free list FIFO, initially 0..num_blocks-1; a block reaching ref 0 goes to the back;
  - token pos of a sequence sits at slot table[pos // block_size] * block_size + pos % block_size;
  - appending into a shared (ref > 1), partially filled last block first takes one fresh block
    (before any growth block) and records the copy (src, dst);
  - everything is checked before anything changes (all-or-nothing);
  - free() releases the last block first.
Errors are the package's exception classes, so results compare by type with the native view.
"""

from __future__ import annotations

from collections import deque

from pycacheflow.errors import InvalidArgumentError, NotFoundError, OutOfMemoryError


class RefBlockManager:
    """Reference block manager over ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1 or num_blocks * block_size > 2**31 - 1:
            raise InvalidArgumentError("num_blocks and block_size")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs = [0] * num_blocks
        self.free_list: deque[int] = deque(range(num_blocks))
        self.tables: dict[int, list[int]] = {}  # seq id -> block ids
        self.num_tokens: dict[int, int] = {}
        self.copies: list[tuple[int, int]] = []

    def num_free_blocks(self) -> int:
        return len(self.free_list)

    def _cow_due(self, seq_id: int) -> bool:
        blocks = self.tables.get(seq_id, [])
        partial = self.num_tokens.get(seq_id, 0) % self.block_size != 0
        return partial and self.refs[blocks[-1]] > 1

    def blocks_needed(self, seq_id: int, num_new_tokens: int) -> int:
        held = len(self.tables.get(seq_id, []))
        total = self.num_tokens.get(seq_id, 0) + num_new_tokens
        grow = -(-total // self.block_size) - held
        return grow + (1 if num_new_tokens > 0 and self._cow_due(seq_id) else 0)

    def can_allocate(self, seq_id: int, num_new_tokens: int) -> bool:
        if seq_id < 0 or num_new_tokens < 0:
            raise InvalidArgumentError("seq_id and num_new_tokens must be >= 0")
        return self.blocks_needed(seq_id, num_new_tokens) <= len(self.free_list)

    def _take(self) -> int:
        block_id = self.free_list.popleft()
        self.refs[block_id] = 1
        return block_id

    def _release(self, block_id: int) -> None:
        self.refs[block_id] -= 1
        if self.refs[block_id] == 0:
            self.free_list.append(block_id)

    def append_slots(self, seq_id: int, num_new_tokens: int) -> tuple[list[int], int]:
        """Returns (slot mapping, copies recorded by this call)."""
        if not self.can_allocate(seq_id, num_new_tokens):
            raise OutOfMemoryError("out of KV blocks")
        blocks = self.tables.setdefault(seq_id, [])
        start = self.num_tokens.setdefault(seq_id, 0)
        num_cow = 0
        if num_new_tokens > 0 and self._cow_due(seq_id):
            src, dst = blocks[-1], self._take()
            self.copies.append((src, dst))
            blocks[-1] = dst
            self._release(src)
            num_cow = 1
        while len(blocks) * self.block_size < start + num_new_tokens:
            blocks.append(self._take())
        self.num_tokens[seq_id] = start + num_new_tokens
        bs = self.block_size
        slots = [blocks[p // bs] * bs + p % bs for p in range(start, start + num_new_tokens)]
        return slots, num_cow

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        if parent_seq_id < 0 or child_seq_id < 0 or parent_seq_id == child_seq_id:
            raise InvalidArgumentError("bad seq ids")
        if parent_seq_id not in self.tables:
            raise NotFoundError(f"unknown seq_id {parent_seq_id}")
        if child_seq_id in self.tables:
            raise InvalidArgumentError(f"child_seq_id {child_seq_id} already exists")
        for block_id in self.tables[parent_seq_id]:
            self.refs[block_id] += 1
        self.tables[child_seq_id] = list(self.tables[parent_seq_id])
        self.num_tokens[child_seq_id] = self.num_tokens[parent_seq_id]

    def free(self, seq_id: int) -> None:
        if seq_id not in self.tables:
            raise NotFoundError(f"unknown seq_id {seq_id}")
        for block_id in reversed(self.tables.pop(seq_id)):
            self._release(block_id)
        del self.num_tokens[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        if seq_id not in self.tables:
            raise NotFoundError(f"unknown seq_id {seq_id}")
        return list(self.tables[seq_id])

    def ref_count(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise InvalidArgumentError(f"block_id {block_id}")
        return self.refs[block_id]
