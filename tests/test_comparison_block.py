"""One JSON format for every comparison page (issue 50): each stored page's JSON carries the same
`comparison` block, one row per arm against its control, built from what the page stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.reports.comparison import FORMAT, POINTS, comparison_block
from oelm.utils.io import load_yaml_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
KEYS = ["table", "arm", "control", "metric", "unit", "seeds", "lr", "gap", "low", "high", "holm_p", "verdict"]
JSON_OF = {
    "report": "report.json",
    "board": "leaderboard.json",
    "finetune": "board.json",
    "ladder": "ladder.json",
    "confirmation": "confirmation.json",
}


def _pages() -> list[tuple[str, Path]]:
    out = []
    for page in load_yaml_text((RESULTS / "pages.yaml").read_text(encoding="utf-8")):
        words = page["command"].split()
        view = words[words.index("--view") + 1] if "--view" in words else "report"
        out.append((view, RESULTS / page["out"] / JSON_OF[view]))
    return out


def test_every_stored_page_is_a_view_of_oelm_report() -> None:
    commands = {page["command"] for page in load_yaml_text((RESULTS / "pages.yaml").read_text(encoding="utf-8"))}
    assert all(c.split()[0] == "report" for c in commands), commands


@pytest.mark.parametrize(("view", "path"), _pages(), ids=lambda v: str(v).replace(str(RESULTS), ""))
def test_every_stored_page_carries_the_one_comparison_block(view: str, path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    block = data["comparison"]
    assert (block["format"], block["version"], block["view"]) == (FORMAT, 1, view)
    compared = [t.get("comparisons") for t in data.get("tables", data.get("groups", []))]
    assert block["rows"] or (compared and not any(compared)), f"{path}: no arm against a control"
    for row in block["rows"]:
        assert list(row)[: len(KEYS)] == KEYS
        assert row["arm"] != row["control"]
        if row["low"] is not None and row["gap"] is not None:
            assert row["low"] <= row["gap"] <= row["high"], row
    # the block is what the page's own keys say, nothing else
    assert block == comparison_block(view, {k: v for k, v in data.items() if k != "comparison"})


def test_the_finetune_rows_sign_a_loss_of_accuracy_as_worse_like_every_other_view() -> None:
    data = {
        "boards": [
            {
                "title": "sst2",
                "reference": "baseline",
                "rows": [
                    {"method": "baseline", "diff": None},
                    {
                        "method": "freeze-qk",
                        "seeds": [0, 1, 2],
                        "lr": 1e-4,
                        "diff": -1.5,
                        "diff_low": -2.0,
                        "diff_high": -1.0,
                        "holm_p": 0.01,
                        "verdict": "worse (resolved)",
                        "family": "primary",
                    },
                ],
            }
        ]
    }
    (row,) = comparison_block("finetune", data)["rows"]
    assert (row["arm"], row["control"], row["unit"], row["seeds"]) == ("freeze-qk", "baseline", POINTS, 3)
    assert (row["gap"], row["low"], row["high"]) == (1.5, 1.0, 2.0)  # + = the arm is worse


def test_a_report_row_is_the_arms_paired_gap_not_the_gap_of_means() -> None:
    data = json.loads((RESULTS / "quickstart" / "report.json").read_text(encoding="utf-8"))
    group = data["groups"][0]
    arm = next(a for a in group["arms"] if a["method"] != group["reference"])
    row = next(r for r in data["comparison"]["rows"] if r["arm"] == arm["method"])
    assert row["gap"] == arm["gap_paired"]["mean"] == arm["mean_seed_gap_percent"]
    assert (row["low"], row["high"]) == (arm["gap_paired"]["ci_low"], arm["gap_paired"]["ci_high"])
    assert row["holm_p"] == arm["decision"]["holm_p"] and row["verdict"] == arm["verdict"]


def test_the_confirmation_view_writes_what_confirm_report_writes(tmp_path: Path) -> None:
    """All five page kinds are views of `oelm report`: `--view confirmation DIR` re-judges a stored
    confirmation exactly as `oelm confirm report DIR` does (the same files, byte for byte)."""
    from oelm.cli import main

    folder = RESULTS / "scale-ladder" / "confirm-gpt-r5" / "records"
    assert main(["report", "--view", "confirmation", str(folder), "--out", str(tmp_path / "view")]) == 0
    assert main(["confirm", "report", str(folder), "--out", str(tmp_path / "confirm")]) == 0
    for name in ("confirmation.md", "confirmation.json"):
        assert (tmp_path / "view" / name).read_bytes() == (tmp_path / "confirm" / name).read_bytes()
    assert main(["report", "--view", "confirmation", str(folder), str(folder)]) == 2
