"""Engine configuration: one frozen object, built once at start-up and passed down.

Each component takes the smallest piece it needs (the scheduler only `SchedulerConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    # One KV slot per running sequence; the cache holds max_num_seqs x max_model_len tokens at most.
    max_num_seqs: int = 32
    # Tokens one step may feed the model (decode rows count one each). Bounds how long a long
    # prompt can stall running streams: the rest of the prompt waits for the next step. 2048 is
    # vLLM's default for its API server below H100-class devices, and holds a burst of 32 chat
    # requests in one prefill step, where 512 took three and a worse TTFT tail (docs/engine.md,
    # measurements).
    max_num_batched_tokens: int = 2048
    # Prompt plus generated tokens of one sequence; 0 takes the model's own limit.
    max_model_len: int = 0
    # A request still waiting after this long is dropped without using the model; 0 = no limit.
    # Longer than any client waits for a first token (the openai SDK's default timeout is 600 s,
    # but an interactive caller gives up far sooner), shorter than a queue that never drains.
    max_queue_seconds: float = 120.0
    # While sequences decode, one prompt gets at most this many tokens per step, so a long prompt
    # cannot freeze running streams for one big step (on CPU a 2,048-token prefill is a long gap
    # between two tokens of every stream; four 512-token chunks are four short ones). Short
    # prompts are not held back, however many arrive together, nor is anything when nothing
    # decodes (an idle engine): their first tokens come first. 0 = no such cap. (vLLM's
    # `long_prefill_token_threshold` caps long prompts always, decoding or not.)
    max_prompt_chunk_while_decoding: int = 512
    # ... and a prompt longer than that gets chunks of what fits in this many seconds on top of a
    # decode step, as measured on the steps run so far (models/scheduler/chunk_pacer.py): 512
    # tokens are milliseconds on a GPU and seconds on two CPU cores. 0 = the token cap alone.
    max_prompt_chunk_seconds_while_decoding: float = 0.5
    # Automatic prefix caching (models/kv/prefix_cache.py): a prompt starts from the K/V of its
    # longest prefix seen before, in whole blocks of this many tokens. 16 is vLLM's block size:
    # a multi-turn history re-rendered differently from its reply still reuses all but the
    # block where they part.
    prefix_caching: bool = True
    prefix_cache_block_size: int = 16
    # A waiting sequence of a more important tier takes the slot of a running one of a less
    # important tier when the batch (or the K/V budget) is full; the preempted one resumes later,
    # from its prompt and what it had generated (the prefix cache holds most of it).
    preemption: bool = True
    # Lanes (models/scheduler/lanes.py): a sequence whose prompt and max_tokens reach this many tokens
    # is heavy (0: one lane); while light ones wait, heavy ones hold at most all but
    # light_lane_share of the batch, and a light one may take a heavy one's slot past that share.
    heavy_sequence_tokens: int = 0
    light_lane_share: float = 0.25
    # How many sequences a step may hold (models/scheduler/batch_policy.py): "continuous" (all that
    # fit) or "log" (the adaptive rule, base x ln(demand + 1)), measured against each other.
    batch_policy: str = "continuous"
    batch_policy_base: float = 8.0
    # Tell the engine's observer every block the prefix cache stores and evicts (vLLM's KV events,
    # models/kv/events.py), for a server that publishes them to routers. Off: not even counted.
    kv_events: bool = False
    # The pool's bound: bytes, or (when 0) this share of the slot cache's full size
    # (max_num_seqs x max_model_len tokens). The pool grows as blocks are kept, up to the bound.
    prefix_cache_bytes: int = 0
    prefix_cache_share: float = 1.0
    # The K/V's memory budget, slots and prefix cache together (models/kv/budget.py): bytes, or
    # (when 0) a share of the device's memory that the weights and the K/V may fill together,
    # vLLM's --gpu-memory-utilization; both 0: no budget, the slots sized by the flags alone.
    kv_cache_bytes: int = 0
    kv_cache_share: float = 0.9
    # Set by the budget, not by a flag (models/kv/budget.py). Where the slot cache commits memory
    # only as tokens are written (the CPU's) and the budget holds fewer than max_num_seqs
    # sequences at max_model_len, sequences are admitted by tokens instead: while the running
    # ones' prompts plus max_tokens (each capped at max_model_len, plus kv_slack_tokens for the
    # pages they fill only in part) stay within max_kv_tokens. 0: slots alone bound the K/V.
    max_kv_tokens: int = 0
    kv_slack_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_model_len == 1 or self.max_model_len < 0:
            raise ValueError("max_model_len must be at least 2 (or 0 for the model's own limit)")
        if self.max_queue_seconds < 0:
            raise ValueError("max_queue_seconds must be 0 (no limit) or positive")
        if self.max_prompt_chunk_while_decoding < 0:
            raise ValueError("max_prompt_chunk_while_decoding must be 0 (no cap) or positive")
        if self.max_prompt_chunk_seconds_while_decoding < 0:
            raise ValueError("max_prompt_chunk_seconds_while_decoding must be 0 (no pacing) or positive")
        if self.prefix_cache_block_size < 1:
            raise ValueError("prefix_cache_block_size must be at least 1")
        if self.prefix_cache_bytes < 0 or self.prefix_cache_share < 0:
            raise ValueError("the prefix cache's size must not be negative")
        if self.max_kv_tokens < 0 or self.kv_slack_tokens < 0:
            raise ValueError("max_kv_tokens and kv_slack_tokens must not be negative")
        if self.kv_cache_bytes < 0 or not 0 <= self.kv_cache_share <= 1:
            raise ValueError("the K/V's memory must be a size in bytes or a share of the device's memory up to 100%")
        if self.max_num_batched_tokens <= self.max_num_seqs:
            # Every running sequence decodes one token per step; prefill needs room beyond that.
            raise ValueError("max_num_batched_tokens must be greater than max_num_seqs")


AUTO_THREADS = -1  # ModelConfig.num_threads: measured at warm-up
QUANTIZATIONS = ("none", "int8")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    # "tiny" (the embedded model), a local Hugging Face model directory, or a hub id.
    model: str = "tiny"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # torch intra-op threads for decode steps on CPU; 0 leaves torch's default; AUTO_THREADS
    # measures at warm-up (models/runner/threads.py): one thread avoids contention with the HTTP process
    # for a small model, where a second one slows each step; a larger model gains from more.
    num_threads: int = AUTO_THREADS
    # torch threads for a step that prefills a burst of prompts (models/runner/threads.py): the HTTP side
    # is idle then, so the other cores can help. 0 = every CPU this process may use; a value not
    # above num_threads turns the switch off.
    prefill_threads: int = 0
    # Hub ids only: the branch, tag or commit to download ("" = the repository's default branch).
    revision: str = ""
    # Hub ids only: tries of a download that fails transiently (connection errors, timeouts, 429 and
    # 5xx from the hub), with exponential backoff between them; an error that retrying cannot
    # change (no such repository, gated, offline mode) fails at once.
    download_attempts: int = 5
    # "int8": the linear layers' weights in 8 bits, activations quantized at each call, a scale per
    # block of 32 where surge's kernel runs, else per channel and per token (models/linear/int8.py;
    # CPU only). "none": the weights as loaded, in `dtype`.
    quantization: str = "none"

    def __post_init__(self) -> None:
        if self.download_attempts < 1:
            raise ValueError("download_attempts must be at least 1")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {self.quantization!r}; expected one of {', '.join(QUANTIZATIONS)}")
        if self.quantization == "int8" and self.device.startswith("cuda"):
            raise ValueError("quantization int8 runs on the CPU only (oneDNN's int8 kernels); use --device cpu")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"unknown device {self.device!r}")
        if self.num_threads < 0 and self.num_threads != AUTO_THREADS:
            raise ValueError("num_threads must be auto, 0 (torch default) or positive")
        if self.prefill_threads < 0:
            raise ValueError("prefill_threads must be 0 (every available CPU) or positive")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # The engine in a child process (its Python does not share the server's GIL), or on a
    # thread of the server's process (tests that reach into the engine; debugging).
    separate_process: bool = True
    # The engine process's nice value (process mode): on a busy CPU the HTTP process, which
    # refuses, answers probes and writes streams, runs first; the model gets every cycle it
    # does not need. 0: the same priority as the server.
    nice: int = 3

    def __post_init__(self) -> None:
        if not 0 <= self.nice <= 19:
            raise ValueError("the engine's nice value must be between 0 and 19")
