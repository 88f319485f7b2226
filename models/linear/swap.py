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
    two names) is built once and shared, as it was. Returns how many were built."""
    built: dict[int, nn.Module] = {}
    for parent, name, child in sites:
        key = id(child)
        if key not in built:
            built[key] = build(child)
        setattr(parent, name, built[key])
    return len(built)
