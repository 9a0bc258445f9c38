"""Shared fixtures: tiny models of every supported family, the offline data folder, benchmark scripts."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


@pytest.fixture
def load_benchmark():
    """load_benchmark("vs_reference"): the module benchmarks.vs_reference (the repository root is on
    pytest's pythonpath, as it is on sys.path for `python -m benchmarks.vs_reference`)."""
    return lambda name: importlib.import_module(f"benchmarks.{name}")


def git(repo: Path, *args: str) -> str:
    """git in `repo` with a fixed identity, whatever repository the test itself runs in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= dict.fromkeys(("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"), "tester")
    env |= dict.fromkeys(("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"), "tester@example.org")
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env)
    return done.stdout.strip()


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py imported as a module (scripts/ is not a package; registered in sys.modules,
    where dataclasses look their module up while the file runs)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shared_data() -> Path:
    """The offline datasets beside the repo (../shared/data), or skip."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline data folder {SHARED_DATA} not present (see ../shared/data/README.md)")
    return SHARED_DATA.resolve()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs: a real full disk for fault tests (root with mount rights only, else skipped;
    injected-OSError tests cover the same code everywhere)."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
