"""Regime search: run several small baseline-vs-oelm-freeze sweeps at once and keep their reports.

Used to choose the quickstart's regime and the gap regime: each named regime is a sweep (2 arms x
3 LRs x 3 seeds, equal budgets, LR chosen on validation, test perplexity on a held-out split)
run through the ordinary `oelm sweep` machinery, one thread per run. Reports land in
OUT/NAME.md (OUT = $OUT or ./regime-search), each headed by its wall time.

    python scripts/regime_search.py --list
    python scripts/regime_search.py --paged                             # the regimes with a stored page
    python scripts/regime_search.py --store NAME...                     # store records, list each page
    python scripts/regime_search.py --summary [OUT]                     # table of the reports
    CONC=4 PAR=4 python scripts/regime_search.py A_docs800 B_code800    # 16 cores
    CONC=1 PAR=2 python scripts/regime_search.py B_code800              # 2 cores

Data: the TinyStories and WikiText-2 samples under DATA (default ../shared/data/lm, relative to
the repo root); the Python corpora are built in.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing import Process
from pathlib import Path

OUT = Path(os.environ.get("OUT", "regime-search"))
ROOT = Path(os.environ.get("RUNS", "runs/regime-search"))
DATA = os.environ.get("DATA", "../shared/data/lm")


def base_cfg(
    steps: int, bs: int = 8, seq: int = 128, model: str = "gpt-tiny", model_overrides: dict | None = None
) -> dict:
    """The training config shared by both arms of one regime."""
    return {
        "model_overrides": model_overrides or {},
        "task": "lm",
        "model": model,
        "steps": steps,
        "batch_size": bs,
        "seq_len": seq,
        "warmup": max(1, steps // 10),
        "eval_every": max(1, steps // 5),
        "eval_batches": 16,
        "final_eval_batches": 64,
        "checkpoint_every": 0,
        "device": "cpu",
        "tensorboard": False,
        "log_every": 50,
    }


def spec(name: str, prep: dict, steps: int, grids: dict, seeds=(0, 1, 2), **kw) -> dict:
    """A sweep spec dict for one regime."""
    out = ROOT / name
    cfg = base_cfg(steps, **kw)
    cfg["data"] = (out / "data").as_posix()
    return {
        "name": name,
        "out": out.as_posix(),
        "prepare": prep,
        "config": cfg,
        "methods": {m: {"lr": g} for m, g in grids.items()},
        "seeds": list(seeds),
        # As the regimes were first measured: each arm's grid as written, an edge choice a warning,
        # not a reason to extend (a one-LR direction check stays one LR).
        "max_extend": 0,
    }


G = [1e-3, 3e-3, 1e-2]
G2 = [1.5e-3, 3e-3, 6e-3]
G3 = [3e-3, 6e-3, 1.2e-2]
DOCS = {"source": "builtin:python-docs", "tokenizer": "byte", "test_fraction": 0.2, "val_fraction": 0.1}
TALES = {"source": "builtin:tales", "tokenizer": "byte", "test_fraction": 0.1, "val_fraction": 0.05}
CODE = {"source": "builtin:python-stdlib", "tokenizer": "byte", "test_fraction": 0.1, "val_fraction": 0.05}
TS = {
    "files": {"train": f"{DATA}/tinystories/train_head.txt", "test": f"{DATA}/tinystories/valid_head.txt"},
    "tokenizer": "byte",
    "val_fraction": 0.05,
    "name": "tinystories-sample",
}
WT = {
    "files": {
        "train": f"{DATA}/wikitext-2-raw/wiki.train.head.txt",
        "val": f"{DATA}/wikitext-2-raw/wiki.valid.head.txt",
        "test": f"{DATA}/wikitext-2-raw/wiki.test.raw",
    },
    "tokenizer": "byte",
    "name": "wikitext-2-sample",
}
BOTH = {"baseline": G, "oelm-freeze": G}
BOTH2 = {"baseline": G2, "oelm-freeze": G2}
ONE = {"baseline": [3e-3], "oelm-freeze": [3e-3]}
NARROW = {"baseline": [1.5e-3, 3e-3, 6e-3], "oelm-freeze": [3e-3, 6e-3, 1.2e-2]}
DEEP = {"n_layer": 4, "d_model": 96, "n_head": 4}

REGIMES = {
    "q600": lambda: spec("q600", DOCS, 600, BOTH),
    "q1000": lambda: spec("q1000", DOCS, 1000, BOTH),
    "ts800": lambda: spec("ts800", TS, 800, BOTH),
    "wt1000": lambda: spec("wt1000", WT, 1000, BOTH),
    "A_docs800": lambda: spec("A_docs800", DOCS, 800, BOTH2),
    "B_code800": lambda: spec("B_code800", CODE, 800, BOTH2),
    "D_deep800": lambda: spec("D_deep800", DOCS, 800, BOTH2, model_overrides=DEEP),
    "E_ts1200": lambda: spec("E_ts1200", TS, 1200, {"baseline": G3, "oelm-freeze": G2}),
    "E2_ts1200b4": lambda: spec("E2_ts1200b4", TS, 1200, {"baseline": G2, "oelm-freeze": G3}, bs=4),
    # Direction checks for an offline quickstart with the frozen arm behind (one LR per arm).
    "P_code1500": lambda: spec("P_code1500", CODE, 1500, ONE),
    "P_docs1500": lambda: spec("P_docs1500", DOCS, 1500, ONE),
    "P_code1500s256": lambda: spec("P_code1500s256", CODE, 1500, ONE, bs=4, seq=256),
    "P_code1500d64": lambda: spec("P_code1500d64", CODE, 1500, ONE, bs=16, model_overrides={"d_model": 64}),
    # The narrow model (d_model 64, head dim 16) on the stdlib source: the quickstart candidates.
    "Q_n1000": lambda: spec("Q_n1000", CODE, 1000, NARROW, bs=16, model_overrides={"d_model": 64}),
    "Q_n1000hi": lambda: spec(
        "Q_n1000",
        CODE,
        1000,
        {"baseline": [1.2e-2, 2.4e-2], "oelm-freeze": [2.4e-2, 4.8e-2]},
        seeds=(0,),
        bs=16,
        model_overrides={"d_model": 64},
    ),
    "T_n1000": lambda: spec(
        "T_n1000",
        TALES,
        1000,
        {"baseline": [1.2e-2], "oelm-freeze": [1.2e-2, 2.4e-2]},
        seeds=(0,),
        bs=16,
        model_overrides={"d_model": 64},
    ),
    "T_t800": lambda: spec("T_t800", TALES, 800, {"baseline": [6e-3], "oelm-freeze": [6e-3]}, seeds=(0,)),
    "Q_n800": lambda: spec("Q_n800", CODE, 800, NARROW, bs=16, model_overrides={"d_model": 64}),
    # Direction checks on WikiText-2 past the 1,200-step gap regime (one seed, one LR per arm).
    "W_n2000": lambda: spec(
        "W_n2000",
        WT,
        2000,
        {"baseline": [1.2e-2], "oelm-freeze": [1.2e-2]},
        seeds=(0,),
        bs=16,
        model_overrides={"d_model": 64},
    ),
    "W_t2400": lambda: spec("W_t2400", WT, 2400, {"baseline": [1.5e-3], "oelm-freeze": [3e-3]}, seeds=(0,)),
}


# The regimes whose pages docs/results/regime-search keeps (their records under records/NAME, each
# page regenerated by `oelm report` through docs/results/pages.yaml).
PAGED = (
    "q600",
    "q1000",
    "ts800",
    "wt1000",
    "A_docs800",
    "B_code800",
    "D_deep800",
    "E_ts1200",
    "E2_ts1200b4",
    "P_code1500",
    "P_docs1500",
    "W_n2000",
    "W_t2400",
)
RESULTS = Path("docs/results")
STORED = "regime-search"


def store(names: list[str]) -> None:
    """Store each finished regime's runs as compact records in docs/results/regime-search/records/NAME
    and list its page in docs/results/pages.yaml (`python scripts/regenerate_results.py` writes it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from oelm.utils.errors import UserError
    from store_records import store as store_records

    pages = RESULTS / "pages.yaml"
    for name in names:
        records = f"{STORED}/records/{name}"
        try:
            n = store_records(ROOT / name, RESULTS / records)
        except UserError as e:
            sys.exit(f"regime_search: {name}: {e}")
        print(f"{name}: {n} run records -> {RESULTS / records}")
        line = f"- {{command: report, records: {records}, out: {STORED}/{name}}}\n"
        listed = pages.read_text(encoding="utf-8")
        if line not in listed:  # each stored regime is listed at once: a later refusal keeps it
            pages.write_text(listed + line, encoding="utf-8")


def run_one(name: str) -> None:
    """Run one regime's sweep and copy its report to OUT/NAME.md."""
    from oelm.experiments.runner import run_sweep
    from oelm.experiments.sweep import spec_from_dict

    start = time.time()
    raw = REGIMES[name]()
    try:
        run_sweep(spec_from_dict(raw), parallel=int(os.environ.get("PAR", 2)), progress=False, threads=1)
        rep = Path(raw["out"]) / "report" / "report.md"
        text = rep.read_text() if rep.is_file() else "no report"
    except Exception:  # keep the other regimes going; the traceback is the report
        text = traceback.format_exc()
    (OUT / f"{name}.md").write_text(f"wall {time.time() - start:.0f}s\n\n{text}")
    print(name, "done", f"{time.time() - start:.0f}s", flush=True)


def summary(folder: Path) -> str:
    """A markdown table of every OUT/NAME.md: each arm's chosen LR, test perplexity, gap and p."""
    rows = [
        "| regime | wall | baseline (LR) | oelm-freeze (LR) | gap [paired 95% CI] | p | warnings |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(folder.glob("*.md")):
        if path.name == "README.md":
            continue
        lines = path.read_text().splitlines()
        arms: dict[str, list[str]] = {}
        for ln in lines:  # the first table is the comparison; later ones are the LR sweep
            if ln.startswith(("| baseline | lr", "| oelm-freeze | lr")):
                arms.setdefault(ln.split("|")[1].strip(), [c.strip() for c in ln.split("|")[1:-1]])
        if set(arms) != {"baseline", "oelm-freeze"}:
            continue
        b, f = arms["baseline"], arms["oelm-freeze"]
        warn = sum("Warning" in ln and "grid" in ln for ln in lines)
        rows.append(
            f"| {path.stem} | {lines[0].removeprefix('wall ')} | {b[2]} ({b[1]}) | {f[2]} ({f[1]}) | "
            f"{f[3]} | {f[4]} | {warn or ''} |"
        )
    return "\n".join(rows)


def main(names: list[str]) -> None:
    if names[:1] == ["--summary"]:
        print(summary(Path(names[1]) if len(names) > 1 else OUT))
        return
    if names == ["--list"] or not names:
        print("\n".join(REGIMES))
        return
    if names == ["--paged"]:
        print(" ".join(PAGED))
        return
    if names[:1] == ["--store"]:
        unknown = [n for n in names[1:] if n not in PAGED]
        if unknown or len(names) < 2:
            sys.exit(f"--store takes regimes with a page ({', '.join(PAGED)}); got {unknown or 'none'}")
        store(names[1:])
        return
    unknown = [n for n in names if n not in REGIMES]
    if unknown:
        sys.exit(f"unknown regime(s) {unknown}; known: {', '.join(REGIMES)}")
    OUT.mkdir(parents=True, exist_ok=True)
    conc, running = int(os.environ.get("CONC", 1)), []
    for name in names:
        while sum(p.is_alive() for p in running) >= conc:
            time.sleep(2)
        proc = Process(target=run_one, args=(name,))
        proc.start()
        running.append(proc)
    for proc in running:
        proc.join()


if __name__ == "__main__":
    main(sys.argv[1:])
