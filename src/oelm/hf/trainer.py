"""`OELMCallback`: the freeze audit inside `transformers.Trainer` (recorded at start, checked at saves and end)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import TrainerCallback

from oelm.core.audit import Audit, AuditCheck, audit_model, verify_audit
from oelm.core.record import METHOD_RECORD_FILE, method_record
from oelm.core.state import method_state
from oelm.hf.peft import keep_record, lora_problems, write_adapter_record
from oelm.hf.wrappers import is_peft, underlying
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text, file_times, follow_umask

HF_AUDIT_FILE = "oelm_audit.json"


class FreezeViolation(RuntimeError):
    """A frozen tensor moved, gained a gradient, or sits in the optimizer."""


class OELMCallback(TrainerCallback):
    """Record the freeze audit at train begin; verify it at every save and at train end.

    A check passes when every frozen tensor is bit-identical to its start fingerprint, has no
    .grad, is held by no optimizer group and has no optimizer state, and no PEFT adapter wraps
    a frozen Q/K. With strict=True (default) a failed check raises FreezeViolation. Each
    checkpoint folder gets `oelm_audit.json` and `oelm_method.json` (the model's own save writes
    it; for a PEFT model, which saves the adapter only, the callback does, and its
    `save_pretrained` then writes it too, as in `trainer.save_model`).

    Under DeepSpeed ZeRO-3 every process holds a shard of each tensor: each check gathers the
    model's parameters first (every process takes part; one full copy per process while it runs),
    the optimizer check reads ZeRO's groups of model tensors (ZeRO-1/2/3), and the model's
    `save_pretrained` (checkpoints, `trainer.save_model`) writes the method record taken at the
    last check instead of fingerprinting the shards.

    With verbose=True (default) the main process prints one line at train begin (method, frozen
    share, the start check) and one at each save's check, and a failed check wherever it happens:
    printed like the Trainer's own `PrinterCallback`, since a library's logging notes are hidden
    unless the application configures logging.
    """

    def __init__(self, strict: bool = True, audit: Audit | None = None, verbose: bool = True) -> None:
        self.strict = strict
        self.audit = audit
        self.verbose = verbose
        self.checks: list[tuple[int, AuditCheck]] = []
        self.record: dict[str, Any] | None = None  # under ZeRO-3: the method record of the last check

    @property
    def final(self) -> AuditCheck | None:
        """The last check (the end-of-training one once training has finished)."""
        return self.checks[-1][1] if self.checks else None

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        base = underlying(model)
        if method_state(base) is None:
            raise UserError("OELMCallback: no method applied to the model; call oelm.apply_method first")
        if self.audit is None:  # an audit given by the caller (e.g. taken before PEFT) is kept
            with full_parameters(base):
                self.audit = audit_model(base)
        if is_zero3(base) and not is_peft(model):
            with full_parameters(base):
                self.record = method_record(base)
            base.save_pretrained = _SaveCheckedRecord(base, self)
        keep_record(model)  # a PEFT model's save_pretrained writes the record beside the adapter
        start = self._check(model, optimizer)  # no tensor moved yet: this checks grads and the optimizer
        self._say(state, start_line(self.audit, start))
        if self.strict and not start.ok:
            raise FreezeViolation("OELM freeze audit failed at train begin: " + "; ".join(start.problems[:5]))

    def on_save(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        check = self._verify(state.global_step, model, optimizer, state)
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if check.ok:
            self._say(state, f"oelm: {folder.name}: freeze audit ok ({check_words(check)})")
        if state.is_world_process_zero and folder.is_dir():
            _write(folder / HF_AUDIT_FILE, self.audit, check)
            if self.record is not None:  # the checkpoint's record, from the gathered tensors
                _write_record(self.record, folder)
            if is_peft(model):  # PEFT's save wrote the adapter only (a hooked one the record too)
                write_adapter_record(model, folder)

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self._verify(state.global_step, model, optimizer, state)

    def _check(self, model: Any, optimizer: Any) -> AuditCheck:
        """The audit's check of the model now (frozen bytes, grads, optimizer) plus PEFT's placement."""
        if self.audit is None:
            raise UserError("OELMCallback: no audit recorded (on_train_begin did not run)")
        base = underlying(model)
        with full_parameters(base):
            check = verify_audit(base, self.audit, optimizer=zero_groups(optimizer))
            if self.record is not None:
                self.record = method_record(base)
        extra = lora_problems(base)
        return AuditCheck(False, check.problems + extra, check.n_frozen_checked) if extra else check

    def _verify(self, step: int, model: Any, optimizer: Any, state: Any = None) -> AuditCheck:
        check = self._check(model, optimizer)
        self.checks.append((step, check))
        if not check.ok:
            self._say(state, f"oelm: step {step}: freeze audit FAILED: " + "; ".join(check.problems[:5]))
        if self.strict and not check.ok:
            raise FreezeViolation(f"OELM freeze audit failed at step {step}: " + "; ".join(check.problems[:5]))
        return check

    def _say(self, state: Any, line: str) -> None:
        if self.verbose and getattr(state, "is_world_process_zero", True):
            print(line, flush=True)


def start_line(audit: Audit, check: AuditCheck) -> str:
    """The train-begin line: method, frozen share, and the start check."""
    t = audit.totals
    verdict = f"ok ({check_words(check)})" if check.ok else "FAILED: " + "; ".join(check.problems[:5])
    return (
        f"oelm: {audit.method}: {t['frozen']:,} of {t['total']:,} parameters frozen ({t['frozen_fraction']:.1%}, "
        f"{len(audit.fingerprints)} tensors); start audit {verdict}; checked again at every save and at the end"
    )


def check_words(check: AuditCheck) -> str:
    """What a passing check established, in words."""
    return f"{check.n_frozen_checked} frozen tensors bit-identical, without gradients, outside the optimizer"


def _write(path: Path, audit: Audit, check: AuditCheck) -> None:

    atomic_write_text(path, json.dumps({"start": audit.to_dict(), "check": check.to_dict()}, indent=2) + "\n")


def is_zero3(model: torch.nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 has partitioned the model's parameters (each process holds a shard)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextlib.contextmanager
def full_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ZeRO-3-partitioned parameters hold their full values (on every process:
    all of them must enter it); a no-op for a model that is not partitioned."""
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        yield
        return
    import deepspeed  # heavy optional dependency: imported on use

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


def zero_groups(optimizer: Any) -> Any:
    """The optimizer as groups of model tensors: a DeepSpeed ZeRO optimizer (under accelerate's
    wrapper) keeps flat fp32 partitions in `param_groups` and the model tensors it updates in
    `bit16_groups` (ZeRO-1/2) or `fp16_groups` (ZeRO-3). Its state belongs to the flat partitions,
    built from those groups only, so a frozen tensor outside them has none. Other optimizers are
    returned unchanged."""
    inner = optimizer
    for _ in range(3):
        if inner is None:
            break
        for attr in ("bit16_groups", "fp16_groups"):
            groups = getattr(inner, attr, None)
            if isinstance(groups, list) and all(isinstance(g, list) for g in groups):
                return SimpleNamespace(param_groups=[{"params": list(g)} for g in groups], state={})
        inner = getattr(inner, "optimizer", None)
    return optimizer


class _SaveCheckedRecord:
    """A ZeRO-3 model's save_pretrained: the class's save, then the record of the callback's last
    gathered check (the shards on one process cannot be fingerprinted without the others)."""

    def __init__(self, model: torch.nn.Module, callback: OELMCallback) -> None:
        self.model = model
        self.callback = callback

    def __call__(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> Any:
        out = type(self.model).save_pretrained(self.model, save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True) and self.callback.record is not None:
            _write_record(self.callback.record, Path(save_directory))
        return out


def _write_record(record: dict[str, Any], folder: Path) -> None:
    before = file_times(folder)
    atomic_write_text(folder / METHOD_RECORD_FILE, json.dumps(record, indent=2) + "\n")
    follow_umask(folder, before=before)
