"""Small file I/O used everywhere: JSON/YAML reads with clear errors, atomic writes."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from oelm.utils.errors import UserError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes through a temp file + fsync + os.replace: readers never see half a file.

    A failed write (full disk, read-only file system, no permission) removes its temp file, leaves
    any previous `path` as it was and raises one UserError naming the file and the fix.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_error(path, err) from None


# What to do about an OSError while writing, by errno; others get the generic fix.
_WRITE_FIXES = {
    errno.ENOSPC: "free space on that disk (or write elsewhere) and run the command again",
    errno.EDQUOT: "free space within your quota (or write elsewhere) and run the command again",
    errno.EROFS: "the file system is read-only: write to a writable folder",
    errno.EACCES: "you may not write there: fix the folder's permissions or write elsewhere",
    errno.EPERM: "you may not write there: fix the folder's permissions or write elsewhere",
}


def write_error(path: str | os.PathLike, err: Exception) -> UserError:
    """One UserError for a failed write of `path`: the file, the system's reason and the fix.

    `err` is an OSError, or a library's error wrapping one (safetensors raises SafetensorError with
    "(os error 28)" in its text on a full disk).
    """
    code = getattr(err, "errno", None)
    if code is None:
        match = re.search(r"os error (\d+)", str(err))
        code = int(match.group(1)) if match else None
    reason = getattr(err, "strerror", None) or (os.strerror(code) if code else type(err).__name__)
    fix = _WRITE_FIXES.get(code, "check the disk and the folder, then run the command again")
    return UserError(f"could not write {str(path)!r} ({reason}); nothing was half-written; {fix}")


def no_file_in_the_way(path: str | os.PathLike, what: str, fix: str) -> None:
    """Refuse an output folder `path` that is a file, or lies under one, before any work starts;
    creates nothing (a command refused later leaves no folder behind)."""
    folder = Path(path)
    for at in (folder, *folder.parents):
        if at.exists():
            if not at.is_dir():
                where = "is a file" if at == folder else f"lies under {str(at)!r}, a file"
                raise UserError(f"the {what} {str(folder)!r} {where}, not a folder; {fix}")
            return


def writable_dir(path: str | os.PathLike, what: str, fix: str) -> Path:
    """Create folder `path` if needed and prove a file can be written in it, before any output is
    written; otherwise one UserError naming the folder, the reason (a file in its place, read-only
    file system, no permission, full disk) and `fix`."""
    no_file_in_the_way(path, what, fix)
    folder = Path(path)
    probe = folder / f".oelm-write-test-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        raise UserError(
            f"cannot write the {what} {str(folder)!r} ({err.strerror or type(err).__name__}); {fix}"
        ) from None
    return folder


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """A text file's contents as UTF-8; other bytes (a file saved as Windows-1252 or Latin-1) are one
    UserError naming the file, the first bad byte's line and the fix."""
    p = Path(path)
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(
            f"{what} {str(p)!r} is not UTF-8 (byte 0x{data[err.start]:02x} on line {line}, e.g. a file saved as "
            "Windows-1252 or Latin-1); re-save it as UTF-8 (e.g. `iconv -f cp1252 -t utf-8`)"
        ) from None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def clean_json(value: Any) -> Any:
    """Non-finite floats become None (JSON has no NaN; a diverged run still gives a readable record)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    """Write a JSON document atomically (non-finite floats become null)."""
    atomic_write_text(path, json.dumps(clean_json(data), indent=2) + "\n")


def atomic_write_yaml(path: str | os.PathLike, data: Any) -> None:
    """Write a YAML document atomically (safe dumper, keys in insertion order)."""
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))


def read_json(path: str | os.PathLike, fix: str | None = None) -> Any:
    """Read a JSON file; a missing or corrupt file is a UserError naming `fix` (or None without fix).

    With fix=None the caller treats the file as optional: missing or unreadable gives None.
    """
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if fix is None:
            return None
        raise UserError(f"{str(path)!r} is missing; {fix}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: deep nesting
        if fix is None:
            return None
        raise UserError(f"{str(path)!r} is corrupt ({type(err).__name__}: {str(err)[:80]}); {fix}") from None


def read_json_object(path: str | os.PathLike, fix: str) -> dict[str, Any]:
    """read_json that also requires a JSON object (mapping) at the top."""
    data = read_json(path, fix)
    if not isinstance(data, dict):
        raise UserError(f"{str(path)!r} is corrupt (not a JSON object); {fix}")
    return data


# A config is a few hundred nodes; an alias bomb (a few hundred bytes that expand to billions of
# nodes once something walks the result) is refused before anything walks it.
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys and alias expansion beyond a small bound, and
    reads a value its explicit tag cannot hold (`!!int abc`, `!!bool maybe`) as a YAML error."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_FAILURES as err:  # the safe constructors' own int(), float(), dict lookups
            raise _bad_tagged_value(node, err) from None

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:  # also two on one line, as in {lr: 1, lr: 2}
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {seen[key]}); keep one", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: let the base class raise its own error
                break
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node) -> None:
    """Count alias references and the node count after expanding them; raise past the bounds."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # nodes whose children are still being walked
    aliases = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes and not done:
            if id(node) in open_nodes:  # an alias inside its own anchor: a value that contains itself
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    "an alias refers to a value that holds it (a recursive alias); write the values out",
                    node.start_mark,
                )
            aliases += 1  # the composer hands an alias back as the anchored node itself
            if aliases > MAX_YAML_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_YAML_ALIASES} aliases; write the values out", node.start_mark
                )
            continue
        children = (
            [c for pair in node.value for c in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        if not done:
            sizes[id(node)] = 0
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children)
            continue
        open_nodes.discard(id(node))
        sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
        if sizes[id(node)] > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"expands to more than {MAX_YAML_NODES:,} values through aliases", node.start_mark
            )


# What PyYAML's safe constructors raise, unwrapped, for a scalar its explicit tag cannot hold:
# `!!int abc` (ValueError), `!!bool maybe` (KeyError), `!!set [1]` (TypeError), `!!int 1e999`...
_CONSTRUCTOR_FAILURES = (ValueError, KeyError, TypeError, OverflowError, AttributeError, IndexError)


def _bad_tagged_value(node: yaml.Node | None, err: BaseException) -> yaml.YAMLError:
    value = f" {node.value!r}" if node is not None and isinstance(node, yaml.ScalarNode) else ""
    tag = f"its tag {node.tag.replace('tag:yaml.org,2002:', '!!')}" if node is not None else "its tag"
    return yaml.constructor.ConstructorError(
        None,
        None,
        f"the value{value} is not what {tag} says ({type(err).__name__}: {str(err)[:60]}); drop the tag or fix the value",
        node.start_mark if node is not None else None,
    )


def load_yaml_text(text: str) -> Any:
    """yaml.safe_load with StrictLoader (duplicate keys and alias bombs are YAMLErrors; so are a value
    its explicit tag cannot hold and nesting deeper than Python's recursion limit)."""
    loader = StrictLoader(text)  # what yaml.load does, with the strict SafeLoader subclass
    try:
        return loader.get_single_data()
    except _CONSTRUCTOR_FAILURES as err:  # raised where a mapping or set is filled in, after its node
        raise _bad_tagged_value(None, err) from None
    except RecursionError:
        raise yaml.composer.ComposerError(
            None, None, "values nested too deeply to read (thousands of levels); flatten them", None
        ) from None
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    """Read a YAML mapping with the strict safe loader (an empty file gives {}); errors are UserErrors."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} {str(p)!r} not found (the file does not exist); check the path")
    text = read_text(p, what)
    try:
        data = load_yaml_text(text) or {}
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())[:200] or type(err).__name__  # one line, however YAML words it
        raise UserError(f"{what} {str(p)!r} is not valid YAML ({detail}); fix the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {str(p)!r} must hold a mapping of keys to values")
    return data


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; put it back at once
    os.umask(mask)
    return mask


def file_times(folder: str | os.PathLike) -> dict[str, int]:
    """{path: modification time in ns} of every file under `folder` (taken before writing into it)."""
    root = Path(folder)
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


def follow_umask(*paths: str | os.PathLike, before: dict[str, int] | None = None) -> None:
    """Give files the mode the user's umask asks for (safetensors writes 0600 whatever the umask).

    A folder is walked; with `before` (file_times of it taken before writing) files that were
    there and are unchanged keep their modes: only what was written gets the umask's mode.
    """
    mode = 0o666 & ~_umask()
    for path in map(Path, paths):
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for f in files:
            if before is None or before.get(str(f)) != f.stat().st_mtime_ns:
                os.chmod(f, mode)
