"""The confirmation plan, CONFIRM_DIR/plan.json: what `oelm confirm plan` fixed before any run.

`oelm confirm plan` builds a `ConfirmationPlan` from a finished pilot sweep (the claims with their
pilot numbers, each arm at its chosen setting, the fresh seeds, the resolved config) and writes it
with `write_plan_file`, a sha256 of its content inside; `oelm confirm run` reads it back through
`read_plan`, which refuses a plan edited after it was written. `to_dict()` is the file's content,
key for key and in the file's order, so a stored plan reads back to the same bytes and its sha256
keeps verifying.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, clean_json, read_json_object, writable_dir

PLAN_FILE = "plan.json"
# What `oelm confirm run` found before its runs: the commit that held the plan, or that none did.
PLAN_COMMIT_FILE = "plan-commit.json"
KIND = "oelm confirmation plan"  # the file's "kind": what it is, for a reader that finds it alone
_WRITE_ONE = "write one with `oelm confirm plan SWEEP_DIR --seeds N --out DIR`"


def content_hash(content: Mapping[str, Any]) -> str:
    """sha256 of a plan's content (every key but `sha256`) as canonical JSON."""
    body = {k: v for k, v in content.items() if k != "sha256"}
    text = json.dumps(clean_json(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Pilot:
    """The pilot sweep the claims came from: its numbers are labelled pilot and enter no fresh statistic."""

    dir: str
    name: str
    seeds: list[int]  # every seed the pilot planned or ran: the fresh seeds avoid them
    runs: int
    sweep_yaml_sha256: str
    records_sha256: str  # over every pilot run's results.json: which records the claims came from
    reference_rule: str  # how the board chose its reference
    # The data fingerprint the pilot's runs record (meta.json's `fingerprint`, or a classification
    # run's examples): the fresh runs must train on the same data. None in plans written before it
    # was recorded (and for pilots whose runs record none); absent from their plan.json and hash.
    data_fingerprint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The pilot as plan.json holds it."""
        return {
            "dir": self.dir,
            "name": self.name,
            "seeds": self.seeds,
            "runs": self.runs,
            "sweep_yaml_sha256": self.sweep_yaml_sha256,
            "records_sha256": self.records_sha256,
            "reference_rule": self.reference_rule,
            **({"data_fingerprint": self.data_fingerprint} if self.data_fingerprint else {}),
        }


@dataclass(frozen=True)
class BoardTable:
    """The board table the claims are made in (one task, dataset, model and metric)."""

    task: str
    dataset: str
    model: str
    primary_metric: str
    higher_is_better: bool

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(task, dataset, model, primary metric): how a report's group is matched to the plan."""
        return (self.task, self.dataset, self.model, self.primary_metric)

    def to_dict(self) -> dict[str, Any]:
        """The table as plan.json holds it."""
        return {
            "task": self.task,
            "dataset": self.dataset,
            "model": self.model,
            "primary_metric": self.primary_metric,
            "higher_is_better": self.higher_is_better,
        }


@dataclass(frozen=True)
class PilotNumbers:
    """A claim's pilot statistics, as the pilot board's decision gave them."""

    seeds: int
    mean_gap: float | None  # % gap to the reference (None: not finite)
    holm_p: float | None
    tost_holm_p: float | None
    m: int  # comparisons Holm corrected over

    def to_dict(self) -> dict[str, Any]:
        """The numbers as plan.json holds them."""
        return {
            "seeds": self.seeds,
            "mean_gap": self.mean_gap,
            "holm_p": self.holm_p,
            "tost_holm_p": self.tost_holm_p,
            "m": self.m,
        }


@dataclass(frozen=True)
class Claim:
    """One planned arm's pilot verdict against the reference: what the fresh seeds must repeat."""

    method: str
    reference: str
    verdict: str  # the pilot decision's verdict (reports.stats: worse, better, equivalent, unresolved)
    wording: str  # the verdict as the board words it
    # False: an arm planned with --all whose pilot verdict was unresolved (compared, no claim).
    # None: the key is absent (plans written before --all, where every entry is a claim).
    claim: bool | None
    direction: str
    margin: float
    pilot: PilotNumbers

    @property
    def is_claim(self) -> bool:
        """Whether the fresh seeds confirm or refute this entry (False: a fresh comparison only)."""
        return self.claim is not False

    def to_dict(self) -> dict[str, Any]:
        """The claim as plan.json holds it."""
        return {
            "method": self.method,
            "reference": self.reference,
            "verdict": self.verdict,
            "wording": self.wording,
            **({} if self.claim is None else {"claim": self.claim}),
            "direction": self.direction,
            "margin": self.margin,
            "pilot": self.pilot.to_dict(),
        }


@dataclass(frozen=True)
class FixedArm:
    """One arm fixed at the setting the pilot's validation chose."""

    lr: float
    setting: str  # the pilot's setting directory name (e.g. lr0.003)
    method_options: dict[str, Any] | None = None  # the pilot arm's options (None: it had none)

    def to_dict(self) -> dict[str, Any]:
        """The arm as plan.json holds it."""
        return {"lr": self.lr, "setting": self.setting} | (
            {"method_options": self.method_options} if self.method_options is not None else {}
        )


@dataclass(frozen=True)
class SeedPlan:
    """How many fresh seeds one planned comparison needs, from a conservative SD of its pilot, fixed
    before any run: the seeds for `power` at ±margin at the Holm level `alpha` (alpha / m), from the
    one-sided `confidence` chi-square upper bound of the pilot's SD of per-seed % gaps."""

    method: str
    compared_with: str
    pilot_seeds: int  # paired pilot seeds behind pilot_sd
    pilot_sd: float | None  # SD of the pilot's per-seed % gaps (None below 2 paired seeds)
    sd_upper: float | None  # its chi-square upper confidence bound (None below MIN_PILOT_SEEDS)
    confidence: float
    margin: float  # the gap (in %) the planned seeds must detect
    alpha: float  # the level of the test: alpha / m, Holm's strictest step
    power: float
    needed: int | None  # fresh seeds for `power` at ±margin (None: not computable, see note)
    planned: int  # fresh seeds in the plan
    note: str  # what the plan says before any run: enough, or why not and that the claim becomes a bound

    @property
    def enough(self) -> bool:
        """Whether the planned seeds reach the power at the margin."""
        return self.needed is not None and self.planned >= self.needed

    def to_dict(self) -> dict[str, Any]:
        """The entry as plan.json holds it."""
        return {k: getattr(self, k) for k in _SEED_PLAN_KEYS}


@dataclass(frozen=True)
class SkippedSeed:
    """A seed above the pilot's that the plan did not take: stored runs under `under` had already run
    it under a planned configuration (the same table, method, model overrides and steps)."""

    seed: int
    under: list[str]  # the record folders holding such runs

    def to_dict(self) -> dict[str, Any]:
        """The entry as plan.json holds it."""
        return {"seed": self.seed, "under": self.under}


@dataclass(frozen=True)
class ConfirmationPlan:
    """plan.json as data: the claims, the arms at their fixed settings and the fresh seeds."""

    pilot: Pilot
    table: BoardTable
    reference: str
    margin: float  # the equivalence margin in %, the pilot board's
    claims: list[Claim]  # in the pilot board's order
    arms: dict[str, FixedArm]  # the reference first, then every claim's arm
    grid: dict[str, Any]  # the pilot grid's values every arm runs at
    seeds: list[int]  # the fresh seeds
    config: dict[str, Any]  # the pilot's resolved base config
    prepare: dict[str, Any] | None  # the pilot's data preparation, if it had one
    sha256: str = ""  # of every other key (content_hash); "" until sealed()
    # The primary comparisons, [method, compared with] pairs of planned arms: Holm runs over them
    # only, every other comparison is exploratory. None: none declared (plans written before the key).
    primary: list[list[str]] | None = None
    # Fresh seeds each planned comparison needs (SeedPlan); None in plans written before the key.
    seed_plan: list[SeedPlan] | None = None
    # Seeds above the pilot's skipped as already run under a planned configuration elsewhere in the
    # stored records; None where none was skipped (and in plans written before the key).
    skipped_seeds: list[SkippedSeed] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan as plan.json holds it, key for key and in the file's order."""
        return {
            "kind": KIND,
            "pilot": self.pilot.to_dict(),
            "table": self.table.to_dict(),
            "reference": self.reference,
            "margin": self.margin,
            "claims": [c.to_dict() for c in self.claims],
            "arms": {m: a.to_dict() for m, a in self.arms.items()},
            "grid": self.grid,
            "seeds": self.seeds,
            "config": self.config,
            "prepare": self.prepare,
            # Written only when set, so a plan written before these keys keeps its bytes and sha256.
            **({} if self.primary is None else {"primary": self.primary}),
            **({} if self.seed_plan is None else {"seed_plan": [e.to_dict() for e in self.seed_plan]}),
            **({} if self.skipped_seeds is None else {"skipped_seeds": [e.to_dict() for e in self.skipped_seeds]}),
            "sha256": self.sha256,
        }

    @property
    def verified(self) -> bool:
        """Whether sha256 is the hash of the content."""
        return self.sha256 == content_hash(self.to_dict())

    def sealed(self) -> ConfirmationPlan:
        """This plan as plan.json will hold it: JSON values only (paths as strings, non-finite
        numbers as null) and the sha256 of that content."""
        content = clean_json(json.loads(json.dumps(self.to_dict(), default=str)))
        content["sha256"] = content_hash(content)
        return ConfirmationPlan.from_dict(content, "the new plan")

    @classmethod
    def from_dict(cls, raw: Any, source: str | Path) -> ConfirmationPlan:
        """A plan from plan.json's content; one UserError naming `source` (the file) when a key is
        missing or unknown or a part is not the kind of value plan.json holds there."""
        read = _Reader(source)
        top = read.keys(raw, "the plan", _PLAN_KEYS, ("primary", "seed_plan", "skipped_seeds"))
        if top["kind"] != KIND:
            read.fail(f"its kind is {top['kind']!r}, not {KIND!r}")
        pilot = read.keys(top["pilot"], "pilot", _PILOT_KEYS, ("data_fingerprint",))
        table = read.keys(top["table"], "table", _TABLE_KEYS)
        claims = read.kind(top["claims"], list, "claims", "a list")
        arms = read.kind(top["arms"], dict, "arms", "a mapping")
        prepare = top["prepare"]
        if prepare is not None:
            prepare = read.kind(prepare, dict, "prepare", "a mapping or null")
        return cls(
            pilot=Pilot(**pilot),
            table=BoardTable(**table),
            reference=top["reference"],
            margin=top["margin"],
            claims=[read.claim(c, f"claims[{i}]") for i, c in enumerate(claims)],
            arms={m: FixedArm(**read.keys(a, f"arms[{m!r}]", _ARM_KEYS, ("method_options",))) for m, a in arms.items()},
            grid=read.kind(top["grid"], dict, "grid", "a mapping"),
            seeds=read.kind(top["seeds"], list, "seeds", "a list"),
            config=read.kind(top["config"], dict, "config", "a mapping"),
            prepare=prepare,
            sha256=top["sha256"],
            primary=None if top.get("primary") is None else read.kind(top["primary"], list, "primary", "a list"),
            seed_plan=None
            if top.get("seed_plan") is None
            else [
                SeedPlan(**read.keys(e, f"seed_plan[{i}]", _SEED_PLAN_KEYS))
                for i, e in enumerate(read.kind(top["seed_plan"], list, "seed_plan", "a list"))
            ],
            skipped_seeds=None
            if top.get("skipped_seeds") is None
            else [
                SkippedSeed(**read.keys(e, f"skipped_seeds[{i}]", ("seed", "under")))
                for i, e in enumerate(read.kind(top["skipped_seeds"], list, "skipped_seeds", "a list"))
            ],
        )


_PLAN_KEYS = (
    "kind",
    "pilot",
    "table",
    "reference",
    "margin",
    "claims",
    "arms",
    "grid",
    "seeds",
    "config",
    "prepare",
    "sha256",
)
_PILOT_KEYS = ("dir", "name", "seeds", "runs", "sweep_yaml_sha256", "records_sha256", "reference_rule")
_TABLE_KEYS = ("task", "dataset", "model", "primary_metric", "higher_is_better")
_CLAIM_KEYS = ("method", "reference", "verdict", "wording", "direction", "margin", "pilot")
_NUMBERS_KEYS = ("seeds", "mean_gap", "holm_p", "tost_holm_p", "m")
_ARM_KEYS = ("lr", "setting")
_SEED_PLAN_KEYS = (
    "method",
    "compared_with",
    "pilot_seeds",
    "pilot_sd",
    "sd_upper",
    "confidence",
    "margin",
    "alpha",
    "power",
    "needed",
    "planned",
    "note",
)


class _Reader:
    """Checks plan.json's parts; every problem is one UserError naming the file."""

    def __init__(self, source: str | Path) -> None:
        self.source = source

    def fail(self, problem: str) -> NoReturn:
        raise UserError(f"{self.source} is not a confirmation plan: {problem}; {_WRITE_ONE}")

    def kind(self, value: Any, kind: type, where: str, what: str) -> Any:
        if not isinstance(value, kind):
            self.fail(f"{where} is {type(value).__name__}, not {what}")
        return value

    def keys(self, raw: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
        """raw, a mapping with every required key and no key outside required + optional."""
        raw = self.kind(raw, dict, where, "a mapping")
        missing = [k for k in required if k not in raw]
        if missing:
            self.fail(f"{where} has no key {', '.join(map(repr, missing))}")
        unknown = [k for k in raw if k not in required and k not in optional]
        if unknown:
            self.fail(f"{where} has unknown key {', '.join(map(repr, unknown))}")
        return raw

    def claim(self, raw: Any, where: str) -> Claim:
        fields = dict(self.keys(raw, where, _CLAIM_KEYS, ("claim",)))
        fields["pilot"] = PilotNumbers(**self.keys(fields["pilot"], f"{where}.pilot", _NUMBERS_KEYS))
        return Claim(**{"claim": None} | fields)


def read_plan(folder: str | Path) -> ConfirmationPlan:
    """FOLDER/plan.json after checking its sha256 (an edited plan is refused)."""
    path = Path(folder) / PLAN_FILE
    raw = read_json_object(path, f"write it first with `oelm confirm plan SWEEP_DIR --seeds N --out {folder}`")
    if raw.get("sha256") != content_hash(raw):
        raise UserError(
            f"{path} does not match its sha256: it was edited after it was written. A confirmation runs "
            "only the plan fixed before the runs; write a new plan with `oelm confirm plan` into another --out"
        )
    return ConfirmationPlan.from_dict(raw, path)


def write_plan_file(folder: str | Path, plan: ConfirmationPlan) -> Path:
    """Write FOLDER/plan.json atomically; the same plan again is a no-op, a different one an error."""
    if not plan.verified:
        raise ValueError("write_plan_file needs a sealed plan (ConfirmationPlan.sealed()): its sha256 is not its hash")
    path = Path(folder) / PLAN_FILE
    content = plan.to_dict()
    if path.is_file():
        stored = read_json_object(path, "remove it or pass another --out")
        if stored != content:
            raise UserError(
                f"{path} holds a different plan (sha256 {str(stored.get('sha256'))[:12]}, this one "
                f"{plan.sha256[:12]}); a plan is fixed once written: pass another --out"
            )
        return path
    writable_dir(path.parent, "confirmation's folder", "pass another --out")
    atomic_write_json(path, content)
    return path


@dataclass(frozen=True)
class PlanCommit:
    """Whether a plan was in a git commit before its runs, as `oelm confirm run` found it the first
    time it ran (before any run trained): the oldest commit whose file held the plan's content, or
    none (the run was let through by --uncommitted-plan). Written once, kept by every later call."""

    plan_sha256: str
    commit: str | None  # None: the plan was in no commit when the runs began
    date: str | None  # the commit's committer date (ISO 8601)
    path: str | None  # the committed copy, relative to its repository
    checked: str  # UTC time of the check, before the first run trained

    @property
    def committed(self) -> bool:
        """Whether a commit held the plan before the runs."""
        return self.commit is not None

    def to_dict(self) -> dict[str, Any]:
        """The record as plan-commit.json holds it."""
        return {
            "plan_sha256": self.plan_sha256,
            "commit": self.commit,
            "date": self.date,
            "path": self.path,
            "checked": self.checked,
        }


_PLAN_COMMIT_KEYS = ("plan_sha256", "commit", "date", "path", "checked")


def read_plan_commit(folder: str | Path, plan: ConfirmationPlan) -> PlanCommit | None:
    """FOLDER/plan-commit.json (None where absent: confirmations run before the check); one
    UserError when it is malformed or belongs to another plan."""
    path = Path(folder) / PLAN_COMMIT_FILE
    if not path.is_file():
        return None
    fix = "restore it from git (it records what `oelm confirm run` found before the runs)"
    raw = read_json_object(path, fix)
    if set(raw) != set(_PLAN_COMMIT_KEYS) or not isinstance(raw["checked"], str):
        raise UserError(f"{path} is not a plan-commit record (keys {', '.join(_PLAN_COMMIT_KEYS)}); {fix}")
    if raw["plan_sha256"] != plan.sha256:
        raise UserError(
            f"{path} records plan {str(raw['plan_sha256'])[:12]}, but {PLAN_FILE} beside it is {plan.sha256[:12]}; "
            f"{fix}"
        )
    return PlanCommit(**raw)


def write_plan_commit(folder: str | Path, record: PlanCommit) -> Path:
    """Write FOLDER/plan-commit.json atomically."""
    path = Path(folder) / PLAN_COMMIT_FILE
    atomic_write_json(path, record.to_dict())
    return path
