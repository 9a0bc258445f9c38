"""The published recipes (configs/published/): each validates, and its CPU scale keeps what it says it keeps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from oelm.experiments.resolve import resolve_config
from oelm.models.gpt import GPT, gpt_config
from oelm.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "configs" / "published").glob("*.yaml"))
VOCAB = {"gpt2": 50257, "byte": 257}  # the tokenizers' vocabularies (the data's meta sets the model's)
# What a CPU scale may change: width, depth, the tokens, and the vocabulary (stated in each file).
SHRUNK = {"n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab_size", "vocab_multiple"}


@pytest.fixture(autouse=True)
def _pretend_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full scales name device cuda, checked up front: validate them here as if it were present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def resolved(path: Path, scale: str | None):
    try:
        return resolve_config(str(path), scale=scale)
    except UserError as err:
        if "llama" in str(err):  # the Llama family lands in its own commit
            pytest.skip(f"{path.name}: the Llama model family is not in this checkout ({err})")
        raise


def model_config(res) -> object:
    """The model config a run of this recipe builds (vocabulary from its tokenizer)."""
    cfg = res.config
    overrides = {**cfg.model_overrides, "vocab_size": VOCAB[res.meta["prepare"]["tokenizer"]]}
    if cfg.model.startswith("llama-"):
        catalog = pytest.importorskip("oelm.models.catalog", reason="the Llama model family is not in this checkout")
        return catalog.preset_config(cfg.model, **overrides)
    return gpt_config(cfg.model, **overrides)


def n_params(model_cfg) -> int:
    with torch.device("meta"):  # shapes only
        if isinstance(model_cfg, type(gpt_config("gpt-tiny"))):
            model = GPT(model_cfg)
        else:
            from oelm.models.catalog import build_lm  # present: model_config skipped otherwise

            model = build_lm(model_cfg)
    return sum(p.numel() for p in model.parameters())


def tokens_per_parameter(res) -> float:
    c = res.config
    return c.steps * c.batch_size * c.grad_accum * c.seq_len / n_params(model_config(res))


def test_there_are_the_two_published_recipes():
    assert {p.stem for p in RECIPES} == {"identity-q-owt", "frozen-qk"}


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_validates_and_its_cpu_scale_keeps_architecture_ratio_and_method(path: Path):
    full, cpu = resolved(path, None), resolved(path, "cpu")
    f, c = full.config, cpu.config
    assert full.meta["study"]["id"] and "arXiv" in path.read_text()  # names its source
    assert (f.device, f.dtype, f.compile) == ("cuda", "bfloat16", True)  # one GPU, bf16, compiled
    assert (c.device, c.dtype) == ("cpu", "float32")
    assert not str(c.data).startswith("/") and not str(f.data).startswith("/")
    # The method and its options are the same at both scales.
    assert (f.method, f.method_options) == (c.method, c.method_options)
    # The architecture: the same family and every field but width, depth and vocabulary.
    mf, mc = model_config(full), model_config(cpu)
    assert type(mf) is type(mc)
    same = {k for k in dataclasses.asdict(mf) if k not in SHRUNK}
    assert {k: getattr(mf, k) for k in same} == {k: getattr(mc, k) for k in same}
    assert mc.d_model < mf.d_model and mc.n_layer < mf.n_layer
    # GPT-2's 50,257 rows padded to 50,304 on the GPU (exact; the LM head's GEMMs leave align-1
    # kernels), the byte vocabulary of the CPU scale unpadded.
    assert (mf.vocab_multiple, mc.vocab_multiple) == (64, 1)
    assert f.seq_len == c.seq_len == mf.block_size
    # The tokens-per-parameter ratio (about 300 in the paper's run) is kept within 2%.
    ratio_full, ratio_cpu = tokens_per_parameter(full), tokens_per_parameter(cpu)
    assert 280 < ratio_full < 320
    assert ratio_cpu == pytest.approx(ratio_full, rel=0.02)
    # The schedule scales with the tokens: warmup as the same fraction of the steps.
    assert c.warmup / c.steps == pytest.approx(f.warmup / f.steps, rel=0.05)


def test_the_identity_q_recipe_runs_the_published_method_with_the_papers_values():
    full = resolved(ROOT / "configs" / "published" / "identity-q-owt.yaml", None).config
    from oelm.core.methods import validate_method_options

    assert full.method == "identity-q"
    opts = validate_method_options(full.method, full.method_options)
    assert (opts["attn_scale"], opts["weight_decay"]) == (0.5, 0.03)
    assert full.weight_decay == 0.1  # the baseline arm's: the method's 0.03 replaces it for identity-q
    model = model_config(resolved(ROOT / "configs" / "published" / "identity-q-owt.yaml", None))
    assert (model.n_layer, model.d_model, model.n_head, model.block_size) == (12, 768, 12, 1024)  # GPT-2 small


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_a_recipes_cpu_scale_states_the_passes_its_budget_plans(path: Path, tmp_path: Path):
    """Issue 49: the identity-Q CPU scale's header promised one pass over its corpus where its
    budget reads it about 19 times. Each CPU scale states its passes (`passes:`), and the budget
    over the data its recipe prepares plans that number (experiments.prepare.check_passes)."""
    from oelm.data.lm import prepare_lm
    from oelm.experiments.prepare import PASSES_TOLERANCE, check_passes, planned_passes

    cpu = resolved(path, "cpu")
    assert "passes" in cpu.meta, f"{path.name}'s cpu scale states no passes over its train split"
    recipe = cpu.meta["prepare"]
    prepare_lm(recipe["source"], recipe["tokenizer"], tmp_path / "data")
    cfg = cpu.config.model_copy(update={"data": str(tmp_path / "data")})
    passes = planned_passes(cfg)[0]
    assert cpu.meta["passes"] / PASSES_TOLERANCE <= passes <= cpu.meta["passes"] * PASSES_TOLERANCE
    assert check_passes(cfg, cpu.meta["passes"], path.name) == passes
    with pytest.raises(UserError, match=r"states 1 pass\(es\) over its train split, but its budget plans 1\d\.\d"):
        check_passes(cfg, 1, path.name)


@pytest.mark.slow
def test_a_config_whose_budget_plans_other_passes_than_it_states_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """`oelm train` and `oelm sweep` state the passes and refuse a study config (or scale) whose
    `passes:` the budget does not plan, before a run folder exists."""
    import yaml

    from oelm.cli import main
    from test_sweep import TINY
    from train_utils import synthetic_lm_dir

    monkeypatch.chdir(tmp_path)
    data = synthetic_lm_dir(tmp_path / "data", n_train=2000)  # 19 steps x 2 x 1024 = 19.5 passes
    config = {**TINY, "data": str(data), "steps": 19, "seq_len": 1024, "model_overrides": {"block_size": 1024}}
    study = {"study": {"id": "passes-check", "title": "t"}, **config, "out": "run", "scales": {"cpu": {"passes": 1}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(study))
    capsys.readouterr()
    assert main(["train", "c.yaml", "--scale", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "states 1 pass(es)" in err and "plans 19.5" in err
    assert not (tmp_path / "run").exists()
    spec = {"name": "p", "base": "c.yaml", "scale": "cpu", "out": "sweep", "methods": {"baseline": {"lr": [1e-3]}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", "s.yaml"]) == 2
    assert "plans 19.5" in capsys.readouterr().err
    assert not (tmp_path / "sweep" / "runs").exists()
