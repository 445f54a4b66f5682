"""Which replica serves a request: the routing policies of ``cacheflow serve --data-parallel N``.

No processes and no HTTP here: a policy sees routing keys and the in-flight count of each live
replica and returns a ``RouteDecision``; the router (server/router.py) does the rest.

Routing keys (``routing_keys``) stand for the start of a prompt, before any tokenization:
    /completion, /completions, /v1/completions   the prompt: its text, or its token ids (the first
                                                 prompt of a list of prompts)
    /chat/completions, /v1/chat/completions      the messages flattened in order, role and text
                                                 content (so the system message and the first
                                                 user message come first; the chat template is
                                                 not rendered)
The sequence (characters, or token ids) is cut into chunks of ``CHUNK_CHARS`` characters
(``CHUNK_TOKENS`` token ids); the keys are hashes of its first 1, 2, 4, ... full chunks, at most
``MAX_CHUNKS``, longest last. A prompt shorter than one chunk has no key. Doubling keeps the
number of keys per request at log2(MAX_CHUNKS) + 1 = 9 while a long shared prefix still finds its
replica at about half its length or better.

The prefix policy (``PrefixPolicy``), per request:
    1. among the keys whose replica is alive, take the longest one the LRU map ``key -> replica``
       holds: the replica that most recently served a request starting the same way (its prefix
       cache most likely holds those KV blocks);
    2. route there unless its in-flight count exceeds the least-loaded live replica's by more than
       ``slack`` requests (default ``DEFAULT_SLACK``); then, or when no key matched, route to the
       least-loaded replica (ties: the one that got fewest requests so far, then the lowest id);
    3. record every key of the request as served by the chosen replica (most recent use), evicting
       the least recently used keys beyond ``max_keys`` (default ``DEFAULT_MAX_KEYS``).
A request counts as a prefix hit when it went to the replica of its longest matching key.

What this was learned from (read, not copied):
  - SGLang's router, cache-aware policy (sgl-project/sglang, sgl-router): one approximate radix
    tree of the prompts routed to each worker; when the load is imbalanced (max - min in-flight >
    balance_abs_threshold and max > balance_rel_threshold x min) the shortest queue wins,
    otherwise the worker with the best prefix match if its match ratio passes cache_threshold.
    Here the tree is replaced by hashed power-of-two prefixes and the imbalance test by one
    absolute slack against the least-loaded replica.
  - vLLM production-stack's prefix-aware router and llm-d's inference scheduler (prefix-cache
    scorer): hashes of fixed-size blocks of the prompt's characters, matched longest first in an
    LRU index of which server saw them, combined with a load score. Here: characters for text so
    that the router needs no tokenizer, token ids when the client sent token ids.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CHUNK_CHARS = 64  # characters per chunk of a text prompt (about 16 tokens of English)
CHUNK_TOKENS = 16  # token ids per chunk of a token prompt (one KV block of the default size)
MAX_CHUNKS = 256  # the longest key covers 256 chunks (16,384 characters or 4,096 tokens)
DEFAULT_SLACK = 8  # in-flight requests a preferred replica may carry above the least-loaded one
DEFAULT_MAX_KEYS = 65_536  # keys the LRU map holds (9 keys per request at most)

POLICY_NAMES = ("prefix", "round-robin", "least-loaded")
COMPLETION_PATHS = frozenset({"/completion", "/completions", "/v1/completions"})
CHAT_PATHS = frozenset({"/chat/completions", "/v1/chat/completions"})


@dataclass(frozen=True)
class RouteDecision:
    """Where one request goes.

    Attributes:
        replica_id: the chosen replica.
        num_matched_chunks: chunks covered by the longest key a live replica had served (0 = none).
        prefix_hit: the request went to that key's replica (not overruled by the slack).
    """

    replica_id: int
    num_matched_chunks: int = 0
    prefix_hit: bool = False


# ---------------------------------------------------------------------------- routing keys


def routing_keys(path: str, body: object) -> list[bytes]:
    """The routing keys of a request to ``path`` with the JSON ``body`` (shortest first).

    Returns:
        [num_keys] 16-byte digests, num_keys <= log2(MAX_CHUNKS) + 1; empty for other paths,
        malformed bodies and prompts shorter than one chunk.
    """
    if not isinstance(body, dict):
        return []
    if path in CHAT_PATHS:
        text = _flatten_messages(body.get("messages"))
        return prefix_keys(text, CHUNK_CHARS, b"chat") if text else []
    if path in COMPLETION_PATHS:
        prompt = _first_prompt(body.get("prompt"))
        if isinstance(prompt, str):
            return prefix_keys(prompt, CHUNK_CHARS, b"text")
        if prompt is not None:
            return prefix_keys(prompt, CHUNK_TOKENS, b"tokens")
    return []


def prefix_keys(items: str | Sequence[int], chunk_len: int, kind: bytes) -> list[bytes]:
    """Hashes of the first 1, 2, 4, ... full chunks of ``items`` (at most MAX_CHUNKS chunks).

    Args:
        items: prompt text, or [num_prompt_tokens] token ids.
        chunk_len: characters (text) or token ids per chunk, >= 1.
        kind: a tag hashed first, so that text, token and chat keys never collide.

    Returns:
        [num_keys] 16-byte digests, shortest prefix first.
    """
    num_chunks = min(len(items) // chunk_len, MAX_CHUNKS)
    digest = hashlib.blake2b(kind, digest_size=16)
    keys: list[bytes] = []
    done = 0  # chunks hashed so far: [0, done)
    target = 1
    while target <= num_chunks:
        digest.update(_encode(items[done * chunk_len : target * chunk_len]))
        keys.append(digest.copy().digest())
        done, target = target, target * 2
    return keys


def _encode(part: str | Sequence[int]) -> bytes:
    if isinstance(part, str):
        return part.encode("utf-8", "surrogatepass")
    return b"".join(int(t).to_bytes(4, "little", signed=True) for t in part)


def _first_prompt(prompt: object) -> str | list[int] | None:
    """The prompt text or token ids that start a completion request (the first of a list)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt
        if isinstance(prompt[0], (str, list)):
            return _first_prompt(prompt[0])
    return None


def _flatten_messages(messages: object) -> str:
    """``role\\x1ftext\\x1e`` per message, in order; text parts of list contents joined."""
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict)
            )
        parts.append(f"{message.get('role', '')}\x1f{content or ''}\x1e")
    return "".join(parts)


# ---------------------------------------------------------------------------- policies


class RoutingPolicy:
    """Chooses a replica per request (one thread: the router's event loop).

    Subclasses implement ``_choose``; ``choose`` also counts the requests sent to each replica,
    which breaks ties between equally loaded replicas.
    """

    name = ""

    def __init__(self) -> None:
        self.num_routed: dict[int, int] = {}  # replica id -> requests routed to it

    def choose(self, keys: Sequence[bytes], in_flight: Mapping[int, int]) -> RouteDecision:
        """Pick the replica for one request and record the choice (mutates the policy).

        Args:
            keys: the request's routing keys, shortest first (``routing_keys``); may be empty.
            in_flight: live replica id -> requests in flight on it now; must not be empty.

        Returns:
            The decision; ``replica_id`` is one of ``in_flight``'s keys.
        """
        if not in_flight:
            raise ValueError("no live replica to route to")
        decision = self._choose(keys, in_flight)
        self.num_routed[decision.replica_id] = self.num_routed.get(decision.replica_id, 0) + 1
        return decision

    def forget(self, replica_id: int) -> None:
        """Drop what the policy remembers about a replica taken out of rotation."""

    def _choose(self, keys: Sequence[bytes], in_flight: Mapping[int, int]) -> RouteDecision:
        raise NotImplementedError

    def _least_loaded(self, in_flight: Mapping[int, int]) -> int:
        """The live replica with the fewest requests in flight (then fewest routed, lowest id)."""
        return min(in_flight, key=lambda r: (in_flight[r], self.num_routed.get(r, 0), r))


class LeastLoadedPolicy(RoutingPolicy):
    """Always the replica with the fewest requests in flight."""

    name = "least-loaded"

    def _choose(self, keys: Sequence[bytes], in_flight: Mapping[int, int]) -> RouteDecision:
        return RouteDecision(self._least_loaded(in_flight))


class RoundRobinPolicy(RoutingPolicy):
    """Live replicas in turn, by id (a dead one is skipped)."""

    name = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        self._counter = itertools.count()

    def _choose(self, keys: Sequence[bytes], in_flight: Mapping[int, int]) -> RouteDecision:
        live = sorted(in_flight)
        return RouteDecision(live[next(self._counter) % len(live)])


class PrefixPolicy(RoutingPolicy):
    """The replica that most recently served the longest matching key, within ``slack`` of the
    least-loaded replica's in-flight count (the rule in the module docstring).

    Args:
        slack: in-flight requests, >= 0, that the preferred replica may carry above the
            least-loaded one before the least-loaded one wins.
        max_keys: keys the LRU map holds, >= 1.
    """

    name = "prefix"

    def __init__(self, slack: int = DEFAULT_SLACK, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        super().__init__()
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.slack = slack
        self.max_keys = max_keys
        self._replica_of: OrderedDict[bytes, int] = OrderedDict()  # LRU: oldest first

    @property
    def num_keys(self) -> int:
        """Keys the LRU map holds now."""
        return len(self._replica_of)

    def _choose(self, keys: Sequence[bytes], in_flight: Mapping[int, int]) -> RouteDecision:
        least = self._least_loaded(in_flight)
        matched, preferred = self._longest_match(keys, in_flight)
        hit = preferred is not None and in_flight[preferred] - in_flight[least] <= self.slack
        chosen = preferred if hit else least
        self._remember(keys, chosen)
        return RouteDecision(chosen, matched, hit)

    def _longest_match(
        self, keys: Sequence[bytes], in_flight: Mapping[int, int]
    ) -> tuple[int, int | None]:
        """(chunks of the longest key held for a live replica, that replica) or (0, None)."""
        for index in range(len(keys) - 1, -1, -1):
            replica_id = self._replica_of.get(keys[index])
            if replica_id is not None and replica_id in in_flight:
                return 1 << index, replica_id
        return 0, None

    def _remember(self, keys: Sequence[bytes], replica_id: int) -> None:
        for key in keys:
            self._replica_of[key] = replica_id
            self._replica_of.move_to_end(key)
        while len(self._replica_of) > self.max_keys:
            self._replica_of.popitem(last=False)

    def forget(self, replica_id: int) -> None:
        for key in [k for k, r in self._replica_of.items() if r == replica_id]:
            del self._replica_of[key]


def make_policy(name: str, slack: int = DEFAULT_SLACK) -> RoutingPolicy:
    """The policy called ``name`` (one of POLICY_NAMES); ``slack`` only applies to "prefix".

    Raises:
        ValueError: an unknown name or a negative slack.
    """
    if name == "prefix":
        return PrefixPolicy(slack)
    if name == "round-robin":
        return RoundRobinPolicy()
    if name == "least-loaded":
        return LeastLoadedPolicy()
    raise ValueError(f"unknown routing policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
