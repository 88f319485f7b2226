"""Loads a causal LM and its tokenizer: the embedded tiny model, a local directory or a hub id.

A hub id is first fetched into the local cache (models/loading/hub.py, with retries), so everything
after that, the server's tokenizer included, reads one local directory and needs no network.

Everything goes through `AutoModelForCausalLM` / `AutoTokenizer`, so the embedded model takes
the same path as any real one. The one exception is `echo` (models/runner/echo.py): the tiny
tokenizer and no weights at all, for measuring the server without a model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from models.config import AUTO_THREADS, EngineConfig, ModelConfig
from models.kv.budget import fit_kv_budget, kv_budget, kv_bytes_per_token, kv_slack_tokens
from models.kv.cache import reserves
from models.kv.memory import device_memory, format_bytes
from models.linear.int8 import quantize_linears
from models.linear.packed import pack_linears
from models.loading import hub
from models.loading.dtype_choice import choose_cpu_dtype
from models.loading.file_pages import copy_out_of_files
from models.loading.mapped_embedding import map_input_embeddings
from models.loading.tokenizer import Tokenizer
from models.loading.widening import load_dtype, narrow_buffers, widen
from models.runner.cpus import cpu_features, prefill_thread_count
from models.runner.echo import ECHO_MODEL
from models.runner.fused_decoder import fuse_projections
from models.runner.threads import StepThreads, step_threads

log = logging.getLogger("surge.loader")

CPU = torch.device("cpu")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The rows oneDNN lays packed weights out for (models/linear/packed.py): a decode step of 32
# sequences, the default max_num_seqs; measured as good as a layout for 1 or 512 rows at 8-2,048.
PACK_ROWS_HINT = 32


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: PreTrainedModel | None  # None: the echo model, which has no weights
    tokenizer: Tokenizer
    path: str  # the local directory it loaded from (for a hub id, the cached snapshot)
    max_position_embeddings: int | None
    vocab_size: int  # the width of the logits (may be padded past the tokenizer's)
    threads: StepThreads | None = None  # per-step CPU thread counts; None: leave torch's alone
    kv_bytes_per_token: int = 0  # the slot cache's bytes a token (models/kv/budget.py); 0: no K/V
    device: torch.device = CPU


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(
    dtype: str, device: torch.device, path: str | None = None, quantization: str = "none"
) -> tuple[torch.dtype, str]:
    """The weights' dtype and why: as asked, or for `auto` bfloat16 on a CUDA device that has it
    (else float16), and on a CPU what models/loading/dtype_choice.py measures for the model at
    `path` (float32 without one, and under int8 weights, whose layers compute in float32)."""
    if dtype != "auto":
        return _DTYPES[dtype], "as asked (--dtype)"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "auto: the GPU supports bfloat16"
        return torch.float16, "auto: the GPU has no bfloat16"
    if path is None:
        return torch.float32, "auto: no model to measure on"
    if quantization == "int8":
        return torch.float32, "auto: int8 weights, whose layers take and give float32"
    text = AutoConfig.from_pretrained(path).get_text_config()
    hidden = int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0) or 0)
    intermediate = int(getattr(text, "intermediate_size", 0) or getattr(text, "n_inner", 0) or 4 * hidden)
    if not hidden:
        return torch.float32, "auto: the model's config names no hidden size to measure on"
    choice = choose_cpu_dtype(cpu_features(), hidden, intermediate)
    return _DTYPES[choice.dtype], f"auto: {choice.reason}"


def resolve_model_path(model: str, revision: str = "", attempts: int = 5) -> str:
    """The local directory of `model`: the embedded tiny model (`tiny`, or `tiny:SIZE`), an existing
    path, or a hub id fetched now."""
    if model == "tiny" or model.startswith("tiny:"):
        from models.loading.tiny import ensure_tiny

        size = model.partition(":")[2]  # `tiny:s`: another size of it (a light model beside the main one)
        return str(ensure_tiny(size=size) if size else ensure_tiny())
    if Path(model).expanduser().exists():
        return model
    if not hub.is_repo_id(model):
        raise ValueError(f"model {model!r}: not a directory and not a hub id")
    log.info("downloading %s (revision %s) from the hub", model, revision or "default")
    return hub.download(model, revision=revision, attempts=attempts)


def load_model(config: ModelConfig) -> LoadedModel:
    if config.num_threads > 0:
        torch.set_num_threads(config.num_threads)
    if config.model == ECHO_MODEL:
        return load_echo()
    device = resolve_device(config.device)
    if config.quantization == "int8" and device.type != "cpu":
        raise ValueError(f"quantization int8 runs on the CPU only (oneDNN's int8 kernels), not on {device}")
    if config.num_threads == AUTO_THREADS and device.type == "cpu":
        # Every CPU --prefill-threads allows until warm-up measures the decode count; where that
        # is one CPU (no policy to switch), the count for good.
        torch.set_num_threads(prefill_thread_count(1, config.prefill_threads))
    started = time.perf_counter()
    log.info("resolving model %s", config.model)
    path = resolve_model_path(config.model, config.revision, config.download_attempts)
    log.info("loading tokenizer from %s", path)
    hf_tokenizer = AutoTokenizer.from_pretrained(path)
    dtype, why = resolve_dtype(config.dtype, device, path, config.quantization)
    log.info("dtype %s (%s)", str(dtype).removeprefix("torch."), why)
    size = _weights_size(path)
    log.info(
        "loading weights from %s (%s) on %s as %s", path, format_bytes(size) if size else "size unknown", device, dtype
    )
    model, narrow = _from_pretrained(path, dtype, device)
    text_config = model.config.get_text_config()
    max_pos = getattr(text_config, "max_position_embeddings", None) or getattr(text_config, "n_positions", None)
    eos = _eos_ids(model)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    num_parameters = sum(p.numel() for p in model.parameters())  # before packing: packed weights are not parameters
    # Before packing or quantizing: the packed kernels keep no float weights to concatenate.
    fuse_projections(model)
    if config.quantization == "int8":
        quantize_linears(model, rows_hint=PACK_ROWS_HINT)
    elif device.type == "cpu":
        pack_linears(model, rows_hint=PACK_ROWS_HINT, compute_dtype=dtype)
    if device.type == "cpu":  # after the linears: a tied output layer packed has let go of the table
        map_input_embeddings(model, path, dtype)
    if narrow:  # loaded narrower (models/loading/widening.py): the norms and the rest
        widen(model, dtype)
    if device.type == "cpu":  # last: whatever still reads the load's mapping of the checkpoint
        copy_out_of_files(model)
    log.info(
        "loaded %s (%.1fM parameters) in %.1f s",
        Path(path).name or path,
        num_parameters / 1e6,
        time.perf_counter() - started,
    )
    return LoadedModel(
        model,
        Tokenizer(hf_tokenizer, eos),
        path,
        int(max_pos) if max_pos else None,
        vocab_size,
        step_threads(device, config.num_threads, config.prefill_threads),
        kv_bytes_per_token(model.config, dtype),
        device,
    )


def _from_pretrained(path: str, dtype: torch.dtype, device: torch.device) -> tuple[PreTrainedModel, bool]:
    """The model on `device`, its weights in `dtype` or, on the CPU, in the checkpoint's narrower
    dtype where widening to `dtype` is exact (models/loading/widening.py: the rest of the load
    widens them layer by layer); and whether it was read narrower. NOTE: not `model.dtype` to tell:
    that is the first parameter's, which a module kept in float32 (`_keep_in_fp32_modules`) sets."""
    # Straight onto the device: from_pretrained builds the model on the meta device and places
    # each tensor where device_map says as it reads it, so a GPU's weights never pass through
    # host memory as a whole model first (a `.to(device)` after loading on the CPU did).
    narrow = load_dtype(path, dtype, device)
    names = str(dtype).removeprefix("torch."), str(narrow).removeprefix("torch.")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=narrow, device_map=device)
    if narrow != dtype and (built := narrow_buffers(model, dtype)):
        log.info("weights read as %s, not %s: buffers built in %s (%s)", *names, names[1], ", ".join(built[:3]))
        del model
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device).eval(), False
    if narrow != dtype:
        log.info("weights read as %s, each widened to %s as it is packed or quantized", names[1], names[0])
    return model.eval(), narrow != dtype


def load_echo() -> LoadedModel:
    """The echo model: the embedded tiny tokenizer (cached on disk) and no weights."""
    from models.loading import tiny

    started = time.perf_counter()
    hf_tokenizer = AutoTokenizer.from_pretrained(tiny.ensure_tokenizer())
    eos = [tiny.IM_END_ID, tiny.ENDOFTEXT_ID]
    log.info("loaded the echo model (no weights) in %.1f s", time.perf_counter() - started)
    return LoadedModel(None, Tokenizer(hf_tokenizer, eos), ECHO_MODEL, tiny.MAX_POSITION_EMBEDDINGS, tiny.VOCAB_SIZE)


# For models whose config states no context length (rare).
DEFAULT_MAX_MODEL_LEN = 2048


def resolve_engine_config(config: EngineConfig, loaded: LoadedModel) -> EngineConfig:
    """`config` as this model and this machine allow: max_model_len from the model when left at
    0, then max_num_seqs and the prefix cache fitted to the K/V's memory budget. Called once the
    weights are loaded, so the memory still free is what the K/V may take."""
    config = resolve_max_model_len(config, loaded)
    scheduler = config.scheduler
    memory = device_memory(loaded.device) if loaded.kv_bytes_per_token else None
    # A reserved slot cache (the CPU's) commits memory per token written: its budget counts tokens.
    slack = 0
    if loaded.model is not None and loaded.kv_bytes_per_token and reserves(loaded.device):
        slack = kv_slack_tokens(loaded.model.config, loaded.kv_bytes_per_token)
    fitted = fit_kv_budget(scheduler, loaded.kv_bytes_per_token, kv_budget(scheduler, memory), slack)
    return replace(config, scheduler=fitted)


def resolve_max_model_len(config: EngineConfig, loaded: LoadedModel) -> EngineConfig:
    """Fill in max_model_len from the model when it was left at 0; never exceed the model's."""
    model_max = loaded.max_position_embeddings or DEFAULT_MAX_MODEL_LEN
    wanted = config.scheduler.max_model_len or model_max
    if wanted > model_max:
        raise ValueError(f"max_model_len {wanted} is larger than the model's limit {model_max}")
    return replace(config, scheduler=replace(config.scheduler, max_model_len=wanted))


def _eos_ids(model: PreTrainedModel) -> list[int]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, list | tuple):
            ids.extend(int(v) for v in value)
    return ids


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _weights_size(path: str) -> int:
    """Bytes of weight files in a local model directory; 0 when there are none at its top level."""
    directory = Path(path)
    if not directory.is_dir():
        return 0
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES))
