"""Classification metrics against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oelm.training.metrics import accuracy, collapsed, macro_f1, majority_accuracy


def test_accuracy_accepts_lists_arrays_tensors():
    assert accuracy([0, 1, 1, 2], [0, 1, 2, 2]) == 0.75
    assert accuracy(np.array([1, 1]), torch.tensor([1, 0])) == 0.5


def test_macro_f1_multiclass_by_hand():
    y = [0, 0, 1, 1, 2, 2]
    p = [0, 1, 1, 1, 0, 2]
    # class 0: tp1 fp1 fn1 -> 0.5; class 1: tp2 fp1 fn0 -> 0.8; class 2: tp1 fp0 fn1 -> 2/3
    assert macro_f1(p, y) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)


def test_macro_f1_is_not_binary_f1_and_skips_absent_classes():
    # Always predicting 1 on a binary split: F1(1) = 2*2/(2*2+2) = 2/3, F1(0) = 0 -> macro 1/3.
    assert macro_f1([1, 1, 1, 1], [1, 1, 0, 0]) == pytest.approx(1 / 3)
    # Class 2 exists in neither labels nor predictions: excluded rather than counted as 0.
    assert macro_f1([0, 1], [0, 1]) == 1.0
    # A class only predicted (never a label) counts with F1 0.
    assert macro_f1([0, 2], [0, 1]) == pytest.approx((1.0 + 0.0 + 0.0) / 3)


def test_majority_and_collapse_rule():
    assert majority_accuracy([0, 1, 1, 2]) == 0.5
    assert collapsed(0.515, 0.5) and collapsed(0.52, 0.5) and collapsed(0.30, 0.5)
    assert not collapsed(0.53, 0.5)


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="differ"):
        accuracy([0, 1], [0])


def test_macro_f1_from_confusion_matches():
    from oelm.training.metrics import macro_f1_from_confusion

    # rows = labels, columns = predictions, for y=[0,0,1,1,2,2], p=[0,1,1,1,0,2]
    cm = [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert macro_f1_from_confusion(cm) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert macro_f1_from_confusion([[2, 0, 0], [0, 0, 0], [0, 0, 1]]) == 1.0  # class 1 absent: skipped
