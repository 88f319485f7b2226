"""Every `surge serve` option: its flag, its `SURGE_*` variable, its type and its help.

The single list of serve options: the CLI, the environment and the table of
docs/configuration.md come from it (app/config/arguments.py builds the parser). Defaults live on
`app.config.settings.Settings`, which this list never imports.
"""

from __future__ import annotations

from dataclasses import dataclass

from middleware.dedup.cache import DEDUP_SCOPES
from models import QUANTIZATIONS


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


OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        str,
        "`tiny` (embedded, built offline; `tiny:s` its smaller size), `echo` (no model: measures serving"
        " overhead), a Hugging Face model directory, or a hub id. Repeatable: each further `--model NAME=MODEL`"
        " serves one more chat model, with an engine of its own, picked by the request's `model`",
        multiple=True,
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
        "`auto`: on a CPU bfloat16 where it has bf16 matmul units and a probe measures it faster on the"
        " model's shape, else float32 (logged with the reason); bfloat16 (or float16) on GPU",
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    Option(
        "quantization",
        str,
        "`int8` (CPU only): linear layers with 8-bit weights and activations, a scale per block of 32"
        " (surge's kernel, x86 with AVX-512 VNNI; elsewhere oneDNN's, per channel and per token):"
        " under a third of their memory, faster where matmuls dominate; `none`: the weights as loaded",
        choices=QUANTIZATIONS,
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
    Option(
        "max_prompt_chunk_seconds_while_decoding",
        float,
        "while sequences decode, a prompt longer than --max-prompt-chunk-while-decoding gets per step the"
        " tokens that fit in this many seconds, as measured on the steps so far (a slow CPU's chunks shrink,"
        " a GPU's stay at the token cap); 0 = the token cap alone",
    ),
    Option("max_model_len", int, "prompt + completion tokens per sequence; 0 = the model's own limit"),
    Option(
        "prefix_caching",
        str,
        "reuse the K/V of prompt prefixes seen before (system prompts, earlier turns); per API key",
        choices=("on", "off"),
    ),
    Option(
        "preemption",
        str,
        "a waiting request of a more important tier takes a running one's slot of a less important tier"
        " when the batch is full; the preempted one resumes later, its client sees a pause",
        choices=("on", "off"),
    ),
    Option(
        "heavy_sequence_tokens",
        int,
        "a sequence whose prompt and max_tokens reach this many tokens is heavy: heavy ones hold at most all"
        " but --light-lane-share of the batch while light ones wait; 0 = one lane",
    ),
    Option("light_lane_share", float, "the share of the batch kept for light sequences while they wait"),
    Option(
        "batch_policy",
        str,
        "sequences a step may hold: `continuous` (all that fit) or `log` (min(max_num_seqs, base x ln(demand + 1)))",
        choices=("continuous", "log"),
    ),
    Option("batch_policy_base", float, "the `log` batch policy's base"),
    Option(
        "user_header",
        str,
        "a request header naming the end user (set by a gateway), used before the body's `user` for"
        " fairness within an API key's share of the queue",
    ),
    Option(
        "kv_events_endpoint",
        str,
        "publish the prefix cache's block events (vLLM's KV events, for prefix-aware routers) on a ZeroMQ PUB"
        " socket: `tcp://*:5557` binds, `tcp://host:5557` connects; empty = off",
    ),
    Option("kv_events_topic", str, "the ZeroMQ topic of every KV event message (vLLM's default: empty)"),
    Option(
        "kv_events_format",
        str,
        "msgpack form of the KV events: `map` (vLLM's current), `array` (vLLM's through 0.10, llm-d's"
        " indexer) or `array-map` (a positional batch of events by name: what vllm-router 0.1.17 reads)",
        choices=("map", "array", "array-map"),
    ),
    Option(
        "prefix_cache_size",
        str,
        "the prefix cache's bound: bytes (`512MiB`, `2GB`) or a share of the KV slots' full size (`50%`)",
    ),
    Option(
        "warm_templates",
        str,
        "JSON file of frequent system prompts (`messages`) or prompt prefixes (`prompt`), prefilled into"
        " the prefix cache before /ready and never evicted, shared by every API key",
    ),
    Option(
        "kv_cache_memory",
        str,
        "the K/V's memory, slots and prefix cache together: a share of the device's memory (the machine's or"
        " the cgroup limit's on CPU) that weights and K/V may fill (`90%`), or bytes (`8GiB`); on a GPU"
        " max_num_seqs is lowered to what fits at max_model_len, on the CPU requests are admitted while their"
        " prompts and max_tokens fit; start-up fails if one sequence does not; `0` = unchecked",
    ),
    Option("served_model_name", str, "model name in the API; empty = the --model value"),
    Option("light_model", str, "a further --model's name: takes simple requests under load (docs/traffic.md)"),
    Option("light_model_level", int, "the degradation level (1-4) from which simple requests go to --light-model"),
    Option("light_model_max_prompt_tokens", int, "it takes requests of this many prompt tokens at most"),
    Option("light_model_max_tokens", int, "... and max_tokens at most this (left out: capped at it)"),
    Option("light_model_min_tier", int, "... from a key tier of at least this (1: tier 0 keeps its model)"),
    Option("embedding_model", str, "/v1/embeddings' model: `tiny`, an encoder directory or hub id; empty = none"),
    Option("served_embedding_model_name", str, "its name in the API; empty = `tiny-embedding` or --embedding-model"),
    Option("embedding_threads", int, "torch CPU threads of the embedding model's batching thread"),
    Option(
        "merge_similar",
        float,
        "merge similar queries: a cosine similarity (0 = off) within which a deterministic request of a key"
        " shares a recent one's generation (docs/traffic.md#merging-similar-queries)",
    ),
    Option(
        "model_version",
        str,
        "this deployment's model version, the `model_version` label of surge_model_info (to compare a canary"
        " with the stable one); empty = --revision, else `unversioned`",
    ),
    Option(
        "tool_call_parser",
        str,
        "the tool-call format of the model's replies; `auto` = the one its chat template writes",
        choices=("auto", "hermes", "llama3_json", "mistral"),
    ),
    Option(
        "json_schema_objects",
        str,
        "objects of a response_format or tool-parameters schema that declare `properties` and say nothing of"
        " `additionalProperties`: `closed` = only the declared ones (OpenAI strict mode's and vLLM's reading;"
        " a grammar that may invent keys lets a model wander in one), `open` = JSON Schema's default",
        choices=("closed", "open"),
    ),
    Option("chat_template", str, "a Jinja chat template file used instead of the model's own; empty = the model's"),
    Option("api_key", str, "accepted Bearer key (repeatable); none = no auth", multiple=True),
    Option(
        "metrics_key",
        str,
        "Bearer key GET /metrics requires (on either port); empty = none: /metrics is open with auth off, and"
        " with API keys set it is refused (403) on the API port, since it shows every tenant's traffic:"
        " set this or --metrics-port. /health and /ready stay open",
    ),
    Option(
        "metrics_port",
        int,
        "a port of its own, on --host, for GET /metrics, /health and /ready (Prometheus and the kubelet's"
        " probes inside the cluster); /metrics then leaves the API port; 0 = /metrics on the API port",
    ),
    Option(
        "auth_failures_per_minute", int, "failed authentications per client address and minute before 429s; 0 = off"
    ),
    Option("cors_origin", str, "allowed CORS origin (repeatable, `*` for any)", multiple=True),
    Option(
        "allowed_host",
        str,
        "with auth off, a host name requests may carry in Host (repeatable; `*.example.com` for its"
        " subdomains; `*` turns the check off); localhost, IP addresses and --host are always allowed,"
        " other names get a 421 (DNS rebinding); with auth on any Host passes",
        multiple=True,
    ),
    Option(
        "num_threads",
        str,
        "torch CPU threads for decode steps; `auto` times a decode step at warm-up on 1 up to every CPU and"
        " takes the count that predicts the most tokens/s beside the HTTP side; 0 = torch default",
    ),
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
    Option(
        "max_connections",
        int,
        "open connections: past it the longest-idle one is closed; with none idle, a few more may open for"
        " /health, /ready and /metrics only (503 for other requests); 0 = no limit",
    ),
    Option(
        "max_connections_per_address",
        int,
        "connections one client address may hold idle or sending a request: past it its longest-idle one is"
        " closed, or with none idle the new one; behind a proxy every client has its address: 0 (off) there",
    ),
    Option(
        "send_timeout_seconds",
        float,
        "time a response may wait for a client that reads nothing (its socket full) before the connection is"
        " cut and the request aborted; 0 = no limit",
    ),
    Option("max_header_bytes", int, "largest request line plus headers (400 beyond)"),
    Option(
        "header_timeout_seconds", float, "time a request's headers may take to arrive before its connection is closed"
    ),
    Option(
        "body_timeout_seconds",
        float,
        "time a request's body may take to arrive after its headers before its connection is closed",
    ),
    Option(
        "max_body_bytes",
        int,
        "largest accepted request body (413 beyond); 0 = 16 bytes per token of --max-request-tokens, within 1-32 MiB",
    ),
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
    Option(
        "redis_cache_url",
        str,
        "Redis for idempotency keys and dedup results, entries it may evict; empty = --redis-url. A Redis of"
        " their own keeps eviction away from the rate-limit buckets (run that one with noeviction)",
    ),
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
    Option(
        "max_concurrent_per_key",
        int,
        "sequences (prompts x n) one API key may have in flight (per replica); 0 = no limit",
    ),
    Option("keys_file", str, "YAML or JSON file of API keys with per-key limits and priority tier"),
    Option(
        "keys_file_reload_seconds",
        float,
        "how often the keys file is looked at: reloaded when what its path names has changed (inode, size,"
        " modification time; a Secret volume's symlink swap included), as on SIGHUP; a file that does not parse"
        " keeps the keys in use (an ERROR); 0 = on SIGHUP only",
    ),
    Option(
        "rate_limit_replicas",
        int,
        "replicas sharing the limits through Redis; while Redis is unreachable each enforces 1/N of them",
    ),
    # --- idempotency and dedup -----------------------------------------------------------------
    Option("idempotency_ttl_seconds", float, "how long a finished response is kept for Idempotency-Key retries"),
    Option("idempotency_lease_seconds", float, "in-flight lease of an Idempotency-Key, extended while it runs"),
    Option("idempotency_max_bytes", int, "largest response stored for an Idempotency-Key; larger ones replay as a 422"),
    Option(
        "idempotency_max_keys_per_tenant",
        int,
        "Idempotency-Keys one API key keeps (running or stored); past it its own oldest go, never another's",
    ),
    Option(
        "idempotency_max_bytes_per_tenant",
        int,
        "stored response bytes one API key keeps; past it its own oldest go (at least --idempotency-max-bytes)",
    ),
    # --- stored responses ---------------------------------------------------------------------
    Option(
        "responses_store_max_entries",
        int,
        "stored Responses one API key keeps (every caller without a key is one tenant); past it its own oldest go",
    ),
    Option("responses_store_max_bytes", int, "bytes of stored Responses one API key keeps; past it its own oldest go"),
    Option("responses_store_ttl_seconds", float, "how long a stored Response is kept (GET, previous_response_id)"),
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
    Option(
        "max_request_tokens",
        int,
        "prompt and completion tokens one request may ask for over all its sequences (prompt tokens x n +"
        " max_tokens x sequences); 0 = 32 x max_model_len",
    ),
    Option(
        "max_request_output_tokens",
        int,
        "completion tokens one request may ask for over all its sequences, each top_logprobs alternative"
        " counted as one more (max_tokens x sequences x (1 + top_logprobs))",
    ),
    Option("max_queued_tokens", int, "waiting prompt tokens beyond which new requests get a 503; 0 = no bound"),
    Option(
        "max_queue_share_per_key",
        float,
        "the most of --max-queued-requests one API key's waiting sequences may hold (429 past it), so another"
        " key always finds room; 1 = no share",
    ),
    Option("max_queue_seconds", float, "a request still queued after this is dropped unrun (503); 0 = no limit"),
    Option("degrade_thresholds", str, "load scores entering degradation levels 1-4; `off` disables"),
    Option("degrade_queue_depth", int, "waiting sequences (of a tier and the tiers above it) that count as load 1.0"),
    Option("degrade_queue_seconds", float, "queue-time p90 that counts as load 1.0"),
    Option("degrade_ttft_seconds", float, "time-to-first-token p90 that counts as load 1.0"),
    Option("degrade_error_rate", float, "error rate that counts as load 1.0"),
    Option("degrade_step_seconds", float, "decode step-time p90 that counts as load 1.0 (or more: next); 0 = off"),
    Option("degrade_full_step_factor", float, "the step-time bound is at least this x the warmup's full decode step"),
    Option("degrade_kv_usage", float, "share of the KV pool in use that counts as load 1.0; 0 = off"),
    Option(
        "degrade_memory_usage",
        float,
        "share of the memory limit (or GPU memory) in use that counts as load 1.0; 0 = off",
    ),
    Option("degrade_compute_usage", float, "CPU (or GPU) busy share that counts as load 1.0; 0 = off (the default)"),
    Option("degrade_cooldown_seconds", float, "calm time before stepping down one degradation level"),
    Option("degrade_hysteresis", float, "a degradation level is left only below (1 - this) x its threshold"),
    Option("degrade_max_tokens", int, "max_tokens clamp from level 2"),
    Option("degrade_max_prompt_tokens", int, "longest prompt accepted from level 2"),
    Option("canned_reply", str, "reply text at level 3 when no cached reply exists"),
    Option(
        "shed_priority",
        int,
        "at levels 3-4, keys whose tier (keys file; 0 without one) is >= this get canned replies, then 503s",
    ),
)
