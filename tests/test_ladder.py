"""The scale ladder: gap to the twin per rung, Holm within a rung, and a trend with its interval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oelm.cli import main
from oelm.reports.comparison import page_sections
from oelm.reports.ladder import architecture_of, write_ladder
from test_report import make_run

SIZES = {"s1": 50_000, "s2": 200_000, "s3": 800_000}
# The true gap of oelm-freeze to its twin shrinks by 4 points per decade of parameters.
GAP = {"s1": 12.0, "s2": 12.0 - 4 * np.log10(4), "s3": 12.0 - 4 * np.log10(16)}


def ladder_run(out: Path, method: str, seed: int, ppl: float, total: int, lr: float = 1e-3, **results) -> Path:
    """One run of a rung of `total` parameters (a tenth frozen for oelm-freeze) at test perplexity `ppl`."""
    frozen = total // 10 if method == "oelm-freeze" else 0
    return make_run(
        out,
        method,
        lr,
        seed,
        test_perplexity=ppl,
        best_val_loss=float(np.log(ppl)),
        trainable_params=total - frozen,
        frozen_params=frozen,
        **results,
    )


def rung(root: Path, name: str, model: str = "gpt-tiny") -> Path:
    rng = np.random.default_rng(len(name) + SIZES[name] % 97)
    out = root / f"{model}-{name}"
    total = SIZES[name]
    for seed in range(4):
        twin = 20.0 + rng.normal(0, 0.1)
        ppl = {
            "oelm-nofreeze": twin,
            "baseline": twin * 1.01,
            "oelm-freeze": twin * (1 + (GAP[name] + rng.normal(0, 0.3)) / 100),
        }
        for method, value in ppl.items():
            ladder_run(
                out, method, seed, value, total, model=model, theoretical_saving=0.0444 * (method == "oelm-freeze")
            )
    return out


def test_ladder_compares_each_frozen_method_with_its_twin_and_fits_the_trend(tmp_path: Path, capsys) -> None:
    rungs = [rung(tmp_path, n) for n in SIZES]
    assert main(["report", "--view", "ladder", *map(str, rungs), "--out", str(tmp_path / "out")]) == 0
    data = page_sections(tmp_path / "out" / "ladder.json")
    steps = data["steps"]
    assert [s["params"] for s in steps] == sorted(SIZES.values())
    assert {s["method"] for s in steps} == {"oelm-freeze"} and {s["twin"] for s in steps} == {"oelm-nofreeze"}
    for s, name in zip(steps, SIZES):
        assert s["gap"] == pytest.approx(GAP[name], abs=0.5) and s["verdict"] == "worse (resolved)"
        assert s["unstable"] == "0 of 4" and s["saving"] == pytest.approx(0.0444)
    (trend,) = data["trends"]
    assert trend["rungs"] == 3 and trend["slope_low"] < -4.0 < trend["slope_high"]
    assert trend["at"] == 10 * SIZES["s3"] and "extrapolation" in trend["note"]
    assert trend["predicted_low"] < 12.0 - 4 * np.log10(160) < trend["predicted_high"]
    md = (tmp_path / "out" / "ladder.md").read_text()
    assert "| training-FLOP saving |" in md and "| 4.44% |" in md
    assert "(ladder.png)" in md and (tmp_path / "out" / "ladder.png").stat().st_size > 0
    assert "trend gpt oelm-freeze" in capsys.readouterr().out


def test_two_rungs_give_no_interval_and_say_so(tmp_path: Path) -> None:
    _, ladder = write_ladder([rung(tmp_path, "s1"), rung(tmp_path, "s2")], tmp_path / "out")
    (trend,) = ladder.trends
    assert trend.slope is None and "at least 3" in trend.note


def test_a_rung_s_table_warning_reaches_the_file_and_the_terminal(tmp_path: Path, capsys) -> None:
    """A rung whose arms saw unequal budgets: the gap's meaning changes, so ladder.md and the
    terminal both carry the table's warning (issue 40, class 2)."""
    rungs = [rung(tmp_path, n) for n in ("s1", "s2")]
    short = rungs[0] / "runs" / "oelm-freeze" / "lr0.001" / "seed0" / "results.json"
    short.write_text(json.dumps({**json.loads(short.read_text()), "tokens_seen": 100}))
    assert main(["report", "--view", "ladder", *map(str, rungs), "--out", str(tmp_path / "out")]) == 0
    assert "  warning: tinystories (lm, gpt-tiny): unequal budgets (tokens_seen" in capsys.readouterr().out
    assert "- tinystories (lm, gpt-tiny): unequal budgets (tokens_seen" in (tmp_path / "out" / "ladder.md").read_text()


def test_a_rung_named_twice_is_refused_not_read_as_a_trend(tmp_path: Path, capsys) -> None:
    """The same rung given twice made a three-point line through a repeated point: a zero-width
    interval and 'shrinks with size (resolved)' from two sizes. One size per rung, or a refusal."""
    small, large = (rung(tmp_path, n) for n in list(SIZES)[:2])
    out = tmp_path / "out"
    assert main(["report", "--view", "ladder", str(small), str(small), str(large), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "counted twice would fake a trend" in err[0] and not out.exists()


def test_a_rung_without_a_twin_is_refused(tmp_path: Path, capsys) -> None:
    make_run(tmp_path / "lonely", "baseline", 1e-3, 0, test_perplexity=20.0, best_val_loss=3.0)
    assert main(["report", "--view", "ladder", str(tmp_path / "lonely"), "--out", str(tmp_path / "out")]) == 2
    assert "needs both arms" in capsys.readouterr().err


def test_architecture_of_names_our_families() -> None:
    assert [architecture_of(m) for m in ("gpt-tiny", "llama-small", "bert-base-uncased")] == [
        "gpt",
        "llama",
        "bert-base-uncased",
    ]


def law_rung(root: Path, total: int, gap: float, seeds: int = 3, ratio: int = 20) -> Path:
    """A rung whose twin follows L = 1.2 + 40 / N^0.4 nats and whose frozen arm is `gap` % worse,
    trained for `ratio` tokens per parameter."""
    rng = np.random.default_rng(total + ratio)
    out = root / f"gpt-tiny-{total}-t{ratio}"
    for seed in range(seeds):
        twin = float(np.exp(1.2 + 40 * total**-0.4 + rng.normal(0, 0.003)))
        for method, value in {
            "oelm-nofreeze": twin,
            "oelm-freeze": twin * (1 + (gap + rng.normal(0, 0.2)) / 100),
        }.items():
            ladder_run(out, method, seed, value, total, model="gpt-tiny", tokens_seen=ratio * total)
    return out


@pytest.mark.slow
def test_five_rungs_get_the_declared_trend_test_and_the_scaling_fits(tmp_path: Path) -> None:
    """A gap falling 3 points per decade over five rungs: 'shrinks with size (resolved)', per-arm
    exponents with intervals, the multiplier and the extrapolation, the figure."""
    sizes = [4_000, 10_000, 25_000, 60_000, 150_000]
    rungs = [law_rung(tmp_path, n, 12.0 - 3 * np.log10(n / sizes[0])) for n in sizes]
    assert main(["report", "--view", "ladder", *map(str, rungs), "--out", str(tmp_path / "out")]) == 0
    data = page_sections(tmp_path / "out" / "ladder.json")
    (trend,) = data["trends"]
    assert trend["verdict"] == "shrinks with size (resolved)" and trend["p_shrink"] < 0.05 < trend["p_grow"]
    # Redone without each rung in turn, the verdict rests on no single one of them.
    assert trend["loo_holds"] == "5 of 5" and trend["loo_slope"][0] <= trend["slope"] <= trend["loo_slope"][1] < 0
    assert {a["method"] for a in data["arm_fits"]} == {"oelm-freeze", "oelm-nofreeze"}
    twin = next(a for a in data["arm_fits"] if a["method"] == "oelm-nofreeze")
    assert twin["alpha_low"] < twin["alpha"] < twin["alpha_high"] and twin["rungs"] == 5 and twin["runs"] == 15
    (pair,) = data["pair_fits"]
    assert pair["at"] == sizes[-1] and pair["multiplier"] > 1 and "curves" not in pair
    assert pair["predicted_low"] <= pair["predicted_gap"] <= pair["predicted_high"]
    md = (tmp_path / "out" / "ladder.md").read_text()
    assert "## Does the cost shrink with size? (the declared trend test)" in md
    assert "| gpt | oelm-freeze vs oelm-nofreeze | parameters | 20 tokens per parameter | 5 |" in md
    assert "shrinks with size (resolved)" in md
    assert (
        "**Over size** (1 tested line of a frozen method against its control; gpt): the gap shrinks (resolved) on 1"
        in md
    )
    assert "## Scaling fits: L(N) = E + A / N^alpha per arm" in md
    assert (tmp_path / "out" / "scaling.png").stat().st_size > 0


def test_a_flat_gap_is_unresolved_with_the_slope_it_could_detect(tmp_path: Path) -> None:
    """No trend in the gap: neither direction resolves, and the verdict names the detectable slope.
    A rung of one seed (the GPU rungs) has no interval: the test leaves it out, and the answer says
    which rung it left out and what its gap was."""
    rungs = [law_rung(tmp_path, n, 10.0) for n in (4_000, 10_000, 25_000)]
    rungs.append(law_rung(tmp_path, 60_000, 3.0, seeds=1))
    assert main(["report", "--view", "ladder", *map(str, rungs), "--out", str(tmp_path / "out")]) == 0
    data = page_sections(tmp_path / "out" / "ladder.json")
    (trend,) = data["trends"]
    assert trend["verdict"].startswith("unresolved (smallest detectable slope ") and trend["rungs"] == 3
    assert trend["p_shrink"] > 0.05 and trend["p_grow"] > 0.05
    md = (tmp_path / "out" / "ladder.md").read_text()
    answer = md[md.index("## The answer") : md.index("\n## ", md.index("## The answer") + 1)]
    assert "**Not in the test** (gpt; 60,000 parameters; one paired seed" in answer
    (top,) = [step for step in data["steps"] if step["params"] == 60_000]
    assert top["n"] == 1 and f"oelm-freeze vs oelm-nofreeze {top['gap']:+.2f}%" in answer
    assert not (tmp_path / "out" / "scaling.png").exists()  # three rungs with an interval: no fit


def test_a_size_trained_at_three_budgets_gets_a_line_over_data(tmp_path: Path) -> None:
    """The tokens-per-parameter axis: two sizes at 20, 80 and 300 tokens per parameter, the gap
    falling 4 points per decade of data; lines over size are drawn per budget, lines over data per
    size, each judged in its own Holm family."""
    rungs = [
        law_rung(tmp_path, n, 12.0 - 4 * np.log10(r / 20), ratio=r) for n in (4_000, 10_000) for r in (20, 80, 300)
    ]
    rungs.append(law_rung(tmp_path, 25_000, 12.0))
    assert main(["report", "--view", "ladder", *map(str, rungs), "--out", str(tmp_path / "out")]) == 0
    data = page_sections(tmp_path / "out" / "ladder.json")
    by = {(t["axis"], t["held"]): t for t in data["trends"]}
    assert set(by) == {
        ("parameters", "20 tokens per parameter"),
        ("parameters", "80 tokens per parameter"),
        ("parameters", "300 tokens per parameter"),
        ("tokens per parameter", "4,000 parameters"),
        ("tokens per parameter", "10,000 parameters"),
    }
    assert by[("parameters", "20 tokens per parameter")]["rungs"] == 3
    for size in ("4,000", "10,000"):
        line = by[("tokens per parameter", f"{size} parameters")]
        assert line["rungs"] == 3 and line["slope"] == pytest.approx(-4.0, abs=1.0) and line["slope_high"] < 0
        assert line["verdict"] == "shrinks with data (resolved)"
    assert sorted({s["budget"] for s in data["steps"]}) == [20, 80, 300]
    # Each budget's line has its own fit record, named by what it holds fixed (none fitted: < 5 rungs).
    assert sorted(p["held"] for p in data["pair_fits"]) == [f"{b} tokens per parameter" for b in (20, 300, 80)]
    # L(N, D) needs five sizes: three give a note, and the answer says there is no fit.
    (fit,) = data["data_fits"]
    assert fit["d_beta"] is None and fit["predicted"] == {} and fit["note"].startswith("3 size(s)")
    md = (tmp_path / "out" / "ladder.md").read_text()
    assert "over size and data together: no L(N, D) fit (3 size(s)" in md
    # The first lines tally the tested lines: two over data, both shrinking; one over size (20 tokens/param).
    assert (
        "**Over data** (2 tested lines of a frozen method against its control; gpt): the gap shrinks (resolved) on 2"
        in md
    )
    assert "**Over size** (1 tested line of" in md


@pytest.mark.slow
def test_five_sizes_with_a_data_axis_get_the_size_and_data_fit(tmp_path: Path) -> None:
    """Five sizes at 20 tokens per parameter, the two smallest also at 80 and 300: each pair gets
    L(N, D) per arm and the gap extrapolated to 124M parameters at 20 and at 300, on the page too."""
    sizes = [4_000, 10_000, 25_000, 60_000, 150_000]
    rungs = [law_rung(tmp_path, n, 12.0 - 3 * np.log10(n / sizes[0])) for n in sizes]
    rungs += [law_rung(tmp_path, n, 12.0, ratio=r) for n in sizes[:2] for r in (80, 300)]
    assert main(["report", "--view", "ladder", *map(str, rungs), "--out", str(tmp_path / "out")]) == 0
    (fit,) = page_sections(tmp_path / "out" / "ladder.json")["data_fits"]
    assert (fit["cells"], fit["sizes"], fit["budgets"]) == (9, 5, 3)
    assert fit["d_alpha"] is not None and fit["d_beta_low"] <= fit["d_beta"] <= fit["d_beta_high"]
    assert set(fit["predicted"]) == {"20", "300"}
    for value, low, high in fit["predicted"].values():
        assert low <= value <= high
    md = (tmp_path / "out" / "ladder.md").read_text()
    assert "## Scaling fits over size and data: L(N, D) = E + A / N^alpha + B / D^beta per arm" in md
    assert "(L(N, D) over 9 cells): extrapolated gap at 124M parameters" in md


def test_the_transfer_check_prices_keeping_the_rung_below_s_lr_on_validation(tmp_path: Path) -> None:
    """The twin's best LR doubles from the small rung to the large one, where the small rung's LR
    is 5% worse on validation: one move kept, one moved at a cost of +5.26%, above the 1% margin."""
    for name, total in (("small", 50_000), ("large", 200_000)):
        for seed in range(3):
            ladder_run(tmp_path / name, "oelm-freeze", seed, 22.0 + 0.1 * seed, total)
            ladder_run(tmp_path / name, "oelm-nofreeze", seed, 20.0 + 0.1 * seed, total)
            if name == "large":  # the twin's grid widens at the large rung, and its new LR wins
                ladder_run(tmp_path / name, "oelm-nofreeze", seed, (20.0 + 0.1 * seed) / 1.05, total, lr=2e-3)
    _, ladder = write_ladder([tmp_path / "small", tmp_path / "large"], tmp_path / "out")
    moves = {t.method: t for t in ladder.transfers}
    assert set(moves) == {"oelm-freeze", "oelm-nofreeze"}
    assert moves["oelm-freeze"].lr == moves["oelm-freeze"].lr_below == 1e-3 and moves["oelm-freeze"].cost == 0.0
    twin = moves["oelm-nofreeze"]
    assert (twin.lr_below, twin.lr, twin.moved) == (1e-3, 2e-3, 1.0)
    # best_val_loss = log(ppl): the cost is the log-loss ratio at the old LR against the new one.
    expected = 100 * np.mean([np.log(20 + 0.1 * s) / np.log((20 + 0.1 * s) / 1.05) - 1 for s in range(3)])
    assert twin.cost == pytest.approx(expected, rel=0.05) and twin.cost > 1.0
    md = (tmp_path / "out" / "ladder.md").read_text()
    assert (
        "stayed the choice in 1 of 2 moves" in md
        and "one LR per rung, carried over from the rung below, is not safe here" in md
    )
    stored = page_sections(tmp_path / "out" / "ladder.json")["transfers"]
    assert {t["method"]: t["cost"] for t in stored} == pytest.approx({"oelm-freeze": 0.0, "oelm-nofreeze": twin.cost})


def test_a_confirmation_gives_a_one_seed_rung_its_interval_and_enters_the_test(tmp_path: Path, capsys) -> None:
    """The GPU rungs' protocol: one seed per LR, then fresh seeds at the chosen LRs. Given with its
    pilot, the confirmation's seeds become the rung's gap, so the rung enters the trend test (it
    was 'not in the test'); beside a pilot with an interval they are only shown. A confirmation
    without its pilot, or at another LR than the pilot chose, is refused."""
    rungs = [law_rung(tmp_path, n, 10.0) for n in (4_000, 10_000, 25_000)]
    top = law_rung(tmp_path, 60_000, 3.0, seeds=1)
    fresh = tmp_path / "confirm-top"
    rng = np.random.default_rng(7)
    for seed in (3, 4, 5, 6):
        twin = float(np.exp(1.2 + 40 * 60_000**-0.4 + rng.normal(0, 0.003)))
        for method, value in {
            "oelm-nofreeze": twin,
            "oelm-freeze": twin * (1 + (4.0 + rng.normal(0, 0.2)) / 100),
        }.items():
            ladder_run(fresh, method, seed, value, 60_000, model="gpt-tiny", tokens_seen=20 * 60_000)
    (fresh / "plan.json").write_text("{}")
    out = tmp_path / "out"
    assert main(["report", "--view", "ladder", *map(str, [*rungs, top, fresh]), "--out", str(out)]) == 0
    data = page_sections(out / "ladder.json")
    (step,) = [s for s in data["steps"] if s["params"] == 60_000]
    assert step["n"] == 4 and step["fresh"] == "fresh seeds" and step["gap"] == pytest.approx(4.0, abs=0.5)
    assert step["pilot_gap"] == pytest.approx(3.0, abs=0.6) and step["ci_low"] < step["gap"] < step["ci_high"]
    (trend,) = data["trends"]
    assert trend["rungs"] == 4 and trend["loo_slope"][0] <= trend["slope"] <= trend["loo_slope"][1]
    md = (out / "ladder.md").read_text()
    assert f"{trend['loo_holds']} refits keep the verdict 'unresolved'" in md
    assert "Not in the test" not in md and "| 4 fresh |" in md and "the pilot's one seed +" in md

    # Beside a pilot with an interval: shown, the pilot's gap kept.
    again = law_rung(tmp_path / "b", 60_000, 3.0, seeds=3)
    assert main(["report", "--view", "ladder", *map(str, [*rungs, again, fresh]), "--out", str(out)]) == 0
    (step,) = [s for s in page_sections(out / "ladder.json")["steps"] if s["params"] == 60_000]
    assert step["n"] == 3 and step["fresh"].startswith("+") and "on 4: worse (resolved)" in step["fresh"]
    assert step["gap"] == pytest.approx(3.0, abs=0.5) and step["pilot_gap"] is None

    capsys.readouterr()
    assert main(["report", "--view", "ladder", *map(str, [*rungs, fresh]), "--out", str(tmp_path / "o2")]) == 2
    assert "no rung given does: name its pilot rung too" in capsys.readouterr().err
    other = tmp_path / "c"
    for method in ("oelm-nofreeze", "oelm-freeze"):
        ladder_run(other, method, 0, 20.0, 60_000, lr=2e-3, model="gpt-tiny", tokens_seen=20 * 60_000)
    assert main(["report", "--view", "ladder", *map(str, [*rungs, other, fresh]), "--out", str(tmp_path / "o3")]) == 2
    assert "where its pilot rung chose 0.002" in capsys.readouterr().err


def test_a_gap_that_shrinks_only_above_the_smallest_rung_shows_in_the_refits_from_each_start(
    tmp_path: Path,
) -> None:
    """No gap at the smallest rung (a model that learns next to nothing), then a gap falling with
    size: the declared test over every rung cannot say it shrinks; the exploratory refits from each
    larger start show that it does above the smallest rung, and the answer says so as exploratory."""
    gaps = {4_000: 0.0, 10_000: 14.0, 25_000: 10.0, 60_000: 6.0}
    rungs = [law_rung(tmp_path, n, g) for n, g in gaps.items()]
    assert main(["report", "--view", "ladder", *map(str, rungs), "--out", str(tmp_path / "out")]) == 0
    (trend,) = page_sections(tmp_path / "out" / "ladder.json")["trends"]
    assert not trend["verdict"].startswith("shrinks")
    (start,) = trend["from_start"]  # from 25,000 two rungs remain: no line with an interval
    assert (
        (start["from"], start["rungs"]) == (10_000, 3)
        and start["slope"] < 0
        and start["verdict"] == "shrinks with size (resolved)"
    )
    md = (tmp_path / "out" / "ladder.md").read_text()
    assert "### Without the smallest rungs (exploratory, not the declared test)" in md
    assert "| gpt | oelm-freeze vs oelm-nofreeze | 20 tokens per parameter | 10,000 | 3 |" in md
    answer = md[md.index("## The answer") : md.index("\n## ", md.index("## The answer") + 1)]
    assert "**Without the smallest rungs** (exploratory, not the declared test)" in answer
    assert "(gpt from 10,000 parameters), 1 of 1 slopes are negative" in answer and "1 shrink (resolved)" in answer
