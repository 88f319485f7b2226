"""int8 with a scale per block of 32 (surge's kernel, `--quantization int8` on x86 with AVX-512
VNNI or AVX2): each entry point's sums equal the grid's exact products, every block keeps its own
scale, the thread split changes nothing, a quantized model loses less than with per-channel
scales, and an entry point is used only after it passed its probe in a child process."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from models.linear import block_int8, block_kernel
from models.linear.block_int8 import BLOCK, BlockInt8Linear
from models.linear.int8 import Int8Linear, activation_qmax
from models.linear.swap import cpu_linears, swap_linears


@pytest.fixture(params=sorted(block_kernel.ISAS))
def kernel(request: pytest.FixtureRequest) -> block_kernel.BlockKernel:
    """Each of the kernel's entry points this CPU runs (AVX-512 VNNI, AVX2): all must agree."""
    try:
        return block_kernel.load(request.param)
    except block_kernel.KernelUnavailable as exc:
        pytest.skip(f"the block kernel's {request.param} path cannot run here: {exc}")


def _grid(a: torch.Tensor) -> torch.Tensor:
    """`a` (rows x features) rounded to the Q8_0 grid, in float64: blocks of 32 along the
    features (the last padded with zeros), scale = the block's largest magnitude / 127."""
    rows, features = a.shape
    padded = torch.zeros(rows, -(-features // BLOCK) * BLOCK, dtype=torch.float32)
    padded[:, :features] = a.float()
    blocks = padded.view(rows, -1, BLOCK)
    scale = blocks.abs().amax(dim=2, keepdim=True) / 127
    codes = torch.round(blocks / scale.clamp_min(torch.finfo(torch.float32).tiny)).clamp(-127, 127)
    return (codes.double() * scale.double()).view(rows, -1)


def _assert_row_close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    """Equal to float32 summation's rounding, relative to each row's largest output: the kernel
    adds the blocks' exact integer sums in float32, the reference in float64."""
    err = (got.double() - want).abs() / want.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    assert err.max() < tol, err.max()


def _reference(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, linear.in_features)
    out = _grid(rows) @ _grid(linear.weight.detach()).T
    if linear.bias is not None:
        out = out + linear.bias.double()
    return out.reshape(*x.shape[:-1], linear.out_features)


@pytest.mark.parametrize(
    ("rows", "in_features", "out_features", "bias"),
    [
        (1, 64, 16, False),
        (5, 100, 37, True),  # a partial last block, a partial last panel of 16 channels
        (70, 96, 48, False),  # rows across two of the kernel's row chunks (64)
        (33, 256, 80, True),  # an odd number of panels (5)
    ],
)
def test_the_kernel_equals_the_grids_exact_product(
    kernel: block_kernel.BlockKernel, rows: int, in_features: int, out_features: int, bias: bool
) -> None:
    torch.manual_seed(rows)
    linear = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(rows, in_features) * torch.logspace(-3, 3, rows)[:, None]
    got = BlockInt8Linear(linear, kernel)(x)
    assert got.shape == (rows, out_features) and got.dtype == torch.float32
    _assert_row_close(got, _reference(linear, x))


def test_extremes_sum_exactly(kernel: block_kernel.BlockKernel) -> None:
    # Codes at both ends of their range in every position: the unsigned weight codes (1..255)
    # times +-127 activations, 32 to a block, must not overflow or saturate.
    linear = nn.Linear(128, 32, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.sign(torch.randn(32, 128)))
    x = torch.sign(torch.randn(4, 128)) * torch.tensor([1.0, 1e4, 1e-4, 3.0])[:, None]
    x[3] = 0.0  # a row of zeros: scale 0, no division by it
    got = BlockInt8Linear(linear, kernel)(x)
    _assert_row_close(got[:3], _reference(linear, x)[:3])
    assert (got[3] == 0).all()


def test_each_block_keeps_its_own_scale(kernel: block_kernel.BlockKernel) -> None:
    # One block of a row a million times smaller than the rest keeps its precision: a scale per
    # row (per token) would round it to zero.
    torch.manual_seed(1)
    linear = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        linear.weight[:, 32:] = 0.0  # only the small block reaches the output
    x = torch.randn(2, 64)
    x[:, :32] *= 1e-6
    got, want = BlockInt8Linear(linear, kernel)(x), linear(x).detach()
    assert ((got - want).norm(dim=1) / want.norm(dim=1)).max() < 0.02


def test_threads_do_not_change_a_bit(kernel: block_kernel.BlockKernel) -> None:
    torch.manual_seed(2)
    linear = nn.Linear(192, 96)
    layer = BlockInt8Linear(linear, kernel)
    x = torch.randn(130, 192)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layer(x)
        torch.set_num_threads(max(2, before))
        many = layer(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


def test_bfloat16_and_strided_inputs(kernel: block_kernel.BlockKernel) -> None:
    linear = nn.Linear(64, 32)
    layer = BlockInt8Linear(linear, kernel)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - linear(x.float())).norm() / linear(x.float()).norm()) < 0.03
    wide = torch.randn(4, 128)
    strided = wide[:, ::2]
    assert not strided.is_contiguous()
    torch.testing.assert_close(layer(strided), layer(strided.contiguous()))
    assert layer(torch.empty(0, 64)).shape == (0, 32)


@torch.inference_mode()
def test_a_block_model_loses_less_than_a_per_channel_one(
    kernel: block_kernel.BlockKernel, tiny_model_dir: Path
) -> None:
    # The point of the grid: on the same model and tokens, blocks of 32 stay closer to float32
    # than oneDNN's per-channel weights and per-token activations, and hold under a third of the bytes.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    blocks, channels = copy.deepcopy(model), copy.deepcopy(model)
    swap_linears(cpu_linears(blocks), lambda linear: BlockInt8Linear(linear, kernel))
    qmax = activation_qmax()
    swap_linears(cpu_linears(channels), lambda linear: Int8Linear(linear, qmax, 4))
    ids = torch.randint(3, 2000, (2, 64), generator=torch.Generator().manual_seed(0))
    want = model(ids).logits.log_softmax(-1)

    def kld(quantized: nn.Module) -> float:
        got = quantized(ids).logits.log_softmax(-1)
        return float((want.exp() * (want - got)).sum(-1).mean())

    assert kld(blocks) < kld(channels)
    copied = copy.deepcopy(blocks)  # a quantized model copies (the library is shared, not copied)
    torch.testing.assert_close(copied(ids).logits, blocks(ids).logits, rtol=0, atol=0)
    linears = {id(m): m for m in model.modules() if type(m) is nn.Linear}.values()
    float_bytes = sum(m.weight.numel() * 4 for m in linears)
    layers = [m for m in blocks.modules() if type(m) is BlockInt8Linear]
    assert sum(m.codes.numel() + m.scales.numel() * 4 for m in layers) < 0.3 * float_bytes


def test_the_library_is_built_once_per_source_and_refused_without_a_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SURGE_KERNEL_CACHE", str(tmp_path / "cache"))
    built = block_kernel.find_or_build()
    assert built.parent == tmp_path / "cache" and built.name == block_kernel.library_name()
    stamp = built.stat().st_mtime_ns
    assert block_kernel.find_or_build() == built and built.stat().st_mtime_ns == stamp
    monkeypatch.setenv("CC", "surge-no-such-compiler")
    with pytest.raises(block_kernel.KernelUnavailable, match="no C compiler"):
        block_kernel.build(tmp_path / "other" / "lib.so")
    monkeypatch.setenv("CC", "cc")
    source = tmp_path / "src" / "kernels" / "q8_blocks.c"
    source.parent.mkdir(parents=True)
    source.write_text(block_kernel.SOURCE.read_text() + "\n#error broken on purpose\n")
    monkeypatch.setattr(block_kernel, "SOURCE", source)
    with pytest.raises(block_kernel.KernelUnavailable, match="broken on purpose"):
        block_kernel.build(tmp_path / "other" / "lib.so")
    assert not list((tmp_path / "other").iterdir())  # no half-written library left behind


def test_a_library_built_into_the_package_is_found_before_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Docker image builds the library next to the source (`python -m models.linear.block_kernel`)
    # and its runtime stage has no compiler: that library must be the one loaded.
    source = tmp_path / "pkg" / "kernels" / "q8_blocks.c"
    source.parent.mkdir(parents=True)
    source.write_text(block_kernel.SOURCE.read_text())
    monkeypatch.setattr(block_kernel, "SOURCE", source)
    monkeypatch.setenv("SURGE_KERNEL_CACHE", str(tmp_path / "cache"))
    block_kernel.main()
    packaged = source.parent / block_kernel.library_name()
    assert packaged.is_file()
    monkeypatch.setenv("CC", "surge-no-such-compiler")
    assert block_kernel.find_or_build() == packaged
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("shape", [(1000, 96), (37, 200), (16, 32)])
def test_packing_in_chunks_gives_the_whole_layers_codes(
    shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weight is quantized a few channels at a time (bounded temporaries at load): the codes
    and scales are those of the whole layer at once, bit for bit."""
    weight = torch.randn(*shape, dtype=torch.bfloat16)
    whole = block_int8.pack_weight(weight)
    monkeypatch.setattr(block_int8, "CHUNK_ELEMENTS", 1)  # one panel of 16 channels at a time
    chunked = block_int8.pack_weight(weight)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_an_entry_point_the_cpu_cannot_run_fails_its_probe_in_a_child_not_here() -> None:
    # What the probe is for: an instruction the CPU lacks kills the child (SIGILL), not the server.
    try:
        path = block_kernel.find_or_build()
    except block_kernel.KernelUnavailable as exc:
        pytest.skip(str(exc))
    import ctypes

    usable = block_kernel.usable_isas(ctypes.CDLL(str(path)))
    for isa in block_kernel.ISAS:
        failure = block_kernel.probe(path, isa)
        if isa in usable:
            assert failure is None, (isa, failure)
        else:
            assert failure is not None and "signal 4" in failure, (isa, failure)


def test_surge_int8_isa_caps_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        best = block_kernel.load()
    except block_kernel.KernelUnavailable as exc:
        pytest.skip(str(exc))
    assert best.isa == next(iter(isa for isa in block_kernel.ISAS if isa in block_kernel.usable_isas(best.library)))
    monkeypatch.setenv("SURGE_INT8_ISA", "avx2")
    assert block_kernel.load().isa == "avx2"
    monkeypatch.setenv("SURGE_INT8_ISA", "none")
    with pytest.raises(block_kernel.KernelUnavailable, match="SURGE_INT8_ISA"):
        block_kernel.load()


@pytest.mark.parametrize(("in_features", "out_features"), [(96, 48), (200, 37)])
def test_the_weight_comes_back_in_bfloat16_exactly(
    kernel: block_kernel.BlockKernel, in_features: int, out_features: int
) -> None:
    """q8b_dequant_bf16: code x scale, rounded once to bfloat16 as torch rounds, the padding (a
    last block of 8 inputs, a partial panel) dropped; both entry points' CPUs give the same bits."""
    torch.manual_seed(3)
    linear = nn.Linear(in_features, out_features, bias=False)
    layer = BlockInt8Linear(linear, kernel)
    want = _grid(linear.weight.detach()).float()[:, :in_features].bfloat16()
    got = torch.full((out_features, in_features), float("nan"), dtype=torch.bfloat16)
    kernel.dequant_bf16(
        layer.codes.data_ptr(), layer.scales.data_ptr(), out_features, in_features, layer.padded_in, got.data_ptr(), 2
    )
    assert torch.equal(got.float(), want.float())  # as values: a zero code is +0 here, -0 in torch.round


@pytest.mark.parametrize("bias", [False, True])
def test_prefill_rows_on_bfloat16_tiles_match_the_grid(kernel: block_kernel.BlockKernel, bias: bool) -> None:
    """From tile_rows up the product runs in bfloat16 on the dequantized weight (AMX where there
    is AMX; torch's bfloat16 matmul anywhere), in slices of output channels; below, the kernel."""
    torch.manual_seed(4)
    linear = nn.Linear(200, 4096 + 48, bias=bias)  # two slices, the second a partial panel
    layer = BlockInt8Linear(linear, kernel, tile_rows=8)
    plain = BlockInt8Linear(linear, kernel)
    x = torch.randn(2, 5, 200)
    tiled = layer(x)  # 10 rows: the tiles
    assert tiled.shape == (2, 5, 4096 + 48) and tiled.dtype == torch.float32
    weight = _grid(linear.weight.detach())[:, :200].float().bfloat16().double()
    want = x.reshape(-1, 200).bfloat16().double() @ weight.T
    if bias:
        want = want + linear.bias.detach().double()
    _assert_row_close(tiled.reshape(-1, 4096 + 48), want, tol=2e-2)  # bfloat16's product
    few = x[0, :4]  # 4 rows: the kernel, bit for bit the layer without tiles
    assert torch.equal(layer(few), plain(few))
    assert "bfloat16 tiles from 8 rows" in repr(layer)
