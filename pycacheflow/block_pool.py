"""Typed view of the native block manager (paged KV bookkeeping), for tests and tools.

The state lives in native code (``native/src/core/block_manager.cpp``, C ABI
``cf_block_manager_*`` in cacheflow.h); this module converts arguments and results and
re-implements nothing. The engine uses the native manager directly; Python never runs it in the
hot path.

Rules, as the native side implements them: a sequence's token ``pos`` sits at slot
``table[pos // block_size] * block_size + pos % block_size``; the free list is FIFO; after
``fork`` parent and child share blocks; appending into a shared, partially filled last block
moves the sequence to a fresh block and records a ``BlockCopy`` (copy-on-write) that the
executor performs before writing that step's slots. Every failed call changes nothing.

Importing this module loads libcacheflow.so and raises ImportError if it is missing.
Not thread-safe: one ``BlockManager`` must not be used from two threads at once.
"""

from __future__ import annotations

from typing import NamedTuple

from pycacheflow import errors
from pycacheflow._native import _check, ffi, lib

BLOCK_ID_NONE: int = lib.CF_BLOCK_ID_NONE  # pads block tables; never a valid block id

_INITIAL_CAPACITY = 64  # first guess for variable-length results; grown on BUFFER_TOO_SMALL


class AllocResult(NamedTuple):
    """Result of ``BlockManager.append_slots``.

    Attributes:
        slot_mapping: [num_new_tokens] int32 slot ids (block_id * block_size + row), in token order.
        num_copies: copy-on-write copies recorded by the call (0 or 1); see ``take_copies``.
    """

    slot_mapping: list[int]
    num_copies: int


class BlockCopy(NamedTuple):
    """One pending copy-on-write: all block_size rows of ``src_block_id`` into ``dst_block_id``."""

    src_block_id: int
    dst_block_id: int


class BlockManager:
    """Owning handle of a native block manager (``cf_block_manager_t``).

    Args:
        num_blocks: blocks in the pool (>= 1).
        block_size: tokens per block (>= 1); num_blocks * block_size must fit int32.

    Raises:
        InvalidArgumentError: a size out of range.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        out = ffi.new("cf_block_manager_t *")
        _check(lib.cf_block_manager_init(num_blocks, block_size, out))
        self._handle = ffi.gc(out[0], lib.cf_block_manager_free)
        self.num_blocks = num_blocks
        self.block_size = block_size

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free the native manager now. Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            ffi.release(handle)

    def __enter__(self) -> BlockManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _h(self) -> object:
        if self._handle is None:
            raise errors.InvalidArgumentError("block manager is closed")
        return self._handle

    # ------------------------------------------------------------------ queries (no mutation)

    def num_free_blocks(self) -> int:
        """Blocks in the free list, in [0, num_blocks]."""
        out = ffi.new("int32_t *")
        _check(lib.cf_block_manager_num_free_blocks(self._h(), out))
        return out[0]

    def can_allocate(self, seq_id: int, num_new_tokens: int) -> bool:
        """Whether ``append_slots(seq_id, num_new_tokens)`` would succeed now.

        Args:
            seq_id: sequence id (>= 0); an unknown id counts as an empty sequence.
            num_new_tokens: tokens to add (>= 0).

        Returns:
            True if the free blocks cover the growth plus a due copy-on-write block.

        Raises:
            InvalidArgumentError: a negative argument.
        """
        out = ffi.new("int32_t *")
        _check(lib.cf_block_manager_can_allocate(self._h(), seq_id, num_new_tokens, out))
        return bool(out[0])

    def block_table(self, seq_id: int, max_blocks: int | None = None) -> list[int]:
        """The sequence's block ids in token order.

        Args:
            seq_id: an existing sequence id.
            max_blocks: pad with BLOCK_ID_NONE to this length ([max_blocks] int32, the layout
                the executor takes); None = no padding.

        Returns:
            [num_blocks] (or [max_blocks]) int32 block ids.

        Raises:
            NotFoundError: unknown seq_id.
            BufferTooSmallError: max_blocks < blocks held.
        """
        capacity = _INITIAL_CAPACITY if max_blocks is None else max_blocks
        while True:
            buf = ffi.new("int32_t[]", max(capacity, 1))
            out = ffi.new("int32_t *")
            try:
                _check(lib.cf_block_manager_block_table(self._h(), seq_id, buf, capacity, out))
            except errors.BufferTooSmallError:
                if max_blocks is not None:
                    raise
                capacity = max(out[0], 2 * capacity)
                continue
            return ffi.unpack(buf, out[0] if max_blocks is None else max_blocks)

    def ref_count(self, block_id: int) -> int:
        """Holders of ``block_id`` (0 = free).

        Raises:
            InvalidArgumentError: block_id outside [0, num_blocks).
        """
        out = ffi.new("int32_t *")
        _check(lib.cf_block_manager_ref_count(self._h(), block_id, out))
        return out[0]

    def check_invariants(self) -> None:
        """Check free + used == total, ref counts == holders, blocks per table, unwritten sharing.

        Raises:
            InternalError: an invariant is broken; the message names the first violation.
        """
        _check(lib.cf_block_manager_check_invariants(self._h()))

    def dump(self) -> str:
        """Human-readable state: free list, ref counts, tables by seq id, pending copies."""
        capacity = 4096
        while True:
            buf = ffi.new("char[]", capacity)
            out = ffi.new("int32_t *")
            try:
                _check(lib.cf_block_manager_dump(self._h(), buf, capacity, out))
            except errors.BufferTooSmallError:
                capacity = max(out[0], 2 * capacity)
                continue
            return ffi.unpack(buf, out[0]).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ mutations

    def append_slots(self, seq_id: int, num_new_tokens: int) -> AllocResult:
        """Give the next ``num_new_tokens`` tokens of ``seq_id`` a slot each (mutates).

        Creates the sequence if unknown (``num_new_tokens=0`` only creates it). Allocates blocks
        as needed, and one copy-on-write block if the last block is shared and partially filled.

        Args:
            seq_id: sequence id (>= 0).
            num_new_tokens: tokens to add (>= 0).

        Returns:
            The slot mapping and the number of copies recorded.

        Raises:
            OutOfMemoryError: not enough free blocks; nothing changed.
            InvalidArgumentError: a negative argument.
        """
        slots = ffi.new("int32_t[]", max(num_new_tokens, 1))
        num_copies = ffi.new("int32_t *")
        _check(
            lib.cf_block_manager_append_slots(
                self._h(), seq_id, num_new_tokens, slots, max(num_new_tokens, 0), num_copies
            )
        )
        return AllocResult(ffi.unpack(slots, num_new_tokens), num_copies[0])

    def take_copies(self) -> list[BlockCopy]:
        """Remove and return the pending copy-on-write copies, oldest first (mutates)."""
        capacity = 16
        while True:
            src = ffi.new("int32_t[]", capacity)
            dst = ffi.new("int32_t[]", capacity)
            out = ffi.new("int32_t *")
            try:
                _check(lib.cf_block_manager_take_copies(self._h(), src, dst, capacity, out))
            except errors.BufferTooSmallError:
                capacity = max(out[0], 2 * capacity)
                continue
            return [BlockCopy(src[i], dst[i]) for i in range(out[0])]

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Create ``child_seq_id`` sharing every block of ``parent_seq_id`` (mutates; never allocates).

        Raises:
            NotFoundError: unknown parent.
            InvalidArgumentError: negative ids, child == parent, or child already exists.
        """
        _check(lib.cf_block_manager_fork(self._h(), parent_seq_id, child_seq_id))

    def free(self, seq_id: int) -> None:
        """Drop the sequence; blocks no one else holds return to the free list (mutates).

        Raises:
            NotFoundError: unknown seq_id.
        """
        _check(lib.cf_block_manager_free_seq(self._h(), seq_id))


__all__ = ["BLOCK_ID_NONE", "AllocResult", "BlockCopy", "BlockManager"]
