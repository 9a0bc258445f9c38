"""The docs render and stay current: every Markdown file of the repository is checked as GitHub shows it.

- code fences: every fence closes, and no block holds an opening fence (```lang) of its own kind,
  the sign of a block left open above it (the rest of the page would render as code);
- relative links resolve: the file or folder exists inside the repository, and a #anchor names a
  heading (GitHub's slug) or an HTML id of the page it points to;
- every image a page shows (`![..](..)`, `<img src=..>`) is a file in the repository;
- generated blocks are current: docs/methods.md's table of every registered method
  (`python scripts/methods_table.py` rewrites it).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", ".venv-floor", "build", "dist", "node_modules", ".pytest_cache"}
FENCE = re.compile(r"^\s*(?P<ticks>`{3,}|~{3,})(?P<info>.*)$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"(?P<bang>!?)\[(?:[^\[\]]|\[[^\[\]]*\])*\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(?P<target>\S+)")
IMG = re.compile(r"<img\b[^>]*\bsrc=[\"'](?P<target>[^\"']+)[\"']", re.I)
HTML_ID = re.compile(r"<a\b[^>]*\b(?:id|name)=[\"'](?P<id>[^\"']+)[\"']", re.I)
HEADING = re.compile(r"^\s{0,3}(?P<hashes>#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files() -> list[Path]:
    """Every .md file of the repository (virtual environments and build output excluded)."""
    return sorted(
        p for p in REPO.rglob("*.md") if not SKIP_DIRS & set(p.relative_to(REPO).parts) and "egg-info" not in str(p)
    )


def fence_problems(lines: list[str]) -> tuple[list[str], list[bool]]:
    """(problems with line numbers, for each line whether it is inside or on a fence)."""
    problems, in_code = [], [False] * len(lines)
    opened: tuple[int, str, int] | None = None  # line, fence character, fence length
    for i, line in enumerate(lines):
        fence = FENCE.match(line)
        if opened is None:
            if fence and not (fence["ticks"][0] == "`" and "`" in fence["info"]):  # "```a```" is inline code
                opened = (i + 1, fence["ticks"][0], len(fence["ticks"]))
                in_code[i] = True
            continue
        in_code[i] = True
        if fence and fence["ticks"][0] == opened[1] and len(fence["ticks"]) >= opened[2]:
            if not fence["info"].strip():
                opened = None
            else:
                problems.append(
                    f"line {i + 1}: an opening fence ({line.strip()}) inside the code block opened at line "
                    f"{opened[0]}: that block is not closed before it"
                )
    if opened is not None:
        problems.append(f"line {opened[0]}: this code block is never closed")
    return problems, in_code


def prose(path: Path, inline_code: bool = False) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside code blocks, inline code removed unless asked."""
    lines = path.read_text(encoding="utf-8").splitlines()
    _, in_code = fence_problems(lines)
    keep = (lambda line: line) if inline_code else (lambda line: INLINE_CODE.sub("", line))
    return [(i + 1, keep(line)) for i, line in enumerate(lines) if not in_code[i]]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|__|\*|_)(.+?)\1", r"\2", text)  # emphasis markers
    kept = "".join(c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a page defines: its headings' slugs (repeats numbered as GitHub does) and HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, text in prose(path, inline_code=True):  # a heading's code is part of its anchor
        if heading := HEADING.match(text):
            base = slug(heading["text"])
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found |= {m["id"] for m in HTML_ID.finditer(text)}
    return found


def link_problems(path: Path) -> list[str]:
    """Relative links that point nowhere, anchors no heading has, and images not in the repository."""
    problems = []
    for number, text in prose(path):
        targets = [(m["target"].strip("<>"), bool(m["bang"])) for m in LINK.finditer(text)]
        targets += [(m["target"], True) for m in IMG.finditer(text)]
        targets += [(m["target"], False) for m in [REFERENCE.match(text)] if m]
        for target, image in targets:
            if SCHEME.match(target) or target.startswith("//"):
                continue  # a web address: not checked offline
            where, _, anchor = unquote(target).partition("#")
            dest = (path.parent / where).resolve() if where else path
            what = "image" if image else "link"
            if REPO not in (dest, *dest.parents):
                problems.append(f"line {number}: {what} {target!r} leaves the repository")
            elif not dest.exists():
                problems.append(f"line {number}: {what} {target!r}: {dest.relative_to(REPO)} does not exist")
            elif image and not dest.is_file():
                problems.append(f"line {number}: image {target!r} is not a file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"line {number}: link {target!r}: no heading or id #{anchor} in {dest.name}")
    return problems


FILES = markdown_files()


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(REPO).as_posix() for p in FILES])
def test_markdown_renders_with_links_anchors_and_images_that_exist(path: Path) -> None:
    fences, _ = fence_problems(path.read_text(encoding="utf-8").splitlines())
    problems = fences + link_problems(path)
    assert not problems, f"{path.relative_to(REPO)}:\n  " + "\n  ".join(problems)


def test_the_checks_catch_what_they_promise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unclosed block, a block swallowing the next one, a dead file, anchor or image are named."""
    lines = ["# Title", "```python", "x = 1", "", "```bash", "echo", "```", "text", "````", "```py", "````"]
    problems, in_code = fence_problems(lines)
    assert problems == [
        "line 5: an opening fence (```bash) inside the code block opened at line 2: that block is not closed before it"
    ]
    assert in_code == [False, True, True, True, True, True, True, False, True, True, True]
    assert fence_problems(["```", "a"])[0] == ["line 1: this code block is never closed"]
    assert fence_problems(["```a``` is inline", "text"])[0] == []

    assert slug("The study's `gpt-01` run: [results](x.md) & more") == "the-studys-gpt-01-run-results--more"
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "img.png").write_bytes(b"png")
    (tmp_path / "other.md").write_text('## A heading\n## A heading\n<a id="kept"></a>\n', encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-heading) [ok](other.md#a-heading-1) [ok](other.md#kept) [ok](#top) ![ok](img.png)\n"
        '# Top\n[dead](gone.md) [anchor](other.md#nope) ![missing](fig.png) <img src="no.png">\n'
        "`[code](not-checked.md)` [web](https://example.org/x) [out](../outside.md)\n"
        "```\n[in a block](ignored.md)\n```\n",
        encoding="utf-8",
    )
    assert link_problems(page) == [
        "line 3: link 'gone.md': gone.md does not exist",
        "line 3: link 'other.md#nope': no heading or id #nope in other.md",
        "line 3: image 'fig.png': fig.png does not exist",
        "line 3: image 'no.png': no.png does not exist",
        "line 4: link '../outside.md' leaves the repository",
    ]


def methods_table():
    """scripts/methods_table.py as a module."""
    spec = importlib.util.spec_from_file_location("methods_table", REPO / "scripts" / "methods_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_methods_page_lists_every_registered_method() -> None:
    import oelm

    script = methods_table()
    text = (REPO / "docs" / "methods.md").read_text(encoding="utf-8")
    assert script.refresh(text) == text, "docs/methods.md's methods table is stale: run python scripts/methods_table.py"
    block = text[text.index(script.OPEN) : text.index(script.CLOSE)]
    for method in oelm.list_methods():
        assert f"| `{method.name}` |" in block, f"{method.name} is registered but not in docs/methods.md's table"
