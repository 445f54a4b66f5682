"""``cacheflow bench``'s building blocks: workloads, runners, baselines, results, plots.

- ``datasets``: random fixed-length, ShareGPT and shared-prefix workloads;
- ``offline``: closed-loop runs on in-process engines (CacheFlow and its stock KV modes);
- ``online``: an asyncio HTTP load generator for llama-server compatible servers;
- ``baselines``: stock llama.cpp tools built from the same pinned tree;
- ``environment``: machine facts and the measured memory bandwidth;
- ``results``: CSV and JSON files; ``plots`` and ``report``: PNGs and the Markdown report.

Metric formulas live in ``pycacheflow.metrics`` (pure, unit-tested).
"""
