"""Process logging: text or JSON lines, each carrying the request id when there is one.

Owns the root handler and its format. One handler on the root logger serves surge's loggers
and uvicorn's (`uvicorn.error`, `uvicorn.access`), so every line has the same shape; the
request id comes from `middleware.edge.request_id.current_request_id`, which is set for the whole
of a request, uvicorn's access line included.

What is never logged: request bodies (prompts, completions) and headers (API keys). No module
logs them, and there is deliberately no option to turn that on; the access line has the
method, path, status and client address only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone
from typing import TextIO

from middleware.edge.request_id import current_request_id

LOG_FORMATS = ("text", "json")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_id_suffix)s: %(message)s"


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (and a text suffix) to every record; a filter on the handler, so it
    sees records propagated from every logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = current_request_id.get()
        record.request_id = request_id
        record.request_id_suffix = f" [{request_id}]" if request_id else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", "")
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one that writes `log_format` lines to `stream`."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, not {log_format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # Python warnings become log lines of the same shape
    if log_format == "json":
        # Progress bars (loading weights) would put non-JSON text on the log stream.
        from transformers.utils import logging as hf_logging

        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # downloads from the hub
        hf_logging.disable_progress_bar()
    # uvicorn's loggers must reach the root handler rather than their own (see app/server/factory.py,
    # which passes log_config=None so uvicorn does not install its handlers).
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True
