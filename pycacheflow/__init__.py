"""CacheFlow: multi-request LLM inference on llama.cpp with a paged KV cache.

    from pycacheflow import LLM, SamplingParams
    llm = LLM()  # default model, downloaded to the user cache on first use
    out = llm.generate(["Hello"], SamplingParams(max_tokens=32))[0]
    print(out.text, out.metrics.ttft_s)

``LLM`` needs the native library (libcacheflow.so); it is imported on first access, so the
pure-Python parts (configs, sampling params, outputs, model download) work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pycacheflow import errors
from pycacheflow.config import EngineConfig
from pycacheflow.errors import CacheFlowError
from pycacheflow.outputs import RequestMetrics, RequestOutput, StreamDelta
from pycacheflow.sampling_params import ReasoningBudget, SamplingParams

if TYPE_CHECKING:
    from pycacheflow.llm import LLM

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "SamplingParams",
    "ReasoningBudget",
    "EngineConfig",
    "RequestOutput",
    "RequestMetrics",
    "StreamDelta",
    "CacheFlowError",
    "errors",
    "__version__",
]


def __getattr__(name: str) -> object:
    # LLM loads libcacheflow.so; defer that to first use (raises ImportError if missing).
    if name == "LLM":
        from pycacheflow.llm import LLM

        return LLM
    raise AttributeError(f"module 'pycacheflow' has no attribute {name!r}")
