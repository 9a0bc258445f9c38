"""Every Python snippet in README.md and docs/ runs in a fresh interpreter, or says why it does not.

A snippet is a ```python block, or the body of a `python - <<'EOF'` heredoc inside a ```bash block,
in README.md or docs/**/*.md (docs/results/ excluded: its pages are generated). Each runs as a
script in a fresh interpreter, in an empty temporary directory, offline (HF_HUB_OFFLINE=1), on one
thread (OMP_NUM_THREADS, unless set).

The last non-blank line above a block's fence may hold one HTML comment, seen in the Markdown
source and not on the rendered page; words separated by ";":

    <!-- snippet: skip (why) -->   not run: reported as skipped with the reason; its oelm imports
                                   and `oelm.X.Y` names are still resolved
    <!-- snippet: slow -->         runs under the `slow` marker
    <!-- snippet: repo-root -->    runs in the repository root (for repository files)

`../shared/data` resolves from the temporary directory too (a link to the shared data folder), so a
snippet that reads it and writes files needs no `repo-root`.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO / ".." / "shared" / "data"
TIMEOUT_S = 180
DIRECTIVE = re.compile(r"^\s*<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
HEREDOC = re.compile(r"^\s*python3?\s+-\s+<<-?\s*(?P<q>['\"]?)(?P<end>\w+)(?P=q)\s*$")
WORDS = {"skip", "slow", "repo-root"}
# One word, a reason in parentheses (one level of nested parentheses allowed), then ";" or the end.
WORD = re.compile(r"\s*(?P<word>[\w-]+)\s*(?:\((?P<reason>(?:[^()]|\([^()]*\))*)\))?\s*(?:;|$)")


@dataclass(frozen=True)
class Snippet:
    doc: str  # path relative to the repository root
    line: int  # 1-based line of the fence (```python) or of the heredoc's `python - <<` line
    code: str
    skip: str | None = None  # the reason
    slow: bool = False
    repo_root: bool = False
    problem: str | None = None  # a malformed directive: the test fails with it

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_files() -> list[Path]:
    docs = [p for p in sorted((REPO / "docs").rglob("*.md")) if "results" not in p.relative_to(REPO / "docs").parts]
    return [REPO / "README.md", *docs]


def parse_directive(line: str) -> tuple[dict, str | None]:
    """The options of a `<!-- snippet: ... -->` line ({} when it is none) and a problem, if any."""
    match = DIRECTIVE.match(line)
    if not match:
        return {}, None
    options: dict = {}
    body, pos = match["body"], 0
    while pos < len(body):
        word = WORD.match(body, pos)
        if not word or word["word"] not in WORDS:
            return {}, f"unreadable snippet directive {line.strip()!r}; known words: {sorted(WORDS)}"
        if (word["word"] == "skip") != bool(word["reason"] and word["reason"].strip()):
            return {}, f"`skip` and only `skip` takes a reason in parentheses: {line.strip()!r}"
        key = {"skip": "skip", "slow": "slow", "repo-root": "repo_root"}[word["word"]]
        options[key] = word["reason"].strip() if key == "skip" else True
        pos = word.end()
    return options, None


def extract(path: Path, root: Path = REPO) -> list[Snippet]:
    """The Python snippets of one Markdown file, each with the directive above its fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    doc = path.relative_to(root).as_posix()
    found: list[Snippet] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, lang = fence["indent"], fence["ticks"], fence["lang"].lower()
        end = i + 1
        closing = re.compile(rf"\s*{ticks[0]}{{{len(ticks)},}}\s*")  # a closing fence has no info string
        while end < len(lines) and not closing.fullmatch(lines[end]):
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]]
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        options, problem = parse_directive(above)
        if lang in ("python", "py", "python3"):
            found.append(Snippet(doc, i + 1, "\n".join(body) + "\n", problem=problem, **options))
        elif lang in ("bash", "sh", "shell", "console", ""):
            k = 0
            while k < len(body):
                heredoc = HEREDOC.match(body[k])
                if heredoc:
                    stop = next((m for m in range(k + 1, len(body)) if body[m].strip() == heredoc["end"]), len(body))
                    code = "\n".join(body[k + 1 : stop]) + "\n"
                    found.append(Snippet(doc, i + 2 + k, code, problem=problem, **options))
                    k = stop
                k += 1
        i = end + 1
    return found


SNIPPETS = [snippet for path in doc_files() for snippet in extract(path)]


def oelm_names(code: str) -> list[str]:
    """The oelm modules and names a snippet imports, and the `oelm.X.Y` attribute chains it reads."""
    names: list[str] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names if alias.name.split(".")[0] == "oelm"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "oelm":
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "oelm":
                names.append(".".join(["oelm", *reversed(chain)]))
    return list(dict.fromkeys(names))


def resolve(name: str) -> None:
    """Import the longest module prefix of `name`, then read the rest as attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name is None or not ".".join(parts[:cut]).startswith(err.name):
                raise
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return
    raise ModuleNotFoundError(name)


def run_snippet(snippet: Snippet, workdir: Path) -> None:
    script = workdir / f"snippet_{Path(snippet.doc).stem}_{snippet.line}.py"
    script.write_text(snippet.code, encoding="utf-8")
    cwd = REPO if snippet.repo_root else workdir / "cwd"
    cwd.mkdir(exist_ok=True)
    if not snippet.repo_root and SHARED_DATA.is_dir():  # `../shared/data` reads as in the repository root
        (workdir / "shared").symlink_to(SHARED_DATA.parent.resolve(), target_is_directory=True)
    env = {"OMP_NUM_THREADS": "1", **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    # One thread unless asked otherwise: tiny shapes gain nothing from more, and on shared cores
    # torch's spinning threads make a snippet several times slower.
    try:
        done = subprocess.run(
            [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{snippet.id}: still running after {TIMEOUT_S} s; shrink it or mark it `skip (why)`")
    if done.returncode != 0:
        tail = (done.stdout[-2000:] + "\n" + done.stderr[-4000:]).strip()
        pytest.fail(f"{snippet.id} failed (exit {done.returncode}) in {cwd}:\n{tail}", pytrace=False)


@pytest.mark.parametrize("snippet", [pytest.param(s, id=s.id, marks=[pytest.mark.slow] * s.slow) for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path):
    if snippet.problem:
        pytest.fail(f"{snippet.id}: {snippet.problem}", pytrace=False)
    if snippet.skip:
        compile(snippet.code, snippet.id, "exec")  # skipped, but still Python
        for name in oelm_names(snippet.code):
            try:
                resolve(name)
            except (ImportError, AttributeError) as err:
                pytest.fail(f"{snippet.id}: `{name}` does not resolve: {err}", pytrace=False)
        pytest.skip(f"{snippet.id}: {snippet.skip}")
    if "../shared/data" in snippet.code and not SHARED_DATA.is_dir():
        pytest.skip(f"{snippet.id}: offline data folder {SHARED_DATA} not present (see ../shared/data/README.md)")
    run_snippet(snippet, tmp_path)


def test_snippets_are_found_with_their_directives(tmp_path: Path):
    """The extractor sees python blocks, bash heredocs and each directive; a bad directive is named."""
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- snippet: skip (needs the hub) -->\n```python\nimport oelm\n```\n\n"
        "<!-- snippet: slow; repo-root -->\n\n```bash\necho hi\npython - <<'EOF'\nprint(1)\nEOF\n```\n\n"
        "```python\nx = 1\n```\n<!-- snippet: skip -->\n```python\ny = 2\n```\n"
        "  ```python\n  z = 3\n  ```\n",
        encoding="utf-8",
    )
    found = extract(page, root=tmp_path)
    assert [(s.id, s.code, s.skip, s.slow, s.repo_root) for s in found] == [
        ("page.md:4", "import oelm\n", "needs the hub", False, False),
        ("page.md:12", "print(1)\n", None, True, True),
        ("page.md:17", "x = 1\n", None, False, False),
        ("page.md:21", "y = 2\n", None, False, False),
        ("page.md:24", "z = 3\n", None, False, False),
    ]
    assert "takes a reason" in found[3].problem
    assert parse_directive("<!-- snippet: skip (a; b (c)); slow -->") == ({"skip": "a; b (c)", "slow": True}, None)
    assert "unreadable" in parse_directive("<!-- snippet: skipp (x) -->")[1]
    assert SNIPPETS, "no snippet found in README.md and docs/"


def test_every_directive_sits_above_a_fence():
    """A `<!-- snippet: ... -->` line that no fence follows would apply to nothing: refuse it."""
    stray = []
    for path in doc_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if DIRECTIVE.match(line):
                after = next((text for text in lines[i + 1 :] if text.strip()), "")
                if not FENCE.match(after):
                    stray.append(f"{path.relative_to(REPO).as_posix()}:{i + 1}")
    assert not stray, f"snippet directives with no fence below them: {stray}"


def test_public_api_loads_lazily_in_one_home():
    """`import oelm` imports no torch; every public name and subpackage loads on first use."""
    code = (
        "import sys\nimport oelm\n"
        "assert 'torch' not in sys.modules, 'import oelm pulled in torch'\n"
        "assert set(oelm.__all__) <= set(dir(oelm)) and 'core' in dir(oelm)\n"
        "assert oelm.core.freezing.optimizer_groups is oelm.optimizer_groups\n"
        "for name in oelm.__all__:\n"
        "    assert getattr(oelm, name).__module__ == oelm._LAZY[name], (name, oelm._LAZY[name])\n"
        "print(' '.join(f'{n}={getattr(oelm, n).__module__}' for n in oelm.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    homes = dict(pair.split("=") for pair in done.stdout.split())
    exported = {}  # module -> its __all__
    for path in (REPO / "src" / "oelm").rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                module = path.relative_to(REPO / "src").with_suffix("").as_posix().replace("/", ".")
                if module != "oelm.__init__":  # oelm's own __all__ is built from its table of homes
                    exported[module.removesuffix(".__init__")] = set(ast.literal_eval(node.value))
    for name, home in homes.items():  # one home: the module defining it; only `oelm` itself re-exports
        others = sorted(m for m, names in exported.items() if name in names and m not in (home, "oelm"))
        assert not others, f"{name} (defined in {home}) is also exported by {others}"
