"""`OELMCallback`: the freeze audit inside `transformers.Trainer` (recorded at start, checked at saves and end)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from oelm.core.audit import Audit, AuditCheck, audit_model, verify_audit
from oelm.core.state import method_state
from oelm.hf.peft import keep_record, lora_problems, write_adapter_record
from oelm.hf.wrappers import is_peft, underlying
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text

AUDIT_FILE = "oelm_audit.json"


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
    """

    def __init__(self, strict: bool = True, audit: Audit | None = None) -> None:
        self.strict = strict
        self.audit = audit
        self.checks: list[tuple[int, AuditCheck]] = []

    @property
    def final(self) -> AuditCheck | None:
        """The last check (the end-of-training one once training has finished)."""
        return self.checks[-1][1] if self.checks else None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        base = underlying(model)
        if method_state(base) is None:
            raise UserError("OELMCallback: no method applied to the model; call oelm.apply_method first")
        if self.audit is None:  # an audit given by the caller (e.g. taken before PEFT) is kept
            self.audit = audit_model(base)
        keep_record(model)  # a PEFT model's save_pretrained writes the record beside the adapter

    def on_save(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        check = self._verify(state.global_step, model, optimizer)
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            _write(folder / AUDIT_FILE, self.audit, check)
            if is_peft(model):  # PEFT's save wrote the adapter only (a hooked one the record too)
                write_adapter_record(model, folder)

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self._verify(state.global_step, model, optimizer)

    def _verify(self, step: int, model: Any, optimizer: Any) -> AuditCheck:
        if self.audit is None:
            raise UserError("OELMCallback: no audit recorded (on_train_begin did not run)")
        base = underlying(model)
        check = verify_audit(base, self.audit, optimizer=optimizer)
        extra = lora_problems(base)
        if extra:
            check = AuditCheck(False, check.problems + extra, check.n_frozen_checked)
        self.checks.append((step, check))
        if self.strict and not check.ok:
            raise FreezeViolation(f"OELM freeze audit failed at step {step}: " + "; ".join(check.problems[:5]))
        return check


def _write(path: Path, audit: Audit, check: AuditCheck) -> None:

    atomic_write_text(path, json.dumps({"start": audit.to_dict(), "check": check.to_dict()}, indent=2) + "\n")
