"""The scale ladder's GPU rungs (scripts/gpu_ladder.py) through their tiny CPU twin: the same pack,
unpack, sweep, store and land path the device call takes, at a few hundred parameters."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import git, load_script
from oelm.data.lm import prepare_lm, read_meta
from oelm.records.compact import read_records
from oelm.utils.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "docs" / "results" / "scale-ladder" / "records"


@pytest.fixture(scope="module")
def gpu():
    return load_script("gpu_ladder")


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    data = tmp_path / "prepared"
    prepare_lm("builtin:tales", "byte", data, max_docs=60, test_fraction=0.1, verbose=False)
    return data


def test_a_pack_expands_to_the_train_prefix_and_the_whole_held_out_splits(gpu, prepared: Path, tmp_path: Path) -> None:
    """Packed then unpacked, train is the first N tokens, val and test are byte-identical, and the
    unpacked folder's fingerprint is new (other train data) but names the folder it came from."""
    n = 20_000
    meta = gpu.pack(prepared, tmp_path / "pack", n, workers=1, wheels=False)
    assert meta["splits"]["train"] == n and meta["packed_from"]["kept"] == n
    out = gpu.unpack(tmp_path / "pack", tmp_path / "data", workers=1)
    old = np.fromfile(prepared / "train.bin", dtype=np.uint16)
    assert np.array_equal(np.fromfile(out / "train.bin", dtype=np.uint16), old[:n])
    for split in ("val", "test"):
        assert (out / f"{split}.bin").read_bytes() == (prepared / f"{split}.bin").read_bytes()
    assert read_meta(out)["data_fingerprint"] != read_meta(prepared).get("data_fingerprint")


def test_a_damaged_pack_is_refused_before_anything_is_written(gpu, prepared: Path, tmp_path: Path) -> None:
    gpu.pack(prepared, tmp_path / "pack", 10_000, workers=1, wheels=False)
    index = json.loads((tmp_path / "pack" / "pack.json").read_text())
    index["chunks"][0]["sha256"] = "0" * 64
    (tmp_path / "pack" / "pack.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="sha256"):
        gpu.unpack(tmp_path / "pack", tmp_path / "data", workers=1)
    assert not (tmp_path / "data").exists()


def test_the_declared_gpu_rungs_sit_above_the_cpu_ladder_at_its_budget(gpu) -> None:
    """The real spec: each GPU rung is larger than the top CPU rung, and trains for 20 tokens per
    total parameter at the GPU's batch; the grids are the transfer rule's."""
    spec = gpu.load_spec(ROOT / "configs/sweeps/scale-ladder/gpu.yaml", tiny=False)
    driver = gpu.scale_ladder
    top = spec["ladder"]["rungs"][-1]
    cpu_top = driver.total_params("gpt-narrow", driver.model_overrides(spec["ladder"]["families"]["gpt"], top), 257)
    below = dict.fromkeys(spec["arms"], 0.01)
    for rung in spec["rungs"]:
        rs = gpu.rung_spec(spec, rung, gpu._grid(spec, below), Path("data/x"))
        o = rs["overrides"]
        n = driver.total_params(o["model"], o["model_overrides"], 257)
        assert n > cpu_top and o["steps"] * 64 * 128 / n == pytest.approx(20, rel=0.02)
        assert o["device"] == "cuda" and o["batch_size"] == 64
        assert rs["methods"]["oelm-freeze"]["lr"] == [0.005, 0.01, 0.02]
    # The packed prefix holds the top rung's tokens with room to spare (random windows).
    assert spec["train_tokens"] >= 1.5 * o["steps"] * 64 * 128


@pytest.mark.slow
def test_the_tiny_twin_trains_stores_and_lands_every_rung(
    gpu, prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One `run` on CPU: both tiny rungs train every arm at every LR, the records come back in one
    tarball beside a summary, `land` stores them where the ladder page reads, and a second `run`
    skips the stored rungs."""
    spec = gpu.load_spec(ROOT / "configs/sweeps/scale-ladder/gpu.yaml", tiny=True)
    gpu.pack(prepared, tmp_path / "pack", 20_000, workers=1, wheels=False)
    stored = tmp_path / "stored"
    shutil.copytree(STORED / "gpt-r6", stored / "gpt-r6")
    out = tmp_path / "OUT"
    summary = gpu.run(spec, out, 600, stored, tmp_path / "pack", tmp_path / "data", tmp_path / "work")
    assert summary["device"] == "cpu"
    assert [r["state"] for r in summary["rungs"].values()] == ["finished", "finished"]
    with tarfile.open(out / gpu.TARBALL) as tar:
        names = {m.name for m in tar.getmembers()}
    assert {"records/gpt-g1/runs.jsonl.gz", "records/gpt-g2/sweep.yaml"} <= names
    n_runs = sum(r["runs"] for r in summary["rungs"].values())
    assert gpu.land(out / gpu.TARBALL, stored) == ["gpt-g1", "gpt-g2"]
    assert sum(len(read_records(stored / n)) for n in ("gpt-g1", "gpt-g2")) == n_runs >= 2 * len(spec["arms"]) * 3
    lrs = gpu.scale_ladder.chosen_lrs(stored / "gpt-g2")
    assert set(lrs) == set(spec["arms"])
    shutil.move(stored / "gpt-g1", tmp_path / "g1-aside")
    with pytest.raises(UserError, match="already stored"):
        gpu.land(out / gpu.TARBALL, stored)
    assert not (stored / "gpt-g1").exists()  # refused (at gpt-g2) before anything was written
    shutil.move(tmp_path / "g1-aside", stored / "gpt-g1")
    confirm = tmp_path / "confirm"
    again = gpu.run(
        spec, tmp_path / "OUT2", 600, stored, tmp_path / "pack", tmp_path / "data", tmp_path / "work", confirm
    )
    assert [r["state"] for r in again["rungs"].values()] == ["stored", "stored"]
    assert again["confirmations"] == {}  # nothing planned yet

    # Then each stored rung is confirmed on fresh seeds: planned here, committed, sealed here (the
    # device gets no git history), run there after the rungs, landed beside the ladder's records.
    monkeypatch.chdir(tmp_path)  # plans name their pilot relative to where they are made
    plans = gpu.plan(spec, stored, confirm, seeds=3)
    assert [p.parent.parent.name for p in plans] == ["confirm-gpt-g1", "confirm-gpt-g2"]
    with pytest.raises(UserError, match="is in no git commit"):
        gpu.seal(confirm)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-f", *[str(p.relative_to(tmp_path)) for p in plans])
    git(tmp_path, "commit", "-q", "-m", "Fix the GPU rungs' confirmation plans before their runs")
    shutil.rmtree(confirm / "gpt-g1")  # a fresh checkout: the ignored folder is gone, the commit holds the plan
    assert gpu.plan(spec, stored, confirm) == [] and (confirm / "gpt-g1" / "plan.json").is_file()
    assert [line.split(":")[0] for line in gpu.seal(confirm)] == ["gpt-g1", "gpt-g2"]
    shutil.rmtree(tmp_path / ".git")  # the device machine: the tree without its history
    third = gpu.run(
        spec, tmp_path / "OUT3", 600, stored, tmp_path / "pack", tmp_path / "data", tmp_path / "work", confirm
    )
    assert [c["state"] for c in third["confirmations"].values()] == ["finished", "finished"]
    assert gpu.land(tmp_path / "OUT3" / gpu.TARBALL, stored) == ["confirm-gpt-g1", "confirm-gpt-g2"]
    home = gpu.confirm_home(stored, "gpt-g2")
    runs = read_records(home)
    assert len(runs) == 3 * len(spec["arms"]) and {k.rsplit("seed", 1)[1] for k in runs} == {"1", "2", "3"}
    assert json.loads((home / "plan-commit.json").read_text())["commit"]
    assert gpu.plan(spec, stored, confirm) == []  # planned once


def test_a_damaged_tarball_or_spec_is_one_clear_error_before_anything_lands(gpu, tmp_path: Path) -> None:
    """What a device call brings back can be cut short or not match its summary; a spec can be
    missing or empty. Each is one UserError naming it, and nothing is written to the stored ladder."""
    import io

    out, stored = tmp_path / "OUT", tmp_path / "stored"
    out.mkdir()
    (out / "gpu-ladder-summary.json").write_text(json.dumps({"rungs": {"gpt-g1": {"state": "finished"}}}))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"x" * 4096
        info = tarfile.TarInfo("records/gpt-g9/runs.jsonl.gz")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    whole = buf.getvalue()
    (out / gpu.TARBALL).write_bytes(whole)
    with pytest.raises(UserError, match=r"lists \['gpt-g1'\] finished.*holds none of their records"):
        gpu.land(out / gpu.TARBALL, stored)
    (out / gpu.TARBALL).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="not a whole gzip tarball.*fetch it again"):
        gpu.land(out / gpu.TARBALL, stored)
    (out / "gpu-ladder-summary.json").write_text("{")
    with pytest.raises(UserError, match="gpu-ladder-summary.json.*corrupt"):
        gpu.land(out / gpu.TARBALL, stored)
    assert not stored.exists()
    with pytest.raises(UserError, match="not found"):
        gpu.load_spec(tmp_path / "absent.yaml", tiny=True)
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(UserError, match=r"invalid GPU ladder spec .*ladder: required \(gpu.yaml shows it\)"):
        gpu.load_spec(tmp_path / "empty.yaml", tiny=True)
    assert gpu.main(["run", "--out", str(out), "--budget-s", "0", "--tiny"]) == 2
    spec_text = (ROOT / "configs/sweeps/scale-ladder/gpu.yaml").read_text()
    shutil.copy(ROOT / "configs/sweeps/scale-ladder/ladder.yaml", tmp_path / "ladder.yaml")
    for edit, says in (
        (("dtype: bfloat16", "dtype: bf16"), "dtype 'bf16': one of"),
        (("lr_from: r6", "lr_from: r66"), "lr_from 'r66' is no rung of the ladder"),
        (("family: gpt", "family: gtp"), "family 'gtp' is not one of the ladder's"),
        (("batch_size: 4", "batch_size: 0"), "batch_size: Input should be greater than 0"),  # in the tiny twin
        (("seeds: [0]", "seeds: [0, 0]"), r"seeds repeat: \[0, 0\]"),
    ):
        (tmp_path / "gpu.yaml").write_text(spec_text.replace(*edit))
        with pytest.raises(UserError, match=says):
            gpu.load_spec(tmp_path / "gpu.yaml", tiny=True)
