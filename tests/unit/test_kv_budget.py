"""cf_kv_cache_rows_for_budget: the engine's rule for sizing a KV cache from a byte budget, which
``cacheflow bench`` calls before it measures anything (native/src/engine/kv_budget.h)."""

import pytest

from pycacheflow import _native
from pycacheflow.errors import InvalidArgumentError

ROW = 1000  # bytes of one KV row (K and V of every layer, one token)


def test_paged_pool_is_whole_multiples_of_256_rows() -> None:
    assert _native.kv_cache_rows_for_budget(1000 * ROW + 999, ROW, "paged", 4) == (768, 256)
    assert _native.kv_cache_rows_for_budget(256 * ROW, ROW, "paged", 1) == (256, 256)
    # one row per sequence at least, rounded up to a multiple of 256
    assert _native.kv_cache_rows_for_budget(600 * ROW, ROW, "paged", 300) == (512, 512)
    assert _native.kv_cache_rows_for_budget(500 * ROW, ROW, "paged", 300) == (0, 512)


def test_budget_below_the_least_cache_is_reported_not_raised() -> None:
    assert _native.kv_cache_rows_for_budget(255 * ROW, ROW, "paged", 1) == (0, 256)
    assert _native.kv_cache_rows_for_budget(0, ROW, "auto", 8) == (0, 256)


def test_stock_split_mode_rounds_each_sequence() -> None:
    # 1,300 rows over 4 sequences: 325 each, rounded down to 256 per sequence
    assert _native.kv_cache_rows_for_budget(1300 * ROW, ROW, "stock", 4) == (1024, 1024)
    assert _native.kv_cache_rows_for_budget(1000 * ROW, ROW, "stock", 4) == (0, 1024)
    # the unified stream is one cache, as the paged pool
    assert _native.kv_cache_rows_for_budget(1000 * ROW, ROW, "stock-unified", 4) == (768, 256)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, ROW, "paged", 1), "kv_cache_bytes must be >= 0"),
        ((1 << 20, 0, "paged", 1), "kv_bytes_per_token must be >= 1"),
        ((1 << 20, ROW, "paged", 0), "max_num_seqs must be >= 1"),
    ],
)
def test_arguments_out_of_range_raise(args: tuple, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        _native.kv_cache_rows_for_budget(*args)
