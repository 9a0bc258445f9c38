"""Files and environments: full disks, read-only folders and non-UTF-8 files end in one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from oelm.utils import io
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, atomic_write_text, read_text

ROOT = os.geteuid() == 0


def _full_disk(monkeypatch: pytest.MonkeyPatch, at: str, code: int = errno.ENOSPC) -> None:
    """Make the write fail with `code` (a full disk by default) at `at` ("fsync" or "replace")."""

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(io.os, at, fail)


@pytest.mark.parametrize("at", ["fsync", "replace"])
@pytest.mark.parametrize(
    "code,words", [(errno.ENOSPC, ("No space left", "free space")), (errno.EROFS, ("Read-only", "writable folder"))]
)
def test_a_full_disk_leaves_the_old_file_and_no_temp_file(at: str, code, words, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "results.json"
    atomic_write_json(path, {"step": 1})
    with monkeypatch.context() as m:
        _full_disk(m, at, code)
        with pytest.raises(UserError) as err:
            atomic_write_json(path, {"step": 2})
    msg = str(err.value)
    assert "results.json" in msg and all(w in msg for w in words) and "\n" not in msg
    assert path.read_text() == '{\n  "step": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.skipif(ROOT, reason="root writes into read-only folders; run the test as a normal user")
def test_a_read_only_folder_is_one_line_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(UserError, match=r"could not write .*x\.txt.*(permission|read-only)"):
            atomic_write_text(folder / "x.txt", "hello")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_other_write_errors_name_the_file_too(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match=r"could not write .*file/sub/x\.txt"):
        atomic_write_text(blocker / "sub" / "x.txt", "hello")  # a file where a folder must be


def test_a_non_utf8_file_names_the_file_line_byte_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "notes.csv"
    path.write_bytes("text,label\nok,1\ncafé \u2013 naïve,0\n".encode("cp1252"))
    with pytest.raises(UserError) as err:
        read_text(path, "data file")
    msg = str(err.value)
    assert "notes.csv" in msg and "line 3" in msg and "0xe9" in msg and "re-save it as UTF-8" in msg
    path.write_text("text,label\ncafé,1\n", encoding="utf-8")
    assert read_text(path) == "text,label\ncafé,1\n"


RECORDS = Path(__file__).resolve().parents[1] / "docs" / "results" / "gap-wikitext2" / "records"


def _read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Writes under `root` fail as on a read-only mount (as root, chmod would not stop them)."""
    import builtins
    import pathlib

    def inside(path) -> bool:
        return Path(os.path.abspath(path)).is_relative_to(root)

    def refuse(path) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    real_mkdir, real_open = pathlib.Path.mkdir, builtins.open

    def mkdir(self, *args, **kwargs):
        if inside(self) and not self.is_dir():
            refuse(self)
        return real_mkdir(self, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and inside(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setattr(builtins, "open", open_)


@pytest.mark.slow
def test_a_report_over_read_only_run_records_writes_elsewhere_or_says_so_in_one_line(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import shutil

    from oelm.cli import main

    if not RECORDS.is_dir():
        pytest.skip(f"{RECORDS} is absent")
    runs = tmp_path / "ro" / "records"
    shutil.copytree(RECORDS, runs)
    before = sorted(str(p) for p in (tmp_path / "ro").rglob("*"))
    _read_only(monkeypatch, tmp_path / "ro")
    assert main(["report", str(runs)]) == 2  # the default output is inside the runs
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the report folder" in err[0] and "Read-only file system" in err[0]
    assert "--out" in err[0] and "Traceback" not in err[0]
    assert main(["report", str(runs), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.md").is_file()
    assert main(["report", "--view", "board", str(runs), "--out", str(tmp_path / "ro" / "board")]) == 2
    assert "cannot write the leaderboard folder" in capsys.readouterr().err
    assert sorted(str(p) for p in (tmp_path / "ro").rglob("*")) == before  # nothing written there


def test_save_pretrained_on_a_full_disk_keeps_the_old_weights_and_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    from safetensors import SafetensorError

    import oelm
    from oelm.hf import saving

    model = oelm.GPT(oelm.gpt_config("gpt-tiny", vocab_size=64, block_size=16, n_layer=1))
    oelm.apply_method(model, "oelm-freeze", seed=0)
    oelm.save_pretrained(model, tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()

    def full(model, path, *args, **kwargs):
        Path(path).write_bytes(b"half")  # what a write that ran out of room leaves
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(saving, "save_model", full)
    with pytest.raises(UserError, match=r"could not write .*model\.safetensors.*No space left on device"):
        oelm.save_pretrained(model, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("name", ["corpus.txt", "corpus.jsonl"])
def test_prepare_lm_on_a_windows_1252_file_names_it_and_the_fix(name: str, tmp_path: Path) -> None:
    from oelm.data.lm import prepare_lm

    text = "Once upon a time, a caf\u00e9.\n\nThe end.\n" if name.endswith(".txt") else '{"text": "caf\u00e9"}\n'
    (tmp_path / name).write_bytes(text.encode("cp1252"))
    with pytest.raises(UserError, match=rf"{name}' is not UTF-8 .*0xe9.*re-save it as UTF-8"):
        prepare_lm(tmp_path / name, "byte", tmp_path / "out")
    assert not (tmp_path / "out" / "meta.json").exists()


def test_a_really_full_disk_while_checkpointing_is_one_line_and_leaves_the_last_checkpoint(
    small_disk: Path, tmp_path: Path, capsys
) -> None:
    """safetensors raises SafetensorError, not OSError, when the disk fills (this was a traceback)."""
    import yaml

    from oelm.cli import main
    from train_utils import one_thread, synthetic_lm_dir, tiny_config

    run = small_disk / "run"
    cfg = tiny_config(synthetic_lm_dir(tmp_path / "data", n_train=4000), run, steps=30, checkpoint_every=5)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**cfg, "eval_every": 5, "keep_last": 10}))
    with one_thread():
        assert main(["train", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not write a checkpoint" in err[0] and "the disk is full" in err[0]
    assert "is intact" in err[0] and "--resume" in err[0]
    ckpts = run / "checkpoints"
    assert not list(ckpts.rglob(".*")), "temp files left behind"
    assert (ckpts / (ckpts / "latest").read_text().strip() / "model.safetensors").is_file()
