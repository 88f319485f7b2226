"""models/linear/packed.py: oneDNN's packed linear in place of nn.Linear on the CPU, kept only
where a probe finds it faster, and equal to F.linear up to float32 rounding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from models.linear.packed import PackedLinear, pack_linears

REPO_ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 64), (32, 64), (1, 37, 64), (3, 5, 64)])
def test_a_packed_linear_computes_what_the_linear_did(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        expected = linear(x)
        got = PackedLinear(linear, rows_hint=32)(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def load(model_dir: Path) -> nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_a_packed_model_gives_the_logits_and_greedy_tokens_of_the_original(tiny_model_dir: Path) -> None:
    original, packed = load(tiny_model_dir), load(tiny_model_dir)
    linears = sum(type(m) is nn.Linear for m in packed.modules())
    assert pack_linears(packed, rows_hint=8, min_speedup=0.0) == linears > 0  # packed whatever the probe says
    assert not any(type(m) is nn.Linear for m in packed.modules())
    prompt = torch.randint(3, 200, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(packed(prompt).logits, original(prompt).logits, rtol=1e-4, atol=1e-4)
        greedy = {"do_sample": False, "max_new_tokens": 16, "min_new_tokens": 16, "pad_token_id": 0}
        assert torch.equal(packed.generate(prompt, **greedy), original.generate(prompt, **greedy))


def test_a_model_stays_as_it_is_where_onednn_is_not_faster(tiny_model_dir: Path) -> None:
    model = load(tiny_model_dir)
    before = [type(m) for m in model.modules()]
    assert pack_linears(model, rows_hint=8, min_speedup=1e9) == 0
    assert [type(m) for m in model.modules()] == before


def test_a_linear_shared_by_two_parents_is_packed_once() -> None:
    shared = nn.Linear(32, 32)
    model = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared), nn.Linear(32, 8).to(torch.float64))
    assert pack_linears(model, rows_hint=4, min_speedup=0.0) == 1
    first, second, untouched = model[0][0], model[1][0], model[2]
    assert isinstance(first, PackedLinear) and first is second
    assert type(untouched) is nn.Linear  # float64: left to torch


def test_bfloat16_layers_are_widened_largest_first_when_the_model_computes_in_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model read narrow (models/loading/widening.py): each layer is widened as it is packed, the
    largest first (its widened and packed copies are resident together while the rest is narrow)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.Linear(24, 96), nn.Linear(96, 8)).to(torch.bfloat16)
    wide = nn.Sequential(nn.Linear(16, 24), nn.Linear(24, 96), nn.Linear(96, 8))
    wide.load_state_dict({name: value.float() for name, value in model.state_dict().items()})
    built: list[int] = []
    real = PackedLinear

    def spy(linear: nn.Linear, rows_hint: int) -> PackedLinear:
        assert linear.weight.dtype == torch.float32
        built.append(linear.weight.numel())
        return real(linear, rows_hint)

    monkeypatch.setattr("models.linear.packed.PackedLinear", spy)
    assert pack_linears(model, rows_hint=4, min_speedup=0.0, compute_dtype=torch.float32) == 3
    probe, *layers = built  # the probe packs (a copy of) the largest layer first
    assert probe == 96 * 24 and layers == [96 * 24, 96 * 8, 24 * 16]
    x = torch.randn(3, 16)
    torch.testing.assert_close(model(x), wide(x), rtol=1e-5, atol=1e-5)


def test_onednn_caches_are_bounded_unless_the_environment_says_otherwise() -> None:
    from models.runner.cpus import ONEDNN_CACHE_CAPACITY, bound_onednn_caches

    env = {"LRU_CACHE_CAPACITY": "512"}
    bound_onednn_caches(env)
    assert env == {"LRU_CACHE_CAPACITY": "512", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
    assert set(ONEDNN_CACHE_CAPACITY) == {"LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc")
def test_a_packed_model_does_not_grow_with_every_row_count_it_sees() -> None:
    """Regression: uncapped, oneDNN kept a primitive (~0.55 MB) for every input shape, and a soak
    grew past its 5% bound. Run in a fresh interpreter, as surge serve starts: the caps must be
    in the environment before torch is imported."""
    code = (
        "import sys, ctypes; from models.runner.cpus import bound_onednn_caches; bound_onednn_caches()\n"
        "import torch; from torch import nn; from models.linear.packed import PackedLinear\n"
        "libc = ctypes.CDLL('libc.so.6')\n"
        "def rss():\n    libc.malloc_trim(0)\n    return int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "torch.set_num_threads(1); layer = PackedLinear(nn.Linear(256, 1024), 32); x = torch.randn(512, 256)\n"
        "with torch.inference_mode():\n    layer(x[:1]); before = rss()\n"
        "    for m in range(1, 513): layer(x[:m])\n"
        "print((rss() - before) / 2**20)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    growth_mib = float(out.stdout.strip().splitlines()[-1])
    assert growth_mib < 80, f"{growth_mib:.0f} MiB for 512 row counts (uncapped: ~280)"


def test_every_row_count_maps_to_a_few_kernels_that_stay_cached() -> None:
    """oneDNN builds a kernel per input shape (each taking ~0.2-0.5 ms to build and a slot of its
    capped cache): rows 1-256 reach it as 25 sizes, so a second pass over every count builds
    nothing. Counted from oneDNN's own log of kernel creations, in a fresh interpreter."""
    code = (
        "from models.runner.cpus import bound_onednn_caches; bound_onednn_caches()\n"
        "import torch; from torch import nn; from models.linear.packed import PackedLinear\n"
        "torch.set_num_threads(1); layer = PackedLinear(nn.Linear(64, 96), 32); x = torch.randn(256, 64)\n"
        "with torch.inference_mode(), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):\n"
        "    for m in range(1, 257): layer(x[:m])\n"
        "    print('SECOND PASS', flush=True)\n"
        "    for m in range(1, 257): layer(x[:m])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    first, _, second = out.stdout.partition("SECOND PASS")
    built = [line for line in first.splitlines() if "create:cache_miss" in line]
    assert 0 < len({line.split(",")[-2] for line in built}) <= 25, "\n".join(built)  # the problem's shape
    assert "cache_miss" not in second


def test_a_bfloat16_model_is_packed_and_keeps_its_logits(tiny_model_dir: Path) -> None:
    """bfloat16 layers are packed too (their own probe), and compute what they did to bf16 rounding;
    where oneDNN cannot pack bfloat16 (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT: an AVX2 CPU),
    they are left as they were, without an error."""
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    packed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    linears = sum(type(m) is nn.Linear for m in packed.modules())
    try:
        PackedLinear(nn.Linear(16, 16, bias=False, dtype=torch.bfloat16), 8)
    except RuntimeError:
        assert pack_linears(packed, rows_hint=8, min_speedup=0.0) == 0
        assert sum(type(m) is nn.Linear for m in packed.modules()) == linears > 0
        return
    assert pack_linears(packed, rows_hint=8, min_speedup=0.0) == linears > 0
    assert all(m.packed.dtype == torch.bfloat16 for m in packed.modules() if isinstance(m, PackedLinear))
    prompt = torch.randint(3, 200, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        got, expected = packed(prompt).logits.float(), original(prompt).logits.float()
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
