"""Conversation caches stay under the memory budget, least recently used first, never one in use."""

from __future__ import annotations

from engine.chat.cache_store import CacheStore


class FakeKV:
    def __init__(self) -> None:
        self.nbytes = 0


def _store(budget: int) -> CacheStore:
    return CacheStore(FakeKV, lambda kv: kv.nbytes, budget_bytes=budget)


def _fill(store: CacheStore, conversation_id: str, nbytes: int) -> list[str]:
    seq = store.checkout(conversation_id)
    seq.kv.nbytes = nbytes
    seq.token_ids[:] = list(range(nbytes))
    return store.release(conversation_id)


def test_least_recently_used_is_evicted_first() -> None:
    store = _store(budget=250)
    _fill(store, "a", 100)
    _fill(store, "b", 100)
    store.checkout("a")  # a is used again: b is now the oldest
    store.release("a")
    assert _fill(store, "c", 100) == ["b"]
    assert "a" in store and "c" in store and "b" not in store


def test_a_cache_in_use_is_never_evicted() -> None:
    store = _store(budget=150)
    _fill(store, "a", 100)
    busy = store.checkout("b")
    busy.kv.nbytes = 100
    assert store.evict_over_budget() == ["a"]
    store.checkout("c").kv.nbytes = 500
    assert store.evict_over_budget() == []  # over budget, but both are in use
    assert "b" in store and "c" in store


def test_forget_drops_a_conversation_and_its_bytes() -> None:
    store = _store(budget=10_000)
    _fill(store, "a", 100)
    _fill(store, "b", 50)
    store.forget("a")
    assert store.total_bytes() == 50
    assert store.held_tokens("a") == []
