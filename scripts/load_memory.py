"""Peak memory while surge loads a model, per dtype and quantization, against the weights' size.

    python -m scripts.load_memory                  # Qwen2.5-0.5B's shape, random weights, built here
    python -m scripts.load_memory --model DIR      # any model directory
    python -m scripts.load_memory --shape 1.5b
    python -m scripts.load_memory --configurations float32/none,float32/int8

Each configuration loads in a fresh process (`models.loading.loader.load_model`, what the engine
runs: the weights, then the fused projections and the packed or 8-bit linear layers) while a
thread reads /proc/self/status every 2 ms. Reported, over the process before the load (torch
and transformers imported): the peak of anonymous memory (what the load allocated: the weights
it converted or built), the peak RSS (the kernel's high-water mark, which also counts the pages
of the safetensors file mapped while they are read: page cache the kernel can drop), and what
stays once loaded. The model directory is built once with random weights in bfloat16, the
dtype real checkpoints ship in (models/loading/tiny.py's tokenizer: the vocabulary does not
change the weights' shapes), so no download is needed. docs/engine.md#loading-large-models.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# hidden, layers, heads, kv heads, intermediate, vocabulary: Qwen2.5's published configurations.
SHAPES = {
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
}
# ("float32", "int8") is what `--quantization int8` loads with `--dtype auto`.
CONFIGURATIONS = [("bfloat16", "none"), ("float32", "none"), ("bfloat16", "int8"), ("float32", "int8")]
CACHE = Path.home() / ".cache" / "surge" / "load-memory"
# 2: the rows the tokenizer can't decode to whole characters are muted (tiny.mute_partial_characters).
SHAPE_VERSION = 2

MEASURE = r"""
import json, resource, sys, threading, time
def status():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                fields[name] = int(rest.split()[0]) * 1024
    return fields
from models.config import ModelConfig
from models.loading.loader import load_model
before = status()
peak_anon = [before["RssAnon"]]
done = threading.Event()
def sample():
    while not done.is_set():
        peak_anon[0] = max(peak_anon[0], status()["RssAnon"])
        time.sleep(0.002)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
start = time.perf_counter()
loaded = load_model(ModelConfig(model=sys.argv[1], dtype=sys.argv[2], quantization=sys.argv[3]))
seconds = time.perf_counter() - start
done.set(); sampler.join()
from models.runner import heap
heap.give_back()  # what the engine does once warm: the load's freed pages go back to the system
after = status()
print(json.dumps({
    "seconds": seconds,
    "peak_anon": peak_anon[0] - before["RssAnon"],
    "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before["VmRSS"],
    "kept_anon": after["RssAnon"] - before["RssAnon"],
    "kept_rss": after["VmRSS"] - before["VmRSS"],
}))
"""


def shape_dir(root: Path, shape: str) -> Path:
    """Where `build` keeps `shape` under `root`; the version renames it when the weights change."""
    return root / f"qwen2.5-{shape}-random-v{SHAPE_VERSION}"


def build(shape: str, out: Path) -> Path:
    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from models.loading import tiny

    hidden, layers, heads, kv_heads, intermediate, vocab = SHAPES[shape]
    config = Qwen2Config(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=1e6,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    tokenizer = AutoTokenizer.from_pretrained(tiny.ensure_tokenizer())
    tiny.mute_partial_characters(model, tokenizer)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def weights_bytes(model: Path) -> int:
    return sum(path.stat().st_size for path in model.glob("*.safetensors"))


def measure(model: Path, dtype: str, quantization: str) -> dict[str, float]:
    from models.runner import heap

    with heap.child_environment():  # the engine child's allocator (jemalloc, where installed)
        proc = subprocess.run(
            [sys.executable, "-c", MEASURE, str(model), dtype, quantization],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model directory (default: a random one of --shape)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument(
        "--configurations",
        type=lambda text: [tuple(item.split("/", 1)) for item in text.split(",")],
        default=CONFIGURATIONS,
        help="DTYPE/QUANTIZATION,... (default: all four)",
    )
    args = parser.parse_args(argv)
    model = args.model or build(args.shape, shape_dir(CACHE, args.shape))
    on_disk = weights_bytes(model)
    mib = 2**20
    print(f"{model}: {on_disk / mib:,.0f} MiB of safetensors\n")
    columns = "peak anonymous (MiB) | x file | peak RSS (MiB) | kept (MiB) | kept RSS (MiB) | load (s)"
    print(f"| dtype | quantization | {columns} |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype, quantization in args.configurations:
        r = measure(model, dtype, quantization)
        print(
            f"| {dtype} | {quantization} | {r['peak_anon'] / mib:,.0f} | {r['peak_anon'] / on_disk:.2f} "
            f"| {r['peak_rss'] / mib:,.0f} | {r['kept_anon'] / mib:,.0f} | {r['kept_rss'] / mib:,.0f} "
            f"| {r['seconds']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
