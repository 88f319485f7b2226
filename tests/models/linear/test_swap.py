"""models/linear/swap.py: which layers are found, and how they are replaced."""

from __future__ import annotations

import weakref

import torch
from torch import nn

from models.linear.swap import cpu_linears, swap_linears


class Scaled(nn.Linear):
    """A subclass whose forward does more than the matmul: never swapped."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4).to(torch.float64)
        self.scaled = Scaled(4, 4)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU())])
        self.alias = self.first  # one layer under two names


class Marked(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear


def test_finds_plain_linears_by_dtype_and_leaves_subclasses() -> None:
    model = Model()
    found = {(type(parent).__name__, name) for parent, name, _ in cpu_linears(model, torch.float32)}
    assert found == {("Model", "first"), ("Model", "alias"), ("Sequential", "0")}
    assert ("Model", "second") in {(type(p).__name__, n) for p, n, _ in cpu_linears(model)}


def test_a_layer_under_two_names_is_built_once_and_stays_shared() -> None:
    model = Model()
    first, inner = model.first, model.blocks[0][0]
    built: list[nn.Linear] = []

    def build(linear: nn.Linear) -> nn.Module:
        built.append(linear)
        return Marked(linear)

    assert swap_linears(cpu_linears(model, torch.float32), build) == 2
    assert sorted(map(id, built)) == sorted([id(first), id(inner)])
    assert isinstance(model.first, Marked) and model.alias is model.first and model.first.linear is first
    assert isinstance(model.blocks[0][0], Marked) and model.blocks[0][0].linear is inner
    assert type(model.scaled) is Scaled and type(model.second) is nn.Linear


def test_each_swapped_layer_is_freed_before_the_next_is_built() -> None:
    """A load never holds two copies of the weights: when a layer is built, every layer swapped
    before it is gone (holding them all doubled a 0.5B model's peak memory at load)."""
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    model.add_module("alias", model[2])  # shared: freed once both its places hold the new layer
    refs: list[weakref.ref[nn.Linear]] = []

    def build(linear: nn.Linear) -> nn.Module:
        assert all(ref() is None for ref in refs), "a swapped layer is still alive"
        refs.append(weakref.ref(linear))
        return nn.Identity()  # keeps nothing of the layer, as the packed and 8-bit layers keep no float weight

    sites = cpu_linears(model)
    assert swap_linears(sites, build) == 6 and sites == []
    assert all(ref() is None for ref in refs)
    assert model.alias is model[2] and isinstance(model.alias, nn.Identity)
