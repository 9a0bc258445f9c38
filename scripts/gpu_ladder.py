"""Train the scale ladder's GPU rungs (configs/sweeps/scale-ladder/gpu.yaml) in one call of the device tool.

The rungs above the CPU ladder (1-3M parameters) need a GPU; a session is lent one rarely and for
minutes, so everything is prepared here and the call does nothing but train:

    python scripts/gpu_ladder.py pack        # here: data/gpu-pack (packed tokens, the wheels the GPU lacks)
    bash scripts/gpu_ladder.sh               # there: the whole device command (carry data/gpu-pack)
    python scripts/gpu_ladder.py land DIR    # here: the records that came back -> docs/results/scale-ladder

`run` trains each rung's sweep (the arms x the transferred LR grid x seeds) under one time budget,
then stores every finished run as the same compact records the CPU rungs commit, packed in one
tarball (what comes back from the device is at most 8 files). A rung already stored is skipped and
carries its chosen LRs to the next, so a second call resumes. `--tiny` runs the same path on CPU
with rungs of a few hundred parameters (tests/test_gpu_ladder.py).

A stored rung (one seed per LR) is then confirmed on fresh seeds, under the confirmation protocol:

    python scripts/gpu_ladder.py plan        # here: data/gpu-confirm/<rung>/plan.json, copied beside the records
    git commit ...                           # the plans, before any of their runs
    python scripts/gpu_ladder.py seal        # here: each plan's commit, checked where the history is
    bash scripts/gpu_ladder.sh               # there (carry data/gpu-pack and data/gpu-confirm)
    python scripts/gpu_ladder.py land DIR    # here: -> docs/results/scale-ladder/confirm-<rung>/records

`run` trains the sealed plans after the rungs, within the same budget.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import PositiveFloat, PositiveInt, ValidationError, model_validator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_ladder  # noqa: E402  (scripts/ is not a package)
import store_records  # noqa: E402
from oelm.data.lm import data_fingerprint, read_meta  # noqa: E402
from oelm.records.compact import RECORDS_FILE  # noqa: E402
from oelm.training.config import format_validation  # noqa: E402
from oelm.utils.errors import UserError  # noqa: E402
from oelm.utils.io import atomic_write_json, atomic_write_text, load_yaml_text, read_json_object, read_yaml  # noqa: E402

SPEC = Path("configs/sweeps/scale-ladder/gpu.yaml")
PACK = Path("data/gpu-pack")
UNPACKED = Path("data/prepared/gutenberg-gpu")
WORK = Path("runs/scale-ladder-gpu")
CONFIRM = Path("data/gpu-confirm")  # the GPU rungs' confirmation plans and runs (ignored; carried)
TARBALL = "gpu-ladder.tar.gz"
CHUNK = 8_000_000  # tokens per compressed chunk (compressed and expanded in parallel)
# What the GPU machine's image lacks of oelm's dependencies (/work/.library/device/KINDS.md).
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")
DTYPES = ("float32", "bfloat16", "float16")


class _GpuSpec(scale_ladder.LadderPlan):
    """The GPU rungs' spec (the whole file, or with its `tiny` twin merged in): every value checked
    before anything is packed, planned or trained."""

    ladder: str
    family: str
    lr_from: str
    batch_size: PositiveInt
    train_tokens: PositiveInt
    device: str
    dtype: str
    parallel: PositiveInt
    tokens_per_param: PositiveFloat | None = None
    tiny: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _agree(self) -> _GpuSpec:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: one of {', '.join(DTYPES)}")
        if self.tiny and set(self.tiny) - set(type(self).model_fields):
            raise ValueError(f"tiny: unknown key(s) {sorted(set(self.tiny) - set(type(self).model_fields))}")
        return self


def load_spec(path: Path, tiny: bool) -> dict[str, Any]:
    """The GPU rungs' spec (its tiny twin with `tiny`), with the CPU ladder's spec under `ladder`."""
    raw = read_yaml(path, "GPU ladder spec")
    spec = {k: v for k, v in raw.items() if k != "tiny"}
    if tiny:
        spec.update(raw.get("tiny") or {})
    try:
        _GpuSpec.model_validate(raw)
        _GpuSpec.model_validate(spec)
    except ValidationError as err:
        raise UserError(format_validation(err, f"GPU ladder spec {path}", "required (gpu.yaml shows it)")) from None
    spec["ladder"] = scale_ladder.load(path.parent / raw["ladder"])
    spec.setdefault("tokens_per_param", spec["ladder"]["tokens_per_param"])
    ladder = spec["ladder"]
    if spec["family"] not in ladder["families"]:
        raise UserError(f"{path}: family {spec['family']!r} is not one of the ladder's {sorted(ladder['families'])}")
    if spec["lr_from"] not in (rungs := [r["name"] for r in ladder["rungs"]]):
        raise UserError(f"{path}: lr_from {spec['lr_from']!r} is no rung of the ladder ({rungs})")
    return spec


# -- pack (here) and unpack (there) --------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _compress(job: tuple[str, int, int, str]) -> dict[str, Any]:
    src, start, stop, dst = job
    tokens = np.memmap(src, dtype=np.uint16, mode="r")[start:stop]
    raw = np.ascontiguousarray(tokens).tobytes()
    Path(dst).write_bytes(lzma.compress(raw, preset=6))
    return {"file": Path(dst).name, "tokens": stop - start, "sha256": _sha(raw)}


def pack(data: Path, out: Path, train_tokens: int, workers: int = 2, wheels: bool = True) -> dict[str, Any]:
    """Write `out`: the first `train_tokens` train tokens of the prepared folder `data` and its
    whole val and test splits, lzma-compressed in chunks, a meta.json for the unpacked folder, and
    (with `wheels`) the wheels the GPU image lacks. Written beside `out`, then moved into place."""
    meta = read_meta(data)
    if meta.get("dtype") != "uint16":
        raise UserError(f"{data}: the pack stores uint16 tokens, this folder holds {meta.get('dtype')}")
    n_train = int(meta["splits"]["train"])
    if train_tokens > n_train:
        raise UserError(f"{data}: --train-tokens {train_tokens:,} is more than its train split ({n_train:,})")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    jobs = [
        (str(data / "train.bin"), a, min(a + CHUNK, train_tokens), str(tmp / f"train-{i:03d}.xz"))
        for i, a in enumerate(range(0, train_tokens, CHUNK))
    ]
    for split in ("val", "test"):
        jobs.append((str(data / f"{split}.bin"), 0, int(meta["splits"][split]), str(tmp / f"{split}.xz")))
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        chunks = list(pool.map(_compress, jobs))
    prefix = hashlib.sha256()
    for c in chunks[:-2]:
        prefix.update(_unxz(tmp / c["file"]))
    new = dict(meta)
    new["splits"] = {**meta["splits"], "train": train_tokens}
    new["split_sha256"] = {**meta["split_sha256"], "train": prefix.hexdigest()}
    new.pop("split_bytes", None)
    new["packed_from"] = {"fingerprint": data_fingerprint(meta), "train_tokens": n_train, "kept": train_tokens}
    new["data_fingerprint"] = data_fingerprint(new)
    atomic_write_json(tmp / "meta.json", new)
    atomic_write_json(tmp / "pack.json", {"chunks": chunks, "fingerprint": new["data_fingerprint"]})
    if wheels:
        _download_wheels(tmp / "wheels")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return new


def _unxz(path: Path) -> bytes:
    return lzma.decompress(path.read_bytes())


def _expand(job: tuple[str, str]) -> tuple[str, bytes]:
    return job[1], _unxz(Path(job[0]))


def unpack(src: Path, dst: Path, workers: int = 8) -> Path:
    """Expand a pack into a prepared data folder (skipped when `dst` already holds this pack);
    every chunk is checked against its sha256 before the folder is published."""
    index = json.loads((src / "pack.json").read_text(encoding="utf-8"))
    if (dst / "meta.json").is_file() and read_meta(dst).get("data_fingerprint") == index["fingerprint"]:
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    by_file = {c["file"]: c for c in index["chunks"]}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        parts = dict(pool.map(_expand, [(str(src / f), f) for f in by_file]))
    for f, raw in parts.items():
        if _sha(raw) != by_file[f]["sha256"]:
            raise UserError(f"{src / f}: its tokens do not match the pack's sha256; pack again (`gpu_ladder.py pack`)")
    with (tmp / "train.bin").open("wb") as fh:
        for f in sorted(p for p in parts if p.startswith("train-")):
            fh.write(parts[f])
    for split in ("val", "test"):
        (tmp / f"{split}.bin").write_bytes(parts[f"{split}.xz"])
    shutil.copy(src / "meta.json", tmp / "meta.json")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


def _download_wheels(dst: Path) -> None:
    """The wheels of oelm's dependencies that the GPU image lacks, for its Python 3.12 on x86-64."""
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 27, 28)] + ["manylinux2014_x86_64"]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "-d",
        str(dst),
    ]
    for p in platforms:
        cmd += ["--platform", p]
    done = subprocess.run([*cmd, *_pinned_wheels()], capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"pip could not download the GPU wheels: {done.stderr.strip().splitlines()[-1:]}")


def _pinned_wheels() -> list[str]:
    """The versions installed here, so the GPU runs the code the tests ran."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in WHEELS]


# -- run (there) ---------------------------------------------------------------------------------


def rung_spec(spec: dict[str, Any], rung: dict[str, Any], grid: dict[str, list[float]], data: Path) -> dict:
    """One GPU rung's sweep spec: the CPU ladder's rung spec with the GPU's batch, device and data."""
    ladder = dict(spec["ladder"], arms=spec["arms"], primary=spec["primary"], seeds=spec["seeds"])
    ladder["max_extend"] = spec["max_extend"]
    rs = scale_ladder.rung_spec(ladder, spec["family"], rung, grid, ratio=spec["tokens_per_param"])
    rs["name"] = rs["name"].removesuffix(f"-t{spec['tokens_per_param']:g}")
    o = rs["overrides"]
    base = load_yaml_text(Path(spec["ladder"]["base"]).read_text(encoding="utf-8"))
    n = scale_ladder.total_params(o["model"], o["model_overrides"], scale_ladder.VOCAB)
    steps = max(20, round(spec["tokens_per_param"] * n / (spec["batch_size"] * base["seq_len"])))
    o.update(
        steps=steps,
        warmup=max(2, steps // 10),
        eval_every=max(1, steps // 4),
        batch_size=spec["batch_size"],
        data=data.as_posix(),
        device=spec["device"],
        dtype=spec["dtype"],
    )
    return rs


def _grid(spec: dict[str, Any], below: dict[str, float]) -> dict[str, list[float]]:
    ladder = dict(spec["ladder"], arms=spec["arms"])
    return scale_ladder.grid_from(ladder, below)


def _sweep(spec_path: Path, out: Path, parallel: int, deadline: float) -> int | None:
    """`oelm sweep` of one rung until the deadline (see _until)."""
    cmd = [sys.executable, "-m", "oelm", "sweep", str(spec_path), "--out", str(out), "--parallel", str(parallel)]
    return _until(cmd + ["--threads", "1", "--no-report"], deadline)


def _until(cmd: list[str], deadline: float) -> int | None:
    """`cmd` in its own process group; SIGTERM at the deadline (finished runs are kept). Returns its
    exit code, or None when the deadline stopped it."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return None


def run(
    spec: dict[str, Any],
    out: Path,
    budget_s: float,
    stored: Path,
    pack_dir: Path = PACK,
    data_dir: Path = UNPACKED,
    work: Path = WORK,
    confirm: Path = CONFIRM,
) -> dict[str, Any]:
    """Train every GPU rung not yet stored, then every sealed confirmation plan under `confirm` not
    yet stored, within `budget_s`; write the records (tarball) and a summary into `out`. Returns
    the summary."""
    start = time.monotonic()
    deadline = start + budget_s
    if not (pack_dir / "pack.json").is_file():
        raise UserError(f"{pack_dir}: no pack here; run `python scripts/gpu_ladder.py pack` and carry it")
    data = unpack(pack_dir, data_dir)
    family = spec["family"]
    below = scale_ladder.chosen_lrs(_stored_or_fail(stored, f"{family}-{spec['lr_from']}"))
    records = work / "records"
    shutil.rmtree(records, ignore_errors=True)
    summary: dict[str, Any] = {"device": _device_name(spec["device"]), "budget_s": budget_s, "rungs": {}}
    for rung in spec["rungs"]:
        name = f"{family}-{rung['name']}"
        if (stored / name / "sweep.yaml").is_file():
            below = scale_ladder.chosen_lrs(stored / name)
            summary["rungs"][name] = {"state": "stored"}
            continue
        rung_dir = work / name
        spec_path = rung_dir / scale_ladder.RUNG_SPEC
        if not spec_path.is_file():  # a grid once written is never moved by a rerun
            rung_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(spec_path, scale_ladder._dump(rung_spec(spec, rung, _grid(spec, below), data)))
        t0 = time.monotonic()
        code = _sweep(spec_path, rung_dir, spec["parallel"], deadline)
        n = store_records.store(rung_dir, records / name) if (rung_dir / "runs").is_dir() else 0
        state = "finished" if code == 0 else ("stopped at the deadline" if code is None else f"exit {code}")
        summary["rungs"][name] = {"state": state, "runs": n, "wall_s": round(time.monotonic() - t0, 1)}
        print(f"{name}: {state}, {n} runs stored, {time.monotonic() - t0:.0f} s", flush=True)
        if code != 0:
            break
        below = scale_ladder.chosen_lrs(rung_dir)
    else:
        summary["confirmations"] = _confirm_all(confirm, stored, spec["parallel"], deadline, records)
    summary["wall_s"] = round(time.monotonic() - start, 1)
    out.mkdir(parents=True, exist_ok=True)
    if records.is_dir():
        with tarfile.open(out / TARBALL, "w:gz") as tar:
            tar.add(records, arcname="records")
    atomic_write_json(out / "gpu-ladder-summary.json", summary)
    return summary


def _confirm_all(confirm: Path, stored: Path, parallel: int, deadline: float, records: Path) -> dict[str, Any]:
    """`oelm confirm run` on every sealed plan (plan-commit.json written here) whose confirmation is
    not stored, one after another until the deadline; each one's finished runs as records."""
    done: dict[str, Any] = {}
    for folder in sorted(p.parent for p in confirm.glob("*/plan-commit.json")):
        name = folder.name
        if (confirm_home(stored, name) / RECORDS_FILE).is_file():
            done[name] = {"state": "stored"}
            continue
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "oelm", "confirm", "run", str(folder), "--parallel", str(parallel)]
        code = _until(cmd + ["--threads", "1"], deadline)
        n = store_records.store(folder, records / f"confirm-{name}") if (folder / "runs").is_dir() else 0
        state = "finished" if code == 0 else ("stopped at the deadline" if code is None else f"exit {code}")
        done[name] = {"state": state, "runs": n, "wall_s": round(time.monotonic() - t0, 1)}
        print(f"confirm-{name}: {state}, {n} runs stored, {time.monotonic() - t0:.0f} s", flush=True)
        if code != 0:
            break
    return done


def confirm_home(stored: Path, name: str) -> Path:
    """Where a GPU rung's confirmation is committed: beside the ladder's records, as the CPU rungs'."""
    return stored.parent / f"confirm-{name}" / "records"


def plan(spec: dict[str, Any], stored: Path, confirm: Path = CONFIRM, seeds: int = 3) -> list[Path]:
    """Plan a fresh-seed confirmation of each stored GPU rung not yet planned: every arm at the LR
    its rung chose, `seeds` fresh seeds, the spec's primary pairs (Holm over them). The plan goes to
    CONFIRM/<rung>/ (it travels to the GPU) and is copied beside the rung's records, to be committed
    before `seal`. A plan already committed there is copied back to CONFIRM where a fresh checkout
    lacks it (CONFIRM is ignored), never planned again. Returns the copies written."""
    written = []
    for rung in spec["rungs"]:
        name = f"{spec['family']}-{rung['name']}"
        home = confirm_home(stored, name)
        if (home / "plan.json").is_file() and not (home / RECORDS_FILE).is_file():
            if not (confirm / name / "plan.json").is_file():
                (confirm / name).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(home / "plan.json", confirm / name / "plan.json")
            continue
        if not (stored / name / "sweep.yaml").is_file() or (home / "plan.json").is_file():
            continue
        args = ["confirm", "plan", str(stored / name), "--seeds", str(seeds), "--all"]
        args += ["--baseline", spec["primary"][0][1], "--out", str(confirm / name)]
        if scale_ladder.oelm(args) != 0:
            raise UserError(f"{stored / name}: `oelm {' '.join(args)}` failed (its message is above)")
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(confirm / name / "plan.json", home / "plan.json")
        written.append(home / "plan.json")
    return written


def seal(confirm: Path = CONFIRM) -> list[str]:
    """Record each plan's commit (plan-commit.json) here, where the git history is: the GPU machine
    gets the working tree without it. A plan in no commit is refused (commit the copies first)."""
    from oelm.experiments.confirm import check_plan_commit
    from oelm.records.plan import read_plan

    sealed = []
    for folder in sorted(p.parent for p in confirm.glob("*/plan.json")):
        record = check_plan_commit(read_plan(folder), folder)
        sealed.append(f"{folder.name}: commit {record.commit[:12]} ({record.date})")
    return sealed


def _stored_or_fail(stored: Path, name: str) -> Path:
    if not (stored / name / "sweep.yaml").is_file():
        raise UserError(f"{stored / name}: the CPU rung the GPU grids are centred on is not stored; run it first")
    return stored / name


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError("device cuda: no GPU is visible here; run with --tiny on CPU, or on the GPU machine")
        return torch.cuda.get_device_name(0)
    return "cpu"


# -- land (here) ---------------------------------------------------------------------------------


def _extract(tar: tarfile.TarFile, prefix: str, dst: Path) -> None:
    """Write the archive's files under `prefix` into `dst`, keeping their relative paths."""
    for m in tar.getmembers():
        if m.name.startswith(prefix) and m.isfile():
            target = dst / m.name.removeprefix(prefix)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(m).read())


def land(tarball: Path, stored: Path) -> list[str]:
    """Unpack the records a GPU call brought back into the stored ladder; refuse to replace a
    rung already stored, and keep only rungs whose sweep finished (every planned run)."""
    if not tarball.is_file():
        raise UserError(f"{tarball}: no such file; give the gpu-ladder.tar.gz the device call brought back")
    summary_path = tarball.with_name("gpu-ladder-summary.json")
    summary = (
        read_json_object(summary_path, "the device call writes it beside the tarball; fetch both again")
        if (summary_path.is_file())
        else {"rungs": {}}
    )
    # (label, archive prefix, destination, the file whose presence means "already stored")
    wanted = [
        (name, f"records/{name}/", stored / name, stored / name)
        for name, info in summary["rungs"].items()
        if info.get("state") == "finished"
    ] + [
        (
            f"confirm-{name}",
            f"records/confirm-{name}/",
            confirm_home(stored, name),
            confirm_home(stored, name) / RECORDS_FILE,
        )
        for name, info in summary.get("confirmations", {}).items()
        if info.get("state") == "finished"
    ]
    for _label, _prefix, dst, marker in wanted:
        if marker.exists():
            raise UserError(f"{dst}: already stored; move it away to land the new records")
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            names = set(tar.getnames())
            if gone := [label for label, prefix, *_ in wanted if not any(n.startswith(prefix) for n in names)]:
                raise UserError(
                    f"{tarball}: the summary lists {gone} finished, but the tarball holds none of their records"
                )
            for _label, prefix, dst, _marker in wanted:
                _extract(tar, prefix, dst)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise UserError(
            f"{tarball}: not a whole gzip tarball ({type(err).__name__}: {err}); fetch it again from the device call"
        ) from None
    return [label for label, *_ in wanted]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    pk = sub.add_parser("pack", help="here: pack the train prefix, val and test, and the GPU's wheels")
    pk.add_argument("--data", type=Path, default=Path("data/prepared/gutenberg-byte"))
    pk.add_argument("--out", type=Path, default=PACK)
    pk.add_argument("--train-tokens", type=int, default=None, help="default: the spec's train_tokens")
    pk.add_argument("--no-wheels", action="store_true")
    pk.add_argument("--workers", type=int, default=2)
    rn = sub.add_parser("run", help="there: train the rungs not yet stored, within the budget")
    rn.add_argument("--out", type=Path, required=True, help="where the tarball and summary go ($OUT)")
    rn.add_argument("--budget-s", type=float, default=420)
    rn.add_argument("--pack", type=Path, default=PACK)
    rn.add_argument("--data", type=Path, default=UNPACKED, help="where the pack is expanded")
    rn.add_argument("--work", type=Path, default=WORK, help="the rungs' run directories")
    pl = sub.add_parser("plan", help="here: plan each stored rung's fresh-seed confirmation (then commit)")
    pl.add_argument("--seeds", type=int, default=3, help="fresh seeds per arm (default 3)")
    sl = sub.add_parser("seal", help="here, after the commit: record each plan's commit for the device")
    ld = sub.add_parser("land", help="here: store the records a device call brought back")
    ld.add_argument("tarball", type=Path)
    ld.add_argument("--stored", type=Path, default=scale_ladder.STORED)
    for q in (pk, rn, pl):
        q.add_argument("--spec", type=Path, default=SPEC)
        q.add_argument("--tiny", action="store_true", help="the tiny CPU twin (CI)")
    for q in (rn, pl):
        q.add_argument("--stored", type=Path, default=scale_ladder.STORED)
    for q in (rn, pl, sl):
        q.add_argument("--confirm", type=Path, default=CONFIRM, help="the confirmation plans' folders")
    args = p.parse_args(argv)
    try:
        if args.verb == "pack":
            spec = load_spec(args.spec, args.tiny)
            meta = pack(
                args.data, args.out, args.train_tokens or spec["train_tokens"], args.workers, not args.no_wheels
            )
            size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
            print(f"{args.out}: {meta['splits']['train']:,} train tokens, {size / 2**20:.1f} MiB")
        elif args.verb == "run":
            if args.budget_s <= 0:
                raise UserError(f"--budget-s {args.budget_s:g}: give the seconds the rungs may train (more than 0)")
            spec = load_spec(args.spec, args.tiny)
            summary = run(spec, args.out, args.budget_s, args.stored, args.pack, args.data, args.work, args.confirm)
            print(json.dumps(summary, indent=1))
        elif args.verb == "plan":
            written = plan(load_spec(args.spec, args.tiny), args.stored, args.confirm, args.seeds)
            print("\n".join(f"planned: {w}" for w in written) or "nothing to plan (every stored rung has a plan)")
            if written:
                print("next: commit those plan.json files, then `python scripts/gpu_ladder.py seal`")
        elif args.verb == "seal":
            print("\n".join(seal(args.confirm)) or f"no plan under {args.confirm}")
        else:
            print("landed:", ", ".join(land(args.tarball, args.stored)) or "nothing (no finished rung)")
    except UserError as e:
        print(f"gpu_ladder: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
