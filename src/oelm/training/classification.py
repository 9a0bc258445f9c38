"""The classification task: our GPTClassifier or a HF sequence classifier on a registered dataset.

The best checkpoint is the one with the highest validation accuracy; the held-out split (see
`oelm.data.cls` for which split plays which role) is evaluated once, on that checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from oelm.core.flops import theoretical_saving
from oelm.data.cls import ClassificationData, PadCollator, encode_pairs, gpt_separator_id, load_classification
from oelm.data.tokenizers import load_tokenizer
from oelm.models.gpt import GPTClassifier
from oelm.models.hf_cls import is_gpt_preset, load_hf_classifier, load_hf_tokenizer, resolve_hf_source
from oelm.records.facts import CLASSIFICATION
from oelm.records.run import TEST_OFFICIAL
from oelm.training import metrics as M
from oelm.training.config import ClassificationOptions, TrainConfig
from oelm.training.distributed import all_reduce_sum, all_reduce_tensor
from oelm.training.task import Batch, Task, checked_model_config
from oelm.utils.errors import UserError

log = logging.getLogger(__name__)

SPLITS = {"val": "validation", "test": "heldout"}


def logits_and_loss(out: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, loss) from our models' tuples or a HF ModelOutput."""
    if isinstance(out, tuple):
        return out[0], out[1]
    return out.logits, out.loss


class ClassificationTask(Task):
    """Sequence classification with dynamic padding, accuracy-based selection and a held-out report."""

    name = "classification"
    higher_is_better = True  # accuracy
    reporting = CLASSIFICATION

    def __init__(self, cfg, dist, device) -> None:
        super().__init__(cfg, dist, device)
        self.opts: ClassificationOptions = cfg.classification or ClassificationOptions()
        self.data: ClassificationData | None = None
        self.data_fingerprint: str | None = None
        self.features: dict[str, list[dict[str, Any]]] = {}
        self.tokenizer: Any = None
        self.hf = False
        self.model_cfg = None
        self.collate: PadCollator | None = None
        self._budget: dict[str, int] = {}  # steps / eval_every resolved from epochs
        self.max_length = 0
        # Same generator on every rank and for every method: the data order depends only on the seed.
        self.gen = torch.Generator().manual_seed(cfg.data_seed if cfg.data_seed is not None else cfg.seed)
        self.order: list[int] = []
        self.order_state = self.gen.get_state()
        self.pos = 0
        self.epoch = 0
        self._host_tokens: dict[int, int] = {}  # id(device mask) -> non-padding tokens, counted on the host
        self.history: list[dict[str, float]] = []  # periodic validation evals, in order
        self.extra_results: dict[str, dict[str, float]] = {}

    # ---- setup -------------------------------------------------------------------------------
    def validate(self) -> None:
        """Load and encode the data, resolve the model and tokenizer, set an epoch budget if asked."""

        self.hf = not is_gpt_preset(self.cfg.model)
        self._check_options()
        self.data = self._load_data()
        if self.hf:
            self._setup_hf()
        else:
            self._setup_gpt()
        self.features = {
            "train": encode_pairs(self.data.train, self.tokenizer, self.max_length, self._sep()),
            "validation": encode_pairs(self.data.validation, self.tokenizer, self.max_length, self._sep()),
            "heldout": encode_pairs(self.data.heldout, self.tokenizer, self.max_length, self._sep()),
        }
        for name, rows in self.data.extra_eval.items():
            self.features[name] = encode_pairs(rows, self.tokenizer, self.max_length, self._sep())
        self._check_batch_fits()
        self._apply_epoch_budget()

    def _check_batch_fits(self) -> None:
        """Refuse an optimizer step larger than the training split: it would hold some rows twice."""
        rows = len(self.features["train"])
        b, accum, world = self.cfg.batch_size, self.cfg.grad_accum, self.dist.world
        if b * accum * world > rows:
            raise UserError(
                f"batch_size {b} x grad_accum {accum} x {world} process(es) = {b * accum * world} rows per "
                f"optimizer step, but the training split has {rows} rows: each step would repeat rows. Lower "
                "batch_size or grad_accum so that their product with the processes is at most "
                f"{rows}, or use more data"
            )

    def _check_options(self) -> None:
        if self.opts.causal and self.hf:
            raise UserError("classification.causal applies to our GPT presets only; drop it for HF models")
        qk_init = self.cfg.method_options.get("qk_init")
        if qk_init not in (None, "reinit") and not self.hf:
            raise UserError(
                f"qk_init={qk_init!r} needs pretrained Q/K weights; our GPT presets start from scratch "
                "(drop --qk-init, or use a HF model)"
            )

    def _load_data(self) -> ClassificationData:
        o = self.opts
        fields = o.text_fields or ["text"]
        data = load_classification(
            o.dataset or self.cfg.data,
            data_dir=o.data_dir,
            seed=o.split_seed,
            max_train=o.max_train,
            max_eval=o.max_eval,
            val_fraction=o.val_fraction,
            three_way_fractions=o.split_fractions,
            eval_dataset=o.eval_dataset,
            eval_data_dir=o.eval_data_dir,
            text_column=fields[0],
            text_pair_column=fields[1] if len(fields) > 1 else None,
            label_column=o.label_field or "label",
            num_labels=o.num_labels,
        )
        if o.num_labels is not None and o.num_labels != data.num_labels:
            raise UserError(
                f"classification.num_labels={o.num_labels} but {data.name} has {data.num_labels} labels "
                f"({', '.join(data.label_names)}); drop num_labels or fix it"
            )
        if self.dist.is_main and self.cfg.progress:
            log.info(data_summary_line(data))
        self.data_fingerprint = examples_fingerprint(data)
        return data

    def _setup_gpt(self) -> None:
        self.tokenizer = load_tokenizer(self.opts.tokenizer)
        if self.data.is_pair:
            gpt_separator_id(self.tokenizer)  # grows the vocabulary before the model is sized
        overrides = {"vocab_size": self.tokenizer.vocab_size, **self.cfg.model_overrides}
        self.model_cfg = checked_model_config(self.cfg.model, overrides, self.cfg.method)
        if self.model_cfg.vocab_size < self.tokenizer.vocab_size:
            raise UserError(
                f"model_overrides.vocab_size={self.model_cfg.vocab_size} is smaller than the tokenizer's "
                f"{self.tokenizer.vocab_size} tokens (incl. the pair separator); drop the override"
            )
        self.max_length = self.opts.max_length or self.cfg.seq_len or self.model_cfg.block_size
        if self.max_length > self.model_cfg.block_size:
            raise UserError(
                f"max_length {self.max_length} exceeds the context of {self.cfg.model} (block_size "
                f"{self.model_cfg.block_size}); lower it or set model_overrides.block_size={self.max_length}"
            )
        self.collate = PadCollator(self.tokenizer.eot_id, self.opts.padding_side)

    def _setup_hf(self) -> None:

        if self.cfg.model_overrides:
            raise UserError("model_overrides apply to our GPT presets only; drop them for HF models")
        resolve_hf_source(self.cfg.model)  # a clear error for a bad folder before anything loads
        self.tokenizer = load_hf_tokenizer(self.cfg.model)
        limit = min(512, getattr(self.tokenizer, "model_max_length", 512) or 512)
        self.max_length = self.opts.max_length or self.cfg.seq_len or limit
        self.collate = PadCollator(int(self.tokenizer.pad_token_id), self.opts.padding_side)

    def _sep(self) -> int | None:
        if self.hf or not self.data.is_pair:
            return None
        return gpt_separator_id(self.tokenizer)

    def steps_per_epoch(self) -> int:
        """Optimizer steps that see the whole train split once (global batch, last one partial)."""
        per_step = self.cfg.batch_size * self.cfg.grad_accum * self.dist.world
        return max(1, math.ceil(len(self.features["train"]) / per_step))

    def _apply_epoch_budget(self) -> None:
        # validate() runs before the run directory is planned, so config.yaml records these.
        per_epoch = self.steps_per_epoch()
        if self.opts.epochs is not None:
            steps = max(1, math.ceil(self.opts.epochs * per_epoch))
            if self.cfg.warmup >= steps and self.cfg.schedule != "constant":
                raise UserError(
                    f"{self.opts.epochs} epoch(s) are {steps} steps, not more than warmup "
                    f"({self.cfg.warmup}); lower --warmup"
                )
            self._budget["steps"] = steps
        if self.opts.evals_per_epoch:
            self._budget["eval_every"] = max(1, per_epoch // self.opts.evals_per_epoch)

    def resolved_config(self) -> TrainConfig:
        """The config with the epoch budget in steps (and evaluations per epoch) filled in."""
        return self.cfg.model_copy(update=self._budget) if self._budget else self.cfg

    def build_model(self) -> nn.Module:
        """GPTClassifier sized to the tokenizer, or the HF model with a new num_labels head."""
        if self.hf:
            model = load_hf_classifier(self.cfg.model, self.data.num_labels, self.data.label_names)
            model.config.pad_token_id = self.collate.pad_id
            return model

        return GPTClassifier(self.model_cfg, self.data.num_labels, causal=self.opts.causal)

    # ---- training ----------------------------------------------------------------------------
    def _next_indices(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if self.pos >= len(self.order):
                self.order_state = self.gen.get_state()
                self.order = torch.randperm(len(self.features["train"]), generator=self.gen).tolist()
                self.pos = 0
                self.epoch += 1
            take = self.order[self.pos : self.pos + n - len(out)]
            out.extend(take)
            self.pos += len(take)
        return out

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def next_batch(self) -> Batch:
        """This rank's slice of the next global batch (epochs reshuffled by the data seed)."""
        b = self.cfg.batch_size
        idx = self._next_indices(b * self.dist.world)[self.dist.rank * b : (self.dist.rank + 1) * b]
        host = self.collate([self.features["train"][i] for i in idx])
        batch = self._to_device(host)
        # Counted before the copy: summing the device mask would sync the host every step.
        self._host_tokens[id(batch["attention_mask"])] = int(host["attention_mask"].sum())
        return batch

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy of a micro-batch."""
        return logits_and_loss(model(**batch))[1]

    def batch_tokens(self, batch: Batch) -> int:
        """Non-padding tokens of a micro-batch."""
        n = self._host_tokens.pop(id(batch["attention_mask"]), None)
        return n if n is not None else int(batch["attention_mask"].sum())

    # ---- evaluation --------------------------------------------------------------------------
    def has_split(self, split: str) -> bool:
        """ "val" is the validation split, "test" the held-out one."""
        return split in SPLITS

    @torch.no_grad()
    def _eval_features(self, model: nn.Module, feats: list[dict[str, Any]], items: bool = False) -> dict[str, Any]:
        n = self.data.num_labels
        bs = self.opts.eval_batch_size or self.cfg.batch_size
        mine = feats[self.dist.rank :: self.dist.world]
        confusion = torch.zeros(n, n, dtype=torch.float64)  # rows: label, columns: prediction
        # Per-example correctness in the split's order (rank r holds examples r, r + world, ...).
        correct = torch.zeros(len(feats), dtype=torch.float64)
        loss_sum = 0.0
        for i in range(0, len(mine), bs):
            batch = self._to_device(self.collate(mine[i : i + bs]))
            logits, _ = logits_and_loss(model(**batch))
            loss_sum += float(nn.functional.cross_entropy(logits.float(), batch["labels"], reduction="sum"))
            labels, preds = batch["labels"].cpu(), logits.argmax(-1).cpu()
            confusion += torch.bincount(labels * n + preds, minlength=n * n).reshape(n, n).double()
            if items:
                start = self.dist.rank + i * self.dist.world
                correct[start : start + len(labels) * self.dist.world : self.dist.world] = (labels == preds).double()
        reduced = all_reduce_sum([loss_sum, *confusion.flatten().tolist()], self.dist, self.device)
        confusion = np.asarray(reduced[1:]).reshape(n, n)
        total = float(confusion.sum())  # plain floats: the history goes into state.pt (weights-only load)
        out: dict[str, Any] = {
            "loss": reduced[0] / max(total, 1.0),
            "accuracy": float(np.trace(confusion) / max(total, 1.0)),
            "macro_f1": M.macro_f1_from_confusion(confusion),
            "examples": int(total),
        }
        if items:
            # Every arm sees the same examples: a report pairs two runs example by example.
            values = all_reduce_tensor(correct.to(self.device), self.dist).cpu()
            # 0/1 integers: about 3 bytes an example in JSON (IMDB's 25,000: ~75 kB).
            out["items"] = {"metric": "heldout_accuracy", "unit": "example", "values": values.round().long().tolist()}
        return out

    def evaluate(self, model: nn.Module, split: str, final: bool) -> dict[str, float]:
        """Loss, accuracy and macro-F1 on the whole split; the held-out eval also runs the extras."""
        metrics = self._eval_features(model, self.features[SPLITS[split]], items=split == "test")
        if split == "val" and not final:
            self.history.append(metrics)
        if split == "test":
            self.extra_results = {k: self._eval_features(model, self.features[k]) for k in self.data.extra_eval}
        return metrics

    def selection_score(self, metrics: dict[str, float]) -> float:
        """The best checkpoint has the highest validation accuracy (ties: the earliest)."""
        return -metrics["accuracy"]

    # ---- results -----------------------------------------------------------------------------
    def results(self, val: dict[str, float], test: dict[str, float] | None) -> dict[str, Any]:
        """Classification keys of results.json (validation of the best checkpoint, held-out, study keys)."""
        last = self.history[-1] if self.history else val
        majority = M.majority_accuracy([f["labels"] for f in self.features["heldout"]])
        val_majority = M.majority_accuracy([f["labels"] for f in self.features["validation"]])
        held = test or {}
        out = {
            "best_accuracy": max([h["accuracy"] for h in self.history] or [val["accuracy"]]),
            "final_val_accuracy": last["accuracy"],
            "final_val_loss": last["loss"],
            "val_accuracy": val["accuracy"],
            "val_macro_f1": val["macro_f1"],
            "val_loss": val["loss"],
            "heldout_accuracy": held.get("accuracy"),
            "heldout_macro_f1": held.get("macro_f1"),
            "heldout_loss": held.get("loss"),
            "heldout_examples": held.get("examples"),  # sets the binomial noise of the accuracy
            "majority_accuracy": majority,
            "val_majority_accuracy": val_majority,
            # Collapse is decided on validation (it makes an LR ineligible, so it is part of the
            # selection); the held-out verdict is recorded for information only.
            "collapsed": M.collapsed(val["accuracy"], val_majority),
            "heldout_collapsed": (
                M.collapsed(held["accuracy"], majority) if held.get("accuracy") is not None else None
            ),
            "final_split": "test",
            "test_source": self._test_source(),
            "split_roles": dict(self.data.split_roles),
            "num_labels": self.data.num_labels,
            "label_names": list(self.data.label_names),
            "data": self.data.summary(),
            "extra_eval": self.extra_results,
            "max_length": self.max_length,
            "epochs_seen": self._epochs_seen(),
            "primary_metric": "heldout_accuracy",
            "selection_metric": "best_accuracy",
            "higher_is_better": self.higher_is_better,
            "reporting": self.reporting.to_dict(),
        }
        return out

    def _test_source(self) -> str:
        """The held-out split's origin, from its role: an official split, or carved by a seed."""
        role = str(self.data.split_roles.get("heldout", ""))
        where = role.split(";")[0]
        return (
            f"seeded hold-out ({where}), not an official test split"
            if "by seed" in where
            else f"{TEST_OFFICIAL} ({where})"
        )

    def _epochs_seen(self) -> float:
        return (max(self.epoch - 1, 0) * len(self.order) + self.pos) / max(len(self.features["train"]), 1)

    def result_aliases(self) -> dict[str, str]:
        """The study's names for the common timing keys."""
        return {"total_time_seconds": "total_wall_time", "avg_step_time": "mean_step_time"}

    def dataset_name(self) -> str:
        """Registered name (with '->eval' for cross-dataset evaluation) or 'local'."""
        return self.data.name if self.data else str(self.cfg.data)

    def model_metadata(self) -> dict[str, Any]:
        """What is needed to rebuild the classifier and its inputs from the weights file."""
        meta: dict[str, Any] = {
            "num_labels": self.data.num_labels,
            "label_names": list(self.data.label_names),
            "max_length": self.max_length,
            "method": self.cfg.method,
            "data_fingerprint": self.data_fingerprint,
        }
        if self.hf:
            meta["hf_model"] = self.cfg.model
        else:
            meta["gpt_config"] = dataclasses.asdict(self.model_cfg)
            meta["tokenizer"] = self.opts.tokenizer
            meta["causal"] = self.opts.causal
            if self.data.is_pair:
                meta["sep_id"] = gpt_separator_id(self.tokenizer)
        return meta

    def flops_saving(self, model: nn.Module) -> float | None:
        """Theoretical training-FLOP saving of the method, at the maximum sequence length."""

        return theoretical_saving(model, self.max_length)

    def progress_fields(self, loss: float) -> dict[str, str]:
        """Loss and the last validation accuracy."""
        acc = f"{self.history[-1]['accuracy']:.3f}" if self.history else "-"
        return {"loss": f"{loss:.4f}", "val_acc": acc}

    # ---- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Data position: generator state before the current epoch's shuffle, position, epoch, history."""
        return {
            "order_state": self.order_state,
            "pos": self.pos,
            "epoch": self.epoch,
            "history": self.history,
            "has_order": bool(self.order),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rebuild the current epoch's order from the stored generator state and continue."""
        self.gen.set_state(state["order_state"])
        self.order_state = state["order_state"]
        if state["has_order"]:
            self.order = torch.randperm(len(self.features["train"]), generator=self.gen).tolist()
        self.pos, self.epoch = int(state["pos"]), int(state["epoch"])
        self.history = list(state["history"])


def data_summary_line(data: ClassificationData) -> str:
    """What was read, in one line: rows per split and the label set, so a miscount shows at once."""
    sizes = data.summary()["sizes"]
    rows = ", ".join(f"{split} {n:,}" for split, n in sizes.items() if n)
    labels = ", ".join(data.label_names[:10]) + (", ..." if len(data.label_names) > 10 else "")
    return f"data: {data.name} ({data.source}): {rows} rows; {data.num_labels} classes: {labels}"


def examples_fingerprint(data: ClassificationData) -> str:
    """A short digest of every example read (texts and labels of each split, in order)."""
    digest = hashlib.sha256()
    for split in (data.train, data.validation, data.heldout, *data.extra_eval.values()):
        for ex in split:
            digest.update(json.dumps([ex.text, ex.text_pair, ex.label]).encode())
        digest.update(b"\x00")  # split boundary
    return digest.hexdigest()[:16]
