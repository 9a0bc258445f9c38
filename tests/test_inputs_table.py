"""docs/inputs.md, the table of every input and its check, cannot rot: every check it names is a
function of that module, every test a test of that file, a Hypothesis row's test draws its inputs
with @given, and every row without a check is listed among the known gaps."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "inputs.md"
COLUMNS = ["#", "input", "must agree with", "check", "test", "generated"]


def rows() -> list[dict[str, str]]:
    """The table rows of docs/inputs.md as {column: cell}."""
    out = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells == COLUMNS or set(cells[0]) <= {"-"}:
            continue
        assert len(cells) == len(COLUMNS), f"docs/inputs.md: a row of {len(cells)} cells: {line}"
        out.append(dict(zip(COLUMNS, cells, strict=True)))
    return out


def ticked(cell: str) -> str:
    return cell.strip("`")


@cache
def definitions(path: Path) -> dict[str, ast.AST]:
    """Top-level functions and classes, and methods as Class.method, of a Python file."""
    found: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"{node.name}.{sub.name}"] = sub
    return found


def module_file(module: str) -> Path | None:
    rel = Path(*module.split("."))
    for path in (
        ROOT / "src" / rel.with_suffix(".py"),
        ROOT / "src" / rel / "__init__.py",
        ROOT / rel.with_suffix(".py"),
    ):
        if path.is_file():
            return path
    return None


def test_the_table_has_rows_numbered_in_order() -> None:
    numbers = [int(r["#"]) for r in rows()]
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(numbers) >= 60


def test_every_named_check_is_a_function_of_its_module() -> None:
    missing = []
    for r in rows():
        check = ticked(r["check"])
        if check == "gap":
            continue
        module, sep, name = check.partition(":")
        path = module_file(module)
        if not sep or path is None or name not in definitions(path):
            missing.append(f"{r['#']}: {check}")
    assert not missing, f"checks named in docs/inputs.md that do not exist: {missing}"


def test_every_named_test_exists_and_a_hypothesis_test_generates() -> None:
    missing = []
    for r in rows():
        if ticked(r["check"]) == "gap":
            assert r["test"] == "-", f"row {r['#']}: a gap names no test"
            continue
        path, sep, name = ticked(r["test"]).partition("::")
        node = definitions(ROOT / path).get(name) if sep and (ROOT / path).is_file() else None
        if node is None or not name.startswith("test_"):
            missing.append(f"{r['#']}: {r['test']}")
            continue
        if r["generated"] == "Hypothesis":
            decorators = [ast.unparse(d) for d in node.decorator_list]
            assert any(d.startswith("given") for d in decorators), f"row {r['#']}: {name} has no @given"
        assert r["generated"] in ("Hypothesis", "sampled", "-"), f"row {r['#']}: generated {r['generated']!r}"
    assert not missing, f"tests named in docs/inputs.md that do not exist: {missing}"


def test_every_gap_is_listed_among_the_known_gaps() -> None:
    text = PAGE.read_text(encoding="utf-8")
    listed = {int(n) for n in re.findall(r"^- (\d+):", text.split("## Known gaps", 1)[1], re.M)}
    gaps = {int(r["#"]) for r in rows() if ticked(r["check"]) == "gap"}
    assert listed == gaps, f"gap rows {sorted(gaps)}, listed {sorted(listed)}"
