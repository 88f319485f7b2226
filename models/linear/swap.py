"""Swapping a model's `nn.Linear` layers for faster ones, in place: the one walk the float32
(models/linear/packed.py) and int8 (models/linear/int8.py) kernels share."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# (the module holding the layer, the layer's attribute name there, the layer)
LinearSite = tuple[nn.Module, str, nn.Linear]


def cpu_linears(model: nn.Module, dtype: torch.dtype | None = None) -> list[LinearSite]:
    """Every plain `nn.Linear` of `model` whose weight is on the CPU (and of `dtype`, if given),
    at every place it sits. Subclasses are left alone: their forward may do more than a matmul.

    NOTE: `_modules`, not `named_children()`, which yields a module held under two names once:
    the second name kept the float32 layer after a swap."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent._modules.items()
        if type(child) is nn.Linear
        and child.weight.device.type == "cpu"
        and (dtype is None or child.weight.dtype == dtype)
    ]


def swap_linears(sites: list[LinearSite], build: Callable[[nn.Linear], nn.Module]) -> int:
    """Put `build(layer)` in each site's place; a layer that sits in two places (one module under
    two names) is built once and shared, as it was. Returns how many were built. Empties `sites`.

    One layer at a time, and nothing here keeps a swapped layer alive: its weight is freed before
    the next one is built, so the model never holds two copies of its weights (holding every
    original until the end doubled the peak memory of a load: a 0.5B-parameter float32 model
    peaked at 2x its weights)."""
    places, layers = _grouped(sites)  # while all are alive: an id is unique only then
    sites.clear()
    for key, where in places.items():
        layer = layers.pop(key)
        replacement = build(layer)
        for parent, name in where:
            setattr(parent, name, replacement)
        del layer, replacement
    return len(places)


def _grouped(sites: list[LinearSite]) -> tuple[dict[int, list[tuple[nn.Module, str]]], dict[int, nn.Linear]]:
    """Each layer's places, and the layers, by id. (A function of its own: a loop's last name
    would keep one layer alive in the caller.)"""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    layers: dict[int, nn.Linear] = {}
    for parent, name, child in sites:
        places.setdefault(id(child), []).append((parent, name))
        layers[id(child)] = child
    return places, layers
