"""The routing policies of `cacheflow serve --data-parallel` alone: fake replicas are ids with an
in-flight count, no processes, no HTTP."""

from __future__ import annotations

import pytest

from pycacheflow.server.router_policy import (
    CHUNK_CHARS,
    CHUNK_TOKENS,
    MAX_CHUNKS,
    LeastLoadedPolicy,
    PrefixPolicy,
    RoundRobinPolicy,
    make_policy,
    prefix_keys,
    routing_keys,
)


def text(prefix_id: int, num_chunks: int, suffix: str = "") -> str:
    """A prompt whose first num_chunks chunks are the same for one prefix_id."""
    unit = f"[prefix {prefix_id:03d}]"
    base = (unit * (CHUNK_CHARS * num_chunks // len(unit) + 1))[: CHUNK_CHARS * num_chunks]
    return base + suffix


def keys(prompt: str) -> list[bytes]:
    return routing_keys("/completion", {"prompt": prompt})


def idle(num_replicas: int = 2) -> dict[int, int]:
    return dict.fromkeys(range(num_replicas), 0)


# ---------------------------------------------------------------------------- keys


def test_keys_are_hashes_of_power_of_two_chunk_prefixes():
    assert keys("x" * (CHUNK_CHARS - 1)) == []  # shorter than one chunk: no key
    assert len(keys("x" * CHUNK_CHARS)) == 1
    assert len(keys("x" * (CHUNK_CHARS * 7))) == 3  # 1, 2, 4 chunks
    assert len(keys("x" * (CHUNK_CHARS * MAX_CHUNKS * 4))) == 9  # capped at MAX_CHUNKS
    a, b = keys(text(1, 8, "question A")), keys(text(1, 8, "question B"))
    assert a == b  # the suffix is shorter than a chunk past the shared 8
    c = keys(text(1, 4) + text(2, 4))
    assert c[:3] == a[:3] and c[3] != a[3]  # shares 4 chunks, not 8


def test_token_text_and_chat_keys_differ_and_tokens_use_their_own_chunk():
    ids = list(range(CHUNK_TOKENS * 4))
    token_keys = routing_keys("/v1/completions", {"prompt": ids})
    assert len(token_keys) == 3
    assert routing_keys("/completion", {"prompt": [ids, [1, 2]]}) == token_keys  # first prompt
    assert prefix_keys("a" * 64, 64, b"text") != prefix_keys("a" * 64, 64, b"chat")


def test_chat_keys_follow_system_then_first_user_message():
    system = {"role": "system", "content": text(3, 8)}
    first = routing_keys("/v1/chat/completions",
                         {"messages": [system, {"role": "user", "content": "hi"}]})  # fmt: skip
    second = routing_keys(
        "/chat/completions",
        {"messages": [system, {"role": "user", "content": [{"type": "text", "text": "bye"}]}]},
    )
    assert first and first == second


@pytest.mark.parametrize("body", [None, [], {"prompt": 5}, {"prompt": []}, {"messages": "x"}])
def test_malformed_bodies_have_no_keys(body):
    assert routing_keys("/completion", body) == []
    assert routing_keys("/v1/chat/completions", body) == []
    assert routing_keys("/tokenize", {"content": text(1, 8)}) == []


# ---------------------------------------------------------------------------- prefix policy


def test_a_shared_prefix_stays_on_one_replica_and_new_prefixes_spread():
    policy = PrefixPolicy()
    first = [policy.choose(keys(text(p, 8)), idle()) for p in range(4)]
    assert [d.replica_id for d in first] == [0, 1, 0, 1]  # no match: least routed wins the tie
    assert not any(d.prefix_hit for d in first)
    again = [policy.choose(keys(text(p, 8, f"q{p}")), idle()) for p in range(4)]
    assert [d.replica_id for d in again] == [0, 1, 0, 1]
    assert all(d.prefix_hit and d.num_matched_chunks == 8 for d in again)


def test_the_longest_matching_key_wins():
    policy = PrefixPolicy()
    policy.choose(keys(text(1, 2)), idle())  # replica 0 saw 2 chunks of prefix 1
    policy.choose(keys(text(1, 8)), {1: 0})  # replica 1 saw 8 (0 was out of rotation)
    decision = policy.choose(keys(text(1, 16)), idle())
    assert decision.replica_id == 1 and decision.num_matched_chunks == 8


def test_the_slack_hands_a_busy_replica_s_prefix_to_the_least_loaded():
    policy = PrefixPolicy(slack=2)
    assert policy.choose(keys(text(1, 4)), idle()).replica_id == 0
    within = policy.choose(keys(text(1, 4)), {0: 2, 1: 0})
    assert within.replica_id == 0 and within.prefix_hit
    over = policy.choose(keys(text(1, 4)), {0: 3, 1: 0})
    assert over.replica_id == 1 and not over.prefix_hit and over.num_matched_chunks == 4
    # replica 1 is now the most recent server of the prefix
    assert policy.choose(keys(text(1, 4)), idle()).replica_id == 1


def test_no_key_goes_to_the_least_loaded():
    policy = PrefixPolicy()
    assert policy.choose([], {0: 3, 1: 1, 2: 2}).replica_id == 1


def test_a_dead_replica_s_keys_do_not_match():
    policy = PrefixPolicy()
    policy.choose(keys(text(1, 4)), idle())
    assert policy.choose(keys(text(1, 4)), {1: 0}).replica_id == 1  # 0 not live
    assert policy.choose(keys(text(1, 4)), idle()).replica_id == 1  # 1 served it last
    policy.forget(1)  # taken out of rotation: its keys go
    assert policy.num_keys == 0
    assert policy.choose(keys(text(1, 4)), idle()).prefix_hit is False


def test_the_lru_map_is_bounded_and_evicts_the_oldest():
    policy = PrefixPolicy(max_keys=3)
    policy.choose(keys(text(1, 4)), idle())  # 3 keys on replica 0
    policy.choose(keys(text(2, 4)), idle())  # 3 keys on replica 1, evicting prefix 1's
    assert policy.num_keys == 3
    decision = policy.choose(keys(text(1, 4)), {0: 0, 1: 0})
    assert decision.num_matched_chunks == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="slack"):
        PrefixPolicy(slack=-1)
    with pytest.raises(ValueError, match="max_keys"):
        PrefixPolicy(max_keys=0)
    with pytest.raises(ValueError, match="no live replica"):
        PrefixPolicy().choose([], {})
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")


# ---------------------------------------------------------------------------- baselines


def test_round_robin_skips_dead_replicas():
    policy = RoundRobinPolicy()
    assert [policy.choose([], idle(3)).replica_id for _ in range(4)] == [0, 1, 2, 0]
    assert policy.choose([], {0: 0, 2: 0}).replica_id in (0, 2)
    assert policy.num_routed[0] >= 2


def test_least_loaded_ignores_prefixes():
    policy = LeastLoadedPolicy()
    k = keys(text(1, 4))
    assert [policy.choose(k, idle()).replica_id for _ in range(3)] == [0, 1, 0]
    assert policy.choose(k, {0: 5, 1: 4}).replica_id == 1


def test_make_policy_names():
    assert isinstance(make_policy("prefix", slack=3), PrefixPolicy)
    assert make_policy("prefix", slack=3).slack == 3
    assert make_policy("round-robin").name == "round-robin"
    assert make_policy("least-loaded").name == "least-loaded"
