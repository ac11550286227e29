"""Exact eviction orders for each policy and for the block index's pins."""

from __future__ import annotations

import pytest

from agentinfra.errors import ConfigError
from agentinfra.kvcache import BlockIndex, LFUAgingPolicy, LRUPolicy, PrefixLRUPolicy, make_policy


def drain(policy: object) -> list[object]:
    out = []
    while (victim := policy.victim()) is not None:  # type: ignore[attr-defined]
        out.append(victim)
    return out


def test_lru_order() -> None:
    policy = LRUPolicy()
    for key in "abcd":
        policy.admit(key, None)
    policy.touch("a")
    policy.discard("c")
    assert drain(policy) == ["b", "d", "a"]
    assert policy.victim() is None


def test_prefix_lru_evicts_leaves_first() -> None:
    policy = PrefixLRUPolicy()
    policy.admit("root", None)
    policy.admit("a1", "root")
    policy.admit("a2", "a1")
    policy.admit("b1", "root")
    policy.touch("root")  # root is most recent, but a1 is older and still has a child
    assert drain(policy) == ["a2", "a1", "b1", "root"]


def test_prefix_lru_skips_parent_even_when_least_recent() -> None:
    policy = PrefixLRUPolicy()
    policy.admit("p", None)
    policy.admit("c", "p")
    policy.touch("c")
    assert policy.victim() == "c"
    assert policy.victim() == "p"


def test_prefix_lru_discarded_parent_frees_children() -> None:
    policy = PrefixLRUPolicy()
    policy.admit("p", None)
    policy.admit("c", "p")
    policy.discard("p")
    assert drain(policy) == ["c"]


def test_lfu_aging_prefers_frequent_then_ages() -> None:
    policy = LFUAgingPolicy()
    for key in "abc":
        policy.admit(key, None)
    policy.touch("a")
    policy.touch("a")  # a: 3 uses
    assert policy.victim() == "b"  # priority 1, older than c
    # clock is now 1: a new block d gets priority 2, above c's 1
    policy.admit("d", None)
    assert drain(policy) == ["c", "d", "a"]


def test_unknown_policy() -> None:
    with pytest.raises(ConfigError, match="lfu-aging, lru, prefix-lru"):
        make_policy("fifo")


def test_index_capacity_and_evictions() -> None:
    index = BlockIndex(3, LRUPolicy())
    for key in "abc":
        assert index.insert(key).is_admitted
    index.touch(["a"])
    result = index.insert("d")
    assert result.evicted == ("b",)
    assert index.leading_hits(["a", "c", "x", "d"]) == 2
    assert index.used == 3


def test_index_touches_tail_first_so_parents_outlive_children() -> None:
    index = BlockIndex(3, LRUPolicy())
    for key in ["x", "y", "z"]:
        index.insert(key)
    index.touch(["x", "y", "z"])
    assert index.insert("w").evicted == ("z",)


def test_pinned_blocks_are_never_evicted() -> None:
    index = BlockIndex(2, LRUPolicy())
    index.insert("a")
    index.insert("b")
    assert index.pin("a")
    assert index.insert("c").evicted == ("b",)
    assert index.pin("c")
    result = index.insert("d")
    assert not result.is_admitted
    assert result.evicted == ()
    index.unpin("a")
    assert index.insert("d").evicted == ("a",)
    assert not index.pin("zz")


def test_sized_inserts() -> None:
    index = BlockIndex(10, LRUPolicy())
    index.insert("a", size=4)
    index.insert("b", size=4)
    assert index.insert("c", size=4).evicted == ("a",)
    assert not index.insert("huge", size=11).is_admitted
    assert index.used == 8
