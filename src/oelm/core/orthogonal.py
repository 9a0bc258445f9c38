"""Initializers for Q/K (and FFN) weights, all in the [out, in] layout of nn.Linear.

A weight of a projection with `n_heads` heads is [n_heads * head_dim, d_in]; head h owns the
row block h*head_dim:(h+1)*head_dim. "Orthonormal head" means that block's rows are orthonormal:
W_h @ W_h.T == I (needs head_dim <= d_in).
"""

from __future__ import annotations

import math

import torch

from oelm.utils.errors import UserError


def _gaussian(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    # float64 on CPU: QR in double precision keeps orthogonality errors near 1e-15.
    return torch.randn(shape, generator=generator, dtype=torch.float64)


def _orthonormal_rows(a: torch.Tensor) -> torch.Tensor:
    """Rows spanning the column space of [..., d_in, k] matrices (k <= d_in), as [..., k, d_in]."""
    q, r = torch.linalg.qr(a, mode="reduced")
    # Fix signs by diag(R) so the factorization is unique (Haar-distributed for Gaussian input).
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs[signs == 0] = 1.0
    return (q * signs.unsqueeze(-2)).transpose(-2, -1)


def _check_heads(n_rows: int, n_heads: int, d_in: int) -> int:
    if n_rows % n_heads:
        raise UserError(f"{n_rows} output rows cannot be split into {n_heads} heads")
    head_dim = n_rows // n_heads
    if head_dim > d_in:
        raise UserError(f"head_dim={head_dim} exceeds the input width {d_in}: its rows cannot be orthonormal")
    return head_dim


def headwise_orthogonal(n_heads: int, head_dim: int, d_in: int, generator: torch.Generator) -> torch.Tensor:
    """One QR per head of a Gaussian [d_in, head_dim]; each head's rows are orthonormal."""
    _check_heads(n_heads * head_dim, n_heads, d_in)
    # One batched QR over the heads: [n_heads, d_in, head_dim] -> [n_heads, head_dim, d_in].
    return _orthonormal_rows(_gaussian((n_heads, d_in, head_dim), generator)).reshape(-1, d_in)


def global_orthogonal(n_rows: int, d_in: int, generator: torch.Generator) -> torch.Tensor:
    """One QR of the whole matrix: orthonormal rows if n_rows <= d_in, else orthonormal columns."""
    if n_rows <= d_in:
        return _orthonormal_rows(_gaussian((d_in, n_rows), generator))
    return _orthonormal_rows(_gaussian((n_rows, d_in), generator)).T


def normal(n_rows: int, d_in: int, generator: torch.Generator, std: float = 0.02) -> torch.Tensor:
    """i.i.d. N(0, std^2) entries (the study's `oelm-random`)."""
    return _gaussian((n_rows, d_in), generator) * std


def torch_default(n_rows: int, d_in: int, generator: torch.Generator) -> torch.Tensor:
    """PyTorch's nn.Linear default (kaiming_uniform_ with a = sqrt(5)): U(-1/sqrt(d_in), 1/sqrt(d_in))."""
    bound = 1.0 / math.sqrt(d_in)
    return (torch.rand((n_rows, d_in), generator=generator, dtype=torch.float64) * 2 - 1) * bound


def scaled_random(n_rows: int, d_in: int, generator: torch.Generator) -> torch.Tensor:
    """Gaussian rows normalized to unit norm: the scale of orthonormal rows without orthogonality."""
    g = _gaussian((n_rows, d_in), generator)
    return g / g.norm(dim=1, keepdim=True)


def identity(n_rows: int, d_in: int) -> torch.Tensor:
    """The identity map (a Q that passes its input through: q = x), for square projections only."""
    if n_rows != d_in:
        raise UserError(
            f"an identity Q needs a square projection, but this one maps {d_in} -> {n_rows}; "
            "use a method with a different Q init (e.g. oelm-freeze)"
        )
    return torch.eye(n_rows, dtype=torch.float64)


def mimetic_pair(
    n_heads: int, head_dim: int, d_in: int, generator: torch.Generator, alpha: float = 0.7, beta: float = 0.7
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mimetic Q/K (Trockman & Kolter 2023): per head, Q_h^T K_h is the best rank-head_dim fit of alpha Z + beta I.

    Z has i.i.d. N(0, 1/d_in) entries. With M = U S V^T (SVD), Q_h = sqrt(S_r) U_r^T and K_h =
    sqrt(S_r) V_r^T (r = head_dim), so q . k = x^T Q_h^T K_h x' follows x^T M x': attention starts
    out looking like a pretrained model's (a diagonal-heavy Q K^T). Returns ([n_heads * head_dim,
    d_in], [n_heads * head_dim, d_in]).
    """
    _check_heads(n_heads * head_dim, n_heads, d_in)
    z = _gaussian((n_heads, d_in, d_in), generator) / math.sqrt(d_in)
    m = alpha * z + beta * torch.eye(d_in, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(m)
    root = s[:, :head_dim].sqrt().unsqueeze(-1)  # [n_heads, r, 1]
    q = root * u[:, :, :head_dim].transpose(1, 2)  # [n_heads, r, d_in]
    k = root * vh[:, :head_dim, :]
    return q.reshape(-1, d_in), k.reshape(-1, d_in)


def orthogonalize_pretrained(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """QR of each pretrained head block, keeping its row space (as the study did for BERT)."""
    n_rows, d_in = weight.shape
    head_dim = _check_heads(n_rows, n_heads, d_in)
    w = weight.detach().to(device="cpu", dtype=torch.float64).view(n_heads, head_dim, d_in)
    return _orthonormal_rows(w.transpose(1, 2)).reshape(n_rows, d_in)


def orthogonality_error(weight: torch.Tensor, n_heads: int) -> float:
    """Largest |W_h W_h^T - I| entry over the heads of an [out, in] weight."""
    n_rows, d_in = weight.shape
    head_dim = _check_heads(n_rows, n_heads, d_in)
    w = weight.detach().to(device="cpu", dtype=torch.float64).view(n_heads, head_dim, d_in)
    gram = w @ w.transpose(1, 2)
    eye = torch.eye(head_dim, dtype=torch.float64)
    return float((gram - eye).abs().max())


def make_generator(seed: int, *keys: object) -> torch.Generator:
    """A CPU generator seeded from a run seed and a tensor's identity, independent of global RNG."""
    # Python's hash of str is salted per process; use a stable FNV-1a over the key text instead.
    h = 0xCBF29CE484222325
    for byte in repr((seed, *keys)).encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return torch.Generator().manual_seed(h & 0x7FFFFFFFFFFFFFFF)
