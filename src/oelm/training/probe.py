"""The probe task: a small GPT on synthetic MQAR / induction data, loss and accuracy on answers only.

Training minimizes cross-entropy on the answer positions only (as MQAR is usually trained): every
other position is a uniformly random token whose loss is irreducible noise and says nothing about
retrieval. The best checkpoint has the highest validation answer accuracy; the test set (a
disjoint stream) is reported, with what the best weights' attention does on it (results.json
`head_scores` for induction, `accuracy_by_query` for MQAR), so stored records keep it without weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oelm.data.synthetic import IGNORE, ProbeData, ProbeOptions
from oelm.records.facts import PROBE
from oelm.training.distributed import all_reduce_sum
from oelm.training.lm import LMTask, perplexity
from oelm.training.task import Batch, checked_model_config
from oelm.utils.errors import UserError

HEAD_ROWS = 128  # test sequences whose attention maps give an induction run's head scores


def answer_stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int, int, int]:
    """(correct answers, answers, rows with every answer correct, rows with answers)."""
    mask = targets != IGNORE
    right = (logits.argmax(-1) == targets) & mask
    rows = mask.any(dim=1)
    whole = (right.sum(1) == mask.sum(1)) & rows
    return int(right.sum()), int(mask.sum()), int(whole.sum()), int(rows.sum())


@contextmanager
def captured_attention() -> Iterator[list[torch.Tensor]]:
    """Record the attention weights [B, H, T, T] of every scaled_dot_product_attention call.

    Patching the functional (not recomputing q/k from weights) sees exactly the q and k a method
    feeds it, including variants that add a norm, a temperature or a low-rank update.
    """
    maps: list[torch.Tensor] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        logits = (q @ k.transpose(-2, -1)).float() * (scale if scale is not None else q.shape[-1] ** -0.5)
        t, s = logits.shape[-2:]
        if is_causal:
            logits = logits.masked_fill(torch.ones(t, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        if attn_mask is not None:
            logits = (
                logits + attn_mask if attn_mask.dtype != torch.bool else logits.masked_fill(~attn_mask, float("-inf"))
            )
        maps.append(logits.softmax(-1).cpu())
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)

    F.scaled_dot_product_attention = spy
    try:
        yield maps
    finally:
        F.scaled_dot_product_attention = real


def head_scores(maps: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> dict[str, list[list[float]]]:
    """Per layer and head: mean attention on the previous token (every t >= 1) and, at answer
    positions, the induction score: attention mass on positions s whose previous token equals the
    current token (where an induction head looks: the successors of earlier occurrences)."""
    t = x.shape[1]
    match = torch.zeros(x.shape[0], t, t, dtype=torch.bool)
    match[:, :, 1:] = x[:, :, None] == x[:, None, :-1]  # match[b, i, s]: x[s - 1] == x[i]
    match &= torch.ones(t, t, dtype=torch.bool).tril()
    answers = (y != IGNORE).float()
    out: dict[str, list[list[float]]] = {"previous_token": [], "induction": []}
    for att in maps:
        prev = att[:, :, torch.arange(1, t), torch.arange(0, t - 1)].mean(dim=(0, 2))
        mass = (att * match[:, None]).sum(-1)  # [B, H, T]
        ind = (mass * answers[:, None]).sum(dim=(0, 2)) / answers.sum()
        out["previous_token"].append(prev.tolist())
        out["induction"].append(ind.tolist())
    return out


def query_rank_accuracy(pred: torch.Tensor, y: torch.Tensor) -> list[float]:
    """MQAR accuracy by query order, from predicted tokens: [first query of each row, second, ...].

    The first query can only be answered by recall; the last one also by elimination (the one
    value of the context not yet seen among the queries), so a model that counts without recalling
    scores high on the last and near 1/pairs on the first.
    """
    asked = y != IGNORE
    rank = asked.long().cumsum(1) * asked  # 1..q at answer positions, 0 elsewhere
    right = pred == y
    return [right[rank == r].float().mean().item() for r in range(1, int(rank.max()) + 1)]


class ProbeTask(LMTask):
    """Synthetic probes through the LM machinery (GPT, FLOPs, metadata); data made on the fly."""

    name = "probe"
    higher_is_better = True  # answer accuracy
    reporting = PROBE

    def __init__(self, cfg, dist, device) -> None:
        super().__init__(cfg, dist, device)
        self.opts: ProbeOptions | None = cfg.probe
        self.data: ProbeData | None = None
        self.history: list[tuple[int, float]] = []  # (step, val accuracy) of periodic evals
        self.diagnostics: dict[str, Any] = {}  # what the best weights' attention does (final test)

    def validate(self) -> None:
        """Check the probe options against the model; build the val/test sets."""

        if self.opts is None:
            raise UserError("task probe needs `probe: {kind: mqar|induction, ...}` (or probe.kind=induction)")
        opts = self.opts
        if self.cfg.seq_len not in (None, opts.seq_len):
            raise UserError(
                f"seq_len {self.cfg.seq_len} differs from probe.seq_len {opts.seq_len}; set only probe.seq_len"
            )
        overrides = {"vocab_size": opts.vocab, "block_size": opts.seq_len, **self.cfg.model_overrides}
        self.model_cfg = checked_model_config(self.cfg.model, overrides, self.cfg.method)
        if self.model_cfg.vocab_size < opts.vocab or self.model_cfg.block_size < opts.seq_len:
            raise UserError("model_overrides make the model smaller than the probe; drop vocab_size/block_size")
        self.seq_len = opts.seq_len
        self.meta = {"source": opts.name(), "tokenizer": ""}
        seed = self.cfg.data_seed if self.cfg.data_seed is not None else self.cfg.seed
        self.data = ProbeData(opts, seed)

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        return {"idx": x.to(self.device), "targets": y.to(self.device)}

    def next_batch(self) -> Batch:
        """This rank's slice of the next global batch of fresh training samples."""
        b, world = self.cfg.batch_size, self.dist.world
        x, y = self.data.train_batch(b * world)
        self.batches_drawn += 1
        mine = slice(self.dist.rank * b, (self.dist.rank + 1) * b)
        return self._to_device(x[mine], y[mine])

    def batch_tokens(self, batch: Batch) -> int:
        """Tokens in a micro-batch (every position is processed, though only answers are scored)."""
        return int(batch["idx"].numel())

    def has_split(self, split: str) -> bool:
        """val and test always exist (generated)."""
        return split in ("val", "test")

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, final: bool) -> dict[str, float]:
        """Answer loss, answer accuracy and whole-sequence accuracy (periodic evals: a prefix)."""
        x, y = self.data.eval[split]
        b, world = self.cfg.batch_size, self.dist.world
        n = len(x) if final else min(len(x), self.cfg.eval_batches * b * world)
        rows = torch.arange(n)[self.dist.rank :: world]
        sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # loss * answers, correct, answers, whole rows, rows
        for i in range(0, len(rows), b):
            batch = self._to_device(x[rows[i : i + b]], y[rows[i : i + b]])
            logits, loss = model(**batch)
            right, count, whole, nrows = answer_stats(logits, batch["targets"])
            for j, v in enumerate((float(loss) * count, right, count, whole, nrows)):
                sums[j] += v
        total, right, count, whole, nrows = all_reduce_sum(sums, self.dist, self.device)
        loss = total / max(count, 1.0)
        out = {
            "loss": loss,
            "perplexity": perplexity(loss),
            "accuracy": right / max(count, 1.0),
            "sequence_accuracy": whole / max(nrows, 1.0),
        }
        if split == "val" and not final:
            self.history.append((self.batches_drawn // self.cfg.grad_accum, out["accuracy"]))
        if split == "test" and final:
            self.diagnostics = self._diagnostics(model, x, y)
        return out

    def _diagnostics(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        """The best weights on the test set, every rank alike (a sharded model needs each rank's
        forward): induction and previous-token scores per layer and head on the first HEAD_ROWS
        sequences (induction), or answer accuracy by query order over the whole set (MQAR)."""
        if self.opts.kind == "induction":
            n = min(len(x), HEAD_ROWS)
            with captured_attention() as maps:
                model(self._to_device(x[:n], y[:n])["idx"])
            return {"head_scores": head_scores(maps, x[:n], y[:n])}
        b = self.cfg.batch_size
        pred = torch.cat([model(x[i : i + b].to(self.device))[0].argmax(-1).cpu() for i in range(0, len(x), b)])
        return {"accuracy_by_query": query_rank_accuracy(pred, y)}

    def selection_score(self, metrics: dict[str, float]) -> float:
        """The best checkpoint has the highest validation answer accuracy (ties: the earliest)."""
        return -metrics["accuracy"]

    def steps_to_target(self) -> int | None:
        """First periodic eval step with val answer accuracy >= probe.target_accuracy."""
        return next((s for s, acc in self.history if acc >= self.opts.target_accuracy), None)

    def results(self, val: dict[str, float], test: dict[str, float] | None) -> dict[str, Any]:
        """Probe keys of results.json (of the best checkpoint); accuracy is higher-is-better."""
        test = test or {}
        return {
            "probe": self.opts.kind,
            "probe_options": self.opts.model_dump(),
            "val_loss": val["loss"],
            "val_answer_accuracy": val["accuracy"],
            "val_sequence_accuracy": val["sequence_accuracy"],
            "test_loss": test.get("loss"),
            "test_answer_accuracy": test.get("accuracy"),
            "test_sequence_accuracy": test.get("sequence_accuracy"),
            "chance_accuracy": self.opts.chance,
            # Not "collapsed": a probe arm at chance is the measurement, so it stays in the table.
            "at_chance": bool(test.get("accuracy", val["accuracy"]) <= self.opts.chance + 0.02),
            "target_accuracy": self.opts.target_accuracy,
            "steps_to_target": self.steps_to_target(),
            "accuracy_curve": [[s, a] for s, a in self.history],
            **self.diagnostics,
            "primary_metric": "test_answer_accuracy",
            "selection_metric": "val_answer_accuracy",
            "higher_is_better": self.higher_is_better,
            "reporting": self.reporting.to_dict(),
        }

    def progress_fields(self, loss: float) -> dict[str, str]:
        """Answer loss and the last validation accuracy."""
        acc = f"{self.history[-1][1]:.3f}" if self.history else "-"
        return {"loss": f"{loss:.4f}", "val_acc": acc}

    def state_dict(self) -> dict[str, Any]:
        """Train-stream generator state, batches drawn and the accuracy history."""
        return {
            "generator": self.data.gen.get_state(),
            "batches_drawn": self.batches_drawn,
            "history": [list(h) for h in self.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the train stream exactly where the checkpoint left it."""
        self.data.gen.set_state(state["generator"])
        self.batches_drawn = int(state["batches_drawn"])
        self.history = [(int(s), float(a)) for s, a in state["history"]]
