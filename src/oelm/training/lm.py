"""The language-modelling task: random windows from a token memmap, perplexity on fixed windows."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from oelm.core.flops import theoretical_saving, training_flops_per_token
from oelm.data.lm import load_lm_split, read_meta
from oelm.models.catalog import build_lm, config_meta
from oelm.records.facts import LM as LM_FACTS
from oelm.records.run import TEST_HOLDOUT, TEST_OFFICIAL
from oelm.training.distributed import all_reduce_tensor
from oelm.training.task import Batch, Task, checked_model_config
from oelm.utils.errors import UserError

log = logging.getLogger(__name__)
RAW_TEXT = (".txt", ".raw", ".jsonl", ".json", ".md")  # what `oelm prepare lm` reads, never what it writes


def read_lm_meta(data_dir: Path) -> dict[str, Any]:
    """meta.json of an LM data directory, with a clear error when it is not one."""

    prepare = f"`oelm prepare lm {data_dir} --tokenizer TOK --out DIR`, then pass --data DIR"
    if data_dir.is_file():
        raise UserError(f"--data {str(data_dir)!r} is a file, not a prepared data folder; prepare it first: {prepare}")
    if not data_dir.is_dir():
        raise UserError(f"data directory {str(data_dir)!r} does not exist; create it with `oelm prepare lm`")
    texts = [p.name for p in data_dir.iterdir() if p.suffix in RAW_TEXT and p.is_file()]
    if texts and not (data_dir / "meta.json").exists():
        raise UserError(
            f"--data {str(data_dir)!r} is a folder of text files ({', '.join(sorted(texts)[:3])}), not a "
            f"prepared data folder; prepare it first: {prepare}"
        )
    meta = read_meta(data_dir)
    for key in ("vocab_size", "dtype", "splits"):
        if key not in meta:
            raise UserError(f"{str(data_dir / 'meta.json')!r} lacks {key!r}; re-run `oelm prepare lm`")
    return meta


def window_starts(n_tokens: int, seq_len: int, count: int | None) -> np.ndarray:
    """Fixed evaluation windows: `count` evenly spaced, or all non-overlapping ones when None."""
    last = n_tokens - seq_len - 1  # a window reads seq_len + 1 tokens (inputs and shifted targets)
    if count is None:
        return np.arange(0, last + 1, seq_len, dtype=np.int64)
    return np.linspace(0, last, num=count).round().astype(np.int64)


class LMTask(Task):
    """Causal LM on `oelm prepare lm` data; batches are random windows, eval windows are fixed."""

    name = "lm"
    reporting = LM_FACTS
    higher_is_better = False  # perplexity and loss

    def __init__(self, cfg, dist, device) -> None:
        super().__init__(cfg, dist, device)
        self.data_dir = Path(cfg.data)
        self.meta: dict[str, Any] = {}
        self.splits: dict[str, np.memmap] = {}
        self.model_cfg = None
        self.seq_len = 0
        # One generator, seeded identically on every rank and for every method: all ranks draw
        # the global batch and each keeps its slice, so the data order depends only on the seed.
        self.gen = torch.Generator().manual_seed(cfg.data_seed if cfg.data_seed is not None else cfg.seed)
        self.batches_drawn = 0

    def validate(self) -> None:
        """Check the data directory, vocabulary and sequence length against the model."""

        self.meta = read_lm_meta(self.data_dir)
        overrides = {"vocab_size": self.meta["vocab_size"], **self.cfg.model_overrides}
        self.model_cfg = checked_model_config(self.cfg.model, overrides, self.cfg.method)
        if self.meta["vocab_size"] > self.model_cfg.vocab_size:
            raise UserError(
                f"the data's vocabulary ({self.meta['vocab_size']} tokens, {self.meta.get('tokenizer')}) "
                f"is larger than the model's vocab_size ({self.model_cfg.vocab_size}); drop the "
                "model_overrides.vocab_size override or raise it"
            )
        self.seq_len = self.cfg.seq_len or self.model_cfg.block_size
        if self.seq_len > self.model_cfg.block_size:
            raise UserError(
                f"seq_len {self.seq_len} exceeds the context of {self.cfg.model} "
                f"(block_size {self.model_cfg.block_size}); lower --seq-len or set "
                f"model_overrides.block_size={self.seq_len}"
            )

        for split in ("train", "val", "test"):
            if split not in self.meta["splits"]:
                continue
            mm = load_lm_split(self.data_dir, split)
            if len(mm) < self.seq_len + 2:
                raise UserError(
                    f"split {split!r} of {str(self.data_dir)!r} has {len(mm)} tokens, fewer than one "
                    f"window of seq_len {self.seq_len}; prepare more data or lower --seq-len"
                )
            self.splits[split] = mm
        for split in ("train", "val"):
            if split not in self.splits:
                raise UserError(f"{str(self.data_dir)!r} lacks {split}.bin; re-run `oelm prepare lm`")
        if "test" not in self.splits and self.dist.is_main and self.cfg.progress:  # a sweep's report says it
            log.warning(
                "%s has no test split: the run's final number will be val_perplexity, on the validation "
                "split that also chooses the checkpoint (not a held-out number); for one, prepare the data "
                "with `oelm prepare lm ... --test-fraction F` (or a source with its own test file)",
                self.data_dir,
            )

    def build_model(self) -> nn.Module:
        """Our GPT or Llama (the preset's family) with the data's vocabulary."""

        return build_lm(self.model_cfg)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean training loss; the GPT computes it without materializing the logits."""
        return model(**batch, return_logits=False)[1]

    def _windows(self, data: np.memmap, starts: np.ndarray | torch.Tensor) -> Batch:
        rows = np.stack([np.asarray(data[s : s + self.seq_len + 1], dtype=np.int64) for s in starts.tolist()])
        xy = torch.from_numpy(rows)
        if self.device.type == "cuda":
            xy = xy.pin_memory().to(self.device, non_blocking=True)
        else:
            xy = xy.to(self.device)
        return {"idx": xy[:, :-1], "targets": xy[:, 1:]}

    def next_batch(self) -> Batch:
        """This rank's slice of the next global batch of random training windows."""
        data = self.splits["train"]
        b, world = self.cfg.batch_size, self.dist.world
        starts = torch.randint(0, len(data) - self.seq_len, (b * world,), generator=self.gen)
        self.batches_drawn += 1
        mine = starts[self.dist.rank * b : (self.dist.rank + 1) * b]
        return self._windows(data, mine)

    def has_split(self, split: str) -> bool:
        """Whether the data directory holds this split."""
        return split in self.splits

    def eval_starts(self, split: str, final: bool) -> np.ndarray:
        """Window starts of an evaluation, shared by every arm (they depend on the data only).

        Validation is the selection set: the same windows at every evaluation, periodic and
        final, so that a checkpoint or an LR is never chosen on a lucky draw. It is the whole
        split (all non-overlapping windows) when that fits in `eval_batches` global batches, else
        that many evenly spaced fixed windows. The test split is read once, at the end: all of it
        unless `final_eval_batches` caps it.
        """
        data = self.splits[split]
        per_batch = self.cfg.batch_size * self.dist.world
        if split == "val":
            every = window_starts(len(data), self.seq_len, None)
            cap = self.cfg.eval_batches * per_batch
            return every if len(every) <= cap else window_starts(len(data), self.seq_len, cap)
        n_batches = self.cfg.final_eval_batches if final else self.cfg.eval_batches
        return window_starts(len(data), self.seq_len, None if n_batches is None else n_batches * per_batch)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, final: bool) -> dict[str, float]:
        """Mean loss, perplexity and the loss's standard error over fixed windows (all ranks)."""
        data = self.splits[split]
        b, world = self.cfg.batch_size, self.dist.world
        every = self.eval_starts(split, final)
        mine = np.arange(len(every))[self.dist.rank :: world]  # this rank's windows (global indices)
        # Per-window losses (windows have equal length, so their mean is the token mean), kept in
        # the global window order: their spread gives the loss's standard error, and because every
        # arm reads the same windows, a report can pair two runs window by window.
        per_window = torch.zeros(len(every), dtype=torch.float64, device=self.device)
        for i in range(0, len(mine), b):
            idx = mine[i : i + b]
            batch = self._windows(data, every[idx])
            # Per-token losses without materializing the logits (a chunk of rows at a time), so
            # evaluation needs no more memory than the training step at the same batch size.
            per = model(**batch, return_logits=False, reduction="none")[1].mean(dim=1)
            per_window[torch.as_tensor(idx, device=self.device)] = per.double()
        per_window = all_reduce_tensor(per_window, self.dist).cpu()
        n = max(len(every), 1)
        loss = float(per_window.sum()) / n
        var = float(per_window.var()) if len(every) > 1 else 0.0
        out = {
            "loss": loss,
            "perplexity": perplexity(loss),
            "tokens": len(every) * self.seq_len,
            "windows": len(every),
            "loss_se": math.sqrt(var / n),
        }
        if split == "test":
            out["items"] = {"metric": "test_loss", "unit": "window", "values": per_window.tolist()}
        return out

    def results(self, val: dict[str, float], test: dict[str, float] | None) -> dict[str, Any]:
        """LM keys of results.json (of the best checkpoint).

        The names say which split and how much of it: `val_*` are on the selection set (`val_windows`
        of the split's `val_windows_all` non-overlapping windows; `val_subset` when that is fewer),
        `final_perplexity` exists only for a test split (`final_split` says which split the final
        numbers are on) and `test_source` says whether that test split is an official one.
        """
        all_val = len(window_starts(len(self.splits["val"]), self.seq_len, None))
        return {
            "val_loss": val["loss"],
            "val_perplexity": val["perplexity"],
            "val_windows": val.get("windows"),
            "val_windows_all": all_val,
            "val_subset": val.get("windows") is not None and val["windows"] < all_val,
            "test_loss": test["loss"] if test else None,
            "test_perplexity": test["perplexity"] if test else None,
            # Size and standard error of the evaluation sets: test noise next to seed noise.
            "val_tokens": val.get("tokens"),
            "test_tokens": test.get("tokens") if test else None,
            "test_windows": test.get("windows") if test else None,
            "test_loss_se": test.get("loss_se") if test else None,
            # Bits per byte of text (loss x tokens per byte / ln 2, with the split's own token and
            # byte counts): comparable across tokenizers, where perplexity is not.
            "val_bits_per_byte": self._bits_per_byte(val["loss"], "val"),
            "test_bits_per_byte": self._bits_per_byte(test["loss"], "test") if test else None,
            "final_perplexity": test["perplexity"] if test else None,
            # What a perplexity is per: a report compares it with another's only for the same tokenizer.
            "tokenizer": tokenizer_name(str(self.meta.get("tokenizer") or "")) or None,
            "final_split": "test" if test else "val",
            "test_source": self._test_source() if test else None,
            "primary_metric": "test_perplexity" if test else "val_perplexity",
            "selection_metric": "best_val_loss",
            "higher_is_better": self.higher_is_better,
            "reporting": self.reporting.to_dict(),
        }

    def _test_source(self) -> str:
        """Whether the test split is the source's own or carved from its training documents."""
        origin = (self.meta.get("split_origin") or {}).get("test")
        return TEST_HOLDOUT if origin == "holdout" else TEST_OFFICIAL

    def _bits_per_byte(self, loss: float, split: str) -> float | None:
        """Bits per UTF-8 byte of the split's text, when `oelm prepare` recorded its byte count."""
        text_bytes = (self.meta.get("split_bytes") or {}).get(split)
        tokens = (self.meta.get("splits") or {}).get(split)
        if not text_bytes or not tokens or not math.isfinite(loss):
            return None
        return loss * tokens / text_bytes / math.log(2)

    def dataset_name(self) -> str:
        """The data's source as recorded by `oelm prepare lm`."""
        return str(self.meta.get("source") or self.data_dir.name)

    def model_metadata(self) -> dict[str, Any]:
        """Model config (`gpt_config` / `llama_config`) and tokenizer spec, so `oelm sample` needs only the weights file."""

        return {
            **config_meta(self.model_cfg),
            "tokenizer": self.meta.get("tokenizer", ""),
            "method": self.cfg.method,
            **({"data_fingerprint": fp} if (fp := self.meta.get("fingerprint")) else {}),
        }

    def flops_per_step(self, model: nn.Module) -> float | None:
        """Training FLOPs of one optimizer step (all ranks) from oelm.core.flops."""

        per_token = training_flops_per_token(model, self.seq_len)
        return float(per_token) * self.cfg.batch_size * self.seq_len * self.cfg.grad_accum * self.dist.world

    def flops_saving(self, model: nn.Module) -> float | None:
        """Theoretical fraction of training FLOPs the method saves."""

        return float(theoretical_saving(model, self.seq_len))

    def progress_fields(self, loss: float) -> dict[str, str]:
        """Loss and perplexity for the progress bar."""
        return {"loss": f"{loss:.4f}", "ppl": f"{perplexity(loss):.2f}"}

    def state_dict(self) -> dict[str, Any]:
        """The data position: generator state and number of global batches drawn."""
        return {"generator": self.gen.get_state(), "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the data order exactly where the checkpoint left it."""
        self.gen.set_state(state["generator"])
        self.batches_drawn = int(state["batches_drawn"])


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


def tokenizer_name(spec: str) -> str:
    """The tokenizer a prepared folder's spec names, without a machine's path: 'byte', 'gpt2'
    (also for 'gpt2:DIR', GPT-2's BPE from local files), else the spec's last path part."""
    if spec.startswith("gpt2:"):
        return "gpt2"
    return spec if spec in ("byte", "gpt2") else Path(spec).name
