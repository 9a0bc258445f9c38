"""Regenerate every stored result page under docs/results/ from its committed run records.

docs/results/pages.yaml lists each page with the `oelm report` / `oelm report --view board` command that
builds it from a folder of compact run records (oelm.records.compact); the generated blocks of
README.md and docs/results/README.md are then refreshed by scripts/results_tables.py.

    python scripts/regenerate_results.py            # rewrite the pages in place
    python scripts/regenerate_results.py --check    # rebuild in a scratch copy; exit 1 naming what differs

Markdown and JSON are compared strictly in everything but the last bits of their numbers: keys,
counts, text and verdicts must be equal; a JSON number may differ by a relative 1e-9 (or, where it was stored rounded to 4-8 significant
digits, by one unit in its last digit) and a decimal
printed in Markdown by one unit in its last printed digit (a signed integer, a gap printed "+13", too;
unsigned integers, counts and seeds, stay exact). A float that comes from a fit, a sum
or BLAS moves in its last bits from one CPU to another (1e-15 relative seen on an AMD EPYC), and
that is not a stale page; an edited record moves far more. Figures (PNG) are rebuilt but not
compared (their bytes depend on the matplotlib version, not on the numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import importlib.util
import io
import json
import math
import os
import re
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
JSON_REL_TOL = 1e-9  # far above a CPU's last-bit drift (~1e-15), far below any figure a page shows
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


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


def check_only(root: Path, only: set[str] | None) -> None:
    """Refuse page names the manifest does not list: a mistyped one would rebuild nothing and
    `--check` would say every page regenerates."""
    known = [str(page["out"]) for page in pages(root)]
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise SystemExit(
            f"--only: no page {', '.join(map(repr, unknown))} in {MANIFEST}; pages: {', '.join(sorted(known))}"
        )


def regenerate(root: Path, quiet: bool = True, only: set[str] | None = None) -> None:
    """Run every page's command (or those whose `out` is in `only`) with `root` as the working directory."""
    check_only(root, only)
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


def _same_json(x: object, y: object) -> bool:
    """Equal JSON values: the same keys, lengths, strings and booleans; numbers within JSON_REL_TOL."""
    if isinstance(x, bool) or isinstance(y, bool) or x is None or y is None or isinstance(x, str):
        return x == y
    if isinstance(x, int | float) and isinstance(y, int | float):
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        if math.isclose(x, y, rel_tol=JSON_REL_TOL, abs_tol=1e-300):
            return True
        # A number stored rounded (a fit's 4 significant digits) may move one unit in its last digit.
        unit = min(_stored_unit(x), _stored_unit(y))  # both sides rounded: the same stored precision
        return unit > 0 and abs(x - y) <= unit * 1.0000001
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same_json(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same_json(u, v) for u, v in zip(x, y, strict=True))
    return False


def _stored_unit(v: float) -> float:
    """One unit in the last digit of a number stored rounded (2 to 8 significant digits), else 0.

    Trailing zeros do not show in a float (1230.0 may be 4 digits): the digits shown count, and
    `_same_json` takes the finer unit of the two sides, so 1230.0 against 1232.0 is two units.
    """
    if isinstance(v, int) or not math.isfinite(v) or v == 0:
        return 0.0
    digits = len(repr(float(v)).partition("e")[0].replace(".", "").replace("-", "").strip("0"))
    if digits > 8:
        return 0.0
    return 10.0 ** (math.floor(math.log10(abs(v))) - max(digits, 2) + 1)


def _last_digit_unit(token: str) -> float:
    """One unit in the last printed digit of a number as it appears in a page ("1.407" -> 0.001)."""
    mantissa, _, exponent = token.replace(",", "").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _same_text(x: str, y: str) -> bool:
    """Equal pages but for printed decimals and signed integers (a gap printed "+13"), each of which
    may move by one unit in its last digit (a last-bit change that falls on a rounding boundary);
    the words, the layout, every unsigned integer (counts, seeds, hashes) and the count and format
    of every number must match."""
    if x == y:
        return True
    if _NUMBER.split(x) != _NUMBER.split(y):
        return False
    a, b = _NUMBER.findall(x), _NUMBER.findall(y)
    if len(a) != len(b):
        return False
    for u, v in zip(a, b, strict=True):
        if u == v:
            continue
        if not re.search(r"[.eE]", u) and not (u[0] in "+-" and v[0] in "+-"):
            return False  # an unsigned integer is a count, a seed or part of a hash: exact
        unit = _last_digit_unit(u)
        if unit != _last_digit_unit(v):
            return False
        if abs(float(u.replace(",", "")) - float(v.replace(",", ""))) > unit * 1.0000001:
            return False
    return True


def same_content(x: Path, y: Path) -> bool:
    """Whether two generated files say the same thing (see the module's docstring for the tolerance)."""
    if filecmp.cmp(x, y, shallow=False):
        return True
    a, b = x.read_text(encoding="utf-8"), y.read_text(encoding="utf-8")
    if x.suffix == ".json":
        try:
            return _same_json(json.loads(a), json.loads(b))
        except json.JSONDecodeError:
            return False
    return _same_text(a, b)


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
        if not (x.is_file() and y.is_file() and same_content(x, y)):
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
    check_only(ROOT, only)  # before the scratch copy: a mistyped page is refused, not "regenerated"
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
