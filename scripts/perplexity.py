"""What 8-bit weights (and bfloat16) cost in output quality: surge's `--quantization int8` against
llama.cpp's Q8_0 GGUF of the same weights, each against its own float32, on one fixed text.

    .venv/bin/python -m scripts.perplexity --model-size l [--ctx 256] [--chunks 16] [--out FILE]
    .venv/bin/python -m scripts.perplexity --model-size m --surge-weights float32,bfloat16,int8 --no-llama

Both sides are scored the way llama.cpp's `llama-perplexity` scores: the text tokenized once, cut
into chunks of `--ctx` tokens, each chunk evaluated from an empty cache, and only the predictions
of its second half counted (each with at least ctx/2 tokens of context). surge's side is the model
as `surge serve` loads it (models/loading/loader.py: float32 with its packed linears, or int8); llama.cpp's
side is `llama-perplexity` on the f32 and Q8_0 GGUFs (built into the bench cache on first use,
about 15 minutes; `--build-llama-server` shares it), the f32 run's logits saved as the base its
Q8_0 run's KL divergence is taken against. The two float32 perplexities agreeing is the check
that both sides score the same tokens the same way.

The text is pseudo-text from the tiny tokenizer's corpus generator on a seed of its own, so the
same command scores the same tokens on every machine. The tiny models have random weights: their
perplexity sits near the vocabulary's size, and what 8 bits cost shows in the ratio to float32,
the mean KL divergence from float32 and how often the top token stays the same.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from models.config import ModelConfig
from models.linear.block_int8 import BlockInt8Linear
from models.linear.int8 import Int8Linear
from models.linear.packed import PackedLinear
from models.loading.loader import load_model
from models.loading.tiny_corpus import CORPUS_SEED, build_corpus
from models.runner.cpus import available_cpus
from scripts.bench import REPO_ROOT, ensure_model
from scripts.benchkit import llama

TEXT_SEED = CORPUS_SEED + 1  # not the lines the tokenizer was trained on


@dataclass(frozen=True)
class Score:
    system: str
    weights: str
    ppl: float
    kld: float | None  # mean KL divergence from the same system's float32, per scored token
    same_top: float | None  # the share of scored tokens whose most likely next token is float32's
    weight_bytes: int


def fixed_text(min_chars: int) -> str:
    lines: list[str] = []
    num_lines = 256
    while sum(len(line) + 1 for line in lines) < min_chars:
        num_lines *= 2
        lines = build_corpus(num_lines=num_lines, seed=TEXT_SEED)
    return "\n".join(lines)


@torch.inference_mode()
def chunk_log_probs(model: nn.Module, tokens: list[int], ctx: int, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the second half of each chunk's predictions and the tokens they
    predict: [chunks x (ctx/2 - 1), vocab] and [chunks x (ctx/2 - 1)]."""
    first = ctx // 2
    out, targets = [], []
    for i in range(chunks):
        chunk = torch.tensor(tokens[i * ctx : (i + 1) * ctx])
        logits = model(chunk[None]).logits[0, first : ctx - 1].float()
        out.append(torch.log_softmax(logits, dim=-1))
        targets.append(chunk[first + 1 :])
    return torch.cat(out), torch.cat(targets)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights as they sit in memory: parameters, packed and quantized layers."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, Int8Linear):
            total += module.packed.numel() * module.packed.element_size() + module.weight_scale.numel() * 4
        elif isinstance(module, PackedLinear):
            total += module.packed.numel() * module.packed.element_size()
        elif isinstance(module, BlockInt8Linear):
            total += sum(t.numel() * t.element_size() for t in (module.codes, module.scales))
        bias = getattr(module, "bias", None)
        if isinstance(module, (Int8Linear, PackedLinear, BlockInt8Linear)) and bias is not None:
            total += bias.numel() * bias.element_size()
    return total


# surge's weights as scored: name -> (--dtype, --quantization); float32 first (the others' base).
SURGE_WEIGHTS = {"float32": ("float32", "none"), "bfloat16": ("bfloat16", "none"), "int8": ("float32", "int8")}


def surge_scores(
    model_dir: Path, text: str, ctx: int, chunks: int, weights: tuple[str, ...] = ("float32", "int8")
) -> tuple[list[Score], int]:
    scores, base = [], None
    for name in ("float32", *(w for w in weights if w != "float32")):
        dtype, quantization = SURGE_WEIGHTS[name]
        config = ModelConfig(str(model_dir), device="cpu", dtype=dtype, num_threads=0, quantization=quantization)
        loaded = load_model(config)
        assert loaded.model is not None  # not the echo model
        torch.set_num_threads(available_cpus())
        tokens = loaded.tokenizer.encode(text)
        if len(tokens) < ctx * chunks:
            raise SystemExit(f"the text is {len(tokens)} tokens, fewer than {ctx} x {chunks}")
        log_probs, targets = chunk_log_probs(loaded.model, tokens, ctx, chunks)
        nll = -log_probs.gather(1, targets[:, None]).mean().item()
        kld = same = None
        if base is None:
            base = log_probs
        else:
            kld = (base.exp() * (base - log_probs)).sum(-1).mean().item()
            same = (base.argmax(-1) == log_probs.argmax(-1)).float().mean().item()
        scores.append(Score("surge", name, float(torch.tensor(nll).exp()), kld, same, weight_bytes(loaded.model)))
    return scores, len(tokens)


_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+)")
_KLD = re.compile(r"Mean\s+KLD:\s+([0-9.eE+-]+)")
_SAME = re.compile(r"Same top p:\s+([0-9.]+)")


def llama_scores(model_dir: Path, cache_dir: Path, text_file: Path, ctx: int, chunks: int) -> list[Score]:
    llama_dir = cache_dir / "llama.cpp"
    binary = llama.ensure_llama_tool(llama_dir, "llama-perplexity")
    base_logits = cache_dir / f"{model_dir.name}-c{ctx}-k{chunks}.kld"
    common = [str(binary), "-f", str(text_file), "-c", str(ctx), "--chunks", str(chunks), "-t", str(available_cpus())]
    scores = []
    for outtype, weights in (("f32", "float32"), ("q8_0", "Q8_0")):
        gguf = llama.ensure_gguf(model_dir, llama_dir, outtype)
        argv = [*common, "-m", str(gguf), "--kl-divergence-base", str(base_logits)]
        if outtype != "f32":
            argv.append("--kl-divergence")
        run = subprocess.run(argv, capture_output=True, text=True, check=True)
        log = run.stdout + run.stderr
        kld, same = _KLD.search(log), _SAME.search(log)
        ppl = _PPL.search(log) or re.search(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", log)
        if ppl is None:
            raise RuntimeError(f"no perplexity in llama-perplexity's output:\n{log[-2000:]}")
        scores.append(
            Score(
                "llama.cpp",
                weights,
                float(ppl.group(1)),
                float(kld.group(1)) if kld and outtype != "f32" else None,
                float(same.group(1)) / 100 if same and outtype != "f32" else None,
                gguf.stat().st_size,
            )
        )
    return scores


def render(scores: list[Score], num_tokens: int, ctx: int, chunks: int) -> str:
    lines = [
        f"{chunks} chunks of {ctx} tokens ({chunks * (ctx // 2 - 1)} scored) of a {num_tokens}-token fixed text.",
        "",
        "| system | weights | weight bytes | perplexity | vs its float32 | mean KLD from its float32 | same top |",
        "|---|---|---|---|---|---|---|",
    ]
    float32 = {s.system: s.ppl for s in scores if s.weights == "float32"}
    for s in scores:
        kld = "" if s.kld is None else f"{s.kld:.6f}"
        same = "" if s.same_top is None else f"{100 * s.same_top:.1f}%"
        lines.append(
            f"| {s.system} | {s.weights} | {s.weight_bytes / 2**20:.1f} MiB | {s.ppl:.2f} "
            f"| {s.ppl / float32[s.system]:.4f}x | {kld} | {same} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", default="l", choices=("s", "m", "l"))
    parser.add_argument("--model-dir", type=Path, help="a model directory instead of the tiny model")
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".cache" / "bench-models")
    parser.add_argument("--ctx", type=int, default=256, help="tokens per chunk (llama-perplexity -c)")
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--no-llama", action="store_true", help="surge's side only (no llama.cpp build)")
    parser.add_argument("--out", type=Path, help="also write the scores as JSON here")
    parser.add_argument(
        "--surge-weights",
        default="float32,int8",
        help=f"surge's weights to score, comma-separated among {', '.join(SURGE_WEIGHTS)} (float32 always: the base)",
    )
    args = parser.parse_args(argv)
    if args.ctx < 4 or args.ctx % 2 or args.chunks < 1:
        parser.error("--ctx must be an even number of at least 4, --chunks at least 1")
    model_dir = args.model_dir.resolve() if args.model_dir else ensure_model(args.model_size, args.cache_dir)
    text = fixed_text(args.ctx * args.chunks * 8)  # a token is 2-4 characters of this text
    text_file = args.cache_dir / f"perplexity-text-{TEXT_SEED}-{len(text)}.txt"
    text_file.parent.mkdir(parents=True, exist_ok=True)
    text_file.write_text(text)
    weights = tuple(w for w in args.surge_weights.split(",") if w)
    if unknown := set(weights) - set(SURGE_WEIGHTS):
        parser.error(f"unknown --surge-weights {sorted(unknown)}")
    scores, num_tokens = surge_scores(model_dir, text, args.ctx, args.chunks, weights)
    if not args.no_llama:
        scores += llama_scores(model_dir, args.cache_dir, text_file, args.ctx, args.chunks)
    print(render(scores, num_tokens, args.ctx, args.chunks))
    if args.out:
        args.out.write_text(json.dumps([asdict(s) for s in scores], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
