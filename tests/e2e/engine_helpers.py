"""Helpers shared by the engine's end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pycacheflow import SamplingParams


def staggered_tokens(llm, prompts: Sequence[str], params_for: Callable[[int], SamplingParams],
                     num_first: int) -> list[list[int]]:  # fmt: skip
    """Greedy token ids of each prompt (in prompt order) when the first `num_first` requests start
    together and the rest arrive once the first request has produced its first output, i.e. while
    the others decode (their prompts then run beside decode rows).

    Args:
        llm: a pycacheflow.LLM.
        prompts: the prompts (num_first of them or more).
        params_for: the SamplingParams of prompt i.
        num_first: how many requests start at once (>= 1).
    """
    first = [llm.add_request(p, params_for(i)) for i, p in enumerate(prompts[:num_first])]
    streams = [llm.iter_outputs(i, timeout=120) for i in first]
    tokens = [list(next(streams[0]).token_ids)]  # the first request decodes: the rest arrive now
    later = [llm.add_request(p, params_for(num_first + i)) for i, p in enumerate(prompts[num_first:])]
    tokens[0] += [t for delta in streams[0] for t in delta.token_ids]
    for stream in streams[1:]:
        tokens.append([t for delta in stream for t in delta.token_ids])
    for i in later:
        tokens.append([t for delta in llm.iter_outputs(i, timeout=120) for t in delta.token_ids])
    return tokens
