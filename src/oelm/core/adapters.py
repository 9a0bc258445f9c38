"""Small trainable modules a method adds on a projection's output (the "adapter" audit role).

An adapter maps (x, y) -> y', where x [..., d_in] is the projection's input and y [..., n_heads *
head_dim] its output (before the head reshape; head h owns the slice h*head_dim:(h+1)*head_dim).
`oelm.core.targets.attach_adapter` wires it into each model family. A new kind is one class here with
`@register_adapter` plus one method record naming it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oelm.utils.errors import UserError


class Adapter(nn.Module):
    """Base class: wraps a projection's output; subclasses set `kind` and `roles`."""

    kind: str = ""
    roles: tuple[str, ...] = ("q", "k")  # the projections this kind attaches to

    def __init__(self, n_heads: int, head_dim: int, d_in: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.d_in = n_heads, head_dim, d_in

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def flops_per_token(self) -> int:
        """Forward matmul FLOPs per token (elementwise work counts 0, as in oelm.core.flops)."""
        return 0

    def extra_repr(self) -> str:
        return f"kind={self.kind}, n_heads={self.n_heads}, head_dim={self.head_dim}"


_KINDS: dict[str, type[Adapter]] = {}


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: make an adapter kind available to method records by its `kind`."""
    _KINDS[cls.kind] = cls
    return cls


def adapter_kinds() -> list[str]:
    """Names of the registered adapter kinds."""
    return list(_KINDS)


def adapter_class(kind: str) -> type[Adapter]:
    """The adapter class of a kind, or a UserError listing the kinds."""
    try:
        return _KINDS[kind]
    except KeyError:
        raise UserError(f"unknown adapter kind {kind!r}; known: {', '.join(_KINDS)}") from None


@register_adapter
class HeadTemperature(Adapter):
    """One trainable scale per query head: multiplies that head's attention logits (init 1)."""

    kind, roles = "temp", ("q",)

    def __init__(self, n_heads: int, head_dim: int, d_in: int, **_: Any) -> None:
        super().__init__(n_heads, head_dim, d_in)
        self.scale = nn.Parameter(torch.ones(n_heads))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (y.unflatten(-1, (self.n_heads, self.head_dim)) * self.scale.to(y.dtype)[:, None]).flatten(-2)


@register_adapter
class DimGain(Adapter):
    """One trainable gain per query dimension (a diagonal bilinear form within each head; init 1)."""

    kind, roles = "gain", ("q",)

    def __init__(self, n_heads: int, head_dim: int, d_in: int, **_: Any) -> None:
        super().__init__(n_heads, head_dim, d_in)
        self.gain = nn.Parameter(torch.ones(n_heads * head_dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y * self.gain.to(y.dtype)


@register_adapter
class QKNorm(Adapter):
    """Per-head RMSNorm of q (or k) with a trainable gain over head_dim (shared by the heads)."""

    kind, roles = "qknorm", ("q", "k")

    def __init__(self, n_heads: int, head_dim: int, d_in: int, **_: Any) -> None:
        super().__init__(n_heads, head_dim, d_in)
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        heads = y.unflatten(-1, (self.n_heads, self.head_dim))
        return F.rms_norm(heads, (self.head_dim,), self.weight.to(y.dtype), eps=1e-6).flatten(-2)


@register_adapter
class LowRank(Adapter):
    """A trainable rank-r update of a frozen projection: y + x A^T B^T, B zero-initialized (LoRA)."""

    kind, roles = "lowrank", ("q", "k")

    def __init__(
        self, n_heads: int, head_dim: int, d_in: int, rank: int = 8, generator: torch.Generator | None = None, **_: Any
    ) -> None:
        super().__init__(n_heads, head_dim, d_in)
        bound = 1.0 / math.sqrt(d_in)  # kaiming_uniform(a=sqrt(5)), LoRA's init of A
        a = torch.empty(rank, d_in).uniform_(-bound, bound, generator=generator)
        self.lora_a = nn.Parameter(a)
        self.lora_b = nn.Parameter(torch.zeros(n_heads * head_dim, rank))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y + F.linear(F.linear(x, self.lora_a.to(x.dtype)), self.lora_b.to(x.dtype))

    def flops_per_token(self) -> int:
        return 2 * self.lora_a.numel() + 2 * self.lora_b.numel()


@register_adapter
class QueryBias(Adapter):
    """A trainable bias on the frozen Q (init 0): adds a query-independent preference over keys."""

    kind, roles = "qbias", ("q",)

    def __init__(self, n_heads: int, head_dim: int, d_in: int, **_: Any) -> None:
        super().__init__(n_heads, head_dim, d_in)
        self.bias = nn.Parameter(torch.zeros(n_heads * head_dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y + self.bias.to(y.dtype)


def make_adapter(
    kind: str,
    n_heads: int,
    head_dim: int,
    d_in: int,
    like: torch.Tensor,
    generator: torch.Generator,
    options: dict[str, Any],
) -> Adapter:
    """An adapter of `kind` on the device and dtype of the tensor `like` (the projection weight)."""
    module = adapter_class(kind)(n_heads, head_dim, d_in, generator=generator, **options)
    return module.to(device=like.device, dtype=like.dtype)


def iter_adapters(model: nn.Module):
    """(qualified name, adapter) of every adapter in a model."""
    return ((n, m) for n, m in model.named_modules() if isinstance(m, Adapter))
