"""Every traffic layer of surge, one subpackage per layer, and the one order they run in.

Two stages, each a list below, outermost first; the app builds its ASGI stack from `DOOR` and its
after-parse chain from `AFTER_PARSE` (app/server/factory.py, app/generation/pipeline.py), and
nowhere else says the order. The rule behind both: the cheapest refusal first, and nothing stored or shared that a
later layer could still refuse.

- At the door, pure ASGI middleware see every HTTP request before its body is parsed: they answer
  from headers (and, for idempotency, the raw body) alone.
- After parse, a generation request has been validated and tokenized, so its cost is known: the
  `GenerationLayer`s (middleware/generation.py) run around its submission to the engine.

Beside the layers: `errors.py` (OpenAI error bodies and the exception routes raise), `redis.py`
(the one Redis connection and its fail-open health), `keys_file.py` (API keys with per-key limits
and tiers), `generation.py` (the after-parse request and layer). Nothing in this package imports
the engine, torch or transformers: only the engine's torch-free value types, through its face
(`from models import ...`, models/__init__.py).
"""

DOOR: tuple[str, ...] = (
    # Request id outermost: every response, rejections included, echoes X-Request-Id, and every log
    # line of the request, uvicorn's access line included, carries it (edge/request_id.py).
    "request_id",
    # Error bodies in the shape of the protocol called (Anthropic's on /v1/messages), outside every
    # layer that can reject, so their errors are reshaped too (edge/error_shape.py).
    "error_shape",
    # CORS (Starlette's, when --cors-origin is set) outside everything else, so preflights and every
    # rejection carry the CORS headers a browser needs to read them.
    "cors",
    # HTTP metrics (app/ops/metrics.py) outside every rejection, so 401s, 429s and 503s count too.
    "http_metrics",
    # Allowed hosts (with auth off): a Host that is not localhost, an IP address or an
    # --allowed-host name is a DNS-rebinding page's, 421 before any layer does work for it
    # (edge/allowed_hosts.py); inside the metrics so the 421s count.
    "allowed_hosts",
    # Draining: after SIGTERM, 503 + Retry-After + Connection: close before any other work
    # (edge/draining.py).
    "draining",
    # API keys: 401 from headers alone, before any body is read (edge/auth.py).
    "auth",
    # Body limit: 413 before anything buffers a body (edge/body_limit.py).
    "body_limit",
    # Requests per minute (when a limit is set): 429 outside idempotency, so a 429 is never stored
    # as an idempotent result and a retry runs again (rate_limit/asgi.py). Tokens are reserved
    # after parse, where the cost is known; this layer adds the x-ratelimit headers.
    "rate_limit",
    # Concurrent sequences per API key (when a limit is set): a key at its limit gets a 429 before its
    # body is read, so its burst cannot take the whole queue; outside idempotency for the same reason
    # as above (rate_limit/concurrency.py). Its sequences are counted after parse.
    "concurrency",
    # Idempotency keys: replays and 409s never reach the model; only completed responses are
    # stored. Always on: without an Idempotency-Key header a request passes at no cost
    # (idempotency/asgi.py).
    "idempotency",
)

AFTER_PARSE: tuple[str, ...] = (
    # Concurrent sequences per API key: the request's place at the door grows to its prompts x n, a
    # 429 past the key's limit; first, as the cheapest refusal and the key's own (rate_limit/concurrency.py).
    "concurrency_sequences",
    # Admission: queue bounds (and each key's share of them), shedding and the request's tier's
    # degradation level, 503s (429 past a key's share) before anything is spent;
    # degrades the sampling parameters (logprobs, max_tokens) every later layer sees
    # (admission/admission.py).
    "admission",
    # The tokens bucket: 429 on the cost as degraded (clamped max_tokens), before any generation;
    # meters what the layers inside return and refunds the unused part (rate_limit/tokens.py).
    "rate_limit_tokens",
    # Level 3 for the sheddable class: a cached reply, else the canned one, never the model. Outside
    # dedup, so a canned reply is never kept as a request's result (admission/canned.py).
    "degraded_reply",
    # Similar-query merging (opt-in per key): a query close in meaning to one of the key's in flight
    # or recently answered takes that generation's dedup key; just outside dedup, which then joins
    # or replays it (dedup/similar.py).
    "merge_similar",
    # Dedup: identical deterministic requests share one generation; innermost, so only what will run
    # the engine starts a flight (dedup/cache.py).
    "dedup",
)
