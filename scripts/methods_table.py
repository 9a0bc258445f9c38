"""Rewrite docs/methods.md's table of every registered method from the registry (oelm.list_methods()).

    python scripts/methods_table.py            # rewrite the table in place
    python scripts/methods_table.py --check    # exit 1 if it is not current

The table sits between OPEN and CLOSE; tests/test_docs_check.py fails while it is stale, so a
method added to `src/oelm/core/methods.py` shows up on the page by running this script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import oelm
from oelm.utils.io import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "methods.md"
OPEN = "<!-- generated: methods (python scripts/methods_table.py; do not edit by hand) -->"
CLOSE = "<!-- /generated -->"


def table() -> str:
    """One row per registered method, in registration order: what it freezes or tunes, its summary."""
    rows = ["| method | frozen roles / tuned | what it is |", "|---|---|---|"]
    for m in oelm.list_methods():
        what = f"tunes: {m.tune}" if m.tune else (", ".join(r for r in ("q", "k", "v", "o", "ffn") if r in m.freeze))
        rows.append(f"| `{m.name}` | {what or '—'} | {m.summary.replace('|', '/')} |")
    return "\n".join(rows)


def refresh(text: str) -> str:
    """The page's text with the generated block rewritten (the block must be there once)."""
    if text.count(OPEN) != 1 or text.count(CLOSE) < 1:
        raise SystemExit(f"{PAGE.name} must hold one {OPEN!r} block closed by {CLOSE!r}")
    head, rest = text.split(OPEN, 1)
    _, tail = rest.split(CLOSE, 1)
    return f"{head}{OPEN}\n{table()}\n{CLOSE}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the table is not current")
    args = p.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8")
    new = refresh(text)
    if args.check:
        print("docs/methods.md's table is current" if new == text else "docs/methods.md's table is stale")
        return 0 if new == text else 1
    if new != text:
        atomic_write_text(PAGE, new)
    print(f"{PAGE.relative_to(ROOT).as_posix()}: {len(oelm.list_methods())} methods")
    return 0


if __name__ == "__main__":
    sys.exit(main())
