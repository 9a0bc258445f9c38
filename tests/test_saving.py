"""Save and load keep the method: oelm_method.json, oelm.from_pretrained, oelm.load_model(RUN_DIR)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import oelm
from oelm.core.audit import audit_model, verify_audit
from oelm.core.record import METHOD_RECORD_FILE, read_record
from oelm.core.state import method_state
from oelm.core.targets import find_targets
from oelm.models.gpt import GPT, gpt_config
from oelm.models.hf_cls import dtype_kwarg
from oelm.training.loop import train
from oelm.utils.errors import UserError
from test_freezing import FAMILIES, VOCAB, make
from train_utils import one_thread, synthetic_lm_dir, tiny_config


def _logits(model, x: torch.Tensor) -> torch.Tensor:
    out = model(x) if isinstance(model, (oelm.GPT, oelm.Llama)) else model(input_ids=x)
    return out[0] if isinstance(out, tuple) else out.logits


def _frozen(model) -> set[str]:
    return {n for n, p in model.named_parameters() if not p.requires_grad}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["oelm-freeze", "oelm-qk-ffn", "oelm-lowrank"])
def test_from_pretrained_restores_the_method_without_reinit(family, method, tmp_path):
    model = make(family).eval()
    oelm.apply_method(model, method, seed=3)
    with torch.no_grad():  # "training": trainable weights move, so a re-init would show
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    oelm.save_pretrained(model, tmp_path)
    record = read_record(tmp_path)
    assert record["method"] == method and record["method_seed"] == 3
    assert set(record["frozen"]) == _frozen(model)

    again = oelm.from_pretrained(tmp_path).eval()
    x = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_logits(model, x), _logits(again, x))
    assert _frozen(again) == _frozen(model)
    state = method_state(again)
    assert state.method.name == method and state.inits == method_state(model).inits
    assert state.options == method_state(model).options
    audit = audit_model(again)
    assert audit.totals["frozen"] == audit_model(model).totals["frozen"]
    assert audit.totals["max_orthogonality_error"] < 1e-5
    assert verify_audit(again, audit).ok


@pytest.mark.parametrize("method", ["oelm-upper-half", "oelm-unfreeze"])
def test_layer_options_and_a_schedule_phase_round_trip(method, tmp_path):
    model = make("bert").eval()
    oelm.apply_method(model, method, seed=1)
    if method == "oelm-unfreeze":  # the schedule's switch happened before saving
        from oelm.core.freezing import unfreeze_projection

        for layer in find_targets(model).layers:
            unfreeze_projection(layer.q)
            unfreeze_projection(layer.k)
    model.save_pretrained(tmp_path)
    again = oelm.from_pretrained(tmp_path)
    assert _frozen(again) == _frozen(model)
    assert method_state(again).options == method_state(model).options


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_hf_own_save_pretrained_writes_the_record_and_plain_load_still_works(family, tmp_path):
    import transformers as T

    model = make(family).eval()
    oelm.apply_method(model, "oelm-freeze", seed=0)
    model.save_pretrained(tmp_path)  # the model's own method, as Trainer calls it
    assert (tmp_path / METHOD_RECORD_FILE).is_file()
    plain = T.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    x = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_logits(model, x), _logits(plain, x), atol=1e-6)
    assert not _frozen(plain)  # plain transformers ignores the record
    copied = copy.deepcopy(model)  # the hook is bound per instance: a copy saves itself
    copied.save_pretrained(tmp_path / "copy")
    assert set(read_record(tmp_path / "copy")["frozen"]) == _frozen(model)
    torch.save(model, tmp_path / "whole.pt")  # the hook pickles with the model
    unpickled = torch.load(tmp_path / "whole.pt", weights_only=False)
    unpickled.save_pretrained(tmp_path / "unpickled")
    assert (tmp_path / "unpickled" / METHOD_RECORD_FILE).is_file()


def test_edited_frozen_weights_and_missing_record_are_clear_errors(tmp_path):
    model = make("bert")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    oelm.save_pretrained(model, tmp_path / "m")
    record = json.loads((tmp_path / "m" / METHOD_RECORD_FILE).read_text())
    name = next(iter(record["frozen"]))
    weights_file = tmp_path / "m" / "model.safetensors"
    weights = load_file(weights_file)
    key = next(k for k in weights if name.endswith(k) or k.endswith(name))
    weights[key] = weights[key] + 1e-3  # the weights edited, the record intact
    save_file(weights, weights_file, metadata={"format": "pt"})
    with pytest.raises(UserError, match="differ from the saved fingerprints"):
        oelm.from_pretrained(tmp_path / "m")
    model.save_pretrained(tmp_path / "plain")
    (tmp_path / "plain" / METHOD_RECORD_FILE).unlink()
    with pytest.raises(UserError, match="saved without a method"):
        oelm.from_pretrained(tmp_path / "plain")


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20-step gpt-tiny oelm-freeze run on synthetic tokens, with best and step checkpoints."""
    root = tmp_path_factory.mktemp("lmrun")
    cfg = tiny_config(synthetic_lm_dir(root / "data", n_train=4000), root / "run", weight_decay=0.1)
    with one_thread():
        train(cfg)
    return root / "run"


def test_load_model_returns_the_trained_model_with_its_method(lm_run):
    from oelm.training.checkpoint import load_weights

    model = oelm.load_model(lm_run)
    assert method_state(model).method.name == "oelm-freeze" and not model.training
    assert _frozen(model) == {n for n, _ in model.named_parameters() if "q_proj" in n or "k_proj" in n}
    assert audit_model(model).totals["max_orthogonality_error"] < 1e-5
    reference = oelm.GPT(model.config)
    load_weights(reference, lm_run / "checkpoints" / "best" / "model.safetensors")
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(x)[0], reference.eval()(x)[0])
    latest = oelm.load_model(lm_run, which="latest")
    assert latest.config == model.config
    with pytest.raises(UserError, match="which="):
        oelm.load_model(lm_run, which="worst")


def test_load_model_refuses_a_checkpoint_whose_frozen_qk_moved(lm_run, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from oelm.training.checkpoint import read_metadata

    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    best = run / "checkpoints" / "best" / "model.safetensors"
    tensors, meta = load_file(best), read_metadata(best)
    tensors["transformer.h.0.attn.q_proj.weight"] += 1e-3
    save_file(tensors, best, metadata=meta)
    with pytest.raises(UserError, match="changed during training"):
        oelm.load_model(run)


def test_load_model_rebuilds_a_gpt_classifier_run(tmp_path):
    import yaml

    from oelm.models.gpt import GPTClassifier, gpt_config
    from oelm.training.checkpoint import save_best

    torch.manual_seed(5)
    cfg = gpt_config("gpt-tiny", vocab_size=VOCAB, block_size=16)
    model = GPTClassifier(cfg, num_labels=3, causal=True)
    oelm.apply_method(model, "oelm-global", seed=5)
    with torch.no_grad():
        model.score.bias.add_(0.5)  # trained, as far as the loader can tell
    meta = {
        "num_labels": 3,
        "label_names": ["a", "b", "c"],
        "max_length": 16,
        "method": "oelm-global",
        "gpt_config": dataclasses.asdict(cfg),
        "tokenizer": "byte",
        "causal": True,
        "task": "classification",
        "seed": 5,
        "step": 10,
    }
    save_best(tmp_path / "checkpoints", model, meta)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"method": "oelm-global", "seed": 5, "method_options": {}}))
    loaded = oelm.load_model(tmp_path)
    assert isinstance(loaded, GPTClassifier) and loaded.causal and loaded.num_labels == 3
    x = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(loaded(x)[0], model.eval()(x)[0])
    assert _frozen(loaded) == _frozen(model) and method_state(loaded).method.name == "oelm-global"


def test_from_pretrained_in_another_dtype_needs_verify_false(tmp_path):
    import transformers as T

    model = make("llama")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    model.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="verify=False"):
        oelm.from_pretrained(tmp_path, **dtype_kwarg(torch.bfloat16))
    half = oelm.from_pretrained(tmp_path, **dtype_kwarg(torch.bfloat16), verify=False)
    assert half.dtype == torch.bfloat16 and _frozen(half) == _frozen(model)
    assert isinstance(half, T.LlamaForSequenceClassification)


@pytest.mark.parametrize("method", ["oelm-unfreeze", "oelm-lowrank"])
def test_load_model_of_runs_with_a_schedule_or_an_adapter(method, tmp_path):
    from oelm.training.checkpoint import load_weights, read_metadata
    from oelm.training.runs import model_from_meta

    cfg = tiny_config(
        synthetic_lm_dir(tmp_path / "data", n_train=2000),
        tmp_path / "run",
        method=method,
        steps=8,
        eval_every=4,
        checkpoint_every=4,
        warmup=1,
    )
    with one_thread():
        train(cfg)
    model = oelm.load_model(tmp_path / "run", which="latest")
    path = tmp_path / "run" / "checkpoints" / "step_0000008" / "model.safetensors"
    reference = model_from_meta(read_metadata(path), path)
    meta = read_metadata(path)
    oelm.apply_method(reference, meta["method"], seed=int(meta["method_seed"]), **json.loads(meta["method_options"]))
    load_weights(reference, path)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(x)[0], reference.eval()(x)[0])
    assert method_state(model).method.name == method


@pytest.mark.parametrize(
    "field,edit",
    [
        ("method", lambda r: r.update(method="baseline")),
        ("method_seed", lambda r: r.update(method_seed=r["method_seed"] + 1)),
        ("frozen", lambda r: r["frozen"].popitem()),
        ("qk_init", lambda r: r.update(qk_init="keep")),
    ],
)
def test_an_edited_method_record_is_refused_naming_the_field(field, edit, tmp_path: Path) -> None:
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16))
    oelm.apply_method(model, "oelm-freeze", seed=0)
    oelm.save_pretrained(model, tmp_path)
    assert oelm.from_pretrained(tmp_path) is not None
    path = tmp_path / METHOD_RECORD_FILE
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(UserError, match=rf"field\(s\) {field} differ from the digests"):
        oelm.from_pretrained(tmp_path)


def test_saved_files_follow_the_users_umask(tmp_path: Path) -> None:
    """safetensors writes 0600 whatever the umask; a saved model must be readable as the user asked."""
    import os

    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16))
    oelm.apply_method(model, "oelm-freeze", seed=0)
    old = os.umask(0o022)
    try:
        oelm.save_pretrained(model, tmp_path / "ours")
        hf = make("bert")
        oelm.apply_method(hf, "oelm-freeze", seed=0)
        oelm.save_pretrained(hf, tmp_path / "hf")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for d in ("ours", "hf") for p in (tmp_path / d).iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes


def test_saving_into_a_folder_leaves_its_other_files_modes_alone(tmp_path: Path) -> None:
    import os

    script, secret = tmp_path / "run.sh", tmp_path / ".env"
    script.write_text("#!/bin/sh\n")
    secret.write_text("TOKEN=x\n")
    os.chmod(script, 0o755)
    os.chmod(secret, 0o600)
    hf = make("bert")
    oelm.apply_method(hf, "oelm-freeze", seed=0)
    hf.save_pretrained(tmp_path)  # the model's own save_pretrained, through oelm's hook
    oelm.save_pretrained(hf, tmp_path)
    assert script.stat().st_mode & 0o777 == 0o755 and secret.stat().st_mode & 0o777 == 0o600
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def _trained(family: str, method: str):
    model = make(family).eval()  # the same initial weights and method seed for every method
    oelm.apply_method(model, method, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    return model


@pytest.mark.parametrize("family", ["oelm-gpt", "gpt2", "bert"])
@pytest.mark.parametrize("other", ["baseline", "oelm-freeze-q", "oelm-lower-half"])
def test_a_record_copied_from_a_model_that_froze_less_is_refused(family, other, tmp_path: Path) -> None:
    """Its frozen tensors match these weights (same seed, same init), so only the Q/K it left
    trainable can tell: before, the weights loaded with their frozen Q/K trainable."""
    oelm.save_pretrained(_trained(family, "oelm-freeze"), tmp_path / "frozen")
    oelm.save_pretrained(_trained(family, other), tmp_path / "other")
    assert oelm.from_pretrained(tmp_path / "other") is not None  # each record fits its own weights
    (tmp_path / "frozen" / METHOD_RECORD_FILE).write_bytes((tmp_path / "other" / METHOD_RECORD_FILE).read_bytes())
    with pytest.raises(UserError, match=rf"record \('{other}'\) does not describe these weights: Q/K tensors"):
        oelm.from_pretrained(tmp_path / "frozen")


def test_a_record_written_before_qk_fingerprints_still_loads(tmp_path: Path) -> None:
    oelm.save_pretrained(_trained("oelm-gpt", "oelm-freeze"), tmp_path)
    path = tmp_path / METHOD_RECORD_FILE
    record = json.loads(path.read_text())
    del record["qk_tensors"], record["identity"]["qk_tensors"]
    path.write_text(json.dumps(record))
    assert _frozen(oelm.from_pretrained(tmp_path)) == set(record["frozen"])
    del record["identity"]  # the field removed but its digest kept is an edit
    record["identity"] = json.loads(path.read_text())["identity"] | {"qk_tensors": "0" * 16}
    path.write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"field\(s\) qk_tensors differ"):
        oelm.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda a: "{not json", "is corrupt"),
        (lambda a: json.dumps({"class": "GPT"}), "does not describe a model"),
        (lambda a: json.dumps({**a, "gpt_config": {**a["gpt_config"], "bogus": 1}}), "does not describe a model"),
    ],
)
def test_a_corrupt_architecture_file_is_one_error_naming_it(edit, words, tmp_path: Path) -> None:
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16))
    oelm.apply_method(model, "oelm-freeze", seed=0)
    oelm.save_pretrained(model, tmp_path)
    path = tmp_path / "oelm_model.json"
    path.write_text(edit(json.loads(path.read_text())))
    with pytest.raises(UserError, match=rf"oelm_model\.json'? {words}.*re-save"):
        oelm.from_pretrained(tmp_path)


def test_a_method_record_that_is_not_utf8_is_one_error(tmp_path: Path) -> None:
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16))
    oelm.apply_method(model, "oelm-freeze", seed=0)
    oelm.save_pretrained(model, tmp_path)
    (tmp_path / METHOD_RECORD_FILE).write_bytes('{"method": "caf\u00e9"}'.encode("cp1252"))
    with pytest.raises(UserError, match=r"oelm_method\.json' is not valid JSON .*re-save the model"):
        oelm.from_pretrained(tmp_path)
