"""The tiny model fixture (scripts/make_tiny_gguf.py) is what the other tests assume it is:
deterministic per seed and context sensitive, so that mixing up sequences' KV would change
greedy outputs. (That it tokenizes like the real model: test_engine_text.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from pycacheflow import SamplingParams

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_gguf.py"


@pytest.fixture(scope="module")
def script():
    """scripts/make_tiny_gguf.py imported as a module."""
    spec = importlib.util.spec_from_file_location("make_tiny_gguf", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def test_same_seed_same_bytes(script, tmp_path, tiny_model_path, real_model_path):
    again = script.write_tiny_gguf(tmp_path / "again.gguf", real_model_path, seed=0)
    assert again.read_bytes() == tiny_model_path.read_bytes()


def test_greedy_outputs_vary_and_depend_on_context(tiny_llm):
    prompts = ["The capital of France is", "Hello", "one two three. The capital of France is"]
    outputs = [o.token_ids for o in tiny_llm.generate(prompts, greedy(24))]
    for token_ids in outputs:
        assert len(set(token_ids)) >= 12, token_ids  # not one token repeated
    assert len(set(outputs)) == 3
    # Prompts 0 and 2 end alike; only attention over the earlier tokens tells them apart.
    assert outputs[0][0] != outputs[2][0]


def test_f16_variant_loads_and_generates(script, tmp_path, real_model_path, make_llm):
    f16 = script.write_tiny_gguf(tmp_path / "f16.gguf", real_model_path, seed=0, dtype="f16")
    llm = make_llm(f16, max_num_seqs=1, n_ctx=256)
    assert "F16" in llm.info.description
    assert (llm.info.n_layer, llm.info.n_embd, llm.info.n_head, llm.info.n_head_kv) == (2, 64, 4, 2)
    assert len(llm.generate(["An f16 model"], greedy(16))[0].token_ids) == 16


def test_script_cli_rejects_bad_shapes(script, tmp_path, real_model_path, capsys):
    out = tmp_path / "bad.gguf"
    rc = script.main([str(out), "--tokenizer-from", str(real_model_path), "--n-head", "3"])
    assert rc == 1
    assert "n_embd (64) must be a multiple of n_head (3)" in capsys.readouterr().err
    assert not out.exists()
