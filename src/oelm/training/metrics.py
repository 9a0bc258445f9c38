"""Classification metrics: accuracy, multi-class macro-F1, majority baseline, collapse rule."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

ArrayLike = Sequence[int] | np.ndarray | torch.Tensor

# A run whose accuracy is at most this far above the majority-class rate learned nothing usable.
COLLAPSE_MARGIN = 0.02


def _as_array(values: ArrayLike) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _pair(preds: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p, y = _as_array(preds), _as_array(labels)
    if p.shape != y.shape:
        raise ValueError(f"predictions ({p.size}) and labels ({y.size}) differ in length")
    if p.size == 0:
        raise ValueError("metrics need at least one example")
    return p, y


def accuracy(preds: ArrayLike, labels: ArrayLike) -> float:
    """Fraction of predictions equal to the label."""
    p, y = _pair(preds, labels)
    return float((p == y).mean())


def macro_f1(preds: ArrayLike, labels: ArrayLike) -> float:
    """Mean over classes of per-class F1; classes absent from both labels and predictions are excluded."""
    p, y = _pair(preds, labels)
    n = int(max(p.max(), y.max())) + 1
    confusion = np.bincount(y * n + p, minlength=n * n).reshape(n, n)
    return macro_f1_from_confusion(confusion)


def macro_f1_from_confusion(confusion: np.ndarray | Sequence[Sequence[float]]) -> float:
    """Macro-F1 from a confusion matrix (rows: label, columns: prediction), as macro_f1 defines it."""
    cm = np.asarray(confusion, dtype=np.float64)
    tp = np.diag(cm)
    predicted, actual = cm.sum(axis=0), cm.sum(axis=1)
    present = (predicted + actual) > 0
    if not present.any():
        raise ValueError("macro_f1 needs at least one example")
    # 2tp / (2tp + fp + fn) = 2tp / (predicted + actual): F1 without the 0/0 of an unpredicted class.
    return float(np.mean(2 * tp[present] / (predicted[present] + actual[present])))


def majority_accuracy(labels: ArrayLike) -> float:
    """Accuracy of always predicting the most frequent label of this (evaluation) split."""
    y = _as_array(labels)
    if y.size == 0:
        raise ValueError("majority_accuracy needs at least one label")
    return float(np.bincount(y).max() / y.size)


def collapsed(acc: float, majority: float, margin: float = COLLAPSE_MARGIN) -> bool:
    """True when accuracy is not more than `margin` (2 points) above the majority-class rate."""
    return bool(acc <= majority + margin)
