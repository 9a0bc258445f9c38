"""One name per file: a module-level `*_FILE` constant names one file across the whole package,
and one file has one constant (issue 50: RECORD_FILE and AUDIT_FILE each named two files)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import oelm

SRC = Path(oelm.__file__).parent


def _file_constants() -> list[tuple[str, str, str]]:
    """(constant, file name, module) for every module-level `NAME_FILE = "..."` in src/oelm."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if (
                        isinstance(target, ast.Name)
                        and target.id.endswith("_FILE")
                        and isinstance(node.value.value, str)
                    ):
                        out.append((target.id, node.value.value, str(path.relative_to(SRC))))
    return out


def test_each_file_constant_names_one_file_and_each_file_has_one_constant():
    constants = _file_constants()
    assert len(constants) >= 10  # the scan sees the package's constants
    values, names = defaultdict(set), defaultdict(set)
    for name, value, _module in constants:
        values[name].add(value)
        names[value].add(name)
    assert {n: v for n, v in values.items() if len(v) > 1} == {}
    assert {v: n for v, n in names.items() if len(n) > 1} == {}


def test_renamed_constants_name_their_files():
    from oelm.core.record import METHOD_RECORD_FILE
    from oelm.records.artifacts import FREEZE_AUDIT_FILE
    from oelm.records.compact import RUN_RECORD_FILE

    assert (METHOD_RECORD_FILE, RUN_RECORD_FILE, FREEZE_AUDIT_FILE) == (
        "oelm_method.json",
        "record.json",
        "freeze_audit.json",
    )
