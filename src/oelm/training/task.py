"""The Task plug-in interface of the loop core, and the registry of tasks by config `task`."""

from __future__ import annotations

import dataclasses
import importlib
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from oelm.core.methods import qk_dim_for
from oelm.models.catalog import preset_config
from oelm.records.facts import ReportingFacts
from oelm.training.config import TrainConfig
from oelm.training.distributed import DistInfo
from oelm.utils.errors import UserError

# config `task` -> "module:Class"; a new task is a new entry plus a Task subclass.
TASKS: dict[str, str] = {
    "lm": "oelm.training.lm:LMTask",
    "classification": "oelm.training.classification:ClassificationTask",
    "probe": "oelm.training.probe:ProbeTask",
}

Batch = dict[str, torch.Tensor]


class Task(ABC):
    """What the loop core needs from a task: data, model, loss, evaluation, result keys.

    Lifecycle (every rank): __init__ -> validate() -> build_model() [under torch.manual_seed]
    -> (load_state_dict() on resume) -> next_batch()/loss() per micro-step -> evaluate() ->
    results(). Batches hold only this rank's shard; evaluate() must reduce over ranks itself
    (all ranks call it with the same arguments) and return at least {"loss": float}.
    """

    name: str = "task"
    # Direction of the task's primary and selection metrics, declared once: recorded in results.json
    # (`higher_is_better`) so that selection and reports never guess it from a metric's name.
    higher_is_better: bool = False
    # How reports show the task's runs (curves, test items, budget, intervals): written into every
    # run's results.json as `reporting`, so report code never branches on the task's name.
    reporting: ReportingFacts = ReportingFacts()

    def __init__(self, cfg: TrainConfig, dist: DistInfo, device: torch.device) -> None:
        self.cfg = cfg
        self.dist = dist
        self.device = device

    @abstractmethod
    def validate(self) -> None:
        """Cheap checks of data and model settings; raise UserError before any work starts."""

    def resolved_config(self) -> TrainConfig:
        """The run's config with what the task resolved in validate() (e.g. an epoch budget).

        Tasks never mutate the config they were given; the trainer adopts this one, so
        config.yaml records the budget that actually ran.
        """
        return self.cfg

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model on the CPU (the loop seeds torch, applies the method, moves it)."""

    @abstractmethod
    def next_batch(self) -> Batch:
        """This rank's next training micro-batch, on self.device."""

    @abstractmethod
    def evaluate(self, model: nn.Module, split: str, final: bool) -> dict[str, float]:
        """Metrics on a split ("val" or "test"), reduced over ranks; final=True for the end."""

    @abstractmethod
    def results(self, val: dict[str, float], test: dict[str, float] | None) -> dict[str, Any]:
        """Task-specific results.json keys (incl. primary_metric, selection_metric)."""

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean training loss of a micro-batch (models return (logits, loss))."""
        return model(**batch)[1]

    def batch_tokens(self, batch: Batch) -> int:
        """Tokens in a micro-batch (for tokens/s and tokens_seen)."""
        return int(next(iter(batch.values())).numel())

    def has_split(self, split: str) -> bool:
        """Whether an evaluation split exists (the best checkpoint is tested when "test" does)."""
        return split == "val"

    def dataset_name(self) -> str:
        """Name of the dataset for results.json."""
        return self.cfg.data

    def model_metadata(self) -> dict[str, Any]:
        """Extra metadata stored in weight files (e.g. the tokenizer spec for sampling)."""
        return {}

    def flops_per_step(self, model: nn.Module) -> float | None:
        """Theoretical training FLOPs of one optimizer step on all ranks, when known."""
        return None

    def selection_score(self, metrics: dict[str, float]) -> float:
        """Lower is better: the best checkpoint minimizes it over validation evals (default loss)."""
        return metrics["loss"]

    def result_aliases(self) -> dict[str, str]:
        """Extra results.json keys copied from the common ones (alias -> key), e.g. study names."""
        return {}

    def flops_saving(self, model: nn.Module) -> float | None:
        """Theoretical fraction of training FLOPs the method saves, when known."""
        return None

    def progress_fields(self, loss: float) -> dict[str, str]:
        """Short fields shown on the progress bar for a training loss."""
        return {"loss": f"{loss:.4f}"}

    def state_dict(self) -> dict[str, Any]:
        """The data position, stored in checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027  (optional hook: stateless tasks keep it)
        """Restore the data position from a checkpoint."""


def checked_model_config(preset: str, overrides: dict[str, Any], method: str | None = None) -> Any:
    """The preset's config (GPT or Llama family) with overrides, a bad override value turned into one UserError.

    A method that changes the Q/K width (thin keys) sets qk_dim, unless model_overrides does.
    """

    try:
        cfg = preset_config(preset, **overrides)
        if method is not None and "qk_dim" not in overrides:
            qk_dim = qk_dim_for(method, cfg.d_model, cfg.n_head)
            if qk_dim is not None:
                cfg = dataclasses.replace(cfg, qk_dim=qk_dim)
        return cfg
    except UserError:
        raise
    except (TypeError, ValueError, AssertionError, ZeroDivisionError) as err:
        raise UserError(
            f"model_overrides {overrides} do not make a valid {preset} config ({err}); fix the values"
        ) from None


def make_task(cfg: TrainConfig, dist: DistInfo, device: torch.device) -> Task:
    """Instantiate the Task registered for cfg.task."""
    target = TASKS.get(cfg.task)
    if target is None:
        raise UserError(f"unknown task {cfg.task!r}; known tasks: {', '.join(TASKS)}")
    module_name, cls_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise UserError(f"task {cfg.task!r} is not available in this installation") from None
    return getattr(module, cls_name)(cfg, dist, device)
