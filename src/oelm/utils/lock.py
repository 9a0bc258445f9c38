"""A directory lock: one writer per run, sweep or data folder (filelock's flock on DIR/.lock).

The kernel releases the lock when its holder exits, however it dies, so there is no stale lock
to detect. The file itself stays (filelock never unlinks a lock others may be waiting on); while
held it names its holder ("host pid") for the refusal message.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from oelm.utils.errors import UserError

LOCK_NAME = ".lock"


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@contextmanager
def dir_lock(directory: Path, what: str = "sweep", keep_file: bool = True) -> Iterator[Path]:
    """Hold DIR/.lock for the block; refuse with one UserError while another process holds it.

    A directory this lock had to create is removed again when it is left empty (a failed start).
    keep_file=False removes the lock file on release too (a data folder holds only its data); a
    block that replaces the folder by a rename takes the lock file with the old one.
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
    lock = _take(path, what, directory)
    mine = os.stat(path)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):  # the block may have removed or replaced the folder
            if os.path.samestat(os.stat(path), mine):  # never another taker's file in a new folder
                if not keep_file or (created and [p.name for p in directory.iterdir()] == [LOCK_NAME]):
                    path.unlink()  # held: a taker that opened it first sees it unlinked and retries (filelock >= 3.30)
                else:
                    os.truncate(path, 0)  # names no holder between this release and the next take
        lock.release()
        _remove_if_empty(directory, created)


def _take(path: Path, what: str, subject: Path) -> FileLock:
    """Acquire the flock on `path` at once and write "host pid" into it; a UserError naming the
    holder and `subject` while another process holds it."""
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = path.read_text(encoding="utf-8").split() if path.is_file() else []
        who = f" (pid {holder[1]} on {holder[0]})" if len(holder) == 2 else ""
        raise UserError(
            f"another {what}{who} is using {str(subject)!r}; wait for it to finish or choose another --out"
        ) from None
    with contextlib.suppress(OSError):
        path.write_text(f"{socket.gethostname()} {os.getpid()}\n", encoding="utf-8")
    return lock


@contextmanager
def sibling_lock(target: Path, what: str) -> Iterator[Path]:
    """Hold PARENT/.NAME.lock for the block: one writer of a folder that is built beside it and
    renamed into place (an export), so the lock cannot live inside it. The lock file is removed
    again while still held (filelock >= 3.30: a taker that opened it sees it unlinked and retries)."""
    target = Path(target)
    path = target.parent / f".{target.name}{LOCK_NAME}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot create the folder {str(target.parent)!r} ({err.strerror or err}); choose a writable output"
        ) from None
    lock = _take(path, what, target)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        lock.release()


def _remove_if_empty(directory: Path, created: bool) -> None:
    if created:
        with contextlib.suppress(OSError):  # not empty (or gone): keep it
            directory.rmdir()


def clear_stale_temps(folder: Path) -> None:
    """Remove the hidden temp folders (.NAME.tmp-<pid>) that killed writers of `folder` left beside
    it (their pid is gone); a live writer's stays."""
    for stale in folder.parent.glob(f".{folder.name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
