"""A fake Hugging Face hub on a loopback port, serving one local model directory as a repository.

It speaks the slice of the hub's HTTP API that huggingface_hub 2.4 uses to fetch a model
(`HfApi.model_info`, `list_repo_tree`, then a HEAD and a GET on `/resolve/` per file), with the
headers it checks (X-Repo-Commit, ETag, Content-Length, X-Error-Code). A fault plan makes the
next requests fail, and every request is recorded, so tests assert on what the client really did.

    with FakeHub(model_dir) as fake:                  # serves model_dir as "surge-test/tiny"
        fake.endpoint                                 # http://127.0.0.1:PORT (pass as endpoint=)
        fake.fail(2, status=503)                      # the next two requests get a 503
        fake.fail(1, status=DROP, path_contains="/resolve/")  # close without answering, once
        fake.requests                                 # [Request("GET", "/api/models/...", 503), ...]
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from scripts.harness.service import Service

REPO_ID = "surge-test/tiny"
COMMIT_SHA = "0123456789abcdef0123456789abcdef01234567"  # the one commit the fake repository has
DROP = 0  # a fault "status": close the connection without sending a response


class Request(NamedTuple):
    method: str
    path: str  # without the query string
    status: int  # DROP when the connection was closed without a response


@dataclass
class _Fault:
    remaining: int
    status: int
    path_contains: str


class FakeHub(Service):
    def __init__(self, model_dir: Path, repo_id: str = REPO_ID, sha: str = COMMIT_SHA) -> None:
        self.repo_id = repo_id
        self.sha = sha
        root = Path(model_dir)
        # Whole files in memory: the tiny models are a few MB.
        self.files: dict[str, bytes] = {
            p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }
        self.requests: list[Request] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def fail(self, count: int, *, status: int = 503, path_contains: str = "") -> None:
        """Make the next `count` requests whose path contains `path_contains` fail with `status` (or DROP)."""
        with self._lock:
            self._faults.append(_Fault(count, status, path_contains))

    def count(self, path_contains: str = "", *, method: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if path_contains in r.path and method in (None, r.method))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- called from the server's threads --------------------------------------------------------

    def _take_fault(self, path: str) -> int | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.path_contains in path:
                    fault.remaining -= 1
                    return fault.status
        return None

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append(Request(method, path, status))

    def _respond(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for a request the fault plan let through."""
        api = f"/api/models/{self.repo_id}"
        if path.startswith("/api/models/"):
            if path != api and not path.startswith(api + "/"):
                return _error(404, "RepoNotFound")
            rest = path[len(api) :]
            if rest == "" or rest.startswith("/revision/"):
                revision = rest[len("/revision/") :] if rest else "main"
                if not self._knows(revision):
                    return _error(404, "RevisionNotFound")
                siblings = [{"rfilename": name} for name in self.files]
                return _json({"id": self.repo_id, "sha": self.sha, "siblings": siblings})
            if rest.startswith("/tree/"):
                revision = rest[len("/tree/") :].split("/", 1)[0]
                if not self._knows(revision):
                    return _error(404, "RevisionNotFound")
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": _git_blob_id(data)}
                    for name, data in self.files.items()
                ]
                return _json(tree)
            return _error(404, "")
        prefix = f"/{self.repo_id}/resolve/"
        if not path.startswith(prefix):
            return _error(404, "RepoNotFound")
        revision, _, filename = path[len(prefix) :].partition("/")
        if not self._knows(revision):
            return _error(404, "RevisionNotFound")
        data = self.files.get(filename)
        if data is None:
            headers = {"X-Repo-Commit": self.sha}
            return 404, {**headers, "X-Error-Code": "EntryNotFound"}, b""
        headers = {"X-Repo-Commit": self.sha, "ETag": f'"{_git_blob_id(data)}"', "Content-Length": str(len(data))}
        return 200, headers, data if method == "GET" else b""

    def _knows(self, revision: str) -> bool:
        return revision in ("main", self.sha)


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so after stop() no kept-alive connection still answers.
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_HEAD(self) -> None:
            self._serve("HEAD")

        def _serve(self, method: str) -> None:
            path = unquote(urlsplit(self.path).path)
            fault = hub._take_fault(path)
            if fault == DROP:
                hub._record(method, path, DROP)
                self.close_connection = True  # nothing written: the client sees the socket close
                return
            headers: dict[str, str] = {}
            if fault is not None:
                status, body = fault, b""
            else:
                status, headers, body = hub._respond(method, path)
            hub._record(method, path, status)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if method == "GET" and body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the test asserts on hub.requests instead

    return Handler


def _json(payload: object) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(payload).encode()


def _error(status: int, error_code: str) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if error_code:
        headers["X-Error-Code"] = error_code
    return status, headers, json.dumps({"error": error_code or "not found"}).encode()


def _git_blob_id(data: bytes) -> str:
    """The id git gives the file's contents, as the hub's ETag for non-LFS files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
