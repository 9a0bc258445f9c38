"""Typed readers of a run's freeze_audit.json and timing_stats.json (the loop writes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from oelm.records.numbers import check_recorded_numbers
from oelm.utils.io import read_json

FREEZE_AUDIT_FILE = "freeze_audit.json"  # {"start": the audit's to_dict(), "end": the final check's to_dict()}
TIMING_FILE = "timing_stats.json"


class TimingStats(TypedDict, total=False):
    """timing_stats.json: the keys reports read (training.results.build_timing writes them all)."""

    step_time: dict[str, Any]
    tokens_per_second: float | None
    flops_per_step: float | None
    theoretical_flops_saving: Any
    peak_memory_bytes: int | None
    device: str
    world_size: int


@dataclass(frozen=True)
class AuditSummary:
    """What a report needs of a freeze audit: the totals per role at the start, the final check."""

    by_role: dict[str, dict[str, int]] = field(default_factory=dict)  # role -> {"trainable", "frozen"}
    total: int | None = None
    trainable: int | None = None
    frozen: int | None = None
    ok: bool | None = None  # the final check (None: the run did not finish)
    problems: tuple[str, ...] = ()

    def role_params(self, *roles: str) -> int:
        """Parameters (trainable + frozen) of the given roles."""
        return sum(
            int(self.by_role.get(r, {}).get("trainable", 0)) + int(self.by_role.get(r, {}).get("frozen", 0))
            for r in roles
        )

    def to_dict(self) -> dict[str, Any]:
        """The summary as the compact run record stores it."""
        return {
            "by_role": self.by_role,
            "total": self.total,
            "trainable": self.trainable,
            "frozen": self.frozen,
            "ok": self.ok,
            "problems": list(self.problems),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> AuditSummary | None:
        """A summary from its to_dict() form (None for anything else)."""
        if not isinstance(raw, dict):
            return None
        roles = raw.get("by_role") if isinstance(raw.get("by_role"), dict) else {}
        return cls(
            by_role={str(k): dict(v) for k, v in roles.items() if isinstance(v, dict)},
            total=_int(raw.get("total")),
            trainable=_int(raw.get("trainable")),
            frozen=_int(raw.get("frozen")),
            ok=raw.get("ok") if isinstance(raw.get("ok"), bool) else None,
            problems=tuple(str(p) for p in raw.get("problems") or ()),
        )


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_audit(run_dir: str | Path) -> AuditSummary | None:
    """The summary of a run directory's freeze_audit.json, or None when absent or unreadable."""
    path = Path(run_dir) / FREEZE_AUDIT_FILE
    raw = read_json(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("start"), dict):
        return None
    check_recorded_numbers(raw, "audit", repr(str(path)))
    totals = raw["start"].get("totals") if isinstance(raw["start"].get("totals"), dict) else {}
    end = raw.get("end") if isinstance(raw.get("end"), dict) else {}
    return AuditSummary.from_dict({**totals, "ok": end.get("ok"), "problems": end.get("problems") or []})


def read_timing(run_dir: str | Path) -> TimingStats:
    """A run directory's timing_stats.json ({} when absent or unreadable)."""
    path = Path(run_dir) / TIMING_FILE
    raw = read_json(path)
    check_recorded_numbers(raw, "timing", repr(str(path)))
    return TimingStats(**raw) if isinstance(raw, dict) else TimingStats()
