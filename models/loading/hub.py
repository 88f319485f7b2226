"""Fetches a model from the Hugging Face hub into the local cache, retrying transient failures.

Owns the network side of loading a hub id: which files to fetch, the retry policy, and the error
a failed start-up shows. It runs once, in the engine process, before the weights load; nothing on
the request path calls it. It knows nothing of torch, the engine or HTTP serving.

Two hub calls, each retried on its own with exponential backoff and jitter: `model_info` (the
file list, to choose which weights to skip) and `snapshot_download` (the files, into the
standard cache, so `HF_HUB_OFFLINE=1` later finds them). Only failures that a later try can fix
are retried: connection errors, timeouts, 408, 429 and 5xx. A missing or gated repository, a
missing revision, a bad token or offline mode fail at once. With `HF_HUB_OFFLINE=1`, or when
every try failed transiently, the snapshot already in the cache (if complete) is used instead.

NOTE: huggingface_hub 2.4 retries some calls itself, and those multiply with ours. `model_info`
(our first call, and the one that sees a hub outage first) has no internal retry. Inside
`snapshot_download`, the tree listing and, after a first failure, each file's HEAD go through
`http_backoff` (5 more tries, 1 s doubling to 8 s), and each file's GET resumes up to 5 times on
connection errors. We cannot turn these off, so a hub that fails mid-snapshot costs up to six
requests and about 23 s per attempt of ours; we retry the snapshot as a whole because it also
swallows connection errors and 5xx into `LocalEntryNotFoundError`, which only a fresh call fixes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

log = logging.getLogger("surge.hub")

# Weights for other frameworks: never loaded by AutoModelForCausalLM, often gigabytes (as vLLM).
OTHER_FRAMEWORK_WEIGHTS = ("*.msgpack", "*.h5", "*.ot", "*.onnx", "*.tflite", "*.gguf")
# Pickled PyTorch weights: skipped when the repository also has safetensors (the loader prefers them).
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth")

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_ERRORS = (
    httpx2.TimeoutException,
    httpx2.NetworkError,
    httpx2.RemoteProtocolError,
    ConnectionError,
    TimeoutError,
)
_PERMANENT_ERRORS = (
    OfflineModeIsEnabled,  # a ConnectionError, but no retry turns offline mode off
    RepositoryNotFoundError,  # also GatedRepoError
    GatedRepoError,
    RevisionNotFoundError,
    HFValidationError,
)
_KNOWN_ERRORS = (*_PERMANENT_ERRORS, HfHubHTTPError, *_TRANSIENT_ERRORS)
# Seconds one metadata request may take; huggingface_hub's own default is no limit.
REQUEST_TIMEOUT_S = 10.0


class DownloadError(RuntimeError):
    """A model could not be fetched from the hub; the message says what was tried."""


def is_repo_id(text: str) -> bool:
    """Whether `text` has the form of a hub id ("name" or "namespace/name")."""
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def is_transient(exc: BaseException) -> bool:
    """Whether retrying could fix `exc`: the first known error along its chain decides."""
    deciding = _deciding_error(exc)
    if deciding is None or isinstance(deciding, _PERMANENT_ERRORS):
        return False
    if isinstance(deciding, HfHubHTTPError):
        return _status(deciding) in TRANSIENT_STATUSES
    return True


def ignore_patterns(filenames: list[str]) -> list[str]:
    """Files of the repository not to fetch: other frameworks' weights, and pickles beside safetensors."""
    has_safetensors = any(name.endswith(".safetensors") for name in filenames)
    return [*OTHER_FRAMEWORK_WEIGHTS, *(PICKLED_WEIGHTS if has_safetensors else ())]


def download(
    repo_id: str,
    *,
    revision: str = "",
    attempts: int = 5,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
    initial_wait: float = 1.0,
    max_wait: float = 30.0,
) -> str:
    """Fetch `repo_id` at `revision` ("" = the default branch) and return its local snapshot directory.

    `endpoint` defaults to `$HF_ENDPOINT`, read now (huggingface_hub reads it once, at import), else
    huggingface_hub's; `cache_dir` to huggingface_hub's (`HF_HUB_CACHE`). Waits between tries
    start at `initial_wait` seconds and double, plus jitter, up to `max_wait`. When the tries run
    out on transient errors, a complete snapshot already in the cache is used (with a warning).
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    if constants.is_offline_mode():
        return _cached(repo_id, revision, cache_dir, reason="HF_HUB_OFFLINE is set")
    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=initial_wait, max=max_wait, jitter=initial_wait),
        retry=retry_if_exception(is_transient),
        before_sleep=lambda state: _log_retry(repo_id, attempts, state),
        reraise=True,
    )
    api = HfApi(endpoint=endpoint, library_name="surge")
    try:
        info = retrying(api.model_info, repo_id, revision=revision or None, timeout=REQUEST_TIMEOUT_S)
        filenames = [sibling.rfilename for sibling in info.siblings or []]
        # The branch or tag name, not the sha, so the cache records refs/<revision> for offline use.
        path = retrying(
            snapshot_download,
            repo_id,
            revision=revision or None,
            endpoint=endpoint,
            cache_dir=cache_dir,
            ignore_patterns=ignore_patterns(filenames),
            library_name="surge",
        )
    except Exception as exc:
        tries = retrying.statistics.get("attempt_number", 1)
        message = f"could not download {repo_id} from {endpoint} after {tries} attempt(s): {describe(exc)}"
        if not is_transient(exc):
            raise DownloadError(message) from exc
        try:
            path = _cached(repo_id, revision, cache_dir, reason="the hub is unreachable")
        except DownloadError:
            raise DownloadError(message) from exc
        log.warning("%s; using the cached snapshot %s", message, path)
        return path
    log.info("fetched %s (revision %s) into %s", repo_id, revision or "default", path)
    return str(path)


def describe(exc: BaseException) -> str:
    """One short line naming the error that decided the outcome: class and message, or HTTP status."""
    deciding = _deciding_error(exc) or exc
    if isinstance(deciding, HfHubHTTPError) and (status := _status(deciding)) is not None:
        try:
            request = deciding.response.request
            return f"HTTP {status} from {request.method} {request.url.path}"
        except RuntimeError:  # a response built without its request
            return f"HTTP {status} ({type(deciding).__name__})"
    lines = str(deciding).strip().splitlines()
    text = lines[0][:200] if lines else ""
    return f"{type(deciding).__name__}: {text}" if text else type(deciding).__name__


def _cached(repo_id: str, revision: str, cache_dir: str | Path | None, *, reason: str) -> str:
    """The snapshot already in the cache, without touching the network."""
    try:
        # The broadest ignore list: the completeness check then covers the files every download fetched.
        path = snapshot_download(
            repo_id,
            revision=revision or None,
            cache_dir=cache_dir,
            local_files_only=True,
            ignore_patterns=[*OTHER_FRAMEWORK_WEIGHTS, *PICKLED_WEIGHTS],
        )
    except LocalEntryNotFoundError as exc:
        raise DownloadError(f"{repo_id}: {reason} and no complete snapshot of it is cached: {describe(exc)}") from exc
    log.info("using the cached snapshot of %s (%s): %s", repo_id, reason, path)
    return str(path)


def _log_retry(repo_id: str, attempts: int, state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    cause = describe(exc) if exc is not None else "no error"
    wait = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning(
        "hub: fetching %s failed (%s); attempt %d of %d, retrying in %.2f s",
        repo_id,
        cause,
        state.attempt_number,
        attempts,
        wait,
    )


def _deciding_error(exc: BaseException) -> BaseException | None:
    """The first error along `exc`'s chain (itself, its cause, its context, ...) that we can classify.

    snapshot_download catches connection errors and HTTP errors and raises LocalEntryNotFoundError
    `from` them, so the outer error alone says nothing about whether to retry.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _KNOWN_ERRORS):
            return current
        current = current.__cause__ or current.__context__
    return None


def _status(exc: HfHubHTTPError) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)
