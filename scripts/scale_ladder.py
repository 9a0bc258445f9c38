"""Run the scale ladder of a ladder spec (configs/sweeps/scale-ladder/ladder.yaml), rung by rung.

For each family and rung, in order: size the model (total parameters of the trainable control),
set the step budget to `tokens_per_param` tokens per parameter, centre each arm's LR grid on the
LR the rung below chose for that arm (the transfer rule; the first rung uses `lr.first`), write
the rung's sweep spec beside its runs and run `oelm sweep` on it. Every step resumes: finished
runs are skipped, a written spec is reused as it is (so a rerun never moves a grid), and a rung
starts only when the rung below has every run finished.

    python scripts/scale_ladder.py configs/sweeps/scale-ladder/ladder.yaml --family gpt
    python scripts/scale_ladder.py configs/sweeps/scale-ladder/ladder.yaml --family llama --rungs r1 r2
    python scripts/scale_ladder.py configs/sweeps/scale-ladder/ladder.yaml --plan    # sizes and budgets only

A rung too long for one session moves on from committed records: `--save-progress` stores every
finished run of each rung under way as docs/results/scale-ladder/under-way/<rung> (records and the
rung's spec; commit them), and a later session on a fresh machine restores them before it resumes
the rung, so only the runs not yet stored train. A rung's folder there goes once the rung is stored.

    python scripts/scale_ladder.py configs/sweeps/scale-ladder/ladder.yaml --save-progress

A choice still at a grid edge after the spec's declared extensions (`max_extend`) is extended
further only by asking: `--max-extend 4 --rungs r4` (or with `--data-axis`) rewrites those rungs'
specs with the higher limit and resumes them; their sweep records keep it.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_records  # noqa: E402  (scripts/ is not a package)
from oelm.cli import main as oelm  # noqa: E402
from oelm.records.compact import RECORDS_FILE  # noqa: E402
from oelm.training.config import format_validation  # noqa: E402
from oelm.utils.errors import UserError  # noqa: E402
from oelm.utils.io import atomic_write_text, load_yaml_text, read_yaml  # noqa: E402

# Where finished rungs are committed (scripts/store_records.py): a later session resumes above them.
STORED = Path("docs/results/scale-ladder/records")
# Where a rung under way keeps its finished runs between sessions (--save-progress).
PROGRESS = Path("docs/results/scale-ladder/under-way")
RUNG_SPEC = "ladder-rung.yaml"
VOCAB = 257  # the byte tokenizer's vocabulary (256 bytes and end of text)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RungSpec(StrictModel):
    """A rung's shape, and optionally its own seeds (the top CPU rung runs one seed per LR, as the
    GPU rungs do, and gets its interval from a fresh-seed confirmation at the chosen LRs)."""

    name: str
    n_layer: PositiveInt
    d_model: PositiveInt
    n_head: PositiveInt
    seeds: list[NonNegativeInt] | None = Field(default=None, min_length=1)


class _Family(StrictModel):
    model: str
    ffn_mult: PositiveInt | None = None
    block_size: PositiveInt | None = None


class _LR(StrictModel):
    first: list[PositiveFloat] = Field(min_length=1)
    transfer: list[PositiveFloat] = Field(min_length=1)


class _DataAxis(StrictModel):
    rung: str
    tokens_per_param: list[PositiveFloat] = Field(min_length=1)


class LadderPlan(StrictModel):
    """What every ladder spec (the CPU ladder's, the GPU rungs') declares: its rungs, arms, primary
    pairs and seeds, each named once, every primary pair two listed arms."""

    rungs: list[RungSpec] = Field(min_length=1)
    arms: list[str] = Field(min_length=1)
    primary: list[list[str]] = Field(min_length=1)
    seeds: list[NonNegativeInt] = Field(min_length=1)
    max_extend: NonNegativeInt

    @model_validator(mode="after")
    def _named_once(self) -> LadderPlan:
        names = [r.name for r in self.rungs]
        for what, values in [("rung names", names), ("seeds", self.seeds), ("arms", self.arms)] + [
            (f"rung {r.name}'s seeds", r.seeds) for r in self.rungs if r.seeds
        ]:
            if len(set(values)) != len(values):
                raise ValueError(f"{what} repeat: {values}; name each once")
        for pair in self.primary:
            if len(pair) != 2 or set(pair) - set(self.arms):
                raise ValueError(f"primary pair {pair}: give two arms of `arms` ({self.arms})")
        return self


class _Spec(LadderPlan):
    """The ladder spec's schema: every value checked before any rung is sized or trained."""

    name: str
    base: str
    out: str
    tokens_per_param: PositiveFloat
    families: dict[str, _Family] = Field(min_length=1)
    lr: _LR
    hypothesis: dict[str, Any]
    data_axis: list[_DataAxis] = []

    @model_validator(mode="after")
    def _agree(self) -> _Spec:
        names = [r.name for r in self.rungs]
        for cell in self.data_axis:
            if cell.rung not in names:
                raise ValueError(f"data_axis names rung {cell.rung!r}; the rungs are {names}")
        if "test" not in self.hypothesis:
            raise ValueError("hypothesis: state its `test`")
        return self


def load(path: Path) -> dict[str, Any]:
    """The ladder spec, checked before any run."""
    spec = read_yaml(path, "ladder spec")
    if "hypothesis" not in spec:
        raise UserError(f"{path}: declare the trend hypothesis and its test (`hypothesis:`) before the ladder runs")
    try:
        _Spec.model_validate(spec)
    except ValidationError as err:
        raise UserError(format_validation(err, f"ladder spec {path}", "required (ladder.yaml shows it)")) from None
    spec["base"] = (path.parent / spec["base"]).resolve()
    return spec


def model_overrides(family: dict[str, Any], rung: dict[str, Any]) -> dict[str, Any]:
    """The model shape of one rung in one family."""
    shape = {k: rung[k] for k in ("n_layer", "d_model", "n_head")}
    if "ffn_mult" in family:
        shape["d_ff"] = family["ffn_mult"] * rung["d_model"]
    if "block_size" in family:
        shape["block_size"] = family["block_size"]
    if family["model"].startswith("llama"):
        shape["n_kv_head"] = rung["n_head"]
    return shape


def total_params(model: str, shape: dict[str, Any], vocab_size: int) -> int:
    """Parameters of the trainable control at this shape, embeddings included."""
    from oelm.models.catalog import build_lm, preset_config

    return sum(p.numel() for p in build_lm(preset_config(model, vocab_size=vocab_size, **shape)).parameters())


def chosen_lrs(sweep_dir: Path) -> dict[str, float]:
    """Each arm's validation-chosen LR in a finished rung (the comparison every report makes)."""
    from oelm.records.load import load_runs
    from oelm.reports.aggregate import compare

    comparison = compare(load_runs([sweep_dir]))
    return {arm.method: arm.lr for group in comparison.groups for arm in group.arms if arm.lr is not None}


def rung_spec(
    spec: dict[str, Any],
    family_name: str,
    rung: dict[str, Any],
    lrs: dict[str, list[float]],
    ratio: float | None = None,
) -> dict:
    """The sweep spec of one rung (at `ratio` tokens per parameter; default the spec's)."""
    family = spec["families"][family_name]
    shape = model_overrides(family, rung)
    base = load_yaml_text(Path(spec["base"]).read_text(encoding="utf-8"))
    tokens_per_step = base["batch_size"] * base["seq_len"]
    n = total_params(family["model"], shape, vocab_size=VOCAB)
    ratio = ratio or spec["tokens_per_param"]
    steps = max(20, round(ratio * n / tokens_per_step))
    suffix = "" if ratio == spec["tokens_per_param"] else f"-t{ratio:g}"
    return {
        "name": f"{spec['name']}-{family_name}-{rung['name']}{suffix}",
        "base": Path(spec["base"]).as_posix(),
        "overrides": {
            "model": family["model"],
            "model_overrides": shape,
            "steps": steps,
            "warmup": max(2, steps // 10),
            "eval_every": max(1, steps // 4),
        },
        "methods": {arm: {"lr": lrs[arm]} for arm in spec["arms"]},
        "seeds": rung.get("seeds", spec["seeds"]),
        "max_extend": spec["max_extend"],
        "primary": spec["primary"],
    }


def grid_from(spec: dict[str, Any], below: dict[str, float] | None) -> dict[str, list[float]]:
    """Each arm's grid: `lr.first` on the first rung, else the transfer rule around the rung below's choice."""
    if below is None:
        return {arm: list(spec["lr"]["first"]) for arm in spec["arms"]}
    missing = [a for a in spec["arms"] if a not in below]
    if missing:
        raise UserError(f"the rung below chose no LR for {missing}: finish it first")
    return {arm: [float(f"{below[arm] * f:.4g}") for f in spec["lr"]["transfer"]] for arm in spec["arms"]}


def committed(rung_dir: Path) -> Path | None:
    """The committed records of a rung or data-axis cell finished in an earlier session (they stand
    in for its run folder, which a later session does not have); None while this session runs it."""
    stored = STORED / rung_dir.name
    return stored if not (rung_dir / "runs").is_dir() and (stored / "sweep.yaml").is_file() else None


def run_family(
    spec: dict[str, Any], family: str, only: set[str] | None, parallel: int, plan: bool, max_extend: int | None = None
) -> int:
    """Every rung of one family in order; returns the number of rungs finished."""
    out = Path(spec["out"])
    below: dict[str, float] | None = None
    done = 0
    for rung in spec["rungs"]:
        rung_dir = out / f"{family}-{rung['name']}"
        spec_path = rung_dir / RUNG_SPEC
        if not plan and (only is None or rung["name"] in only):
            resume_progress(rung_dir)
        if stored := committed(rung_dir):  # its records carry the transfer on
            print(f"{family} {rung['name']}: stored in {stored.as_posix()}", flush=True)
            below = chosen_lrs(stored)
            done += 1
            continue
        if spec_path.is_file():  # a grid once written is never moved by a rerun
            rs = load_yaml_text(spec_path.read_text(encoding="utf-8"))
        else:
            if below is None and rung is not spec["rungs"][0]:
                print(f"{family} {rung['name']}: waits for the rung below", flush=True)
                return done
            rs = rung_spec(spec, family, rung, grid_from(spec, below))
        o = rs["overrides"]
        n, steps = total_params(o["model"], o["model_overrides"], VOCAB), o["steps"]
        print(f"{family} {rung['name']}: {n:,} parameters, {steps} steps ({steps * 1024:,} tokens)", flush=True)
        if plan:
            below = {arm: math.sqrt(g[0] * g[-1]) for arm, g in ((a, m["lr"]) for a, m in rs["methods"].items())}
            continue
        if only is not None and rung["name"] not in only:
            below = chosen_lrs(rung_dir) if (rung_dir / "runs").is_dir() else None
            continue
        _write_spec(spec_path, rs, max_extend)
        code = oelm(
            ["sweep", spec_path.as_posix(), "--out", rung_dir.as_posix(), "--parallel", str(parallel), "--threads", "1"]
        )
        if code != 0:
            print(f"{family} {rung['name']}: the sweep exited {code}; rerun to resume", flush=True)
            return done
        below = chosen_lrs(rung_dir)
        done += 1
    return done


def run_data_axis(
    spec: dict[str, Any],
    family: str,
    parallel: int,
    plan: bool,
    max_extend: int | None = None,
    only: set[str] | None = None,
) -> None:
    """The tokens-per-parameter axis: listed rungs (or only those named) again at larger budgets, each
    arm's grid centred on the LR the same rung chose at the ladder's budget (the same transfer rule),
    read from the rung's run folder or, once committed, from its stored records."""
    out = Path(spec["out"])
    rungs = {r["name"]: r for r in spec["rungs"]}
    for entry in spec.get("data_axis") or []:
        if only is not None and entry["rung"] not in only:
            continue
        rung = rungs[entry["rung"]]
        for ratio in entry["tokens_per_param"]:
            rung_dir = out / f"{family}-{rung['name']}-t{ratio:g}"
            spec_path = rung_dir / RUNG_SPEC
            if not plan:
                resume_progress(rung_dir)
            if stored := committed(rung_dir):
                print(f"{rung_dir.name}: stored in {stored.as_posix()}", flush=True)
                continue
            if spec_path.is_file():
                rs = load_yaml_text(spec_path.read_text(encoding="utf-8"))
            else:
                base_dir = out / f"{family}-{rung['name']}"
                source = committed(base_dir) or (base_dir if (base_dir / "runs").is_dir() else None)
                if plan and source is None:
                    below = {a: math.sqrt(spec["lr"]["first"][0] * spec["lr"]["first"][-1]) for a in spec["arms"]}
                elif source is None:
                    print(f"{family} {rung['name']} at {ratio:g} tokens per parameter: waits for the rung", flush=True)
                    continue
                else:
                    below = chosen_lrs(source)
                rs = rung_spec(spec, family, rung, grid_from(spec, below), ratio=ratio)
            steps = rs["overrides"]["steps"]
            print(f"{family} {rung['name']} at {ratio:g} tokens per parameter: {steps} steps", flush=True)
            if plan:
                continue
            _write_spec(spec_path, rs, max_extend)
            cmd = ["sweep", spec_path.as_posix(), "--out", rung_dir.as_posix(), "--parallel", str(parallel)]
            if oelm([*cmd, "--threads", "1"]) != 0:
                print(f"{rung_dir}: the sweep failed; rerun to resume", flush=True)
                return


def resume_progress(rung_dir: Path) -> int:
    """Restore a rung's runs stored under way in an earlier session (PROGRESS/<rung>) into its folder,
    with the rung's spec as first written, where the folder holds no runs yet; returns the runs restored."""
    saved = PROGRESS / rung_dir.name
    if (rung_dir / "runs").is_dir() or not (saved / RECORDS_FILE).is_file():
        return 0
    if (STORED / rung_dir.name / "sweep.yaml").is_file():
        raise UserError(
            f"{rung_dir.name} is stored in {STORED.as_posix()} and under way in {saved.as_posix()}: remove {saved.as_posix()}"
        )
    n = store_records.restore(saved, rung_dir)
    atomic_write_text(rung_dir / RUNG_SPEC, (saved / RUNG_SPEC).read_text(encoding="utf-8"))
    print(f"{rung_dir.name}: {n} finished runs restored from {saved.as_posix()}", flush=True)
    return n


def save_progress(out: Path) -> list[str]:
    """Store the finished runs of every rung under way in OUT (not yet stored whole in STORED) as
    PROGRESS/<rung>, with the rung's spec; returns a line per rung saved."""
    lines = []
    for rung_dir in sorted(p for p in out.glob("*") if (p / "runs").is_dir() and (p / RUNG_SPEC).is_file()):
        if (STORED / rung_dir.name / "sweep.yaml").is_file():
            continue
        n = store_records.store(rung_dir, PROGRESS / rung_dir.name)
        text = store_records.repo_relative((rung_dir / RUNG_SPEC).read_text(encoding="utf-8"))
        atomic_write_text(PROGRESS / rung_dir.name / RUNG_SPEC, text)  # names no machine's folders
        lines.append(f"{rung_dir.name}: {n} finished runs -> {(PROGRESS / rung_dir.name).as_posix()}")
    return lines


def _write_spec(path: Path, rs: dict[str, Any], max_extend: int | None) -> None:
    """Write a rung's spec the first time; rewrite it only to raise its extension limit when asked."""
    if max_extend is not None and max_extend != rs.get("max_extend"):
        if max_extend < int(rs.get("max_extend") or 0):
            raise UserError(
                f"{path}: --max-extend {max_extend} is below the rung's {rs['max_extend']}; it only raises it"
            )
        print(f"{path.parent.name}: grids may extend {max_extend} times per side (declared: {rs.get('max_extend')})")
        rs["max_extend"] = max_extend
    elif path.is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, _dump(rs))


def _dump(raw: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(raw, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", type=Path)
    p.add_argument("--family", nargs="+", default=None, help="families to run (default: all, in the spec's order)")
    p.add_argument(
        "--rungs",
        nargs="+",
        default=None,
        help="only these rungs (the ones below must be finished); with --data-axis, only these rungs' cells",
    )
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--plan", action="store_true", help="print each rung's size and budget; train nothing")
    p.add_argument("--data-axis", action="store_true", help="run the spec's tokens-per-parameter rungs instead")
    p.add_argument(
        "--max-extend",
        type=int,
        default=None,
        help="raise the named rungs' grid-extension limit past the spec's declared one (kept in their records)",
    )
    p.add_argument(
        "--save-progress",
        action="store_true",
        help="store the finished runs of the rungs under way for a later session to resume from; train nothing",
    )
    args = p.parse_args(argv)
    try:
        return run(args)
    except UserError as err:
        print(f"scale_ladder: error: {err}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """The ladder's command line, every argument checked against the spec before any rung runs."""
    spec = load(args.spec)
    if args.max_extend is not None and args.max_extend < 0:
        raise UserError(f"--max-extend {args.max_extend}: give a count of grid extensions per side (0 or more)")
    names = [r["name"] for r in spec["rungs"]]
    if args.rungs and (unknown := sorted(set(args.rungs) - set(names))):
        raise UserError(f"--rungs: no rung {unknown} in {args.spec}; its rungs: {names}")
    axis = [cell["rung"] for cell in spec.get("data_axis") or []]
    if args.data_axis and args.rungs and (off := sorted(set(args.rungs) - set(axis))):
        raise UserError(
            f"--rungs {off} with --data-axis: no data-axis cells at those rungs in {args.spec}; it has {axis}"
        )
    if unknown := sorted(set(args.family or ()) - set(spec["families"])):
        raise UserError(f"--family: no family {unknown} in {args.spec}; it has {sorted(spec['families'])}")
    if args.save_progress:
        print("\n".join(save_progress(Path(spec["out"]))) or "no rung under way", flush=True)
        return 0
    only = set(args.rungs) if args.rungs else None
    for family in args.family or list(spec["families"]):
        if args.data_axis:
            run_data_axis(spec, family, args.parallel, args.plan, args.max_extend, only)
        else:
            run_family(spec, family, only, args.parallel, args.plan, args.max_extend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
