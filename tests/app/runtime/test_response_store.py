"""The stored responses' bounds, per tenant: entries, bytes and time, the oldest going first, and
never another tenant's."""

from __future__ import annotations

import pytest

from app.runtime.response_store import ResponseStore, StoredResponse, StoreLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stored(text: str = "x") -> StoredResponse:
    return StoredResponse({"id": "r", "output": [text]}, [], [])


def test_a_tenant_past_its_entries_loses_its_own_oldest_only() -> None:
    store = ResponseStore(StoreLimits(max_entries=2))
    store.put("b", "b1", stored())
    for name in ("a1", "a2", "a3"):
        store.put("a", name, stored())
    assert store.get("a", "a1") is None and store.get("a", "a2") is not None and store.get("a", "a3") is not None
    assert store.get("b", "b1") is not None and store.usage("a")[0] == 2


def test_a_tenant_past_its_bytes_loses_its_oldest_and_a_response_past_them_alone_is_not_kept() -> None:
    one = stored("y" * 100).num_bytes
    store = ResponseStore(StoreLimits(max_bytes=2 * one + 10))
    for name in ("a1", "a2", "a3"):
        assert store.put("a", name, stored("y" * 100))
    assert store.get("a", "a1") is None and store.usage("a") == (2, 2 * one)
    assert not store.put("a", "big", stored("y" * (3 * one)))
    assert store.get("a", "big") is None and store.usage("a") == (2, 2 * one)


def test_entries_expire_and_their_bytes_are_given_back() -> None:
    clock = Clock()
    store = ResponseStore(StoreLimits(ttl_seconds=60), clock)
    store.put("a", "old", stored())
    clock.now += 30
    store.put("a", "new", stored())
    clock.now += 31
    assert store.get("a", "old") is None and store.get("a", "new") is not None
    clock.now += 30
    assert store.get("a", "new") is None and store.usage("a") == (0, 0)


def test_another_tenant_can_neither_read_nor_delete() -> None:
    store = ResponseStore(StoreLimits())
    store.put("a", "r1", stored())
    assert store.get("b", "r1") is None and not store.delete("b", "r1")
    assert store.delete("a", "r1") and store.get("a", "r1") is None and not store.delete("a", "r1")


def test_storing_an_id_again_replaces_it() -> None:
    store = ResponseStore(StoreLimits(max_entries=2))
    store.put("a", "r1", stored("first"))
    store.put("a", "r1", stored("second"))
    entry = store.get("a", "r1")
    assert entry is not None and entry.response["output"] == ["second"] and store.usage("a")[0] == 1


@pytest.mark.parametrize("limits", [{"max_entries": 0}, {"max_bytes": 0}, {"ttl_seconds": 0}])
def test_bounds_must_be_positive(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        StoreLimits(**limits)  # type: ignore[arg-type]
