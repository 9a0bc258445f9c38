"""A directory lock: one writer per sweep directory, with stale locks (a dead pid) taken over."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oelm.utils.errors import UserError

LOCK_NAME = ".lock"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder(path: Path) -> tuple[str, int] | None:
    """(host, pid) written in a lock file, or None when unreadable (half-written by a killed process)."""
    try:
        host, pid = path.read_text(encoding="utf-8").split()
        return host, int(pid)
    except (OSError, ValueError):
        return None


def _try_create(path: Path) -> bool:
    """Create the lock file with its content in one step (a hard link of a finished temp file), so
    another taker never reads an empty lock; False when it already exists."""
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(f"{socket.gethostname()} {os.getpid()}\n", encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive create, then write
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{socket.gethostname()} {os.getpid()}\n")
        return True
    finally:
        tmp.unlink(missing_ok=True)


UNREADABLE_STALE_S = 10.0  # an unreadable lock younger than this may be one being written


@contextmanager
def dir_lock(directory: Path, what: str = "sweep") -> Iterator[Path]:
    """Hold DIR/.lock for the block; refuse clearly when a live process holds it.

    A directory this lock had to create is removed again when it is left empty (a failed start).
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"output {str(directory)!r} exists and is not a directory; choose another --out")
    if directory.is_symlink() and not directory.exists():
        raise UserError(
            f"output {str(directory)!r} is a symbolic link to {str(directory.readlink())!r}, which does not "
            "exist; create the target folder or choose another --out"
        )
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot create the output folder {str(directory)!r} ({err.strerror or err}); choose a writable --out"
        ) from None
    path = directory / LOCK_NAME
    if not os.access(directory, os.W_OK):
        _remove_if_empty(directory, created)
        raise UserError(
            f"output folder {str(directory)!r} is not writable; choose another --out or fix its permissions"
        )
    for _ in range(3 + int(UNREADABLE_STALE_S / 0.2)):  # a stale lock is removed once; racing takers retry
        if _try_create(path):
            break
        holder = _holder(path)
        same_host = holder is not None and holder[0] == socket.gethostname()
        if holder is None and _age(path) < UNREADABLE_STALE_S:  # perhaps still being written: wait
            time.sleep(0.2)
            continue
        if holder is not None and (not same_host or pid_alive(holder[1])):
            _remove_if_empty(directory, created)
            raise UserError(
                f"another {what} (pid {holder[1]} on {holder[0]}) is using {str(directory)!r}; wait for it to "
                f"finish, or if it is gone, delete {str(path)!r}"
            )
        path.unlink(missing_ok=True)  # stale: its process is dead, or the file is unreadable
    else:
        _remove_if_empty(directory, created)
        raise UserError(f"could not take the lock {str(path)!r}; delete it if no {what} is running")
    try:
        yield path
    finally:
        if _holder(path) == (socket.gethostname(), os.getpid()):
            path.unlink(missing_ok=True)
        _remove_if_empty(directory, created)


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _remove_if_empty(directory: Path, created: bool) -> None:
    if created:
        with contextlib.suppress(OSError):  # not empty (or gone): keep it
            directory.rmdir()
