"""Regenerate every stored result page under docs/results/ from its committed run records.

docs/results/pages.yaml lists each page with the `oelm report` / `oelm leaderboard` command that
builds it from a folder of compact run records (oelm.records.compact); the generated blocks of
README.md and docs/results/README.md are then refreshed by scripts/results_tables.py.

    python scripts/regenerate_results.py            # rewrite the pages in place
    python scripts/regenerate_results.py --check    # rebuild in a scratch copy; exit 1 naming what differs

Markdown and JSON are compared byte for byte; figures (PNG) are rebuilt but not compared (their
bytes depend on the matplotlib version, not on the numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import importlib.util
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

from oelm.cli import main as oelm
from oelm.utils.io import load_yaml_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("docs/results")  # relative to the repository root: commands embed these paths
MANIFEST = RESULTS / "pages.yaml"
COMPARED = (".md", ".json")
GENERATED = (RESULTS, Path("docs/examples"))  # where pages live (README.md is compared too)


def pages(root: Path) -> list[dict]:
    """The manifest's entries."""
    # The manifest is a list, which read_yaml (mappings only) refuses: the strict loader on its text.
    entries = load_yaml_text((root / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(entries, list):
        raise SystemExit(f"{MANIFEST} must be a list of pages")
    return entries


def command(page: dict) -> list[str]:
    """The oelm command line of one page (paths relative to the repository root)."""
    out = os.path.normpath(RESULTS / page["out"])
    records = page["records"] if isinstance(page["records"], list) else [page["records"]]  # ladder: one per rung
    return [
        *page["command"].split(),  # "confirm report": a subcommand's step
        *((RESULTS / r).as_posix() for r in records),
        "--out",
        Path(out).as_posix(),
        *page.get("args", []),
    ]


def regenerate(root: Path, quiet: bool = True, only: set[str] | None = None) -> None:
    """Run every page's command (or those whose `out` is in `only`) with `root` as the working directory."""
    here = Path.cwd()
    os.chdir(root)
    try:
        for page in pages(root):
            if only is not None and page["out"] not in only:
                continue
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
                code = oelm(command(page))
            if code != 0:
                raise SystemExit(f"`oelm {' '.join(command(page))}` exited {code}")
        spec = importlib.util.spec_from_file_location("results_tables", root / "scripts" / "results_tables.py")
        tables = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = tables  # dataclasses look their module up while the file runs
        spec.loader.exec_module(tables)
        with contextlib.redirect_stdout(io.StringIO()):
            tables.main([])
    finally:
        os.chdir(here)


def differences(a: Path, b: Path) -> list[str]:
    """Markdown / JSON files the regeneration writes (docs/results, docs/examples, README.md) that
    differ between two trees."""
    out = []
    names: set[Path] = set()
    for tree in (a, b):
        for folder in GENERATED:
            names |= {p.relative_to(tree) for p in (tree / folder).rglob("*") if p.suffix in COMPARED}
    names |= {Path("README.md")}
    for name in sorted(names):
        x, y = a / name, b / name
        if not (x.is_file() and y.is_file() and filecmp.cmp(x, y, shallow=False)):
            out.append(name.as_posix())
    return out


def check(root: Path = ROOT, only: set[str] | None = None) -> list[str]:
    """Rebuild every page (or those in `only`) in a scratch copy of the tree; the files that differ
    from the committed ones."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        for part in ("docs", "scripts", "configs"):
            shutil.copytree(root / part, copy / part)
        shutil.copy2(root / "README.md", copy / "README.md")
        regenerate(copy, only=only)
        return differences(root, copy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="rebuild in a scratch copy and report what differs")
    p.add_argument("--only", nargs="+", metavar="OUT", help="only these pages (their `out` in pages.yaml)")
    args = p.parse_args(argv)
    only = set(args.only) if args.only else None
    if args.check:
        diff = check(only=only)
        for name in diff:
            print(f"differs from its records: {name}")
        print("every page regenerates from its records" if not diff else f"{len(diff)} file(s) differ")
        return 1 if diff else 0
    regenerate(ROOT, quiet=False, only=only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
