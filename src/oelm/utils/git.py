"""Read-only questions to git (through its command line): which repository holds a folder, which
committed files hold a string, and the commit that first held it. Nothing here writes to a repository.

Every function answers None or an empty list where git is missing or the folder is in no repository.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Variables that point git at another repository (set inside hooks): cleared, so a folder's own
# repository answers.
_LOCATING = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")
TIMEOUT_S = 30


def _git(repo: str | Path, *args: str) -> str | None:
    """git's stdout for `git -C repo ARGS`, or None when git is missing, times out or fails."""
    env = {k: v for k, v in os.environ.items() if k not in _LOCATING}
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=TIMEOUT_S, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def repository_root(folder: str | Path) -> Path | None:
    """The top folder of the git work tree holding `folder` (ignored folders included), or None."""
    folder = Path(folder)
    while not folder.is_dir():  # a folder not written yet: ask from the nearest one that exists
        if folder.parent == folder:
            return None
        folder = folder.parent
    out = _git(folder, "rev-parse", "--show-toplevel")
    return Path(out.strip()) if out and out.strip() else None


def committed_files_with(repo: str | Path, text: str, pathspec: str = "*") -> list[str]:
    """Paths (relative to the repository) of the files in HEAD's tree whose content holds `text`."""
    out = _git(repo, "grep", "-l", "-F", "-e", text, "HEAD", "--", pathspec)
    return [line.split(":", 1)[1] for line in (out or "").splitlines() if ":" in line]


def show(repo: str | Path, rev: str, path: str) -> str | None:
    """The content of `path` at commit `rev`, or None."""
    return _git(repo, "show", f"{rev}:{path}")


def first_commit_with(repo: str | Path, text: str, path: str) -> tuple[str, str] | None:
    """(hash, committer date in ISO 8601) of the oldest commit of HEAD's history that changed how
    often `text` occurs in `path` (where it was added), or None."""
    out = _git(repo, "log", "--format=%H %cI", "-S", text, "HEAD", "--", path)
    lines = (out or "").split()
    return (lines[-2], lines[-1]) if len(lines) >= 2 else None
