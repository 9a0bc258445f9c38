"""One JSON format for every comparison page: the page envelope.

Every page the toolkit writes compares arms with a control (report.json, leaderboard.json,
board.json, ladder.json, confirmation.json), and every one of them is written as this one envelope,
the same top-level keys whatever the view:

    {"format": "oelm comparison", "version": 2, "view": "board", "command": "oelm report ...",
     "rows": [{"table", "arm", "control", "metric", "unit", "seeds", "lr",
               "gap", "low", "high", "holm_p", "verdict", "family", "params", "tokens_per_param"}],
     "sections": {...}}

`rows` is one row per arm against its control, in one shape, built by one function from what the
page stored, so a reader (or a script) meets one format for "this arm against that control" whatever
page it opens. `gap` is signed so that + means the arm is worse; `low`/`high` are its paired 95%
interval; `unit` says what the gap is measured in (per-seed % of the control's metric, or accuracy
points). `sections` holds what the data switched on for this view (LR sweeps, ranks, costs, fits,
a pilot's claims): the numbers the markdown page prints. `command` is the command that wrote the
page (null where it was written by a run, not by a command). `read_page` reads one back, refusing a
file that is not this format and version.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oelm.utils.errors import UserError
from oelm.utils.io import clean_json

FORMAT = "oelm comparison"
VERSION = 2
PERCENT = "% of the control's metric (mean per-seed gap, + = worse)"
POINTS = "accuracy points (control - arm, + = worse)"


def _row(table: str, arm: str, control: str, metric: str, unit: str, **fields: Any) -> dict:
    """One row, every key present (None where the page has no such number)."""
    row = {"table": table, "arm": arm, "control": control, "metric": metric, "unit": unit}
    for key in ("seeds", "lr", "gap", "low", "high", "holm_p", "verdict", "family", "params", "tokens_per_param"):
        row[key] = fields.get(key)
    return row


def _paired(arm: dict) -> dict:
    """gap/low/high/holm_p/seeds of an arm as report.json and leaderboard.json store it."""
    paired = arm.get("gap_paired") or {}
    decision = arm.get("decision") or {}
    return {
        "gap": paired.get("mean", arm.get("mean_seed_gap_percent")),
        "low": paired.get("ci_low"),
        "high": paired.get("ci_high"),
        "holm_p": decision.get("holm_p"),
        "seeds": paired.get("n") or (arm.get("primary") or {}).get("n"),
        "family": decision.get("family") or None,
    }


def _table(group: dict) -> str:
    return f"{group.get('dataset')} ({group.get('task')}, {group.get('model')})"


def _arm_rows(data: dict, tables: str, arms: str) -> Iterator[dict]:
    """Rows of report.json (`groups`/`arms`) and leaderboard.json (`tables`/`ranked`): one shape."""
    for table in data.get(tables, []):
        for arm in table.get(arms, []):
            if arm.get("method") == table.get("reference"):
                continue
            yield _row(
                _table(table),
                arm["method"],
                table.get("reference"),
                table.get("primary_metric"),
                PERCENT,
                lr=arm.get("lr"),
                verdict=arm.get("verdict"),
                params=arm.get("trainable_params"),
                **_paired(arm),
            )


def _report_rows(data: dict) -> Iterator[dict]:
    return _arm_rows(data, "groups", "arms")


def _board_rows(data: dict) -> Iterator[dict]:
    return _arm_rows(data, "tables", "ranked")


def _finetune_rows(data: dict) -> Iterator[dict]:
    for board in data.get("boards", []):
        for row in [*board.get("rows", []), *board.get("exploratory", [])]:
            if row.get("method") == board.get("reference"):
                continue
            diff = row.get("diff")  # arm - reference in points: + = better; the block signs + = worse
            yield _row(
                board.get("title"),
                row["method"],
                board.get("reference"),
                "test accuracy",
                POINTS,
                seeds=len(row.get("seeds") or []),
                lr=row.get("lr"),
                gap=None if diff is None else -diff,
                low=None if row.get("diff_high") is None else -row["diff_high"],
                high=None if row.get("diff_low") is None else -row["diff_low"],
                holm_p=row.get("holm_p"),
                verdict=row.get("verdict"),
                family=row.get("family"),
                params=row.get("trainable_params"),
            )


def _ladder_rows(data: dict) -> Iterator[dict]:
    for step in data.get("steps", []):
        params, budget = step.get("params"), step.get("budget")
        size = "" if params is None else f", {params:,} parameters"
        data_size = "" if budget is None else f", {budget:g} tokens per parameter"
        yield _row(
            f"{step.get('architecture')} ({step.get('model')}){size}{data_size}",
            step["method"],
            step.get("twin"),
            "test loss",
            PERCENT,
            seeds=step.get("n"),
            lr=step.get("lr"),
            gap=step.get("gap"),
            low=step.get("ci_low"),
            high=step.get("ci_high"),
            verdict=step.get("verdict"),
            params=step.get("params"),
            tokens_per_param=step.get("budget"),
        )


def _confirmation_rows(data: dict) -> Iterator[dict]:
    for claim in data.get("claims", []):
        fresh = claim.get("fresh") or {}
        row = _paired(fresh)
        row["seeds"] = len(fresh.get("seeds") or []) or row["seeds"]
        yield _row(
            "fresh seeds",
            claim["method"],
            data.get("reference"),
            (claim.get("claim") or {}).get("metric") or "primary metric",
            PERCENT,
            lr=claim.get("lr"),
            verdict=fresh.get("verdict"),
            **row,
        )


VIEWS = {
    "report": _report_rows,
    "board": _board_rows,
    "finetune": _finetune_rows,
    "ladder": _ladder_rows,
    "confirmation": _confirmation_rows,
}


def comparison_rows(view: str, sections: dict) -> list[dict]:
    """The envelope's `rows` (`sections`: what the page stores, as JSON)."""
    return list(VIEWS[view](sections))


def page_json(view: str, data: dict) -> dict:
    """`data` (a page's sections, and its `command` if it has one) as the one page envelope."""
    sections = json.loads(json.dumps(clean_json(data), default=str))
    command = sections.pop("command", None)
    return {
        "format": FORMAT,
        "version": VERSION,
        "view": view,
        "command": command,
        "rows": comparison_rows(view, sections),
        "sections": sections,
    }


def read_page(path: str | Path, view: str | None = None) -> dict:
    """A page's JSON envelope as written by `page_json`; an older or foreign file is refused in one line."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable page JSON ({e}); rerun the command that wrote it") from e
    found = (data.get("format"), data.get("version")) if isinstance(data, dict) else (None, None)
    if found != (FORMAT, VERSION):
        raise UserError(
            f"{path}: not an {FORMAT!r} page of version {VERSION} (found {found[0]!r} version {found[1]!r}); "
            "rerun the command that wrote it (stored pages: python scripts/regenerate_results.py)"
        )
    if view is not None and data.get("view") != view:
        raise UserError(f"{path}: a {data.get('view')!r} page, not a {view!r} page; pass the {view} page's JSON")
    return data


def page_sections(path: str | Path, view: str | None = None) -> dict:
    """The `sections` of a page's JSON envelope (see `read_page`)."""
    return read_page(path, view)["sections"]
