"""EngineConfig: defaults and the validation Python owns (types, C widths, choice names).

Ranges and rules between fields are the native engine's (one owner per value): their messages,
surfaced as is, are checked in tests/e2e/test_engine_errors.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycacheflow import EngineConfig
from pycacheflow.config import KV_MODES, LOG_LEVELS, POLICIES, c_enum_name


def test_defaults():
    c = EngineConfig(model="m.gguf")
    assert (c.n_ctx, c.max_num_seqs, c.max_num_batched_tokens) == (0, 16, 512)
    assert (c.kv_mode, c.policy, c.log_level, c.flash_attn, c.block_size) == (
        "auto",
        "fcfs",
        "error",
        None,
        16,
    )
    assert c.model_path == "m.gguf"


def test_path_like_model():
    assert EngineConfig(model=Path("/x/m.gguf")).model_path == "/x/m.gguf"


@pytest.mark.parametrize("kv_mode", KV_MODES)
@pytest.mark.parametrize("policy", POLICIES)
def test_all_choices_accepted(kv_mode, policy):
    EngineConfig(model="m", kv_mode=kv_mode, policy=policy)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "model must be a non-empty path"),
        ({"n_ctx": 2**31}, "n_ctx must be < 2**31"),
        ({"max_num_seqs": -(2**31) - 1}, "max_num_seqs must be < 2**31 in magnitude"),
        ({"kv_cache_bytes": 2**62}, "kv_cache_bytes must be < 2**62"),
        (
            {"kv_mode": "fast"},
            "kv_mode must be one of auto, stock, stock-unified, paged; got 'fast'",
        ),
        ({"policy": "lifo"}, "policy must be one of fcfs, sjf, priority; got 'lifo'"),
        ({"log_level": "loud"}, "log_level must be one of"),
    ],
)
def test_bad_values_name_the_value(kwargs, message):
    kwargs.setdefault("model", "m.gguf")
    with pytest.raises(ValueError) as info:
        EngineConfig(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "kwargs", [{"max_num_seqs": 2.0}, {"n_ctx": True}, {"flash_attn": 1}, {"model": 3}]
)
def test_wrong_types(kwargs):
    kwargs.setdefault("model", "m.gguf")
    with pytest.raises((TypeError, ValueError)):
        EngineConfig(**kwargs)


def test_c_enum_name():
    assert c_enum_name("CF_KV_MODE_", "stock-unified") == "CF_KV_MODE_STOCK_UNIFIED"
    assert "warn" in LOG_LEVELS


def test_ranges_are_left_to_the_engine():
    # Constructed as given; the engine refuses them with its own message (test_engine_errors.py).
    config = EngineConfig(model="m.gguf", max_num_seqs=0, max_num_batched_tokens=4, n_ctx=-1)
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.n_ctx) == (0, 4, -1)


def test_device_fields():
    """rpc_servers and devices: a comma-separated str or a sequence, kept as a tuple; the endpoints
    and device names themselves are the engine's to check (tests/e2e/test_rpc_split.py)."""
    c = EngineConfig(model="m.gguf")
    assert (c.rpc_servers, c.devices, c.split_mode, c.main_gpu, c.tensor_split) == ((), None, "layer", 0, ())
    c = EngineConfig(model="m.gguf", rpc_servers="h1:1, h2:2", devices=["RPC0"], tensor_split=[3, 1.5])
    assert (c.rpc_servers, c.devices, c.tensor_split) == (("h1:1", "h2:2"), ("RPC0",), (3.0, 1.5))
    for kwargs, error in [({"rpc_servers": "a:1,,b:2"}, ValueError), ({"devices": ()}, ValueError),
                          ({"split_mode": "tensor"}, ValueError), ({"tensor_split": "3,1"}, TypeError),
                          ({"tensor_split": (True,)}, TypeError), ({"rpc_servers": 5}, TypeError)]:  # fmt: skip
        with pytest.raises(error):
            EngineConfig(model="m.gguf", **kwargs)
