"""Hugging Face hub names, offline first: a cached name works offline; an unreachable one fails fast.

Without this check, `datasets` and `transformers` retry an unreachable hub for 10-60 s before
their own (long) error. Here a quick connection test (or the user's offline setting) decides in
well under two seconds, and the error names the fix. Endpoint and cache folders are huggingface_hub's
constants (read at its import, as the libraries read them); the offline variables, at each call.
"""

from __future__ import annotations

import os
import socket
import sys
from functools import cache
from pathlib import Path
from urllib.parse import urlparse

from oelm.utils.errors import UserError

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def offline_requested() -> bool:
    """Whether the user set one of the Hugging Face offline variables."""
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"} for v in _OFFLINE_VARS)


@cache
def hub_reachable(timeout_s: float = 1.5) -> bool:
    """One TCP connection to huggingface_hub's endpoint (HF_ENDPOINT), cached for the process."""
    from huggingface_hub import constants  # heavy optional dependency: imported on use

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def in_cache(name: str, repo_type: str = "model") -> bool:
    """Whether the local Hugging Face caches hold a snapshot of this repo id."""
    from huggingface_hub import constants  # heavy optional dependency: imported on use
    from huggingface_hub.file_download import repo_folder_name  # heavy optional dependency: imported on use

    if (Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type=repo_type) / "snapshots").is_dir():
        return True
    if repo_type == "dataset":  # datasets also keeps prepared Arrow files in its own cache
        root = Path(os.environ.get("HF_DATASETS_CACHE", Path(constants.HF_HOME) / "datasets"))
        return (root / name.replace("/", "___")).is_dir()
    return False


def go_offline() -> None:
    """Make huggingface_hub, transformers and datasets use the cache only (no retries)."""
    for var in _OFFLINE_VARS:
        os.environ[var] = "1"
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True
    ds = sys.modules.get("datasets.config")
    if ds is not None:
        ds.HF_HUB_OFFLINE = True
        if hasattr(ds, "HF_DATASETS_OFFLINE"):
            ds.HF_DATASETS_OFFLINE = True


def require_hub(name: str, repo_type: str, fix: str) -> None:
    """Return when `name` can be loaded (reachable hub, or cached); else one clear UserError, fast."""
    if offline_requested():
        if in_cache(name, repo_type):
            return
        raise UserError(
            f"Hugging Face {repo_type} {name!r} is not in the local cache and offline mode is set "
            f"(HF_HUB_OFFLINE); {fix}, or unset HF_HUB_OFFLINE with a network to download it"
        )
    if hub_reachable():
        return
    if in_cache(name, repo_type):
        go_offline()  # the cached copy, without the libraries' retries
        return
    raise UserError(
        f"Hugging Face {repo_type} {name!r} needs the hub, which is not reachable (no network) and "
        f"the name is not in the local cache; {fix}"
    )
