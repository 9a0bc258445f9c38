"""`oelm confirm`: a hashed plan fixed before running, fresh seeds only, each claim confirmed or not."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import git
from oelm.cli import main
from oelm.experiments.confirm import (
    CONFIRMED,
    EMPTY_SHA256,
    NO_CLAIM,
    NOT_CONFIRMED,
    PilotLink,
    make_plan,
    pilot_link,
    plan_spec,
    records_hash,
    report_confirmation,
    run_confirmation,
    write_plan,
)
from oelm.experiments.resolve import resolve_config
from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import spec_from_dict
from oelm.records.compact import write_record
from oelm.records.load import find_run_dirs, load_runs
from oelm.records.plan import (
    PLAN_COMMIT_FILE,
    PLAN_FILE,
    ConfirmationPlan,
    PlanCommit,
    content_hash,
    read_plan,
    write_plan_file,
)
from oelm.reports.comparison import page_sections
from oelm.reports.leaderboard import write_leaderboard
from oelm.reports.report import write_report
from oelm.training.config import dump_config
from oelm.utils.errors import UserError
from test_report import make_run
from test_sweep import TINY
from test_validate_once import count_validations
from train_utils import synthetic_lm_dir

BASE = [10.0, 10.2, 9.9]
# method -> per-seed relative gap to the baseline on the pilot seeds 0-2 (test perplexity, + = worse)
PILOT = {
    "oelm-freeze": [0.10, 0.11, 0.09],  # worse, resolved
    "oelm-random": [0.05, 0.045, 0.055],  # worse, resolved
    "oelm-qknorm": [0.03, -0.02, 0.01],  # unresolved: not a claim
}


@pytest.fixture(autouse=True)
def _work_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test works in its scratch folder: a plan names its pilot relative to the working directory."""
    monkeypatch.chdir(tmp_path)


def _pilot(tmp_path: Path) -> Path:
    """A finished pilot sweep written to the run-directory schema, with its sweep.yaml."""
    root = tmp_path / "pilot"
    for seed, ppl in enumerate(BASE):
        make_run(root, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        make_run(root, "baseline", 3e-4, seed, test_perplexity=ppl + 1, best_val_loss=1.7)
        for method, gaps in PILOT.items():
            make_run(root, method, 3e-3, seed, test_perplexity=ppl * (1 + gaps[seed]), best_val_loss=1.6)
            make_run(root, method, 1e-2, seed, test_perplexity=ppl * 2, best_val_loss=1.9)
    methods = {"baseline": {"lr": [3e-4, 1e-3]}} | {m: {"lr": [3e-3, 1e-2]} for m in PILOT}
    base = {**TINY, "data": str(synthetic_lm_dir(tmp_path / "data"))}
    record = {"name": "pilot", "base": base, "methods": methods, "seeds": [0, 1, 2], "grid": {}, "baseline": "baseline"}
    (root / "sweep.yaml").write_text(yaml.safe_dump(record))
    return root


def _as_planned(out: Path) -> None:
    """Give the fresh runs written by make_run the config the plan trains them with (a sweep refuses
    run folders that hold runs of other settings)."""
    for run in plan_spec(read_plan(out), out).runs():
        if run.run_dir.is_dir():
            (run.run_dir / "config.yaml").write_text(dump_config(resolve_config(run.config).config))


def test_plan_fixes_claims_lrs_and_fresh_seeds_under_a_hash(tmp_path: Path) -> None:
    pilot, out = _pilot(tmp_path), tmp_path / "confirm"
    path, plan = write_plan(pilot, out, 3)
    stored = json.loads(path.read_text())
    assert stored == plan.to_dict() and stored["sha256"] == content_hash(stored) == plan.sha256
    assert read_plan(out) == plan
    assert plan.seeds == [3, 4, 5] and not set(plan.seeds) & set(plan.pilot.seeds)
    assert plan.pilot.seeds == [0, 1, 2] and plan.reference == "baseline"
    assert [c.method for c in plan.claims] == ["oelm-random", "oelm-freeze"]  # board order; qknorm unresolved
    assert {c.wording for c in plan.claims} == {"worse (resolved)"}
    assert plan.claims[1].direction == "gap > 0 (worse)" and plan.claims[1].margin == 1.0
    assert {m: a.lr for m, a in plan.arms.items()} == {"baseline": 1e-3, "oelm-freeze": 3e-3, "oelm-random": 3e-3}
    assert not (out / "runs").exists()  # written before anything runs

    assert write_plan(pilot, out, 3)[1] == plan  # the same plan again: unchanged
    with pytest.raises(UserError, match="different plan"):
        write_plan(pilot, out, 4)
    with pytest.raises(UserError, match="inside the pilot"):
        write_plan(pilot, pilot / "confirm", 3)
    with pytest.raises(UserError, match="no claim to confirm"):
        write_plan(pilot, tmp_path / "other", 3, claims=["oelm-qknorm"])
    with pytest.raises(UserError, match="--baseline 'basline' names no arm of these runs; arms: baseline, "):
        write_plan(pilot, tmp_path / "typo", 3, baseline="basline")  # not "no reference with finished runs"
    assert not (tmp_path / "typo").exists()
    named = write_plan(pilot, tmp_path / "named", 3, claims=["oelm-random"])[1]
    assert [c.method for c in named.claims] == ["oelm-random"] and set(named.arms) == {"baseline", "oelm-random"}

    edited = {**stored, "arms": {**stored["arms"], "oelm-freeze": {**stored["arms"]["oelm-freeze"], "lr": 1e-2}}}
    path.write_text(json.dumps(edited, indent=2))
    with pytest.raises(UserError, match="edited after it was written"):
        read_plan(out)


REPO = Path(__file__).resolve().parents[1]
STORED_PLANS = sorted(REPO.glob("docs/results/**/records/final/plan.json"))


def test_the_stored_plans_are_found() -> None:
    names = {p.relative_to(REPO / "docs/results").parts[:-3] for p in STORED_PLANS}
    assert {("twin-board",), ("scale", "deep"), ("scale", "narrow"), ("scale", "wide")} <= names


@pytest.mark.parametrize("path", STORED_PLANS, ids=lambda p: "/".join(p.relative_to(REPO / "docs/results").parts[:-3]))
def test_a_stored_plan_reads_back_to_the_same_bytes_and_hash(path: Path, tmp_path: Path) -> None:
    plan = read_plan(path.parent)  # the sha256 verifies
    text = path.read_text(encoding="utf-8")
    assert plan.verified and plan.sealed() == plan and plan == ConfirmationPlan.from_dict(json.loads(text), path)
    assert json.dumps(plan.to_dict(), indent=2) + "\n" == text  # key for key, in order, same values
    assert write_plan_file(tmp_path, plan) == tmp_path / PLAN_FILE
    assert (tmp_path / PLAN_FILE).read_text(encoding="utf-8") == text
    assert write_plan_file(path.parent, plan) == path  # the same plan again: a no-op
    # confirmation.json, written from the same plan, carries its pilot and claims unchanged.
    done = page_sections(path.parent / "confirmation.json")
    assert done["plan_sha256"] == plan.sha256 and done["pilot"] == plan.pilot.to_dict()
    assert [c["claim"] for c in done["claims"]] == [c.to_dict() for c in plan.claims]
    assert [c["lr"] for c in done["claims"]] == [plan.arms[c.method].lr for c in plan.claims]


def test_an_edited_or_incomplete_plan_is_refused(tmp_path: Path) -> None:
    stored = json.loads(STORED_PLANS[0].read_text(encoding="utf-8"))
    plan = ConfirmationPlan.from_dict(stored, STORED_PLANS[0])
    path = tmp_path / PLAN_FILE

    def store(content: dict) -> None:
        path.write_text(json.dumps(content, indent=2), encoding="utf-8")

    for edit in ({"margin": 2.0}, {"seeds": [*stored["seeds"], 99]}, {"pilot": {**stored["pilot"], "runs": 1}}):
        store({**stored, **edit})
        with pytest.raises(UserError, match="does not match its sha256: it was edited after it was written"):
            read_plan(tmp_path)
        with pytest.raises(UserError, match="holds a different plan"):
            write_plan_file(tmp_path, plan)
    with pytest.raises(ValueError, match="sealed plan"):
        write_plan_file(tmp_path / "other", ConfirmationPlan.from_dict({**stored, "margin": 2.0}, "edited"))

    # A key missing (or one too many) with a matching hash: one UserError naming the file and the key.
    for drop, where in (("margin", "the plan has no key 'margin'"), ("verdict", "claims[0] has no key 'verdict'")):
        content = json.loads(json.dumps(stored))
        (content["claims"][0] if drop == "verdict" else content).pop(drop)
        store({**content, "sha256": content_hash(content)})
        with pytest.raises(UserError, match="^" + re.escape(f"{path} is not a confirmation plan: {where};")):
            read_plan(tmp_path)
    content = {**stored, "note": "x"}
    store({**content, "sha256": content_hash(content)})
    with pytest.raises(UserError, match="the plan has unknown key 'note'"):
        read_plan(tmp_path)

    # A plan written before --all has no "claim" key: every entry is a claim, and it stays absent.
    content = json.loads(json.dumps(stored))
    for claim in content["claims"]:
        del claim["claim"]
    store({**content, "sha256": content_hash(content)})
    legacy = read_plan(tmp_path)
    assert all(c.is_claim for c in legacy.claims) and legacy.to_dict() == {**content, "sha256": content_hash(content)}


def test_claims_confirmed_or_not_on_fresh_seeds_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pilot, out = _pilot(tmp_path), tmp_path / "confirm"
    assert main(["confirm", "plan", str(pilot), "--seeds", "3", "--out", str(out)]) == 0
    fresh = {3: 10.1, 4: 9.8, 5: 10.3}
    for seed, ppl in fresh.items():  # freeze stays ~10% worse; random is now within noise
        i = seed - 3
        make_run(out, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        make_run(out, "oelm-freeze", 3e-3, seed, test_perplexity=ppl * (1 + [0.10, 0.105, 0.095][i]), best_val_loss=1.6)
        make_run(out, "oelm-random", 3e-3, seed, test_perplexity=ppl * (1 + [0.01, -0.01, 0.005][i]), best_val_loss=1.6)
    make_run(out, "oelm-random", 3e-3, 0, test_perplexity=99.0, best_val_loss=1.6)  # a stray pilot seed: ignored
    _as_planned(out)
    capsys.readouterr()
    assert main(["confirm", "run", str(out), "--uncommitted-plan"]) == 0
    printed = capsys.readouterr().out
    assert "1 of 2 claim(s) confirmed" in printed and "not confirmed" in printed

    result = page_sections(out / "confirmation.json")
    by = {c["method"]: c for c in result["claims"]}
    assert by["oelm-freeze"]["result"] == CONFIRMED and by["oelm-random"]["result"] == NOT_CONFIRMED
    assert by["oelm-freeze"]["fresh"]["seeds"] == [3, 4, 5] and by["oelm-random"]["fresh"]["seeds"] == [3, 4, 5]
    assert by["oelm-freeze"]["fresh"]["gap_paired"]["mean"] == pytest.approx(10.0)
    assert by["oelm-freeze"]["fresh"]["decision"]["m"] == 2  # Holm over the claims
    assert by["oelm-random"]["why"].startswith("fresh verdict: ")
    md = (out / "confirmation.md").read_text()
    assert (
        "worse (resolved) (pilot, 3 seeds, mean per-seed gap +10.00%)" in md and "**1 of 2 claim(s) confirmed.**" in md
    )

    # `confirm report` judges the same records again without training: the same files.
    again = tmp_path / "again"
    assert main(["confirm", "report", str(out), "--out", str(again)]) == 0
    assert (again / "confirmation.md").read_text() == md
    assert page_sections(again / "confirmation.json") == result

    # A missing fresh run: the claim cannot be confirmed on fewer than the planned seeds.
    for run in (out / "runs" / "oelm-freeze").glob("*/seed5"):
        (run / "results.json").unlink()
    with pytest.raises(UserError, match="1 of the plan's 9 runs are missing or unfinished"):
        report_confirmation(out)  # judges records only: trains nothing, so it refuses
    conf = run_confirmation(out, uncommitted_plan=True, progress=False)
    freeze = next(c for c in conf.results if c.claim.method == "oelm-freeze")
    assert freeze.result == NOT_CONFIRMED and "fewer than the 3 planned" in freeze.why


def test_all_plans_every_arm_and_unresolved_pilots_make_no_claim(tmp_path: Path) -> None:
    """--all: the pilot only chose the LRs; every arm is compared on the fresh seeds."""
    pilot, out = _pilot(tmp_path), tmp_path / "final"
    assert main(["confirm", "plan", str(pilot), "--seeds", "3", "--out", str(out), "--all"]) == 0
    plan = read_plan(out)
    assert set(plan.arms) == {"baseline", *PILOT}
    claims = {c.method: c.is_claim for c in plan.claims}
    assert claims == {"oelm-freeze": True, "oelm-random": True, "oelm-qknorm": False}
    with pytest.raises(UserError, match="drop --claims"):
        write_plan(pilot, tmp_path / "both", 3, claims=["oelm-freeze"], every=True)
    for i, (seed, ppl) in enumerate({3: 10.1, 4: 9.8, 5: 10.3}.items()):
        make_run(out, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        make_run(out, "oelm-freeze", 3e-3, seed, test_perplexity=ppl * (1 + [0.10, 0.105, 0.095][i]), best_val_loss=1.6)
        make_run(out, "oelm-random", 3e-3, seed, test_perplexity=ppl * (1 + [0.05, 0.045, 0.05][i]), best_val_loss=1.6)
        make_run(out, "oelm-qknorm", 3e-3, seed, test_perplexity=ppl * (1 + [0.04, 0.041, 0.039][i]), best_val_loss=1.6)
    _as_planned(out)
    conf = run_confirmation(out, uncommitted_plan=True, progress=False)
    by = {c.claim.method: c for c in conf.results}
    assert by["oelm-freeze"].result == CONFIRMED and by["oelm-random"].result == CONFIRMED
    assert by["oelm-qknorm"].result == NO_CLAIM  # resolved on fresh seeds, but it was no pilot claim
    assert by["oelm-qknorm"].versus.decision.verdict == "worse" and by["oelm-qknorm"].versus.decision.m == 3
    md = (out / "confirmation.md").read_text()
    assert "**2 of 2 claim(s) confirmed.** 1 arm(s) compared on fresh seeds without a pilot claim." in md


def test_reports_quote_the_seed_plans_count_and_name_the_observed_gaps_apart(tmp_path: Path, capsys) -> None:
    """The seeds for 80% power at ±1% that a report, a board and `oelm compare`'s lines print for a
    comparison are the count `oelm confirm plan` plans for it on the same records (one function,
    stats.margin_seeds); the seeds to detect the observed gap are another quantity, named so and
    worded as a power estimate."""
    pilot = _pilot(tmp_path)
    claims = make_plan(pilot, None)  # the claims oelm-freeze and oelm-random: m = 2
    every = make_plan(pilot, None, every=True)  # oelm-qknorm makes no claim: the --all plan, m = 3
    qknorm = next(e for e in every.seed_plan if e.method == "oelm-qknorm")
    planned = {e.method: e.needed for e in claims.seed_plan} | {"oelm-qknorm": qknorm.needed}
    assert all(planned.values()) and qknorm.alpha == pytest.approx(0.05 / 3)
    md_path, comp = write_report([pilot], out=tmp_path / "report")
    board_md = write_leaderboard([pilot], tmp_path / "board", "baseline")[0].read_text()
    md = md_path.read_text()
    for method, n in planned.items():
        line = next(x for x in md.splitlines() if x.startswith(f"- {method}: "))
        board_line = next(x for x in board_md.splitlines() if x.startswith(f"- {method}: pilot"))
        for text in (line, board_line):
            assert re.search(r"seeds for 80% power at ±1% \(the seed plan of `oelm confirm plan`: [^)]*\): (\d+)", text)
            assert re.search(r"\): (\d+)", text.split("seeds for 80% power")[1]).group(1) == str(n), (method, text)
        pw = comp.groups[0].versus_of(method).power
        assert f"about {pw.seeds_for_observed} fresh seeds would detect a true mean per-seed gap" in line
        assert pw.seeds_for_observed != n and "a power estimate, not a promise" in line
    assert main(["confirm", "plan", str(pilot), "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert f"{max(planned['oelm-freeze'], planned['oelm-random'])} planned" in out


@pytest.mark.slow
def test_run_trains_only_the_planned_runs(tmp_path: Path) -> None:
    raw = {
        "name": "tiny",
        "out": str(tmp_path / "pilot"),
        "config": {**TINY, "data": str(synthetic_lm_dir(tmp_path / "data"))},
        "methods": {"baseline": {"lr": [1e-3, 3e-3]}, "oelm-freeze": {"lr": [3e-3]}},
        "seeds": [0, 1, 2],
        "max_extend": 0,
    }
    run_sweep(spec_from_dict(raw), progress=False, report=False, threads=1)
    out = tmp_path / "confirm"
    # A wide margin gives 6-step runs a claim either way (a resolved gap or equivalence).
    _, plan = write_plan(tmp_path / "pilot", out, 3, margin=50.0)
    lrs = {m: a.lr for m, a in plan.arms.items()}
    conf = run_confirmation(out, uncommitted_plan=True, progress=False, threads=1)
    assert conf.outcome is not None and not conf.outcome.failed
    trained = {(r.method, r.lr, r.seed) for r in conf.outcome.trained}
    assert trained == {(m, lr, s) for m, lr in lrs.items() for s in (3, 4, 5)}
    dirs = sorted(p.relative_to(out / "runs").as_posix() for p in (out / "runs").glob("*/*/seed*"))
    assert dirs == sorted(f"{m}/lr{lr:g}/seed{s}" for m, lr in lrs.items() for s in (3, 4, 5))
    for d in dirs:
        config = yaml.safe_load((out / "runs" / d / "config.yaml").read_text())
        assert config["lr"] == lrs[d.split("/")[0]] and config["seed"] in (3, 4, 5)
    assert {c.result for c in conf.results} <= {CONFIRMED, NOT_CONFIRMED} and len(conf.results) == 1
    again = run_confirmation(out, uncommitted_plan=True, progress=False, threads=1)  # resumable: nothing trains twice
    assert again.outcome is not None and not again.outcome.trained and len(again.outcome.skipped) == 6


def test_a_warning_of_the_fresh_table_reaches_the_file_and_the_terminal(tmp_path: Path, capsys) -> None:
    """Unequal budgets among the fresh runs change what a confirmed verdict means: confirmation.md and
    `oelm confirm run` both say so (issue 40, class 2)."""
    pilot, out = _pilot(tmp_path), tmp_path / "confirm"
    assert main(["confirm", "plan", str(pilot), "--seeds", "3", "--out", str(out)]) == 0
    for i, seed in enumerate((3, 4, 5)):
        make_run(out, "baseline", 1e-3, seed, test_perplexity=10 + i / 10, best_val_loss=1.5)
        for method in ("oelm-freeze", "oelm-random"):
            short = {"tokens_seen": 900} if method == "oelm-random" else {}
            make_run(out, method, 3e-3, seed, test_perplexity=11 + i / 10, best_val_loss=1.6, **short)
    _as_planned(out)
    capsys.readouterr()
    assert main(["confirm", "run", str(out), "--uncommitted-plan"]) == 0
    printed = capsys.readouterr().out
    assert "warning: unequal budgets (tokens_seen differ" in printed
    assert "- **Warning:** unequal budgets (tokens_seen differ" in (out / "confirmation.md").read_text()


# --- the pilot link: a plan's records_sha256 (issue 47, item 6) -----------------------------------


def _compact(pilot: Path, dst: Path) -> Path:
    """The pilot as committed compact records (record.json only), with its sweep.yaml."""
    dst.mkdir(parents=True)
    (dst / "sweep.yaml").write_text((pilot / "sweep.yaml").read_text())
    for run in load_runs([pilot / "runs"]):
        write_record(run, dst / run.path.relative_to(pilot), relative_to=pilot)
    return dst


def test_a_plan_from_committed_pilot_records_hashes_them(tmp_path: Path) -> None:
    """A pilot of compact records (record.json, no results.json) was hashed as no records: the
    sha256 of an empty string (the stored Llama 124k and AG News plans carry it)."""
    pilot = _pilot(tmp_path)
    compact = _compact(pilot, tmp_path / "pilot-records")
    plan = make_plan(compact, 3)
    dirs = find_run_dirs([compact])
    assert plan.pilot.records_sha256 != EMPTY_SHA256
    assert (plan.pilot.records_sha256, len(dirs)) == records_hash(compact, dirs)
    assert plan.pilot.runs == len(dirs) == 24
    # One record changed: another hash (the plan names exactly the records its claims came from).
    record = dirs[0] / "record.json"
    record.write_text(record.read_text().replace('"seed"', '"seed" ', 1))
    assert records_hash(compact, dirs)[0] != plan.pilot.records_sha256
    assert make_plan(pilot, 3).pilot.records_sha256 != EMPTY_SHA256  # run directories: results.json


def test_hashing_no_records_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "pilot" / "runs" / "baseline" / "lr0.001" / "seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")  # started, never finished: no results
    with pytest.raises(UserError, match="none of its 1 runs holds results.json or record.json"):
        records_hash(tmp_path / "pilot", [run])
    with pytest.raises(UserError, match="none of its 0 runs"):
        records_hash(tmp_path / "pilot", [])


# Stored confirmations: a plan with its judged page. A plan alone is one committed before its runs
# (the protocol's first step: its runs under way), with nothing judged yet to check.
STORED_CONFIRMATIONS = sorted(
    p.parent for p in REPO.glob("docs/results/**/plan.json") if (p.parent / "confirmation.json").is_file()
)


def test_stored_plans_without_a_pilot_link_are_listed_and_their_pages_say_so(monkeypatch) -> None:
    """The stored plans whose pilot records_sha256 is the sha256 of no records: their confirmation
    pages say plainly that the link is missing and give the hash recomputed after the fact."""
    monkeypatch.chdir(REPO)  # plans name their pilot from the repository root
    unlinked = {}
    for folder in STORED_CONFIRMATIONS:
        plan = read_plan(folder)
        page = (folder / "confirmation.md").read_text(encoding="utf-8")
        done = page_sections(folder / "confirmation.json")
        if plan.pilot.records_sha256 != EMPTY_SHA256:
            assert pilot_link(plan) is None and "pilot link is missing" not in page and done["pilot_link"] is None
            continue
        name = folder.relative_to(REPO / "docs/results").as_posix()
        sha, n = records_hash(plan.pilot.dir, find_run_dirs([plan.pilot.dir]))
        unlinked[name] = n
        assert pilot_link(plan) == PilotLink((sha, n)) and n == plan.pilot.runs
        assert "**The plan's pilot link is missing:**" in page
        assert f"Recomputed after the fact from the committed pilot records in `{plan.pilot.dir}`" in page
        assert f"`{sha}`. That hash is not part of the sealed plan." in page
        linked = {"records_sha256": sha, "records": n}
        assert done["pilot_link"] == {"missing": True, "recomputed_after_the_fact": linked}
    assert unlinked == {"finetune-agnews-minilm/records": 27, "ladder/llama-d64-confirm/records": 69}


def test_a_pilot_named_by_a_machine_path_is_refused_before_the_plan_is_written(tmp_path: Path, monkeypatch) -> None:
    """The SST-2 board's plan named its pilot /tmp/board37, so it could not be stored with its
    records: a plan names its pilot relative to the working directory, or is not written."""
    pilot = _pilot(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(
        UserError, match="absolute path outside the working directory.*cd .* && oelm confirm plan pilot"
    ):
        write_plan(pilot, work / "confirm", 3)
    assert not (work / "confirm").exists()
    assert write_plan("../pilot", work / "confirm", 3)[1].pilot.dir == "../pilot"  # named relatively: kept
    monkeypatch.chdir(tmp_path)
    _, plan = write_plan(pilot, tmp_path / "inside", 3)  # absolute, under the working directory
    assert (
        plan.pilot.dir == "pilot"
        and json.loads((tmp_path / "inside" / PLAN_FILE).read_text())["pilot"]["dir"] == "pilot"
    )


# --- a plan committed before its runs (issue 47, item 6) -------------------------------------------


def _fresh(out: Path) -> None:
    """The planned fresh runs of the default plan, finished (oelm-freeze ~10% worse)."""
    _fresh_at(out, [3, 4, 5])


def _fresh_at(out: Path, seeds: list[int]) -> None:
    """The planned fresh runs of the default plan at these seeds, finished (oelm-freeze ~10% worse)."""
    for i, (seed, ppl) in enumerate(zip(seeds, [10.1, 9.8, 10.3], strict=True)):
        make_run(out, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        make_run(out, "oelm-freeze", 3e-3, seed, test_perplexity=ppl * (1 + [0.10, 0.105, 0.095][i]), best_val_loss=1.6)
        make_run(out, "oelm-random", 3e-3, seed, test_perplexity=ppl * 1.05, best_val_loss=1.6)
    _as_planned(out)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository whose runs/ folder is ignored, as this project's; the working directory."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text("runs/\n")
    git(root, "add", ".gitignore")
    git(root, "commit", "-q", "-m", "start")
    monkeypatch.chdir(root)
    _pilot(root / "runs")
    return root


def _commit(repo: Path, plan: Path, to: str) -> tuple[str, str]:
    """Copy a plan into the repository and commit it: (commit, committer date)."""
    (repo / to).parent.mkdir(parents=True, exist_ok=True)
    (repo / to).write_bytes(plan.read_bytes())
    git(repo, "add", to)
    git(repo, "commit", "-q", "-m", "Fix the plan before its runs")
    return git(repo, "rev-parse", "HEAD"), git(repo, "log", "-1", "--format=%cI")


def test_confirm_run_refuses_a_plan_no_commit_holds_and_records_the_one_that_does(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = repo / "runs" / "confirm" / "x"  # ignored: plans live outside the history
    assert main(["confirm", "plan", "runs/pilot", "--seeds", "3", "--out", str(out)]) == 0
    _fresh(out)
    with pytest.raises(UserError, match=r"is in no git commit .*cp .*plan\.json docs/results/NAME/records/plan\.json"):
        run_confirmation(out, progress=False)
    assert main(["confirm", "run", str(out)]) == 2  # the command: the same refusal, nothing run
    assert not (out / PLAN_COMMIT_FILE).exists() and not (out / "confirmation.md").exists()

    # An edited copy committed is not the plan.
    edited = json.loads((out / PLAN_FILE).read_text())
    (repo / "edited.json").write_text(json.dumps({**edited, "margin": 2.0}))
    git(repo, "add", "edited.json")
    git(repo, "commit", "-q", "-m", "an edited copy")
    with pytest.raises(UserError, match="is in no git commit"):
        run_confirmation(out, progress=False)

    commit, date = _commit(repo, out / PLAN_FILE, "docs/results/x/records/plan.json")
    monkeypatch.chdir(tmp_path)  # the repository the plan sits in answers from anywhere
    run_confirmation(out, progress=False)
    recorded = json.loads((out / PLAN_COMMIT_FILE).read_text())
    assert recorded["commit"] == commit and recorded["date"] == date
    assert recorded["path"] == "docs/results/x/records/plan.json" and recorded["plan_sha256"] == edited["sha256"]
    line = f"Plan committed before the runs: `docs/results/x/records/plan.json` in commit `{commit}` ({date})"
    page = (out / "confirmation.md").read_text()
    assert line in page and page_sections(out / "confirmation.json")["plan_commit"] == recorded

    git(repo, "commit", "-q", "--allow-empty", "-m", "later")  # a later commit moves nothing
    run_confirmation(out, progress=False)
    assert json.loads((out / PLAN_COMMIT_FILE).read_text()) == recorded
    assert report_confirmation(out, tmp_path / "again").plan_commit == PlanCommit(**recorded)
    assert (tmp_path / "again" / "confirmation.md").read_text() == page


def test_an_uncommitted_plan_runs_only_by_the_flag_and_the_page_says_so(repo: Path) -> None:
    out = repo / "runs" / "confirm" / "y"
    assert main(["confirm", "plan", "runs/pilot", "--seeds", "3", "--out", str(out)]) == 0
    _fresh(out)
    assert main(["confirm", "run", str(out), "--uncommitted-plan"]) == 0
    recorded = json.loads((out / PLAN_COMMIT_FILE).read_text())
    assert recorded["commit"] is None and recorded["date"] is None and recorded["path"] is None
    assert "**Plan not committed before the runs:**" in (out / "confirmation.md").read_text()
    # Committed after its runs began: the record keeps what was true when they began.
    _commit(repo, out / PLAN_FILE, "docs/results/y/records/plan.json")
    conf = run_confirmation(out, progress=False)
    assert conf.plan_commit is not None and not conf.plan_commit.committed
    assert page_sections(out / "confirmation.json")["plan_commit"]["commit"] is None


def test_stored_confirmations_say_their_plan_commit_was_not_recorded() -> None:
    """Confirmations stored before `confirm run` checked the commit: the page says it is not recorded."""
    for folder in STORED_CONFIRMATIONS:
        page = (folder / "confirmation.md").read_text(encoding="utf-8")
        if not (folder / PLAN_COMMIT_FILE).exists():
            assert "The plan's commit before the runs is not recorded" in page, folder


# --- fresh seeds are fresh everywhere in the stored records (issue 47, item 6) --------------------


def test_fresh_seeds_skip_seeds_already_run_under_a_planned_configuration(tmp_path: Path, capsys) -> None:
    """Three of the twin board's eight fresh seeds replayed runs of the board before it: a plan skips
    every seed a stored run of a planned arm (same table, method, overrides and steps) already ran."""
    pilot, old = _pilot(tmp_path), tmp_path / "old"
    assert write_plan(pilot, old, 3)[1].seeds == [3, 4, 5]
    make_run(old, "oelm-freeze", 3e-3, 3, test_perplexity=11.0, best_val_loss=1.6)  # a planned arm: used
    make_run(old, "baseline", 1e-3, 4, test_perplexity=10.0, best_val_loss=1.5)  # the reference: used
    make_run(old, "oelm-random", 3e-3, 5, test_perplexity=10.5, best_val_loss=1.6)  # other steps: fresh
    _as_planned(old)
    config = old / "runs" / "oelm-random" / "lr0.003" / "seed5" / "config.yaml"
    config.write_text(config.read_text().replace("steps: 6\n", "steps: 60\n"))
    make_run(old, "oelm-qknorm", 3e-3, 6, test_perplexity=10.5, best_val_loss=1.6)  # not planned: fresh
    rebuilt = make_run(old, "oelm-freeze", 3e-3, 7, test_perplexity=11.0, best_val_loss=1.6, steps=None)
    (rebuilt / "config.yaml").unlink()  # a record that kept neither config nor steps matches on the rest

    capsys.readouterr()
    argv = ["confirm", "plan", "pilot", "--seeds", "3", "--out", "new", "--exclude-seeds-from", "old"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    plan = read_plan(tmp_path / "new")
    assert plan.seeds == [5, 6, 8]
    assert [(e.seed, e.under) for e in plan.skipped_seeds] == [(3, ["old"]), (4, ["old"]), (7, ["old"])]
    assert "seed 3 skipped: already run under a planned configuration in old" in printed
    assert read_plan(tmp_path / "new").to_dict()["skipped_seeds"][0] == {"seed": 3, "under": ["old"]}

    unscanned = write_plan(pilot, tmp_path / "unscanned", 3, exclude_seeds_from=[])[1]
    assert (
        unscanned.seeds == [3, 4, 5] and unscanned.skipped_seeds is None and "skipped_seeds" not in unscanned.to_dict()
    )
    with pytest.raises(UserError, match="--exclude-seeds-from nowhere: not a folder"):
        write_plan(pilot, tmp_path / "bad", 3, exclude_seeds_from=["nowhere"])

    # The page says which seeds the plan skipped, and why.
    _fresh_at(tmp_path / "new", plan.seeds)
    run_confirmation(tmp_path / "new", uncommitted_plan=True, progress=False)
    page = (tmp_path / "new" / "confirmation.md").read_text()
    assert "Fresh seeds 5, 6, 8 (seeds 3, 4, 7 skipped: already run under a planned configuration in `old`)" in page


def test_a_plan_skips_seeds_of_the_stored_records_of_its_repository_by_default(repo: Path) -> None:
    old = repo / "docs" / "results" / "old" / "records"
    write_plan("runs/pilot", old, 3, exclude_seeds_from=[])
    make_run(old, "oelm-freeze", 3e-3, 3, test_perplexity=11.0, best_val_loss=1.6)
    _as_planned(old)
    plan = write_plan("runs/pilot", repo / "runs" / "confirm" / "z", 3)[1]
    assert plan.seeds == [4, 5, 6] and [(e.seed, e.under) for e in plan.skipped_seeds] == [
        (3, ["docs/results/old/records"])
    ]


@pytest.mark.slow
def test_the_decisive_twin_boards_plan_would_now_skip_the_seeds_the_twin_board_ran(monkeypatch) -> None:
    """The audit's finding, from the stored records: seeds 103-105 of the decisive board's fresh
    seeds had already run, at the same settings, as the twin board's fresh seeds."""
    monkeypatch.chdir(REPO)
    stored = read_plan(REPO / "docs/results/twin-decisive/records")
    assert stored.seeds == list(range(103, 111))  # what it planned then
    plan = make_plan(
        "docs/results/twin-decisive/pilot-records",
        8,
        baseline="oelm-nofreeze",
        margin=stored.margin,
        every=True,
        exclude_seeds_from=["docs/results/twin-board"],
    )
    assert [(e.seed, e.under) for e in plan.skipped_seeds] == [
        (s, ["docs/results/twin-board/records/final"]) for s in (103, 104, 105)
    ]
    assert plan.seeds == list(range(106, 114))


# --- the stability rule on the fresh seeds (issue 47, item 6) -------------------------------------


def test_an_arm_whose_fresh_seeds_scatter_or_spike_is_flagged_on_the_page_and_in_the_json(tmp_path: Path) -> None:
    """The pilot chose each setting under the robust LR rule on its own seeds; the same check on the
    fresh seeds flags an arm whose seeds scatter past 10% (oelm-freeze's did, 18% at 1.2e-2) or hold
    an unstable run, beside the claim's result."""
    pilot, out = _pilot(tmp_path), tmp_path / "confirm"
    write_plan(pilot, out, 3)
    for i, (seed, ppl) in enumerate({3: 10.1, 4: 9.8, 5: 10.3}.items()):
        make_run(out, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        freeze = ppl * (1 + [0.10, 0.105, 0.30][i])
        make_run(out, "oelm-freeze", 3e-3, seed, test_perplexity=freeze, best_val_loss=[1.5, 1.6, 1.9][i])
        make_run(out, "oelm-random", 3e-3, seed, test_perplexity=ppl * 1.05, best_val_loss=1.6)
    _as_planned(out)
    conf = run_confirmation(out, uncommitted_plan=True, progress=False)
    assert set(conf.flagged) == {"oelm-freeze"}
    assert conf.flagged["oelm-freeze"].flag == "seeds scatter (24.0% > 10%)"
    done = page_sections(out / "confirmation.json")
    stability = {e["method"]: e for e in done["stability"]}
    assert set(stability) == {"baseline", "oelm-freeze", "oelm-random"}
    assert stability["oelm-freeze"]["flag"] == "seeds scatter (24.0% > 10%)" and stability["oelm-freeze"]["checked"]
    assert stability["oelm-freeze"]["spread"] == pytest.approx(0.4 / (5.0 / 3))
    assert stability["oelm-random"]["flag"] is None and stability["oelm-random"]["spread"] == 0.0
    gaps = [10.0, 10.5, 30.0]
    assert stability["oelm-freeze"]["median_gap_percent"] == pytest.approx(10.5)
    assert stability["oelm-freeze"]["mean_gap_percent"] == pytest.approx(sum(gaps) / 3)
    by = {c["method"]: c for c in done["claims"]}
    assert (
        by["oelm-freeze"]["stability_flag"] == "seeds scatter (24.0% > 10%)"
        and by["oelm-random"]["stability_flag"] is None
    )
    page = (out / "confirmation.md").read_text()
    assert "1 of 3 arm(s) flagged." in page
    assert "- **Stability flag:** oelm-freeze at lr0.003, on 3 fresh seeds: seeds scatter (24.0% > 10%)." in page
    assert "median +10.50%, mean +16.83%" in page
    freeze_row = next(line for line in page.splitlines() if line.startswith("| oelm-freeze |"))
    assert freeze_row.endswith("[stability flag: oelm-freeze] |")

    # A spike in a fresh run of the reference flags every comparison with it.
    spiked = out / "runs" / "baseline" / "lr0.001" / "seed4" / "metrics.jsonl"
    lines = [json.loads(line) for line in spiked.read_text().splitlines()]
    lines += [{"kind": "eval", "step": 60, "split": "val", "loss": 3.0, "perplexity": 20.1}]
    spiked.write_text("".join(json.dumps(x) + "\n" for x in lines))
    conf = report_confirmation(out)
    assert conf.flagged["baseline"].flag.startswith("seed 4 unstable (spiked: validation loss 3 at step 60")
    page = (out / "confirmation.md").read_text()
    random_row = next(line for line in page.splitlines() if line.startswith("| oelm-random |"))
    assert random_row.endswith("[stability flag: baseline] |") and "2 of 3 arm(s) flagged." in page


def test_the_decisive_twin_boards_page_flags_oelm_freezes_fresh_scatter() -> None:
    page = (REPO / "docs/results/twin-decisive/records/confirmation.md").read_text(encoding="utf-8")
    assert "- **Stability flag:** oelm-freeze at lr0.012, on 8 fresh seeds: seeds scatter (18.0% > 10%)." in page
    assert "median +11.48%, mean +18.56%" in page
    done = page_sections(REPO / "docs/results/twin-decisive/records/confirmation.json")
    assert [e["method"] for e in done["stability"] if e["flag"]] == ["oelm-freeze"]


# --- one gap beside its interval, one margin per board (issue 47, item 6) --------------------------


def test_the_page_prints_the_mean_per_seed_gap_beside_its_paired_interval(tmp_path: Path) -> None:
    """The gap of the means (+15% here: the third seed's reference is twice the others) sat beside the
    interval of the mean per-seed gap (+10%); the page prints the interval's own quantity."""
    pilot, out = _pilot(tmp_path), tmp_path / "confirm"
    write_plan(pilot, out, 3)
    for i, seed in enumerate((3, 4, 5)):
        ppl = [10.0, 10.0, 20.0][i]
        make_run(out, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        make_run(out, "oelm-freeze", 3e-3, seed, test_perplexity=ppl * [1.0, 1.0, 1.3][i], best_val_loss=1.6)
        make_run(out, "oelm-random", 3e-3, seed, test_perplexity=ppl * 1.05, best_val_loss=1.6)
    _as_planned(out)
    run_confirmation(out, uncommitted_plan=True, progress=False)
    fresh = next(c for c in page_sections(out / "confirmation.json")["claims"] if c["method"] == "oelm-freeze")["fresh"]
    assert fresh["gap_percent"] == pytest.approx(15.0) and fresh["mean_seed_gap_percent"] == pytest.approx(10.0)
    assert fresh["gap_paired"]["mean"] == fresh["mean_seed_gap_percent"]
    page = (out / "confirmation.md").read_text()
    assert "| Fresh mean per-seed gap [paired 95% CI] |" in page
    row = next(line for line in page.splitlines() if line.startswith("| oelm-freeze |"))
    low, high = fresh["gap_paired"]["ci_low"], fresh["gap_paired"]["ci_high"]
    assert f"| +10.00% [{low:+.2f}, {high:+.2f}] |" in row and "+15.00%" not in row
    assert "(pilot, 3 seeds, mean per-seed gap +10.00%)" in row


def _confirmed(tmp_path: Path, name: str, margin: float) -> Path:
    """A finished confirmation planned at `margin` (its runs written as planned)."""
    pilot, out = tmp_path / "pilot", tmp_path / name
    if not pilot.exists():
        _pilot(tmp_path)
    write_plan(pilot, out, 3, margin=margin)
    _fresh_at(out, [3, 4, 5])
    return out


def test_a_board_over_a_confirmation_uses_its_plans_margin_and_refuses_another(tmp_path: Path) -> None:
    """The decisive twin board's leaderboard judged equivalence within ±1% while its confirmation,
    planned at ±3%, judged within ±3%: a board over a confirmation takes the plan's margin."""
    wide = _confirmed(tmp_path, "wide", 3.0)
    path, boards = write_leaderboard([wide], tmp_path / "board")
    assert boards[0].group.margin == 3.0 and "equivalence margin ±3%" in path.read_text()
    assert page_sections(tmp_path / "board" / "leaderboard.json")["tables"][0]["margin_percent"] == 3.0
    assert write_leaderboard([wide], tmp_path / "same", margin=3.0)[1][0].group.margin == 3.0
    with pytest.raises(UserError, match=r"--margin 1: the confirmation plan of this board fixed ±3% .*drop --margin"):
        write_leaderboard([wide], tmp_path / "other", margin=1.0)
    assert main(["report", "--view", "board", str(wide), "--out", str(tmp_path / "cli"), "--margin", "1"]) == 2
    narrow = _confirmed(tmp_path, "narrow", 1.0)
    with pytest.raises(UserError, match=r"fixed different equivalence margins .*±3%.*±1%"):
        write_leaderboard([wide, narrow], tmp_path / "mixed")
    # A board without a plan keeps the default (or --margin).
    assert write_leaderboard([tmp_path / "pilot"], tmp_path / "pilot-board")[1][0].group.margin == 1.0


def test_every_stored_board_over_a_confirmation_uses_its_plans_margin() -> None:
    pages = yaml.safe_load((REPO / "docs/results/pages.yaml").read_text(encoding="utf-8"))
    checked = 0
    for page in pages:
        records = REPO / "docs/results" / str(page["records"])
        if page["command"] != "report --view board" or not (records / PLAN_FILE).is_file():
            continue
        board = page_sections(REPO / "docs/results" / page["out"] / "leaderboard.json")
        assert {t["margin_percent"] for t in board["tables"]} == {read_plan(records).margin}, page["out"]
        checked += 1
    assert checked >= 6  # the twin board, three scale boards, the decisive board, the Llama 124k rung


def test_confirm_report_refuses_a_plan_whose_runs_were_trained_otherwise(tmp_path: Path) -> None:
    """Another pilot's plan.json over these runs (its steps differ): `confirm run` refuses the folder,
    and `confirm report` must too instead of judging the runs as that pilot's confirmation."""
    pilot, out = _pilot(tmp_path), tmp_path / "confirm"
    write_plan(pilot, out, 3)
    _fresh(out)
    report_confirmation(out)  # the runs as planned: judged
    for run in plan_spec(read_plan(out), out).runs():  # the runs of a plan for 2 more steps
        config = resolve_config({**run.config, "steps": run.config["steps"] + 2}).config
        (run.run_dir / "config.yaml").write_text(dump_config(config))
    with pytest.raises(UserError, match=r"9 of its runs were trained otherwise than its plan\.json .*steps"):
        report_confirmation(out)
    with pytest.raises(UserError, match=r"trained otherwise than this spec plans them.*steps"):
        run_confirmation(out, uncommitted_plan=True, progress=False)


def test_confirm_report_validates_the_plans_config_once_not_per_run(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 50: `oelm confirm report`, which trains nothing, validated each planned run's config
    twice (the plan's sweep, then each run against its record): 18 validations for 9 runs. Now the
    plan's config once (which checks its run's arm) and the other two arms' method options once each."""
    pilot, out = _pilot(tmp_path), tmp_path / "confirm"
    write_plan(pilot, out, 3)
    _fresh(out)
    assert len(plan_spec(read_plan(out), out).runs()) == 9
    counts = count_validations(monkeypatch)
    assert main(["confirm", "report", str(out)]) == 0
    assert "confirmation.md" in capsys.readouterr().out
    assert counts == {"config": 1, "method": 3}


def _fingerprinted_pilot(tmp_path: Path, fingerprint: str) -> Path:
    """_pilot's runs recording the data fingerprint of the pilot's prepared data."""
    root = tmp_path / "pilot"
    for seed, ppl in enumerate(BASE):
        make_run(root, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5, data_fingerprint=fingerprint)
        for method, gaps in PILOT.items():
            make_run(
                root,
                method,
                3e-3,
                seed,
                test_perplexity=ppl * (1 + gaps[seed]),
                best_val_loss=1.6,
                data_fingerprint=fingerprint,
            )
    methods = {"baseline": {"lr": [1e-3]}} | {m: {"lr": [3e-3]} for m in PILOT}
    data = synthetic_lm_dir(tmp_path / "data")
    meta = json.loads((data / "meta.json").read_text()) | {"fingerprint": fingerprint}
    (data / "meta.json").write_text(json.dumps(meta))
    record = {"name": "pilot", "base": {**TINY, "data": str(data)}, "methods": methods, "seeds": [0, 1, 2]}
    (root / "sweep.yaml").write_text(yaml.safe_dump(record | {"grid": {}, "baseline": "baseline"}))
    return root


def test_confirm_run_on_data_prepared_again_is_refused_naming_both_fingerprints(tmp_path: Path, capsys) -> None:
    """Issue 49: data prepared again between the pilot and its confirmation trained the fresh seeds on
    other splits and judged them against the pilot with exit 0."""
    pilot, out = _fingerprinted_pilot(tmp_path, "33b4a170"), tmp_path / "confirm"
    assert main(["confirm", "plan", str(pilot), "--seeds", "3", "--out", str(out)]) == 0
    assert read_plan(out).pilot.data_fingerprint == "33b4a170"
    meta_path = tmp_path / "data" / "meta.json"
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"fingerprint": "99784be8"}))
    capsys.readouterr()
    assert main(["confirm", "run", str(out), "--uncommitted-plan"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "99784be8" in err and "33b4a170" in err and "prepared again" in err
    assert not (out / "runs").exists() and not (out / "confirmation.md").exists()

    # confirm report over fresh runs that recorded the other data refuses them too
    for seed in (3, 4, 5):
        make_run(out, "baseline", 1e-3, seed, test_perplexity=10, best_val_loss=1.5, data_fingerprint="99784be8")
        for method in ("oelm-freeze", "oelm-random"):
            make_run(out, method, 3e-3, seed, test_perplexity=11, best_val_loss=1.6, data_fingerprint="99784be8")
    _as_planned(out)
    with pytest.raises(UserError, match=r"fingerprint 99784be8.*the pilot .* on 33b4a170"):
        report_confirmation(out)


def test_a_plan_without_a_recorded_fingerprint_reads_the_pilots_runs(tmp_path: Path) -> None:
    """Plans written before the pilot's fingerprint was recorded keep their bytes and hash; the check
    then reads the fingerprint from the pilot's runs where they are still found."""
    pilot, out = _fingerprinted_pilot(tmp_path, "33b4a170"), tmp_path / "confirm"
    _, plan = write_plan(pilot, out, 3)
    raw = json.loads((out / PLAN_FILE).read_text())
    del raw["pilot"]["data_fingerprint"]
    raw["sha256"] = content_hash(raw)
    (out / PLAN_FILE).write_text(json.dumps(raw))
    old = read_plan(out)
    assert old.pilot.data_fingerprint is None and old.to_dict()["sha256"] == content_hash(old.to_dict())
    assert "data_fingerprint" not in old.to_dict()["pilot"]
    meta_path = tmp_path / "data" / "meta.json"
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"fingerprint": "99784be8"}))
    with pytest.raises(UserError, match="holds data fingerprint 99784be8, but the pilot .* trained on 33b4a170"):
        run_confirmation(out, uncommitted_plan=True, progress=False, threads=1)
