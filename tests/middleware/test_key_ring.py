"""KeyRing and KeysFileWatcher without a server: what a reload replaces, and when it happens."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from middleware.key_ring import KeyRing, KeySet, KeysFileWatcher
from middleware.keys_file import Limits, load_keys_file

DEFAULT = Limits(rpm=60, tpm=0)


def watched(path: Path, api_keys: tuple[str, ...] = ()) -> KeysFileWatcher:
    ring = KeyRing(KeySet.from_file(api_keys, load_keys_file(path), DEFAULT))
    return KeysFileWatcher(ring, str(path), api_keys=api_keys, default_limits=DEFAULT)


def test_a_reload_keeps_nothing_of_a_removed_key(tmp_path: Path) -> None:
    """Per-key settings of a removed key (tier, priority floor, limits) go with the old set."""
    path = tmp_path / "keys.yaml"
    path.write_text("sk-gone: {tier: 2, min_priority: -5, rpm: 9, max_concurrent: 3}\nsk-kept: {tpm: 100}\n")
    watcher = watched(path, api_keys=("sk-flag",))
    before = watcher.ring.current
    path.write_text("sk-kept: {tpm: 100}\nsk-new:\n")
    assert watcher.check()
    keys = watcher.ring.current
    assert keys is not before  # replaced whole, the old set untouched
    assert set(keys.keys) == {b"sk-flag", b"sk-kept", b"sk-new"}
    assert b"sk-gone" not in {*keys.tiers, *keys.min_priorities}
    assert "sk-gone" not in {*keys.rate_limits, *keys.concurrency_limits}
    assert keys.rate_limits["sk-new"] == DEFAULT and keys.rate_limits["sk-kept"] == Limits(60, 100)
    assert b"sk-gone" in before.keys and before.tiers[b"sk-gone"] == 2
    assert not watcher.check()  # unchanged: nothing read


def test_a_secret_volumes_symlink_swap_is_seen_even_with_the_same_size_and_time(tmp_path: Path) -> None:
    """Kubernetes updates a Secret volume by pointing `..data` at a new directory: the path names
    a new inode; the size and the modification time may well be the same."""
    for version, key in (("v1", "sk-aaaa"), ("v2", "sk-bbbb")):
        (tmp_path / version).mkdir()
        (tmp_path / version / "keys.yaml").write_text(f"{key}:\n")
        os.utime(tmp_path / version / "keys.yaml", ns=(1_000_000_000, 1_000_000_000))
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "keys.yaml").symlink_to("..data/keys.yaml")
    watcher = watched(tmp_path / "keys.yaml")
    assert watcher.ring.current.keys == (b"sk-aaaa",)
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")  # atomic, as the kubelet does
    assert watcher.check()
    assert watcher.ring.current.keys == (b"sk-bbbb",)


def test_a_file_that_does_not_parse_keeps_the_keys_and_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("sk-secret-one:\n")
    watcher = watched(path)
    before = watcher.ring.current
    path.write_text("sk-secret-two: {rpm: [\n")
    with caplog.at_level(logging.ERROR, logger="surge.keys"):
        assert not watcher.check()
        assert not watcher.check()  # the same broken file: not reported again
        path.unlink()
        assert not watcher.check()  # gone (mid-rename, say): reported, keys kept
        assert not watcher.check()
    assert watcher.ring.current is before
    errors = [record.getMessage() for record in caplog.records]
    assert len(errors) == 2, errors
    assert "not valid YAML" in errors[0] and "keeping the 1 keys in use" in errors[0]
    assert "cannot read it" in errors[1]
    assert not any("sk-secret" in error for error in errors)
    assert not watcher.reload()  # asked for (SIGHUP): reported again
    assert len(caplog.records) == 3
    path.write_text("sk-secret-two:\n")
    assert watcher.check() and watcher.ring.current.keys == (b"sk-secret-two",)
