"""Server settings: one frozen object, built once from flags and `SURGE_*` environment variables
(app/config/arguments.py), its checks, and what the rest of the server derives from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from app.config.sizes import parse_size
from middleware.admission.admission import AdmissionConfig
from middleware.admission.degradation import DegradationConfig
from middleware.dedup.cache import DEDUP_SCOPES
from middleware.edge.allowed_hosts import check_allowed_host
from middleware.idempotency.asgi import DEFAULT_MAX_STORED_BYTES
from middleware.idempotency.store import TenantQuota
from middleware.keys_file import KeysFile, Limits, load_keys_file
from models import AUTO_THREADS, EngineConfig, ModelConfig, SchedulerConfig

# Each default lives once, on the config object that uses it; the settings take it from there.
_MODEL = ModelConfig()
_SCHEDULER = SchedulerConfig()
_ENGINE = EngineConfig()
_DEGRADATION = DegradationConfig()
_ADMISSION = AdmissionConfig()
_QUOTA = TenantQuota()


@dataclass(frozen=True, slots=True)
class Settings:
    model: str = _MODEL.model
    revision: str = _MODEL.revision
    download_attempts: int = _MODEL.download_attempts
    quantization: str = _MODEL.quantization
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = _MODEL.device
    dtype: str = _MODEL.dtype
    max_num_seqs: int = _SCHEDULER.max_num_seqs
    max_num_batched_tokens: int = _SCHEDULER.max_num_batched_tokens
    max_prompt_chunk_while_decoding: int = _SCHEDULER.max_prompt_chunk_while_decoding
    max_prompt_chunk_seconds_while_decoding: float = _SCHEDULER.max_prompt_chunk_seconds_while_decoding
    max_model_len: int = _SCHEDULER.max_model_len
    prefix_caching: str = "on" if _SCHEDULER.prefix_caching else "off"
    preemption: str = "on" if _SCHEDULER.preemption else "off"
    heavy_sequence_tokens: int = _SCHEDULER.heavy_sequence_tokens
    light_lane_share: float = _SCHEDULER.light_lane_share
    batch_policy: str = _SCHEDULER.batch_policy
    user_header: str = ""
    batch_policy_base: float = _SCHEDULER.batch_policy_base
    kv_events_endpoint: str = ""
    kv_events_topic: str = ""
    kv_events_format: str = "map"
    prefix_cache_size: str = f"{_SCHEDULER.prefix_cache_share:.0%}"
    warm_templates: str = ""
    kv_cache_memory: str = f"{_SCHEDULER.kv_cache_share:.0%}"
    served_model_name: str = ""
    # Each further --model: "name=model", one more chat model with an engine of its own.
    models: tuple[str, ...] = ()
    light_model: str = ""
    light_model_level: int = 2
    light_model_max_prompt_tokens: int = 1024
    light_model_max_tokens: int = 256
    light_model_min_tier: int = 0
    embedding_model: str = "tiny"
    served_embedding_model_name: str = ""
    embedding_threads: int = 1
    merge_similar: float = 0.0
    model_version: str = ""
    tool_call_parser: str = "auto"
    json_schema_objects: str = "closed"
    chat_template: str = ""
    api_key: tuple[str, ...] = ()
    auth_failures_per_minute: int = 30
    metrics_key: str = ""
    metrics_port: int = 0  # 0: /metrics on the API port
    max_concurrent_per_key: int = 0
    cors_origin: tuple[str, ...] = ()
    allowed_host: tuple[str, ...] = ()  # with auth off; loopback names and IP addresses always pass
    num_threads: str = "auto"  # or a count (models/config.py AUTO_THREADS)
    prefill_threads: int = _MODEL.prefill_threads
    engine_mode: str = "process" if _ENGINE.separate_process else "thread"
    engine_nice: int = _ENGINE.nice
    max_body_bytes: int = 0
    # Connection bounds (app/server/http_protocol.py): h11's default header bound, 16 KiB.
    max_connections: int = 2048
    # Idle or still-arriving connections per client address: above the openai SDK's pool of 100 idle
    # ones (httpx keeps 20), so one client never meets it; far below max_connections, so one address
    # cannot fill it (requests being answered do not count: the traffic layers bound those).
    max_connections_per_address: int = 128
    # nginx's send_timeout: a client that takes nothing of a response for this long is gone.
    send_timeout_seconds: float = 60.0
    max_header_bytes: int = 16 * 1024
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    keepalive_seconds: float = 5.0
    log_level: str = "info"
    log_format: str = "text"
    shutdown_delay_seconds: float = 2.0
    shutdown_grace_seconds: float = 30.0
    redis_url: str = ""
    redis_cache_url: str = ""
    redis_timeout_ms: int = 200
    redis_down_after_failures: int = 3
    redis_connect_attempts: int = 5
    rate_limit_rpm: int = 0
    rate_limit_tpm: int = 0
    keys_file: str = ""
    # A Secret volume's update reaches the pod within a minute or so; a few seconds more is noise.
    keys_file_reload_seconds: float = 5.0
    rate_limit_replicas: int = 1
    idempotency_ttl_seconds: float = 86400.0
    idempotency_lease_seconds: float = 30.0
    idempotency_max_bytes: int = DEFAULT_MAX_STORED_BYTES
    idempotency_max_keys_per_tenant: int = _QUOTA.max_entries
    idempotency_max_bytes_per_tenant: int = _QUOTA.max_bytes
    dedup_ttl_seconds: float = 300.0
    # Stored responses (the Responses API's `store`), per API key: app/runtime/response_store.py.
    responses_store_max_entries: int = 1000
    responses_store_max_bytes: int = 64 * 1024 * 1024
    responses_store_ttl_seconds: float = 86400.0
    dedup_scope: str = "key"
    max_queued_requests: int = _ADMISSION.max_queued_requests
    max_queued_tokens: int = _ADMISSION.max_queued_tokens
    max_queue_share_per_key: float = _ADMISSION.max_queue_share_per_key
    max_request_tokens: int = 0
    max_request_output_tokens: int = 262_144
    max_queue_seconds: float = _SCHEDULER.max_queue_seconds
    degrade_thresholds: str = ",".join(f"{threshold:g}" for threshold in _DEGRADATION.thresholds)
    degrade_queue_depth: int = _DEGRADATION.queue_depth
    degrade_queue_seconds: float = _DEGRADATION.queue_seconds
    degrade_ttft_seconds: float = _DEGRADATION.ttft_seconds
    degrade_error_rate: float = _DEGRADATION.error_rate
    degrade_step_seconds: float = _DEGRADATION.step_seconds
    degrade_full_step_factor: float = _DEGRADATION.full_step_factor
    degrade_kv_usage: float = _DEGRADATION.kv_usage
    degrade_memory_usage: float = _DEGRADATION.memory_usage
    degrade_compute_usage: float = _DEGRADATION.compute_usage
    degrade_cooldown_seconds: float = _DEGRADATION.cooldown_seconds
    degrade_hysteresis: float = _DEGRADATION.hysteresis
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
        if not 0 <= self.metrics_port < 65536 or self.metrics_port == self.port:
            raise ValueError("metrics_port must be 0 (off) or a port between 1 and 65535 other than port")
        if self.keys_file_reload_seconds < 0:
            raise ValueError("keys_file_reload_seconds must be 0 (on SIGHUP only) or positive")
        if self.max_body_bytes != 0 and self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be 0 (derived) or at least 1024")
        if self.body_timeout_seconds <= 0:
            raise ValueError("body_timeout_seconds must be positive")
        if self.max_connections < 0 or self.max_header_bytes < 1024 or self.header_timeout_seconds <= 0:
            raise ValueError(
                "max_connections must be 0 or positive, max_header_bytes at least 1024, header_timeout_seconds positive"
            )
        if self.max_connections_per_address < 0 or self.send_timeout_seconds < 0:
            raise ValueError("max_connections_per_address and send_timeout_seconds must be 0 (off) or positive")
        for host in self.allowed_host:
            check_allowed_host(host)
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
        if (
            self.idempotency_max_keys_per_tenant < 1
            or self.idempotency_max_bytes_per_tenant < self.idempotency_max_bytes
        ):
            raise ValueError(
                "idempotency_max_keys_per_tenant must be positive and idempotency_max_bytes_per_tenant at least"
                " idempotency_max_bytes"
            )
        if (
            self.responses_store_max_entries < 1
            or self.responses_store_max_bytes < 1
            or self.responses_store_ttl_seconds <= 0
        ):
            raise ValueError("responses_store_max_entries, _max_bytes and _ttl_seconds must be positive")
        if self.embedding_threads < 1 or not 0 <= self.merge_similar <= 1:
            raise ValueError("embedding_threads must be at least 1, merge_similar from 0 (off) to 1 (a cosine)")
        if self.merge_similar and not (self.embedding_model and self.dedup_ttl_seconds):
            raise ValueError("merge_similar needs an embedding model (--embedding-model) and dedup on (a TTL)")
        names = [name for name, _ in self.chat_models]  # a malformed --model NAME=MODEL raises here
        if len(set(names)) < len(names) or self.embedding_model_name in names:
            raise ValueError("every served model needs a name of its own (--model NAME=..., --served-*-model-name)")
        if self.light_model and (self.light_model not in names or not 1 <= self.light_model_level <= 4):
            raise ValueError("light_model must name a served chat model, light_model_level be from 1 to 4")
        if self.dedup_ttl_seconds < 0:
            raise ValueError("dedup_ttl_seconds must be 0 (off) or positive")
        if self.max_request_tokens < 0 or self.max_request_output_tokens < 1:
            raise ValueError("max_request_tokens must be 0 (derived) or positive, max_request_output_tokens positive")
        if self.max_concurrent_per_key < 0:
            raise ValueError("max_concurrent_per_key must be 0 (no limit) or positive")
        if self.auth_failures_per_minute < 0:
            raise ValueError("auth_failures_per_minute must be 0 (off) or positive")
        if self.dedup_scope not in DEDUP_SCOPES:
            raise ValueError(f"dedup_scope must be one of {', '.join(DEDUP_SCOPES)}")
        if self.json_schema_objects not in ("closed", "open"):
            raise ValueError("json_schema_objects must be closed or open")
        if self.prefix_caching not in ("on", "off"):
            raise ValueError("prefix_caching must be on or off")
        if self.preemption not in ("on", "off"):
            raise ValueError("preemption must be on or off")
        if self.batch_policy not in ("continuous", "log") or self.batch_policy_base <= 0:
            raise ValueError("batch_policy must be continuous or log, with a positive batch_policy_base")
        if self.heavy_sequence_tokens < 0 or not 0 < self.light_lane_share < 1:
            raise ValueError("heavy_sequence_tokens must be >= 0 and light_lane_share within (0, 1)")
        if self.kv_events_endpoint:
            if not self.kv_events_endpoint.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError("kv_events_endpoint must be a ZeroMQ address: tcp://..., ipc://... or inproc://...")
            if self.kv_events_format not in ("map", "array", "array-map"):
                raise ValueError("kv_events_format must be map, array or array-map")
            if self.prefix_caching == "off":
                raise ValueError("kv_events_endpoint publishes the prefix cache's events: it needs prefix_caching on")
        cache_bytes, cache_share = parse_size(self.prefix_cache_size)
        kv_bytes, kv_share = parse_size(self.kv_cache_memory)
        engine = EngineConfig(
            model=ModelConfig(
                self.model,
                self.device,
                self.dtype,
                parse_threads(self.num_threads),
                prefill_threads=self.prefill_threads,
                revision=self.revision,
                download_attempts=self.download_attempts,
                quantization=self.quantization,
            ),
            scheduler=SchedulerConfig(
                self.max_num_seqs,
                self.max_num_batched_tokens,
                self.max_model_len,
                self.max_queue_seconds,
                max_prompt_chunk_while_decoding=self.max_prompt_chunk_while_decoding,
                max_prompt_chunk_seconds_while_decoding=self.max_prompt_chunk_seconds_while_decoding,
                prefix_caching=self.prefix_caching == "on",
                preemption=self.preemption == "on",
                heavy_sequence_tokens=self.heavy_sequence_tokens,
                light_lane_share=self.light_lane_share,
                batch_policy=self.batch_policy,
                batch_policy_base=self.batch_policy_base,
                kv_events=bool(self.kv_events_endpoint),
                prefix_cache_bytes=cache_bytes,
                prefix_cache_share=cache_share,
                kv_cache_bytes=kv_bytes,
                kv_cache_share=kv_share,
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
            step_seconds=self.degrade_step_seconds,
            full_step_factor=self.degrade_full_step_factor,
            kv_usage=self.degrade_kv_usage,
            memory_usage=self.degrade_memory_usage,
            compute_usage=self.degrade_compute_usage,
            cooldown_seconds=self.degrade_cooldown_seconds,
            hysteresis=self.degrade_hysteresis,
        )
        object.__setattr__(self, "degradation", degradation)
        admission = AdmissionConfig(
            max_queued_requests=self.max_queued_requests,
            max_queued_tokens=self.max_queued_tokens,
            degraded_max_tokens=self.degrade_max_tokens,
            degraded_max_prompt_tokens=self.degrade_max_prompt_tokens,
            canned_reply=self.canned_reply,
            shed_priority=self.shed_priority,
            max_queue_share_per_key=self.max_queue_share_per_key,
        )
        object.__setattr__(self, "admission", admission)
        # A KeysFileError (a ValueError) names the file, the key and the field.
        object.__setattr__(self, "keys", load_keys_file(self.keys_file) if self.keys_file else None)
        template = _read_template(self.chat_template) if self.chat_template else None
        object.__setattr__(self, "chat_template_text", template)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def chat_models(self) -> tuple[tuple[str, str], ...]:
        """(name in the API, --model value) of every chat model served, the main one first."""
        extra = []
        for entry in self.models:
            name, sep, source = entry.partition("=")
            if not sep or not name.strip() or not source.strip():
                raise ValueError(f"--model {entry!r}: each further model is NAME=MODEL (a name, a path or hub id)")
            extra.append((name.strip(), source.strip()))
        return ((self.model_name, self.model), *extra)

    def engine_of(self, source: str) -> EngineConfig:
        """A further chat model's engine config: the main one's, with `source`'s weights."""
        return replace(self.engine, model=replace(self.engine.model, model=source, revision=""))

    def chat_model_named(self, requested: str) -> str | None:
        """The served name of the chat model `requested` names (a name, or the main --model value)."""
        names = dict(self.chat_models)
        if requested in names:
            return requested
        return self.model_name if requested == self.model else None

    @property
    def embedding_model_name(self) -> str:
        """The embeddings model's name in the API ("" when none is served)."""
        if not self.embedding_model:
            return ""
        default = "tiny-embedding" if self.embedding_model == "tiny" else self.embedding_model
        return self.served_embedding_model_name or default

    def names_embedding_model(self, requested: str) -> bool:
        """`requested` is the embedding model's served name, or its --embedding-model value where
        that is not also the chat model's (`tiny` names the chat model)."""
        if not self.embedding_model:
            return False
        if requested == self.embedding_model_name:
            return True
        return requested == self.embedding_model and self.chat_model_named(requested) is None

    @property
    def version_label(self) -> str:
        """What surge_model_info says this deployment's model version is."""
        return self.model_version or self.revision or "unversioned"

    @property
    def is_auth_on(self) -> bool:
        return bool(self.api_key) or self.keys is not None

    @property
    def rate_limits(self) -> Limits:
        """The server-wide limits: every key's that the keys file does not set."""
        return Limits(self.rate_limit_rpm, self.rate_limit_tpm)


def _read_template(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"--chat-template {path}: {exc.strerror or exc}") from exc


def parse_threads(text: str) -> int:
    """`--num-threads`: `auto` (measured at warm-up: AUTO_THREADS), 0 (torch's default) or a count."""
    if text.strip().lower() == "auto":
        return AUTO_THREADS
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f"num_threads must be auto, 0 (torch's default) or a positive count, not {text!r}")
    return count
