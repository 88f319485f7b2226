"""Tests for models/loading/hub.py: real downloads from a fake hub on loopback, with faults and real retries.

Real huggingface_hub, real tenacity, real HTTP (tests/hub_server.py); only the waits are short.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx2
import huggingface_hub.constants
import pytest
import torch
from huggingface_hub.errors import OfflineModeIsEnabled

from models.config import ModelConfig
from models.loading import hub
from models.loading.loader import load_model, resolve_model_path
from scripts.harness.ports import free_port
from tests.hub_server import COMMIT_SHA, DROP, REPO_ID, FakeHub, Request

INITIAL_WAIT, MAX_WAIT = 0.05, 0.2  # seconds; real backoff, just short
MODEL_INFO = f"/api/models/{REPO_ID}"


@pytest.fixture(autouse=True)
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: tests/conftest.py sets HF_HUB_OFFLINE=1 for the suite, and huggingface_hub reads it once,
    # at import; these tests talk to a loopback fake, never the real hub.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def fake_hub(tiny_model_dir: Path) -> Iterator[FakeHub]:
    with FakeHub(tiny_model_dir) as fake:
        yield fake


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "hf-cache"


def _download(
    fake: FakeHub | None,
    cache_dir: Path,
    *,
    attempts: int = 5,
    endpoint: str | None = None,
    repo_id: str = REPO_ID,
) -> str:
    endpoint = endpoint or (fake.endpoint if fake is not None else None)
    return hub.download(
        repo_id,
        revision="",
        attempts=attempts,
        endpoint=endpoint,
        cache_dir=cache_dir,
        initial_wait=INITIAL_WAIT,
        max_wait=MAX_WAIT,
    )


def _retry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "surge.hub" and "retrying in" in r.getMessage()]


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_loads_after_two_503s(fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="surge.hub")
    fake_hub.fail(2, status=503)

    path = Path(_download(fake_hub, cache_dir))

    assert path.is_relative_to(cache_dir) and path.name == COMMIT_SHA
    assert _files(path) == fake_hub.files
    assert fake_hub.requests[:3] == [
        Request("GET", MODEL_INFO, 503),
        Request("GET", MODEL_INFO, 503),
        Request("GET", MODEL_INFO, 200),
    ]
    # Every file was fetched once: no retry beyond the two model_info failures.
    assert fake_hub.count("/resolve/", method="GET") == len(fake_hub.files)
    lines = _retry_lines(caplog)
    assert len(lines) == 2
    for k, line in enumerate(lines, start=1):
        assert REPO_ID in line and f"attempt {k} of 5" in line and "HTTP 503" in line


def test_dropped_connection_is_retried(fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake_hub.fail(1, status=DROP)

    path = Path(_download(fake_hub, cache_dir))

    assert _files(path) == fake_hub.files
    assert fake_hub.requests[:2] == [Request("GET", MODEL_INFO, DROP), Request("GET", MODEL_INFO, 200)]
    lines = _retry_lines(caplog)
    assert len(lines) == 1 and "RemoteProtocolError" in lines[0] and "attempt 1 of 5" in lines[0]


def test_dropped_file_download_reruns_the_snapshot(
    fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A file's first HEAD is not retried inside huggingface_hub: the error leaves snapshot_download,
    # and our retry runs the snapshot again, which skips the files already fetched.
    fake_hub.fail(1, status=DROP, path_contains="/resolve/")

    path = Path(_download(fake_hub, cache_dir))

    assert _files(path) == fake_hub.files
    assert sum(1 for r in fake_hub.requests if r.status == DROP) == 1
    assert fake_hub.count("/resolve/", method="GET") == len(fake_hub.files)
    lines = _retry_lines(caplog)
    assert len(lines) == 1 and "RemoteProtocolError" in lines[0]


def test_a_503_on_the_tree_listing_is_retried_inside_huggingface_hub(
    fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Documents the NOTE in models/loading/hub.py: huggingface_hub's http_backoff retries the tree listing
    # itself (after 1 s), so our retry never sees this failure. If this starts failing, the two
    # layers of retries have changed.
    fake_hub.fail(1, status=503, path_contains="/tree/")

    _download(fake_hub, cache_dir)

    assert [r.status for r in fake_hub.requests if "/tree/" in r.path] == [503, 200]
    assert _retry_lines(caplog) == []


def test_unknown_repo_fails_at_once(fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(hub.DownloadError) as info:
        _download(fake_hub, cache_dir, repo_id="surge-test/missing")

    message = str(info.value)
    assert "surge-test/missing" in message and fake_hub.endpoint in message
    assert "after 1 attempt" in message and "HTTP 404" in message
    assert fake_hub.requests == [Request("GET", "/api/models/surge-test/missing", 404)]
    assert _retry_lines(caplog) == []


def test_gives_up_after_the_attempts(fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake_hub.fail(100, status=503)

    with pytest.raises(hub.DownloadError) as info:
        _download(fake_hub, cache_dir, attempts=3)

    assert "after 3 attempt(s)" in str(info.value) and "HTTP 503" in str(info.value)
    assert fake_hub.requests == [Request("GET", MODEL_INFO, 503)] * 3
    lines = _retry_lines(caplog)
    assert len(lines) == 2
    assert "attempt 1 of 3" in lines[0] and "attempt 2 of 3" in lines[1]


def test_429_is_retried(fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake_hub.fail(1, status=429)

    _download(fake_hub, cache_dir)

    assert fake_hub.requests[:2] == [Request("GET", MODEL_INFO, 429), Request("GET", MODEL_INFO, 200)]
    assert len(_retry_lines(caplog)) == 1 and "HTTP 429" in _retry_lines(caplog)[0]


def test_connection_refused_is_retried_then_fails(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    with pytest.raises(hub.DownloadError) as info:
        _download(None, cache_dir, attempts=3, endpoint=endpoint)

    assert "after 3 attempt(s)" in str(info.value) and "ConnectError" in str(info.value)
    lines = _retry_lines(caplog)
    assert len(lines) == 2 and all("ConnectError" in line for line in lines)


def test_offline_mode_uses_the_cached_snapshot(
    fake_hub: FakeHub, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _download(fake_hub, cache_dir)
    fake_hub.stop()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    assert _download(None, cache_dir, endpoint="http://127.0.0.1:9") == first


def test_offline_mode_without_a_cached_snapshot_fails_at_once(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    with pytest.raises(hub.DownloadError, match="HF_HUB_OFFLINE is set and no complete snapshot"):
        _download(None, cache_dir, endpoint="http://127.0.0.1:9")


def test_unreachable_hub_falls_back_to_the_cached_snapshot(
    fake_hub: FakeHub, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _download(fake_hub, cache_dir)
    fake_hub.fail(100, status=503)

    assert _download(fake_hub, cache_dir, attempts=2) == first

    assert [r for r in fake_hub.requests if r.status == 503] == [Request("GET", MODEL_INFO, 503)] * 2
    assert any("using the cached snapshot" in r.getMessage() for r in caplog.records if r.name == "surge.hub")


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (httpx2.ConnectError("refused"), True),
        (httpx2.ReadTimeout("slow"), True),
        (ConnectionResetError(), True),
        (OfflineModeIsEnabled("offline"), False),
        (ValueError("bad"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert hub.is_transient(exc) is transient


def test_is_transient_looks_through_the_chain() -> None:
    try:
        try:
            raise httpx2.ConnectError("refused")
        except httpx2.ConnectError as inner:
            raise FileNotFoundError("no cached snapshot") from inner
    except FileNotFoundError as outer:
        assert hub.is_transient(outer)


def test_ignore_patterns_skip_pickles_only_beside_safetensors() -> None:
    assert "*.bin" in hub.ignore_patterns(["config.json", "model.safetensors", "pytorch_model.bin"])
    assert "*.bin" not in hub.ignore_patterns(["config.json", "pytorch_model.bin"])
    assert "*.gguf" in hub.ignore_patterns(["config.json", "pytorch_model.bin"])


def test_a_path_that_is_neither_a_directory_nor_a_hub_id(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory and not a hub id"):
        resolve_model_path(str(tmp_path / "no" / "such" / "dir"))


def test_a_local_directory_is_used_as_is(tiny_model_dir: Path) -> None:
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)


def test_load_model_from_the_hub(fake_hub: FakeHub, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache_dir))
    fake_hub.fail(1, status=503)

    loaded = load_model(ModelConfig(model=REPO_ID, device="cpu", dtype="float32", download_attempts=3))

    assert Path(loaded.path).is_relative_to(cache_dir) and Path(loaded.path).name == COMMIT_SHA
    assert loaded.model is not None and fake_hub.requests[0].status == 503
    ids = torch.tensor([loaded.tokenizer.encode("hello world")])  # (1, T)
    with torch.no_grad():
        logits = loaded.model(ids).logits  # (1, T, V)
    assert logits.shape == (1, ids.shape[1], loaded.vocab_size)
