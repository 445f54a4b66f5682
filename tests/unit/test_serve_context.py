"""How serve sizes the KV cache and the slots from -c, -np and -kvu (cli/serve_context.py), as
llama-server's llama-context.cpp, common/fit.cpp and n_ctx_slot() do. No engine."""

from __future__ import annotations

import pytest

from cli.serve_context import ContextPlan, ModelShape, plan_context, read_model_shape
from pycacheflow.gguf_metadata import read_metadata

SMOLLM2 = ModelShape(n_ctx_train=8192, kv_bytes_per_token=23040, file_bytes=98_362_432)
GIB = 2**30


@pytest.mark.parametrize(
    "ctx_size,parallel,kv_unified,plan",
    [
        (2048, 4, False, ContextPlan(2048, 512)),
        (5, 4, False, ContextPlan(1024, 256)),  # each slot's share padded to 256
        (1000, 3, False, ContextPlan(1536, 512)),
        (1000, 3, True, ContextPlan(1024, 1024)),  # -kvu: one shared stream
        (1000, -1, False, ContextPlan(1024, 1024)),  # -np automatic: llama-server turns -kvu on
        (0, -1, False, ContextPlan(8192, 8192)),
        (0, 4, False, ContextPlan(4 * 8192, 8192)),
        (0, 4, True, ContextPlan(8192, 8192)),
    ],
)
def test_plan_as_llama_server(ctx_size, parallel, kv_unified, plan):
    assert plan_context(ctx_size, parallel, kv_unified, SMOLLM2, memory_bytes=64 * GIB) == plan


def test_fit_shrinks_the_trained_context_to_the_memory():
    plan = plan_context(0, 64, False, SMOLLM2, memory_bytes=8 * GIB)
    assert plan.n_ctx % (64 * 256) == 0 and 64 * 4096 <= plan.n_ctx < 64 * 8192
    assert plan.n_ctx * SMOLLM2.kv_bytes_per_token <= 7 * GIB - SMOLLM2.file_bytes
    assert plan.n_ctx_slot == plan.n_ctx // 64 and "tokens per slot" in plan.note
    small = plan_context(0, 64, False, SMOLLM2, memory_bytes=2 * GIB)
    assert small.n_ctx == 64 * 4096 and "not even 4096 tokens per slot fit" in small.note
    # at or below --fit-ctx already: left as it is; sliding-window or unknown shapes: not fitted
    short = ModelShape(2048, 23040)
    assert plan_context(0, 64, False, short, memory_bytes=GIB).n_ctx == 64 * 2048
    swa = ModelShape(8192, 23040, sliding_window=True)
    assert plan_context(0, 64, False, swa, memory_bytes=GIB).note is None
    assert plan_context(0, 4, False, None) == ContextPlan(0, 0)  # the engine's default


def test_fit_off_target_and_min_ctx():
    """--fit off keeps the trained context; --fit-target and --fit-ctx move the fit's margin
    and floor."""
    off = plan_context(0, 64, False, SMOLLM2, memory_bytes=8 * GIB, fit=False)
    assert off == ContextPlan(64 * 8192, 8192)
    roomier = plan_context(0, 64, False, SMOLLM2, memory_bytes=8 * GIB, fit_target_bytes=0)
    tighter = plan_context(0, 64, False, SMOLLM2, memory_bytes=8 * GIB, fit_target_bytes=3 * GIB)
    default = plan_context(0, 64, False, SMOLLM2, memory_bytes=8 * GIB)
    assert tighter.n_ctx < default.n_ctx < roomier.n_ctx
    assert "3072 MiB left free" in tighter.note
    floor = plan_context(0, 64, False, SMOLLM2, memory_bytes=2 * GIB, fit_min_ctx=1024)
    assert floor.n_ctx >= 64 * 1024 and floor.n_ctx < 64 * 4096


def test_the_shape_comes_from_the_gguf_metadata(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(4096)
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv([1, 2])  # per layer
    writer.add_key_length(32)
    writer.add_value_length(16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shape = read_model_shape(path)
    assert shape == ModelShape(4096, (1 + 2) * (32 + 16) * 2, path.stat().st_size, False)
    meta = read_metadata(path, ["general.architecture", "llama.attention.head_count_kv", "x"])
    assert meta == {"general.architecture": "llama", "llama.attention.head_count_kv": [1, 2]}
    (tmp_path / "bad.gguf").write_bytes(b"GGUF")
    assert read_model_shape(tmp_path / "bad.gguf") is None
