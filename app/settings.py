"""Server settings: one frozen object, built once from flags and `SURGE_*` environment variables.

Precedence: a command-line flag, then `SURGE_<NAME>` (e.g. `SURGE_MAX_NUM_SEQS`), then the
default. List settings (`--api-key`, `--cors-origin`) repeat the flag, or take a
comma-separated environment variable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from middleware.admission.admission import AdmissionConfig
from middleware.admission.degradation import DegradationConfig
from middleware.dedup.cache import DEDUP_SCOPES
from middleware.idempotency.asgi import DEFAULT_MAX_STORED_BYTES
from middleware.keys_file import KeysFile, load_keys_file
from models.config import EngineConfig, ModelConfig, SchedulerConfig


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # flag without dashes, snake_case; the env var is SURGE_<NAME upper>
    type: type
    help: str
    choices: tuple[str, ...] | None = None
    multiple: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "SURGE_" + self.name.upper()

    @property
    def default(self) -> Any:
        """The default lives once, on the Settings field of the same name."""
        return Settings.__dataclass_fields__[self.name].default


# The single list of serve options: the CLI, the environment and the table of docs/configuration.md come from it.
OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        str,
        "`tiny` (embedded, built offline), `echo` (no model: measures serving overhead), a Hugging Face model"
        " directory, or a hub id",
    ),
    Option("revision", str, "hub ids only: branch, tag or commit to download; empty = the default branch"),
    Option(
        "download_attempts",
        int,
        "hub ids only: tries of a download that fails transiently (connection errors, timeouts, 429, 5xx),"
        " with exponential backoff",
    ),
    Option("host", str, "address to listen on"),
    Option("port", int, "port to listen on"),
    Option("device", str, "`auto` picks CUDA when torch sees a GPU", choices=("auto", "cpu", "cuda")),
    Option(
        "dtype",
        str,
        "`auto`: float32 on CPU, bfloat16 (or float16) on GPU",
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    Option("max_num_seqs", int, "sequences decoded together; each holds one KV-cache slot"),
    Option(
        "max_num_batched_tokens",
        int,
        "tokens fed to the model per step; longer prompts are prefilled in chunks of this size",
    ),
    Option(
        "max_prompt_chunk_while_decoding",
        int,
        "while sequences decode, one prompt's tokens per step at most: a long prompt is prefilled in pieces"
        " and running streams keep moving; short prompts and an idle engine are not held back; 0 = no cap",
    ),
    Option("max_model_len", int, "prompt + completion tokens per sequence; 0 = the model's own limit"),
    Option("served_model_name", str, "model name in the API; empty = the --model value"),
    Option(
        "tool_call_parser",
        str,
        "the tool-call format of the model's replies; `auto` = the one its chat template writes",
        choices=("auto", "hermes", "llama3_json", "mistral"),
    ),
    Option("chat_template", str, "a Jinja chat template file used instead of the model's own; empty = the model's"),
    Option("api_key", str, "accepted Bearer key (repeatable); none = no auth", multiple=True),
    Option("metrics_key", str, "Bearer key GET /metrics requires; empty = /metrics open (health and ready stay open)"),
    Option(
        "auth_failures_per_minute", int, "failed authentications per client address and minute before 429s; 0 = off"
    ),
    Option("cors_origin", str, "allowed CORS origin (repeatable, `*` for any)", multiple=True),
    Option("num_threads", int, "torch CPU threads; 1 avoids contention with the event loop, 0 = torch default"),
    Option(
        "prefill_threads",
        int,
        "torch CPU threads for a step that prefills a burst of prompts (128+ prompt tokens), while the"
        " HTTP side waits; 0 = every CPU the process may use (affinity and cgroup quota)",
    ),
    Option(
        "engine_mode",
        str,
        "`process`: the engine runs in a child process, beside the HTTP server rather than sharing its GIL;"
        " `thread`: on a thread of the server's process",
        choices=("process", "thread"),
    ),
    Option(
        "engine_nice",
        int,
        "nice value of the engine process (process mode): on a busy CPU the HTTP server (refusals, probes,"
        " stream writes) runs before model compute; 0 = the same priority",
    ),
    Option("max_connections", int, "open connections and requests beyond which uvicorn answers 503; 0 = no limit"),
    Option("max_header_bytes", int, "largest request line plus headers (400 beyond)"),
    Option(
        "header_timeout_seconds", float, "time a request's headers may take to arrive before its connection is closed"
    ),
    Option("max_body_bytes", int, "largest accepted request body (413 beyond)"),
    Option("keepalive_seconds", float, "SSE keep-alive comment interval while a stream is silent"),
    Option("log_level", str, "log level", choices=("debug", "info", "warning", "error")),
    Option("log_format", str, "`json`: one JSON object per log line, with request_id", choices=("text", "json")),
    # --- shutdown -----------------------------------------------------------------------------
    Option(
        "shutdown_delay_seconds",
        float,
        "after SIGTERM, how long /ready is 503 and new requests get 503 before the listener closes",
    ),
    Option("shutdown_grace_seconds", float, "after the delay, the longest wait for in-flight requests"),
    # --- traffic layer: shared state -------------------------------------------------------
    Option("redis_url", str, "Redis for state shared by replicas (e.g. redis://host:6379/0); empty = in-process"),
    Option("redis_timeout_ms", int, "longest wait on Redis per decision; beyond it, fail open to in-process state"),
    Option(
        "redis_down_after_failures",
        int,
        "consecutive failed Redis calls that mark it down (each failed call falls back on its own)",
    ),
    Option(
        "redis_connect_attempts",
        int,
        "tries to reach Redis at start-up, with exponential backoff; after the last, start on in-process state",
    ),
    # --- rate limits --------------------------------------------------------------------------
    Option("rate_limit_rpm", int, "requests per minute per API key (per client address without keys); 0 = off"),
    Option("rate_limit_tpm", int, "tokens (prompt + max_tokens) per minute per API key; 0 = off"),
    Option("max_concurrent_per_key", int, "requests one API key may have in flight (per replica); 0 = no limit"),
    Option("keys_file", str, "YAML or JSON file of API keys with per-key limits and priority tier"),
    Option(
        "rate_limit_replicas",
        int,
        "replicas sharing the limits through Redis; while Redis is unreachable each enforces 1/N of them",
    ),
    # --- idempotency and dedup -----------------------------------------------------------------
    Option("idempotency_ttl_seconds", float, "how long a finished response is kept for Idempotency-Key retries"),
    Option("idempotency_lease_seconds", float, "in-flight lease of an Idempotency-Key, extended while it runs"),
    Option("idempotency_max_bytes", int, "largest response stored for an Idempotency-Key; larger ones replay as a 422"),
    Option("dedup_ttl_seconds", float, "how long identical deterministic requests share a result; 0 = off"),
    Option(
        "dedup_scope", str, "who shares dedup results: key (requests of one API key) or global", choices=DEDUP_SCOPES
    ),
    # --- admission control and degradation ---------------------------------------------------
    Option(
        "max_queued_requests",
        int,
        "waiting sequences (one per choice of each prompt) past which new requests get a fast 503; 0 = no bound",
    ),
    Option("max_queued_tokens", int, "waiting prompt tokens beyond which new requests get a 503; 0 = no bound"),
    Option("max_queue_seconds", float, "a request still queued after this is dropped unrun (503); 0 = no limit"),
    Option("degrade_thresholds", str, "load scores entering degradation levels 1-4; `off` disables"),
    Option("degrade_queue_depth", int, "waiting requests that count as load 1.0"),
    Option("degrade_queue_seconds", float, "queue-time p90 that counts as load 1.0"),
    Option("degrade_ttft_seconds", float, "time-to-first-token p90 that counts as load 1.0"),
    Option("degrade_error_rate", float, "error rate that counts as load 1.0"),
    Option("degrade_cooldown_seconds", float, "calm time before stepping down one degradation level"),
    Option("degrade_max_tokens", int, "max_tokens clamp from level 2"),
    Option("degrade_max_prompt_tokens", int, "longest prompt accepted from level 2"),
    Option("canned_reply", str, "reply text at level 3 when no cached reply exists"),
    Option(
        "shed_priority",
        int,
        "at levels 3-4, keys whose tier (keys file; 0 without one) is >= this get canned replies, then 503s",
    ),
)


# Each default lives once, on the config object that uses it; the settings take it from there.
_MODEL = ModelConfig()
_SCHEDULER = SchedulerConfig()
_ENGINE = EngineConfig()
_DEGRADATION = DegradationConfig()
_ADMISSION = AdmissionConfig()


@dataclass(frozen=True, slots=True)
class Settings:
    model: str = _MODEL.model
    revision: str = _MODEL.revision
    download_attempts: int = _MODEL.download_attempts
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = _MODEL.device
    dtype: str = _MODEL.dtype
    max_num_seqs: int = _SCHEDULER.max_num_seqs
    max_num_batched_tokens: int = _SCHEDULER.max_num_batched_tokens
    max_prompt_chunk_while_decoding: int = _SCHEDULER.max_prompt_chunk_while_decoding
    max_model_len: int = _SCHEDULER.max_model_len
    served_model_name: str = ""
    tool_call_parser: str = "auto"
    chat_template: str = ""
    api_key: tuple[str, ...] = ()
    auth_failures_per_minute: int = 30
    metrics_key: str = ""
    max_concurrent_per_key: int = 0
    cors_origin: tuple[str, ...] = ()
    num_threads: int = _MODEL.num_threads
    prefill_threads: int = _MODEL.prefill_threads
    engine_mode: str = "process" if _ENGINE.separate_process else "thread"
    engine_nice: int = _ENGINE.nice
    max_body_bytes: int = 8 * 1024 * 1024
    # Connection bounds (app/http_protocol.py): h11's default header bound, 16 KiB.
    max_connections: int = 2048
    max_header_bytes: int = 16 * 1024
    header_timeout_seconds: float = 10.0
    keepalive_seconds: float = 5.0
    log_level: str = "info"
    log_format: str = "text"
    shutdown_delay_seconds: float = 2.0
    shutdown_grace_seconds: float = 30.0
    redis_url: str = ""
    redis_timeout_ms: int = 200
    redis_down_after_failures: int = 3
    redis_connect_attempts: int = 5
    rate_limit_rpm: int = 0
    rate_limit_tpm: int = 0
    keys_file: str = ""
    rate_limit_replicas: int = 1
    idempotency_ttl_seconds: float = 86400.0
    idempotency_lease_seconds: float = 30.0
    idempotency_max_bytes: int = DEFAULT_MAX_STORED_BYTES
    dedup_ttl_seconds: float = 300.0
    dedup_scope: str = "key"
    max_queued_requests: int = _ADMISSION.max_queued_requests
    max_queued_tokens: int = _ADMISSION.max_queued_tokens
    max_queue_seconds: float = _SCHEDULER.max_queue_seconds
    degrade_thresholds: str = ",".join(f"{threshold:g}" for threshold in _DEGRADATION.thresholds)
    degrade_queue_depth: int = _DEGRADATION.queue_depth
    degrade_queue_seconds: float = _DEGRADATION.queue_seconds
    degrade_ttft_seconds: float = _DEGRADATION.ttft_seconds
    degrade_error_rate: float = _DEGRADATION.error_rate
    degrade_cooldown_seconds: float = _DEGRADATION.cooldown_seconds
    degrade_max_tokens: int = _ADMISSION.degraded_max_tokens
    degrade_max_prompt_tokens: int = _ADMISSION.degraded_max_prompt_tokens
    canned_reply: str = _ADMISSION.canned_reply
    shed_priority: int = _ADMISSION.shed_priority
    engine: EngineConfig = field(init=False)
    degradation: DegradationConfig = field(init=False)
    admission: AdmissionConfig = field(init=False)
    keys: KeysFile | None = field(init=False)  # the parsed --keys-file, checked at start-up
    chat_template_text: str | None = field(init=False)  # the --chat-template file, read at start-up

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError("port must be between 1 and 65535")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.max_connections < 0 or self.max_header_bytes < 1024 or self.header_timeout_seconds <= 0:
            raise ValueError(
                "max_connections must be 0 or positive, max_header_bytes at least 1024, header_timeout_seconds positive"
            )
        if self.keepalive_seconds <= 0:
            raise ValueError("keepalive_seconds must be positive")
        if self.shutdown_delay_seconds < 0 or self.shutdown_grace_seconds < 0:
            raise ValueError("shutdown_delay_seconds and shutdown_grace_seconds must not be negative")
        if self.redis_timeout_ms <= 0:
            raise ValueError("redis_timeout_ms must be positive")
        if self.redis_down_after_failures < 1:
            raise ValueError("redis_down_after_failures must be at least 1")
        if self.redis_connect_attempts < 1:
            raise ValueError("redis_connect_attempts must be at least 1")
        if self.rate_limit_rpm < 0 or self.rate_limit_tpm < 0:
            raise ValueError("rate limits must be 0 (off) or positive")
        if self.rate_limit_replicas < 1:
            raise ValueError("rate_limit_replicas must be at least 1")
        if self.idempotency_ttl_seconds <= 0 or self.idempotency_lease_seconds <= 0:
            raise ValueError("idempotency TTL and lease must be positive")
        if self.idempotency_max_bytes < 1024:
            raise ValueError("idempotency_max_bytes must be at least 1024")
        if self.dedup_ttl_seconds < 0:
            raise ValueError("dedup_ttl_seconds must be 0 (off) or positive")
        if self.max_concurrent_per_key < 0:
            raise ValueError("max_concurrent_per_key must be 0 (no limit) or positive")
        if self.auth_failures_per_minute < 0:
            raise ValueError("auth_failures_per_minute must be 0 (off) or positive")
        if self.dedup_scope not in DEDUP_SCOPES:
            raise ValueError(f"dedup_scope must be one of {', '.join(DEDUP_SCOPES)}")
        engine = EngineConfig(
            model=ModelConfig(
                self.model,
                self.device,
                self.dtype,
                self.num_threads,
                prefill_threads=self.prefill_threads,
                revision=self.revision,
                download_attempts=self.download_attempts,
            ),
            scheduler=SchedulerConfig(
                self.max_num_seqs,
                self.max_num_batched_tokens,
                self.max_model_len,
                self.max_queue_seconds,
                max_prompt_chunk_while_decoding=self.max_prompt_chunk_while_decoding,
            ),
            separate_process=self.engine_mode == "process",
            nice=self.engine_nice,
        )
        object.__setattr__(self, "engine", engine)
        thresholds = self.degrade_thresholds.strip().lower()
        degradation = DegradationConfig(
            thresholds=() if thresholds in ("", "off", "none") else tuple(float(t) for t in thresholds.split(",")),
            queue_depth=self.degrade_queue_depth,
            queue_seconds=self.degrade_queue_seconds,
            ttft_seconds=self.degrade_ttft_seconds,
            error_rate=self.degrade_error_rate,
            cooldown_seconds=self.degrade_cooldown_seconds,
        )
        object.__setattr__(self, "degradation", degradation)
        admission = AdmissionConfig(
            max_queued_requests=self.max_queued_requests,
            max_queued_tokens=self.max_queued_tokens,
            degraded_max_tokens=self.degrade_max_tokens,
            degraded_max_prompt_tokens=self.degrade_max_prompt_tokens,
            canned_reply=self.canned_reply,
            shed_priority=self.shed_priority,
        )
        object.__setattr__(self, "admission", admission)
        # A KeysFileError (a ValueError) names the file, the key and the field.
        object.__setattr__(self, "keys", load_keys_file(self.keys_file) if self.keys_file else None)
        template = _read_template(self.chat_template) if self.chat_template else None
        object.__setattr__(self, "chat_template_text", template)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


def _read_template(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"--chat-template {path}: {exc.strerror or exc}") from exc


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    for option in OPTIONS:
        if option.multiple:
            # Resolved in settings_from_namespace: a flag given on the command line replaces the env list.
            parser.add_argument(option.flag, action="append", default=None, help=option.help + f" [{option.env}]")
            continue
        raw = environ.get(option.env)
        default = option.type(raw) if raw is not None else option.default
        parser.add_argument(
            option.flag,
            type=option.type,
            default=default,
            choices=option.choices,
            help=option.help + f" [{option.env}]",
        )


def settings_from_namespace(ns: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    values = {}
    for option in OPTIONS:
        value = getattr(ns, option.name)
        if option.multiple:
            if value is None:
                raw = environ.get(option.env)
                value = [v.strip() for v in (raw or "").split(",") if v.strip()]
                if option.name == "api_key" and raw is not None and not value:
                    # NOTE: a Secret that rendered empty must not silently turn auth off.
                    raise ValueError(f"{option.env} is set but holds no key; unset it to run without auth")
            elif option.name == "api_key" and not all(v.strip() for v in value):
                raise ValueError(f"{option.flag} needs a key, not an empty string")
            value = tuple(value)
        values[option.name] = value
    return Settings(**values)


def parse_settings(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="surge serve")
    env = os.environ if environ is None else environ
    add_serve_arguments(parser, env)
    return settings_from_namespace(parser.parse_args(list(argv)), env)
