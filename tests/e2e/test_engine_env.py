"""The engine's tuning variables (A/B switches documented in the README and `cacheflow --help`) take whole numbers in
their range: any other value is named on stderr, with the range, and the default kept, so that a typo such as `false`
or `yes` never silently flips a run. CACHEFLOW_CUDA_GEMM, which only a CUDA build acts on, is checked on any build (a
new-user review saw a bad value pass silently on the CPU). CACHEFLOW_CUDA_GRAPH_PER_SHAPE is read once per process, so
it is not in this in-process list; it parses the same way in the same function."""

from __future__ import annotations

import pytest

from pycacheflow import SamplingParams

pytestmark = [pytest.mark.e2e]


@pytest.mark.parametrize(("name", "says"), [
    ("CACHEFLOW_STEP_PADDING", "from 0 to 1; ignored (the engine's own choice stays)"),
    ("CACHEFLOW_HOST_SAMPLING", "from 0 to 1; ignored (the default, 0, stays)"),
    ("CACHEFLOW_BATCHED_INPUT_COPIES", "from 0 to 1; ignored (the default, 1, stays)"),
    ("CACHEFLOW_SHARED_PREFIX_WAIT", "from 0 to 1048576; ignored (the default, 64, stays)"),
    ("CACHEFLOW_EMBD_ON_DEVICE", "from 0 to 1; ignored (the engine's own choice stays)"),
    ("CACHEFLOW_CUDA_GEMM", "from 0 to 15; ignored (the default, 15, stays)"),
])  # fmt: skip
def test_a_value_out_of_range_is_named_and_the_default_kept(real_model_path, make_llm, monkeypatch, capfd, name,
                                                            says):
    monkeypatch.setenv(name, "yes")
    llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=2, n_ctx=1024)
    (out,) = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4))
    assert len(out.token_ids) == 4
    assert capfd.readouterr().err.count(f"cacheflow: {name}=yes is not a whole number {says}") == 1  # said once


def test_host_sampling_takes_one_as_on(real_model_path, make_llm, monkeypatch):
    """CACHEFLOW_HOST_SAMPLING=1 samples every row on the CPU (before, any value but 0 did, `false` included)."""
    monkeypatch.setenv("CACHEFLOW_HOST_SAMPLING", "1")
    llm = make_llm(real_model_path, kv_mode="paged", max_num_seqs=2, n_ctx=1024)
    llm.generate(["The capital of France is"], SamplingParams(max_tokens=4))
    stats = llm.stats()
    assert stats.num_rows_sampled_in_graph == 0 and stats.num_rows_sampled_host > 0, stats
