"""One JSON format for every comparison page (issue 50): each stored page's JSON is the same
envelope (format, version, view, command, rows, sections), its rows one per arm against its control,
built from what the page stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.reports.comparison import FORMAT, POINTS, VERSION, comparison_rows, page_json, page_sections, read_page
from oelm.utils.errors import UserError
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


ENVELOPE = ["format", "version", "view", "command", "rows", "sections"]


@pytest.mark.parametrize(("view", "path"), _pages(), ids=lambda v: str(v).replace(str(RESULTS), ""))
def test_every_stored_page_is_the_one_envelope(view: str, path: Path) -> None:
    data = read_page(path, view)
    assert list(data) == ENVELOPE and (data["format"], data["version"], data["view"]) == (FORMAT, VERSION, view)
    assert data["command"] is None or data["command"].startswith("oelm ")
    sections = data["sections"]
    compared = [t.get("comparisons") for t in sections.get("tables", sections.get("groups", []))]
    assert data["rows"] or (compared and not any(compared)), f"{path}: no arm against a control"
    for row in data["rows"]:
        assert list(row)[: len(KEYS)] == KEYS
        assert row["arm"] != row["control"]
        if row["low"] is not None and row["gap"] is not None:
            assert row["low"] <= row["gap"] <= row["high"], row
    # the rows are what the page's sections say, nothing else
    assert data["rows"] == comparison_rows(view, sections)


def test_a_page_json_lifts_its_command_and_keeps_every_other_key_in_sections() -> None:
    page = page_json("finetune", {"command": "oelm report --view finetune x", "boards": []})
    assert list(page) == ENVELOPE
    assert (page["command"], page["rows"], page["sections"]) == ("oelm report --view finetune x", [], {"boards": []})
    assert page_json("report", {"groups": []})["command"] is None  # written by a run, not a command


def test_an_older_or_foreign_page_is_refused_in_one_line(tmp_path: Path) -> None:
    old = tmp_path / "report.json"
    old.write_text(json.dumps({"groups": [], "comparison": {"format": FORMAT, "version": 1}}))
    with pytest.raises(UserError, match="not an 'oelm comparison' page of version 2 .*found None version None.*rerun"):
        page_sections(old)
    old.write_text("{")
    with pytest.raises(UserError, match="not a readable page JSON"):
        read_page(old)
    old.write_text(json.dumps(page_json("ladder", {"steps": []})))
    with pytest.raises(UserError, match="a 'ladder' page, not a 'board' page"):
        read_page(old, "board")


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
    (row,) = comparison_rows("finetune", data)
    assert (row["arm"], row["control"], row["unit"], row["seeds"]) == ("freeze-qk", "baseline", POINTS, 3)
    assert (row["gap"], row["low"], row["high"]) == (1.5, 1.0, 2.0)  # + = the arm is worse


def test_a_report_row_is_the_arms_paired_gap_not_the_gap_of_means() -> None:
    page = read_page(RESULTS / "quickstart" / "report.json", "report")
    group = page["sections"]["groups"][0]
    arm = next(a for a in group["arms"] if a["method"] != group["reference"])
    row = next(r for r in page["rows"] if r["arm"] == arm["method"])
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
