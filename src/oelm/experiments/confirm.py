"""Confirmation on fresh seeds: a board's claims, fixed before running, tested on seeds never used to select.

`plan` reads a finished pilot sweep through the same board as `oelm report --view board` (each arm's LR
chosen on the pilot's validation, verdicts against the board's reference), takes its claims (every
method whose verdict is resolved or equivalent, or the named ones), fixes each arm at its chosen
setting, picks seeds the pilot never used and writes DIR/plan.json with a sha256 of its content
before anything runs. `run` refuses an edited plan, trains exactly the planned runs with the sweep
machinery (resumable), and tests every claim on the fresh seeds only, with the reports' own
comparison: per-seed paired % gaps, Holm over the claims, TOST within the plan's margin.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from oelm.data.lm import read_meta
from oelm.experiments.executors import ExecutorSpec
from oelm.experiments.prepare import ensure_lm_data
from oelm.experiments.runner import LOCAL, SweepOutcome, run_sweep
from oelm.experiments.sweep import SweepSpec, planned_identities, validate
from oelm.records.compact import RUN_RECORD_FILE, record_text
from oelm.records.comparable import config_differences
from oelm.records.load import find_run_dirs, load_run, load_runs, stored_record
from oelm.records.plan import (
    KIND,
    PLAN_COMMIT_FILE,
    PLAN_FILE,
    BoardTable,
    Claim,
    ConfirmationPlan,
    FixedArm,
    Pilot,
    PilotNumbers,
    PlanCommit,
    SeedPlan,
    SkippedSeed,
    content_hash,
    read_plan,
    read_plan_commit,
    write_plan_commit,
    write_plan_file,
)
from oelm.records.run import RESULTS_FILE, RunRecord
from oelm.records.sweep import SWEEP_FILE, check_primary, read_sweep_record
from oelm.reports import stats
from oelm.reports.aggregate import (
    MAX_SPREAD,
    Arm,
    Group,
    Versus,
    compare,
    gap_by_seed,
    require_arm,
    stability_check,
)
from oelm.reports.board import Entry, build
from oelm.reports.comparison import page_json
from oelm.reports.tables import (
    family_lines,
    fmt_gap,
    fmt_p,
    fmt_verdict,
    md_table,
    text_table,
    verdict_text,
)
from oelm.utils import git
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, atomic_write_text, no_file_in_the_way, writable_dir

CONFIRMED, NOT_CONFIRMED = "confirmed", "not confirmed"
# An arm planned with --all whose pilot verdict was unresolved: no claim, only its fresh comparison.
NO_CLAIM = "no pilot claim (fresh comparison)"
MIN_SEEDS = stats.MIN_PAIRED_SEEDS  # fewer fresh seeds than this cannot test anything
_DIRECTION = {stats.WORSE: "gap > 0 (worse)", stats.BETTER: "gap < 0 (better)"}


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# plan


def _pilot_spec(sweep_dir: Path) -> SweepSpec:
    """The pilot as its SWEEP/sweep.yaml records it (base config, arms, seeds, grid)."""
    record = read_sweep_record(sweep_dir)
    if record is None:
        raise UserError(f"{sweep_dir / SWEEP_FILE} not found; pass the directory `oelm sweep` wrote")
    return SweepSpec.from_record(record)


# sha256 of no bytes: what the records hash was when it read no record (plans written before
# records_hash counted compact records hold it; see pilot_link_lines).
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _result_digest(run_dir: Path) -> str | None:
    """sha256 of a run's results: results.json of a run directory, else its committed record
    (record.json, or its line in a board's records file, hashed as the record.json text it is)."""
    for name in (RESULTS_FILE, RUN_RECORD_FILE):
        if (run_dir / name).is_file():
            return _file_hash(run_dir / name)
    raw = stored_record(run_dir)
    return None if raw is None else hashlib.sha256(record_text(raw).encode("utf-8")).hexdigest()


def records_hash(sweep_dir: str | Path, run_dirs: Sequence[Path]) -> tuple[str, int]:
    """sha256 over every pilot run's results (results.json, or record.json for a committed compact
    record; by path), and how many it read: which records the claims came from.

    A UserError when it reads none: the sha256 of no records ties a plan to nothing (the Llama 124k
    and AG News plans carry one, written when only results.json was read and their pilots were
    committed records holding record.json)."""
    files = [(d, f) for d in run_dirs if (f := _result_digest(Path(d))) is not None]
    if not files:
        raise UserError(
            f"{sweep_dir}: none of its {len(run_dirs)} runs holds {RESULTS_FILE} or {RUN_RECORD_FILE}, so the plan "
            "could tie its claims to no record; pass the finished pilot (a directory `oelm sweep` wrote, "
            "or its committed records)"
        )
    lines = sorted(f"{os.path.relpath(d, sweep_dir)} {f}" for d, f in files)
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest(), len(files)


def _overrides(value: Any) -> str:
    return json.dumps(value or {}, sort_keys=True, default=str)


def _same(planned: Any, stored: Any) -> bool:
    """Whether a planned and a stored value agree; an unknown one (None) agrees with any."""
    return planned is None or stored is None or planned == stored


def _planned_keys(spec: SweepSpec, settings: dict[str, tuple[FixedArm, dict[str, Any]]]) -> set[tuple]:
    """(method, model overrides, steps) of every planned arm: what a stored run must share, with the
    board's task, dataset and model, to have run a planned seed under the same configuration."""
    keys = set()
    for run in spec.runs():
        arm = settings.get(run.method)
        if arm is not None and run.run_dir.parent.name == arm[0].setting:
            # As the spec sets them (steps left to the default: None, which matches any value).
            keys.add((run.method, _overrides(run.config.get("model_overrides")), run.config.get("steps")))
    return keys


def _record_folder(run_dir: Path) -> str:
    """The sweep or record folder of a run: the folder above its runs/ (the run's own folder without one)."""
    parts = run_dir.parts
    top = len(parts) - 1 - parts[::-1].index("runs") if "runs" in parts else len(parts)
    folder = Path(*parts[:top]) if top else run_dir
    if folder.is_absolute() and _inside(folder, Path.cwd()):  # a plan names no machine's folder it can avoid
        folder = folder.resolve().relative_to(Path.cwd().resolve())
    return folder.as_posix()


def used_seeds(folders: Sequence[str | Path], table: tuple[str, str, str], keys: set[tuple]) -> dict[int, list[str]]:
    """Seeds that stored runs under FOLDERS already ran under a planned configuration: the same task,
    dataset and model (`table`), and a planned arm's method, model overrides and steps (`keys`; a
    record that does not keep its overrides or steps, one rebuilt from a stored table, matches on the
    rest). Each seed with the folders that hold such runs."""
    methods = {k[0] for k in keys}
    found: dict[int, list[str]] = {}
    for folder in folders:
        for path in find_run_dirs([folder]):
            run = load_run(path)
            res = run.results
            if (
                run.seed is None
                or run.method not in methods
                or (res.get("task"), res.get("dataset"), res.get("model")) != table
            ):
                continue
            overrides = _overrides(run.config.get("model_overrides")) if run.config else None
            steps = run.config.get("steps", res.get("steps"))
            if any(m == run.method and _same(o, overrides) and _same(n, steps) for m, o, n in keys):
                where = _record_folder(path)
                if where not in found.setdefault(run.seed, []):
                    found[run.seed].append(where)
    return found


def stored_records(sweep_dir: Path) -> list[Path]:
    """Where a plan looks for seeds already run, by default: docs/results of the repository the
    pilot sits in (nothing outside a repository)."""
    root = git.repository_root(sweep_dir)
    folder = root / "docs" / "results" if root is not None else None
    if folder is None or not folder.is_dir():
        return []
    return [Path(os.path.relpath(folder)) if _inside(folder, Path.cwd()) else folder]


def _setting(spec: SweepSpec, arm: Arm) -> tuple[FixedArm, dict[str, Any]]:
    """An arm fixed at the setting the pilot's validation chose (lr, method options), and its grid values."""
    for run in spec.runs():
        if run.method == arm.method and run.run_dir.parent.name == arm.setting:
            options = spec.methods[arm.method].get("method_options")
            return FixedArm(run.lr, arm.setting, options or None), run.extra
    raise UserError(f"{arm.method}'s chosen setting {arm.setting} is not a run of {spec.out / 'sweep.yaml'}")


def _claims(board: dict[str, Entry], reference: str, named: Sequence[str] | None, every: bool = False) -> list[Entry]:
    """The ranked entries whose pilot verdict is resolved or equivalent (or the named ones, which must be).

    `every`: every ranked arm but the reference, whatever its pilot verdict: the final comparison
    of a protocol whose pilot only chose the learning rates (unresolved pilots carry no claim).
    """
    if every:
        if named:
            raise UserError("--all plans every ranked arm; drop --claims (or drop --all to name claims)")
        return [e for m, e in board.items() if m != reference]
    if not named:
        claims = [e for m, e in board.items() if m != reference and e.versus.decision is not None]
        claims = [e for e in claims if e.versus.decision.verdict != stats.UNRESOLVED]
        if not claims:
            needs = [
                f"{m} {n}"
                for m, e in board.items()
                if m != reference and (pw := e.versus.power) is not None and (n := pw.seeds_for_observed)
            ]
            detail = (
                f" (seeds to detect each observed gap at {stats.POWER:.0%} power, were the pilot's SD the true one: "
                f"{', '.join(needs)})"
                if needs
                else ""
            )
            raise UserError(
                f"no claim to confirm: every method's pilot verdict against {reference} is unresolved{detail}; "
                "a pilot with about that many seeds (`oelm sweep SPEC.yaml --seeds ...`) can make a claim for "
                "`oelm confirm plan` to check on fresh seeds"
            )
        return claims
    out = []
    for name in dict.fromkeys(named):
        if name == reference:
            raise UserError(f"--claims {name}: that is the board's reference, which every claim is compared with")
        entry = board.get(name)
        if entry is None:
            raise UserError(f"--claims {name}: not a ranked method of the pilot board; ranked: {', '.join(board)}")
        d = entry.versus.decision
        if d is None or d.verdict == stats.UNRESOLVED:
            raise UserError(f"--claims {name}: its pilot verdict is {verdict_text(d)}: there is no claim to confirm")
        out.append(entry)
    return out


def _claim(entry: Entry, group: Group) -> Claim:
    """One claim as the plan fixes it (its pilot numbers, labelled pilot)."""
    d = entry.versus.decision
    assert d is not None and group.baseline is not None
    return Claim(
        method=entry.method,
        reference=group.baseline,
        verdict=d.verdict,
        wording=verdict_text(d),
        claim=d.verdict != stats.UNRESOLVED,
        direction=_DIRECTION.get(d.verdict, f"|gap| < {d.margin:g}% (equivalent)"),
        margin=d.margin,
        pilot=PilotNumbers(seeds=d.n, mean_gap=d.mean_gap, holm_p=d.holm_p, tost_holm_p=d.tost_holm_p, m=d.m),
    )


def _seed_entry(
    pair: tuple[str, str], group: Group, m: int, margin: float
) -> tuple[str, str, int, float | None, float | None, int | None]:
    """(method, compared with, pilot seeds, pilot SD, its upper bound, seeds needed) of one pair."""
    arms = {a.method: a for a in group.arms}
    gaps = list(gap_by_seed(arms[pair[0]], arms[pair[1]], group.higher_is_better).values())
    plan = stats.margin_seeds(gaps, margin, m)  # the count every report quotes as the seed plan's
    return pair[0], pair[1], plan.pilot_seeds, plan.pilot_sd, plan.sd_upper, plan.needed


def _seed_note(n: int, needed: int | None, upper: float | None, planned: int, margin: float) -> str:
    """What the plan says about one comparison's seeds before any run."""
    if upper is None:
        return (
            f"the pilot has {n} paired seed(s); an upper bound of its SD needs at least {stats.MIN_PILOT_SEEDS}, so "
            "no seed count is planned from it: the claim is stated as a bound (the fresh gap's one-sided 95% "
            "upper end); a pilot of at least 3 seeds per LR can plan one"
        )
    if needed is None:
        return f"more than {stats.MAX_SEEDS} seeds needed: the claim is stated as a bound"
    if planned >= needed:
        return f"{planned} planned >= {needed} needed: {stats.POWER:.0%} power at ±{margin:g}%"
    return (
        f"{needed} seeds needed, {planned} planned: the budget cannot reach {stats.POWER:.0%} power at "
        f"±{margin:g}%, so the claim is stated as a bound (the fresh gap's one-sided 95% upper end)"
    )


def seed_plan(
    pairs: Sequence[tuple[str, str]], group: Group, m: int, margin: float, n_seeds: int | None
) -> tuple[int, list[SeedPlan]]:
    """The fresh seeds to plan (n_seeds, else the most any pair needs) and each pair's SeedPlan: the
    seeds for 80% power at ±margin at Holm's level alpha / m, from the chi-square upper bound of the
    pilot's SD of per-seed % gaps."""
    entries = [_seed_entry(p, group, m, margin) for p in pairs]
    if n_seeds is None:
        missing = [f"{e[0]} vs {e[1]} ({e[2]} paired pilot seeds)" for e in entries if e[5] is None]
        if missing or not entries:
            raise UserError(
                f"--seeds not given and the pilot cannot plan them for {', '.join(missing) or 'any comparison'}: "
                f"an upper bound of the SD needs at least {stats.MIN_PILOT_SEEDS} paired pilot seeds; pass --seeds N "
                "(the claim is then stated as a bound) or run a larger pilot"
            )
        n_seeds = max(e[5] for e in entries if e[5] is not None)
    plans = [
        SeedPlan(
            method=method,
            compared_with=other,
            pilot_seeds=n,
            pilot_sd=sd,
            sd_upper=upper,
            confidence=stats.SD_CONFIDENCE,
            margin=margin,
            alpha=stats.ALPHA / m,
            power=stats.POWER,
            needed=needed,
            planned=n_seeds,
            note=_seed_note(n, needed, upper, n_seeds, margin),
        )
        for method, other, n, sd, upper, needed in entries
    ]
    return n_seeds, plans


def make_plan(
    sweep_dir: str | Path,
    n_seeds: int | None,
    claims: Sequence[str] | None = None,
    baseline: str | None = None,
    margin: float = stats.MARGIN,
    every: bool = False,
    primary: Sequence[Sequence[str]] | None = None,
    exclude_seeds_from: Sequence[str | Path] | None = None,
) -> ConfirmationPlan:
    """The sealed plan (with its sha256) for a finished pilot sweep: nothing is written or run.

    `primary`: the primary comparisons ([method, compared with] pairs of planned arms; default: the
    pilot's declared `primary`). `n_seeds` None: the seeds the seed plan asks for (seed_plan).
    Fresh seeds lie above every pilot seed and skip every seed a stored run under
    `exclude_seeds_from` (default: stored_records, docs/results of the pilot's repository) already
    ran under a planned configuration (used_seeds); the plan lists what it skipped.
    """
    sweep_dir = Path(sweep_dir)
    if n_seeds is not None and n_seeds < MIN_SEEDS:
        raise UserError(f"--seeds {n_seeds}: a paired test needs at least {MIN_SEEDS} fresh seeds")
    spec = _pilot_spec(sweep_dir)
    boards, _, runs = build([sweep_dir], baseline, margin=margin)
    if len(boards) != 1:
        raise UserError(f"{sweep_dir} holds {len(boards)} tables; a confirmation plans the claims of one table")
    group = boards[0].group
    if baseline is not None:
        require_arm([group], baseline)
    if group.baseline is None:
        raise UserError(f"{sweep_dir}: the board has no reference with finished runs; nothing can be claimed")
    ranked = {e.method: e for e in boards[0].ranked}
    if group.baseline not in ranked:
        raise UserError(f"the reference {group.baseline} is incomplete in {sweep_dir}: finish the pilot first")
    chosen = _claims(ranked, group.baseline, claims, every)
    settings = {group.baseline: _setting(spec, ranked[group.baseline].arm)} | {
        e.method: _setting(spec, e.arm) for e in chosen
    }
    extras = {json.dumps(extra, sort_keys=True) for _, extra in settings.values()}
    if len(extras) > 1:
        raise UserError(
            f"the arms chose different values of the pilot's grid ({', '.join(sorted(extras))}); a confirmation "
            "runs every arm at one set of grid values: name claims that share them with --claims"
        )
    where = f"{sweep_dir}: the plan's primary (plan its arms with --all or --claims)"
    pairs = check_primary([list(p) for p in (spec.primary if primary is None else primary)], settings, where)
    family = [(a, b) for a, b in pairs] or [(e.method, group.baseline) for e in chosen]
    n_seeds, seeds_for = seed_plan(family, group, len(family), margin, n_seeds)
    if n_seeds < MIN_SEEDS:
        raise UserError(f"--seeds {n_seeds}: a paired test needs at least {MIN_SEEDS} fresh seeds")
    pilot_seeds = sorted(set(spec.seeds) | {r.seed for r in runs if r.seed is not None})
    start = max(pilot_seeds, default=-1) + 1
    folders = stored_records(sweep_dir) if exclude_seeds_from is None else list(exclude_seeds_from)
    for folder in folders:
        if not Path(folder).is_dir():
            raise UserError(f"--exclude-seeds-from {folder}: not a folder; pass folders of run records")
    used = used_seeds(folders, (group.task, group.dataset, group.model), _planned_keys(spec, settings))
    fresh: list[int] = []
    seed = start
    while len(fresh) < n_seeds:
        if seed not in used:
            fresh.append(seed)
        seed += 1
    skipped = [SkippedSeed(s, sorted(used[s])) for s in sorted(used) if start <= s < seed]
    plan = ConfirmationPlan(
        pilot=Pilot(
            dir=os.path.normpath(sweep_dir),
            name=spec.name,
            seeds=pilot_seeds,
            runs=len(runs),
            sweep_yaml_sha256=_file_hash(sweep_dir / SWEEP_FILE),
            records_sha256=records_hash(sweep_dir, [r.path for r in runs])[0],
            reference_rule=boards[0].reference_rule,
            data_fingerprint=_one_fingerprint(runs),
        ),
        table=BoardTable(
            task=group.task,
            dataset=group.dataset,
            model=group.model,
            primary_metric=group.primary_metric,
            higher_is_better=group.higher_is_better,
        ),
        reference=group.baseline,
        margin=margin,
        claims=[_claim(e, group) for e in chosen],
        arms={method: arm for method, (arm, _) in settings.items()},
        grid=json.loads(extras.pop()),
        seeds=fresh,
        config=spec.base,
        prepare=spec.prepare,
        primary=pairs or None,
        seed_plan=seeds_for,
        skipped_seeds=skipped or None,
    )
    return plan.sealed()


def _one_fingerprint(runs: Sequence[RunRecord]) -> str | None:
    """The data fingerprint the runs record, when they record one (the board refused two)."""
    prints = {fp for r in runs if (fp := r.results.get("data_fingerprint"))}
    return prints.pop() if len(prints) == 1 else None


def _inside(path: Path, parent: Path) -> bool:
    path, parent = path.resolve(), parent.resolve()
    return path == parent or parent in path.parents


def _named_relatively(sweep_dir: Path) -> Path:
    """The pilot as a plan names it: relative to the working directory, never one machine's folder.

    The SST-2 board's plan named its pilot /tmp/board37, so it could not be stored with its records
    (stored pages name no machine's folders) and a sealed plan cannot be edited: an absolute path
    under the working directory is made relative, one outside it is refused before anything is written.
    """
    if not sweep_dir.is_absolute():
        return sweep_dir
    here = Path.cwd().resolve()
    if _inside(sweep_dir, here):
        return sweep_dir.resolve().relative_to(here)
    raise UserError(
        f"the pilot {sweep_dir} is named by an absolute path outside the working directory, and plan.json "
        "would carry it (a plan is committed with its records, which name no machine's folders); run "
        "`oelm confirm plan` from a folder above the pilot and name it relatively (e.g. `cd "
        f"{sweep_dir.parent} && oelm confirm plan {sweep_dir.name} ...`)"
    )


def write_plan(
    sweep_dir: str | Path,
    out: str | Path,
    n_seeds: int | None,
    claims: Sequence[str] | None = None,
    baseline: str | None = None,
    margin: float = stats.MARGIN,
    every: bool = False,
    primary: Sequence[Sequence[str]] | None = None,
    exclude_seeds_from: Sequence[str | Path] | None = None,
) -> tuple[Path, ConfirmationPlan]:
    """Write OUT/plan.json before anything runs; the same plan again is a no-op, a different one an error."""
    out = Path(out)
    if _inside(out, Path(sweep_dir)):
        raise UserError(f"--out {out} lies inside the pilot {sweep_dir}; its runs would count as pilot runs")
    no_file_in_the_way(out, "confirmation's folder", "pass another --out")
    sweep_dir = _named_relatively(Path(sweep_dir))
    plan = make_plan(sweep_dir, n_seeds, claims, baseline, margin, every, primary, exclude_seeds_from)
    return write_plan_file(out, plan), plan


# ---------------------------------------------------------------------------------------------
# run


def plan_spec(plan: ConfirmationPlan, out: str | Path, validate_runs: bool = True) -> SweepSpec:
    """The planned runs as a sweep: the claims' arms and the reference at their fixed settings x the fresh seeds.

    validate_runs=False leaves every run's config unvalidated: `confirm report`, which trains nothing,
    validates the plan's config once instead (planned_identities)."""
    methods = {
        m: {"lr": [a.lr], **({"method_options": a.method_options} if a.method_options else {})}
        for m, a in plan.arms.items()
    }
    spec = SweepSpec(
        name=f"{plan.pilot.name}-confirm",
        base=dict(plan.config),
        methods=methods,
        seeds=list(plan.seeds),
        grid={k: [v] for k, v in plan.grid.items()},
        out=Path(out),
        prepare=plan.prepare,
        baseline=plan.reference,
        max_extend=0,  # the plan fixed each arm's LR: a confirmation never extends a grid
    )
    if validate_runs:
        validate(spec)
    return spec


@dataclass
class ClaimResult:
    """One claim and what the fresh seeds say about it."""

    claim: Claim
    arm: Arm | None
    versus: Versus | None  # the arm against the reference on the fresh seeds
    result: str
    why: str  # why not confirmed ('' when confirmed)
    complete: bool = True  # every planned seed of the claim and the reference finished
    # Where the seed plan could not reach its power: the one-sided 95% upper end of the fresh mean
    # per-seed gap (%), the bound the claim is stated as; None otherwise.
    bound: float | None = None


@dataclass(frozen=True)
class FreshStability:
    """The robust LR rule's stability check (reports.aggregate.stability_check) applied to one arm's
    fresh seeds at its fixed setting: no unstable run, and the seeds' (max - min) / |mean| of their
    validation selection values at most MAX_SPREAD. The pilot chose the setting on its own seeds; a
    setting whose fresh seeds fail the check would not have passed the rule on them."""

    method: str
    setting: str | None
    seeds: int  # fresh seeds with a kept selection value
    spread: float | None  # None: fewer than 2 values (records rebuilt from a stored table keep none)
    flag: str  # why the fresh seeds fail the check ('' where they pass or it cannot be checked)
    # The per-seed % gaps to the reference: their median beside their mean (a skew shows as a split).
    median_gap: float | None = None
    mean_gap: float | None = None

    @property
    def checked(self) -> bool:
        """Whether the check could see the seeds' scatter (or an unstable run)."""
        return bool(self.flag) or self.spread is not None

    def to_dict(self) -> dict[str, Any]:
        """The entry as confirmation.json holds it."""
        return {
            "method": self.method,
            "setting": self.setting,
            "seeds": self.seeds,
            "spread": self.spread,
            "max_spread": MAX_SPREAD,
            "checked": self.checked,
            "flag": self.flag or None,
            "median_gap_percent": self.median_gap,
            "mean_gap_percent": self.mean_gap,
        }


def fresh_stability(plan: ConfirmationPlan, group: Group | None) -> list[FreshStability]:
    """The stability check of every planned arm on the fresh seeds (reference first, as planned)."""
    if group is None:
        return []
    arms = {a.method: a for a in group.arms}
    ref = arms.get(plan.reference)
    out = []
    for method in plan.arms:
        arm = arms.get(method)
        cell = arm.chosen_cell if arm is not None else None
        if arm is None or cell is None:
            continue
        gaps = (
            list(gap_by_seed(arm, ref, group.higher_is_better).values()) if ref is not None and arm is not ref else []
        )
        out.append(
            FreshStability(
                method,
                arm.setting,
                len(cell.runs),
                cell.spread,
                stability_check([cell])[cell.setting],
                statistics.median(gaps) if gaps else None,
                statistics.fmean(gaps) if gaps else None,
            )
        )
    return out


@dataclass
class Confirmation:
    """The judged claims, the fresh-seed table they come from, and the sweep that trained the runs."""

    plan: ConfirmationPlan
    group: Group | None
    results: list[ClaimResult]
    outcome: SweepOutcome | None = None
    # What `confirm run` found before the runs (plan-commit.json); None: not recorded (run before the check).
    plan_commit: PlanCommit | None = None

    @property
    def stability(self) -> list[FreshStability]:
        """The stability rule's check of each planned arm on its fresh seeds."""
        return fresh_stability(self.plan, self.group)

    @property
    def flagged(self) -> dict[str, FreshStability]:
        """The arms whose fresh seeds fail the stability check, by method."""
        return {e.method: e for e in self.stability if e.flag}


def _fresh_runs(spec: SweepSpec) -> list[RunRecord]:
    """Records of exactly the planned runs (fresh seeds only: nothing else under the directory counts)."""
    planned = {os.path.normpath(r.run_dir) for r in spec.runs()}
    root = spec.out / "runs"
    dirs = find_run_dirs([root], missing_ok=True)
    return [load_run(d) for d in dirs if os.path.normpath(d) in planned]


def judge(plan: ConfirmationPlan, runs: Sequence[RunRecord]) -> tuple[Group | None, list[ClaimResult]]:
    """Each claim confirmed or not on these runs: the same paired test, Holm over the claims, the plan's margin."""
    seeds = set(plan.seeds)
    runs = [r for r in runs if r.seed in seeds]
    primary = [(str(a), str(b)) for a, b in plan.primary or []]
    groups = compare(runs, baseline=plan.reference, margin=plan.margin, primary=primary).groups if runs else []
    group = next((g for g in groups if (g.task, g.dataset, g.model, g.primary_metric) == plan.table.key), None)
    arms = {a.method: a for a in group.arms} if group is not None else {}
    ref = arms.get(plan.reference)
    results = []
    for claim in plan.claims:
        arm = arms.get(claim.method)
        short = [m for m, a in ((claim.method, arm), (plan.reference, ref)) if a is None or a.primary.n < len(seeds)]
        vs = group.versus_of(arm.method) if group is not None and arm is not None else None
        d = vs.decision if vs is not None else None
        if short:
            why = f"{', '.join(short)}: fewer than the {len(seeds)} planned seeds finished"
            results.append(ClaimResult(claim, arm, vs, NOT_CONFIRMED, why, complete=False))
        elif not claim.is_claim:
            results.append(ClaimResult(claim, arm, vs, NO_CLAIM, ""))
        elif d is not None and d.verdict == claim.verdict:
            results.append(ClaimResult(claim, arm, vs, CONFIRMED, ""))
        else:
            results.append(ClaimResult(claim, arm, vs, NOT_CONFIRMED, f"fresh verdict: {verdict_text(d)}"))
    short_of = {(e.method, e.compared_with) for e in plan.seed_plan or [] if not e.enough}
    for r in results:
        if (r.claim.method, plan.reference) in short_of and r.arm is not None and ref is not None:
            gaps = list(gap_by_seed(r.arm, ref, plan.table.higher_is_better).values())
            r.bound = stats.gap_upper_bound(gaps)
    return group, results


def seed_plan_lines(plan: ConfirmationPlan, results: Sequence[ClaimResult] = ()) -> list[str]:
    """The seed plan as the plan fixed it before any run, and the bound of every claim it could not power."""
    if not plan.seed_plan:
        return []
    first = plan.seed_plan[0]
    lines = [
        "## Seed plan (fixed before any run)",
        "",
        f"Seeds for {first.power:.0%} power at ±{first.margin:g}% (paired t at the Holm level "
        f"α/m = {first.alpha:.3g}), from the {first.confidence:.0%} chi-square upper bound of the pilot's SD of "
        "per-seed % gaps (a pilot of at least 3 paired seeds).",
        "",
    ]
    rows = [
        [
            f"{e.method} vs {e.compared_with}",
            f"{e.pilot_sd:.3g}% ({e.pilot_seeds} seeds)" if e.pilot_sd is not None else f"n/a ({e.pilot_seeds} seeds)",
            "n/a" if e.sd_upper is None else f"{e.sd_upper:.3g}%",
            "n/a" if e.needed is None else str(e.needed),
            str(e.planned),
            e.note,
        ]
        for e in plan.seed_plan
    ]
    head = ["comparison", "pilot SD of the gap", "upper bound", "seeds needed", "planned", "the plan says"]
    lines += md_table(head, rows)
    bounds = [r for r in results if r.bound is not None]
    if bounds:
        lines += [""] + [
            f"- {r.claim.method} (a bound: its seeds could not reach the planned power): the gap to "
            f"{r.claim.reference} is below {r.bound:+.2f}% with 95% confidence (one-sided)."
            for r in bounds
        ]
    return lines


def find_plan_commit(plan: ConfirmationPlan, folder: str | Path) -> tuple[str, str, str] | None:
    """(commit, committer date, path) of the oldest commit whose file holds this plan's content, in
    the repository FOLDER sits in or the working directory's (plans live in ignored folders such as
    runs/confirm/NAME: the committed copy is any file of HEAD's tree that is this plan, its sha256
    verifying); None where no commit holds it."""
    repos = [r for r in (git.repository_root(folder), git.repository_root(Path.cwd())) if r is not None]
    for repo in dict.fromkeys(repos):
        for path in git.committed_files_with(repo, plan.sha256, "*.json"):
            try:
                raw = json.loads(git.show(repo, "HEAD", path) or "")
            except json.JSONDecodeError:
                continue
            if not isinstance(raw, dict) or raw.get("kind") != KIND or raw.get("sha256") != plan.sha256:
                continue
            if content_hash(raw) != plan.sha256:
                continue  # an edited copy: not the plan
            commit, date = git.first_commit_with(repo, plan.sha256, path) or (None, None)
            if commit is not None and date is not None:
                return commit, date, path
    return None


def check_plan_commit(plan: ConfirmationPlan, out: Path, uncommitted: bool = False) -> PlanCommit:
    """The plan's commit before its runs: refused (one UserError) where no commit holds the plan,
    unless `uncommitted`; recorded in OUT/plan-commit.json the first time, kept by every later call
    (a resumed confirmation keeps what was true when its first run began). A record that names a
    commit is kept without asking git again: a copy of the tree without its history (a GPU machine
    that gets the working tree, scripts/gpu_ladder.py) runs a plan checked where the history was."""
    recorded = read_plan_commit(out, plan)
    if recorded is not None and recorded.commit is not None:
        return recorded
    found = find_plan_commit(plan, out)
    if found is None and not uncommitted:
        raise UserError(
            f"{out / PLAN_FILE} (sha256 {plan.sha256[:12]}) is in no git commit of this repository: a "
            "confirmation's plan is committed before its runs, so the order can be checked from history. Copy "
            f"it into the repository beside the board's records (e.g. `cp {out / PLAN_FILE} "
            "docs/results/NAME/records/plan.json`), commit it, then run again; or pass --uncommitted-plan, "
            "and the page says the plan was not committed before the runs"
        )
    if recorded is not None:
        return recorded
    commit, date, path = found or (None, None, None)
    checked = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    record = PlanCommit(plan.sha256, commit, date, path, checked)
    write_plan_commit(out, record)
    return record


def run_confirmation(
    out: str | Path,
    parallel: int = 1,
    threads: int | None = None,
    progress: bool = True,
    executor: ExecutorSpec = LOCAL,
    uncommitted_plan: bool = False,
) -> Confirmation:
    """Verify the plan and that a commit holds it (check_plan_commit), train its runs (finished ones
    are kept), judge the claims, write OUT/confirmation.*."""
    out = Path(out)
    plan = read_plan(out)
    spec = plan_spec(plan, out)
    committed = check_plan_commit(plan, out, uncommitted_plan)
    check_pilot_data(plan, spec)
    outcome = run_sweep(spec, parallel=parallel, progress=progress, report=False, threads=threads, executor=executor)
    fresh = _fresh_runs(spec)
    check_fresh_data(plan, fresh)
    group, results = judge(plan, fresh)
    confirmation = Confirmation(plan, group, results, outcome, committed)
    atomic_write_text(out / "confirmation.md", "\n".join(render(confirmation)) + "\n")
    atomic_write_json(out / "confirmation.json", page_json("confirmation", to_json(confirmation)))
    return confirmation


def pilot_fingerprint(plan: ConfirmationPlan) -> str | None:
    """The data fingerprint of the pilot's runs: the plan's, or (a plan written before it recorded
    one) the one the pilot's run records hold where they are still found; None when unknown."""
    if plan.pilot.data_fingerprint:
        return plan.pilot.data_fingerprint
    if not Path(plan.pilot.dir).is_dir():
        return None
    return _one_fingerprint(load_runs([plan.pilot.dir]))


def check_pilot_data(plan: ConfirmationPlan, spec: SweepSpec) -> None:
    """The prepared data a confirmation trains on must be the pilot's: data prepared again (other
    hold-out, source or tokenizer) would train the fresh seeds on other splits and judge them against
    the pilot. Checked before any run, from meta.json (prepared first from the plan's recipe, as
    the sweep would); a language-model task only (a classification run's fingerprint is known once
    it has read its examples: check_fresh_data refuses those before judging)."""
    pilot = pilot_fingerprint(plan)
    if pilot is None or spec.base.get("task", "lm") != "lm" or not spec.base.get("data"):
        return
    data = Path(spec.base["data"])
    if spec.prepare:
        ensure_lm_data(spec.prepare, data)
    fresh = read_meta(data).get("fingerprint")
    if fresh and fresh != pilot:
        raise UserError(
            f"{data} holds data fingerprint {fresh}, but the pilot {plan.pilot.dir} trained on {pilot}: the data "
            "was prepared again since (other hold-out, source or tokenizer), and the fresh seeds would be judged "
            "on other splits; prepare it again as the pilot did, or plan a new pilot on this data"
        )


def check_fresh_data(plan: ConfirmationPlan, runs: Sequence[RunRecord]) -> None:
    """The fresh runs must record the pilot's data fingerprint (also after the fact, by confirm report)."""
    pilot = pilot_fingerprint(plan)
    other = [r for r in runs if pilot and (fp := r.results.get("data_fingerprint")) and fp != pilot]
    if other:
        raise UserError(
            f"{len(other)} fresh run(s) trained on data fingerprint {other[0].results.get('data_fingerprint')}, "
            f"e.g. {other[0].path}, but the pilot {plan.pilot.dir} on {pilot}: the data was prepared again; "
            "retrain them on the pilot's data, or plan a new pilot on this data"
        )


def _check_runs_as_planned(folder: Path, planned: dict[str, dict[str, Any]], runs: Sequence[RunRecord]) -> None:
    """The runs `confirm report` judges must be the runs its plan.json plans, as `confirm run` checks
    their run folders: a plan.json of another pilot (other steps, data, model) over these runs
    would judge them as that pilot's confirmation. Live run directories and committed records alike;
    `planned`: each planned run's identity by its folder (planned_identities)."""
    stale = [
        (run, diff)
        for run in runs
        if (identity := planned.get(os.path.normpath(run.path))) is not None
        and (diff := config_differences(identity, run.config))
    ]
    if stale:
        run, diff = stale[0]
        raise UserError(
            f"{folder}: {len(stale)} of its runs were trained otherwise than its {PLAN_FILE} plans them, e.g. "
            f"{run.path} (differs in: {', '.join(diff[:5])}); the plan belongs to another pilot or the runs to "
            "another plan: report the folder whose plan trained these runs"
        )


def report_confirmation(folder: str | Path, out: str | Path | None = None) -> Confirmation:
    """Judge a finished confirmation again from FOLDER/plan.json and the runs under FOLDER/runs
    (live run directories or committed compact records): trains nothing, writes
    OUT/confirmation.* (default FOLDER), so a stored confirmation regenerates from its records."""
    folder = Path(folder)
    target = Path(out) if out is not None else folder
    fix = "pass --out with a writable folder (the records are only read)"
    no_file_in_the_way(target, "confirmation page's folder", fix)
    plan = read_plan(folder)
    spec = plan_spec(plan, folder, validate_runs=False)
    planned = planned_identities(spec)  # the plan's config validated once, not once per run
    runs = _fresh_runs(spec)
    missing = len(spec.runs()) - sum(1 for r in runs if r.finished)
    if missing:
        raise UserError(
            f"{folder}: {missing} of the plan's {len(spec.runs())} runs are missing or unfinished; "
            f"finish them with `oelm confirm run {folder}` first"
        )
    _check_runs_as_planned(folder, planned, runs)
    check_fresh_data(plan, runs)
    group, results = judge(plan, runs)
    confirmation = Confirmation(plan, group, results, plan_commit=read_plan_commit(folder, plan))
    writable_dir(target, "confirmation page's folder", fix)
    atomic_write_text(target / "confirmation.md", "\n".join(render(confirmation)) + "\n")
    atomic_write_json(target / "confirmation.json", page_json("confirmation", to_json(confirmation)))
    return confirmation


# ---------------------------------------------------------------------------------------------
# output


@dataclass(frozen=True)
class PilotLink:
    """A plan whose pilot records_sha256 is the sha256 of no records: the link to its pilot is
    missing. `recomputed`: the hash over the pilot's records as they are found now (after the fact,
    not part of the sealed plan) and how many it read; None where the pilot is not found here."""

    recomputed: tuple[str, int] | None


def pilot_link(plan: ConfirmationPlan) -> PilotLink | None:
    """None where the plan ties its pilot to records; else what can be said of the missing link."""
    if plan.pilot.records_sha256 != EMPTY_SHA256:
        return None
    folder = Path(plan.pilot.dir)
    dirs = find_run_dirs([folder], missing_ok=True)
    return PilotLink(records_hash(folder, dirs) if dirs else None)


def plan_commit_line(record: PlanCommit | None) -> str:
    """Whether a commit held the plan before the runs, as `confirm run` recorded it."""
    if record is None:
        return (
            "The plan's commit before the runs is not recorded: this confirmation ran before `oelm confirm run` "
            f"checked that a commit holds the plan (no {PLAN_COMMIT_FILE}), so the order of plan and runs is not "
            "shown here."
        )
    if not record.committed:
        return (
            f"**Plan not committed before the runs:** no commit held it when `oelm confirm run` began "
            f"({record.checked}); it ran with --uncommitted-plan."
        )
    return (
        f"Plan committed before the runs: `{record.path}` in commit `{record.commit}` ({record.date}), found by "
        f"`oelm confirm run` before its first run ({record.checked})."
    )


def pilot_link_lines(plan: ConfirmationPlan) -> list[str]:
    """The page's plain statement that the plan's pilot link is missing (nothing where it is not)."""
    link = pilot_link(plan)
    if link is None:
        return []
    pilot = plan.pilot
    text = (
        f"**The plan's pilot link is missing:** its pilot `records_sha256` is `{EMPTY_SHA256}`, the sha256 "
        f"of no records (the plan was written when only results.json files were hashed, and `{pilot.dir}` "
        "held committed record.json files), so the sealed plan does not say which pilot records its claims "
        "came from."
    )
    if link.recomputed is None:
        text += f" It is not recomputed here: `{pilot.dir}` is not found from this folder."
    else:
        sha, n = link.recomputed
        text += (
            f" Recomputed after the fact from the committed pilot records in `{pilot.dir}` ({n} records; the plan "
            f"counted {pilot.runs} runs): `{sha}`. That hash is not part of the sealed plan."
        )
    return [text, ""]


def _claim_cell(claim: Claim) -> str:
    return f"{claim.wording} (pilot, {claim.pilot.seeds} seeds, mean per-seed gap {claim.pilot.mean_gap:+.2f}%)"


def _row(c: ClaimResult, group: Group | None, flagged: dict[str, FreshStability] | None = None) -> list[str]:
    """Method, claim (pilot), fresh gap, fresh p, fresh verdict, result (with the stability flag of
    the arm's or the reference's fresh seeds)."""
    arm = c.arm
    fresh = [fmt_gap(arm, group), fmt_p(arm, group), fmt_verdict(arm, group)] if arm and group else ["n/a"] * 3
    result = c.result + ("" if c.complete else f" ({c.why})")
    marks = [m for m in (c.claim.method, c.claim.reference) if m in (flagged or {})]
    if marks:
        result += f" [stability flag: {', '.join(marks)}]"
    return [c.claim.method, _claim_cell(c.claim), *fresh, result]


def stability_lines(conf: Confirmation) -> list[str]:
    """The stability rule on the fresh seeds: each arm that fails it, or that every arm passes."""
    entries = conf.stability
    if not entries:
        return []
    rule = (
        "The robust LR rule's stability check, applied to the fresh seeds at each arm's fixed setting (no "
        f"unstable run; the seeds' (max - min) / |mean| of their validation selection values at most {MAX_SPREAD:.0%})"
    )
    flagged = [e for e in entries if e.flag]
    unchecked = [e.method for e in entries if not e.checked]
    if flagged:
        verdict = f"{len(flagged)} of {len(entries)} arm(s) flagged."
    elif len(unchecked) < len(entries):
        verdict = f"every arm it could check passes ({len(entries) - len(unchecked)} of {len(entries)})."
    else:
        verdict = "no arm could be checked."
    lines = [f"{rule}: {verdict}"]
    for e in flagged:
        skew = (
            f"; its per-seed gaps to {conf.plan.reference}: median {e.median_gap:+.2f}%, mean {e.mean_gap:+.2f}%"
            if e.median_gap is not None and e.mean_gap is not None
            else ""
        )
        rests = "every gap to it rests" if e.method == conf.plan.reference else "its fresh verdict rests"
        lines.append(
            f"- **Stability flag:** {e.method} at {e.setting}, on {e.seeds} fresh seeds: {e.flag}. The rule would "
            f"not accept this setting on these seeds, so {rests} on a setting at the edge of stability{skew}."
        )
    if unchecked:
        lines.append(
            f"- Not checked ({', '.join(unchecked)}): fewer than 2 of the arm's fresh records keep a validation "
            "selection value (records rebuilt from a stored table keep none)."
        )
    return lines


HEADER = ["Method", "Claim (pilot)", "Fresh mean per-seed gap [paired 95% CI]", "Fresh p", "Fresh verdict", "Result"]


def _skipped_text(plan: ConfirmationPlan) -> str:
    """' (seeds 3, 4 skipped: already run under a planned configuration in FOLDER)', or ''."""
    if not plan.skipped_seeds:
        return ""
    under = sorted({u for e in plan.skipped_seeds for u in e.under})
    return (
        f" (seeds {', '.join(str(e.seed) for e in plan.skipped_seeds)} skipped: already run under a planned "
        f"configuration in {', '.join(f'`{u}`' for u in under)})"
    )


def render(conf: Confirmation) -> list[str]:
    """confirmation.md as lines."""
    plan, pilot, table = conf.plan, conf.plan.pilot, conf.plan.table
    seeds = ", ".join(map(str, plan.seeds))
    n_ok = sum(c.result == CONFIRMED for c in conf.results)
    n_claims = sum(c.result != NO_CLAIM for c in conf.results)
    lrs = ", ".join(f"{m} {a.lr:g}" for m, a in plan.arms.items())
    return [
        f"# Confirmation of {pilot.name} on fresh seeds",
        "",
        f"Plan `{PLAN_FILE}`, sha256 `{plan.sha256}` (checked before the runs). Pilot `{pilot.dir}` "
        f"(seeds {', '.join(map(str, pilot.seeds))}, {pilot.runs} runs): its numbers are labelled pilot "
        "and enter no statistic below.",
        "",
        plan_commit_line(conf.plan_commit),
        "",
        *pilot_link_lines(plan),
        f"Fresh seeds {seeds}{_skipped_text(plan)}; {table.dataset} ({table.task}, {table.model}), {table.primary_metric}; "
        f"reference {plan.reference}; each arm at the LR its pilot validation chose "
        f"({lrs}). Each claim is tested on the fresh "
        f"seeds only: paired per-seed % gap to the reference, Holm over the {len(plan.claims)} claim(s), "
        f"TOST within ±{plan.margin:g}%. A claim is confirmed when the fresh verdict is the pilot's; an "
        f"arm whose pilot verdict was unresolved makes no claim, and its fresh verdict is the comparison.",
        "",
        *md_table(HEADER, [_row(c, conf.group, conf.flagged) for c in conf.results]),
        "",
        f"**{n_ok} of {n_claims} claim(s) confirmed.**"
        + (
            f" {len(conf.results) - n_claims} arm(s) compared on fresh seeds without a pilot claim."
            if n_claims < len(conf.results)
            else ""
        ),
        "",
        *[f"- **Warning:** {w}" for w in verdict_warnings(conf)],
        *([""] if verdict_warnings(conf) else []),
        *stability_lines(conf),
        *([""] if conf.stability else []),
        *(family_lines(conf.group) if conf.group is not None else []),
        *([""] if conf.plan.seed_plan else []),
        *seed_plan_lines(conf.plan, conf.results),
    ]


def verdict_warnings(conf: Confirmation) -> list[str]:
    """The fresh table's warnings (unequal budgets, unstable runs, ...): each changes how a verdict
    reads, so confirmation.md and the terminal both carry them."""
    return list(conf.group.warnings) if conf.group is not None else []


def summary_lines(conf: Confirmation) -> list[str]:
    """The short table `oelm confirm run` prints."""
    rows = [[c.claim.method, c.claim.wording, *_row(c, conf.group, conf.flagged)[4:]] for c in conf.results]
    return text_table(["Method", "Claim (pilot)", "Fresh verdict", "Result"], rows)


def _pilot_link_json(plan: ConfirmationPlan) -> dict[str, Any] | None:
    """confirmation.json's pilot_link: None where the plan ties its pilot to records."""
    link = pilot_link(plan)
    if link is None:
        return None
    sha, n = link.recomputed or (None, None)
    return {"missing": True, "recomputed_after_the_fact": {"records_sha256": sha, "records": n} if sha else None}


def to_json(conf: Confirmation) -> dict[str, Any]:
    """confirmation.json: the plan's identity, and per claim its pilot claim and fresh numbers."""

    def fresh(c: ClaimResult) -> dict[str, Any] | None:
        if c.arm is None or c.versus is None:
            return None
        vs = c.versus
        return {
            "seeds": sorted(c.arm.by_seed),
            "gap_percent": vs.gap,  # the gap of the means
            "mean_seed_gap_percent": vs.gap_paired.mean if vs.gap_paired else None,  # what the page prints
            "gap_paired": vs.gap_paired.to_dict() if vs.gap_paired else None,
            "decision": vs.decision.to_dict() if vs.decision else None,
            "verdict": verdict_text(vs.decision),
        }

    plan = conf.plan
    flagged = conf.flagged
    return {
        "plan_sha256": plan.sha256,
        "plan_commit": conf.plan_commit.to_dict() if conf.plan_commit is not None else None,
        "pilot": plan.pilot.to_dict(),
        "pilot_link": _pilot_link_json(plan),
        "reference": plan.reference,
        "seeds": plan.seeds,
        "margin": plan.margin,
        "primary": plan.primary,
        "seed_plan": [e.to_dict() for e in plan.seed_plan or []],
        "stability": [e.to_dict() for e in conf.stability],
        "claims": [
            {
                "method": c.claim.method,
                "lr": plan.arms[c.claim.method].lr,
                "claim": c.claim.to_dict(),
                "fresh": fresh(c),
                "result": c.result,
                "why": c.why or None,
                "bound": c.bound,
                "stability_flag": flagged[c.claim.method].flag if c.claim.method in flagged else None,
            }
            for c in conf.results
        ],
        "confirmed": sum(c.result == CONFIRMED for c in conf.results),
    }
