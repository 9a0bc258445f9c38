"""Initializers: orthonormal head rows, scale-matched random rows, pretrained row spaces."""

import pytest
import torch

from oelm.core import orthogonal as ortho
from oelm.utils.errors import UserError


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_headwise_rows_are_orthonormal_per_head():
    w = ortho.headwise_orthogonal(4, 8, 32, gen())
    assert w.shape == (32, 32)
    for h in range(4):
        block = w[h * 8 : (h + 1) * 8]
        assert torch.allclose(block @ block.T, torch.eye(8, dtype=w.dtype), atol=1e-12)
    assert ortho.orthogonality_error(w, 4) < 1e-12


def test_headwise_heads_are_independent_not_globally_orthogonal():
    # Head-wise QR draws each head separately: different heads' rows are not orthogonal.
    w = ortho.headwise_orthogonal(4, 8, 32, gen())
    assert ortho.orthogonality_error(w, 1) > 1e-3


def test_sign_fix_makes_qr_deterministic_per_seed():
    a = ortho.headwise_orthogonal(2, 4, 16, gen(3))
    b = ortho.headwise_orthogonal(2, 4, 16, gen(3))
    assert torch.equal(a, b)
    assert not torch.equal(a, ortho.headwise_orthogonal(2, 4, 16, gen(4)))


def test_global_orthogonal_square_and_tall():
    w = ortho.global_orthogonal(32, 32, gen())
    assert torch.allclose(w @ w.T, torch.eye(32, dtype=w.dtype), atol=1e-12)
    tall = ortho.global_orthogonal(64, 16, gen())  # FFN fc_in: more rows than inputs
    assert tall.shape == (64, 16)
    assert torch.allclose(tall.T @ tall, torch.eye(16, dtype=tall.dtype), atol=1e-12)


def test_scaled_random_has_unit_rows_but_is_not_orthogonal():
    w = ortho.scaled_random(32, 64, gen())
    assert torch.allclose(w.norm(dim=1), torch.ones(32, dtype=w.dtype), atol=1e-12)
    assert ortho.orthogonality_error(w, 4) > 1e-2


def test_normal_has_the_requested_std():
    w = ortho.normal(256, 256, gen(), std=0.02)
    assert abs(float(w.std()) - 0.02) < 1e-3


def test_orthogonalize_pretrained_keeps_each_heads_row_space():
    pretrained = torch.randn(32, 48, dtype=torch.float64, generator=gen(1))
    w = ortho.orthogonalize_pretrained(pretrained, 4)
    assert ortho.orthogonality_error(w, 4) < 1e-12
    for h in range(4):
        rows = slice(h * 8, (h + 1) * 8)
        projector = w[rows].T @ w[rows]  # projects onto the new head's row space
        assert torch.allclose(pretrained[rows] @ projector, pretrained[rows], atol=1e-10)


def test_heads_wider_than_input_are_rejected():
    with pytest.raises(UserError, match="head_dim"):
        ortho.headwise_orthogonal(1, 64, 32, gen())


def test_generator_is_stable_and_keyed():
    a = torch.randn(3, generator=ortho.make_generator(0, 1, "q"))
    b = torch.randn(3, generator=ortho.make_generator(0, 1, "q"))
    c = torch.randn(3, generator=ortho.make_generator(0, 1, "k"))
    assert torch.equal(a, b) and not torch.equal(a, c)
