"""configs/README.md says, row by row, which learning rates each config uses: the study configs
keep the study's own (fidelity), the sweeps give each arm its own grid (the fair protocol); the
study's gaps it quotes are recomputed from configs/study/study_numbers.yaml."""

from __future__ import annotations

import re
from pathlib import Path

from oelm.reports import stats
from oelm.utils.io import read_yaml

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "configs" / "README.md").read_text(encoding="utf-8")
NUMBERS = read_yaml(ROOT / "configs" / "study" / "study_numbers.yaml", "study numbers")["experiments"]


def table(first_header: str) -> list[dict[str, str]]:
    """The rows of the page's table whose header starts with `first_header`."""
    lines = PAGE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def study_config(name: str) -> dict:
    return read_yaml(ROOT / "configs" / "study" / f"{name}.yaml", "study config")


def gap(arm: str, base: str) -> str:
    a, b = NUMBERS[arm], NUMBERS[base]
    return f"{stats.relative_gap(a['value'], b['value'], a['metric'] != 'perplexity'):+.2f}%"


def test_every_study_row_names_the_studys_own_learning_rate_and_its_gap() -> None:
    rows = table("experiment")
    lr_col = next(k for k in rows[0] if k.startswith("learning rate"))
    assert "the study's own" in lr_col and "fidelity" in lr_col
    gap_col = next(k for k in rows[0] if k.startswith("study's gap"))
    seen = set()
    for row in rows:
        stem = re.search(r"`([a-z0-9-]+)(?:/(\d\d))?\.yaml`", row["config"])
        names = [stem[1]] + ([stem[1][:-2] + stem[2]] if stem[2] else [])
        seen.update(names)
        assert row[lr_col] == " / ".join(f"{study_config(n)['lr']:g}" for n in names), row
        ids = [study_config(n)["study"]["id"] for n in names]
        if not all(i in NUMBERS for i in ids):
            assert row[gap_col] == "not reported"
        elif len(ids) == 2:
            assert row[gap_col] == f"{gap(ids[1], ids[0])} (02 vs 01)"
        elif NUMBERS[ids[0]]["method"] == "baseline":
            assert row[gap_col] == "0 (its baseline)"
        else:
            base = re.search(r"\(vs ([A-Z0-9-]+)\)", row[gap_col])[1]
            assert NUMBERS[base]["method"] == "baseline" and NUMBERS[base]["dataset"] == NUMBERS[ids[0]]["dataset"]
            assert row[gap_col] == f"{gap(ids[0], base)} (vs {base})"
    configs = {p.stem for p in (ROOT / "configs" / "study").glob("*.yaml")} - {"study_numbers"}
    assert seen == configs


def test_every_sweep_row_names_its_lr_protocol() -> None:
    rows = table("spec")
    for row in rows:
        sizes = set()
        for spec in re.findall(r"`([a-z0-9-]+\.yaml)`", row["spec"]):
            for arm in read_yaml(ROOT / "configs" / "sweeps" / spec, "sweep spec")["methods"].values():
                lr = arm.get("lr")
                sizes.add(len(lr) if isinstance(lr, list) else 1)
        if sizes == {1}:
            assert row["LR protocol"] == "fixed: the paper's LR per arm (fidelity)", row
        else:
            n = f"{min(sizes)}" if len(sizes) == 1 else f"{min(sizes)}-{max(sizes)}"
            assert row["LR protocol"] == f"fair: each arm its own grid of {n} LRs", row
