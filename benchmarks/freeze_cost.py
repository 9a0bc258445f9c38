"""What freezing Q/K (and FFN) saves in training compute: theory, executed FLOPs, and time.

For each model, `baseline`, `oelm-freeze` and `oelm-qk-ffn` are built from the same seed and
measured side by side in one process:
  theoretical_saving  analytic share of training FLOPs removed (oelm.core.flops)
  executed_saving     share removed in FLOPs actually executed (FlopCounterMode, forward+backward)
  time_ratio          median step time (forward+backward+AdamW step) of the method / baseline

    python -m benchmarks.freeze_cost                 # study shapes (slow on a CPU)
    python -m benchmarks.freeze_cost --scale 0.25    # batch scaled down for a quick look
    python -m benchmarks.freeze_cost --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from oelm.core.flops import executed_flops, theoretical_saving
from oelm.core.freezing import apply_method, optimizer_groups
from oelm.hf.build import build_model
from oelm.models.gpt import GPT, GPTClassifier

from .harness import balanced_orders

# model, batch, sequence length, num_labels (None = language model)
CASES = [
    ("gpt-medium-512", 8, 512, None),
    ("bert-base-uncased", 32, 128, 2),
    ("gpt2", 8, 512, None),
]
# Extra cases, run only when named with --models.
OPTIONAL_CASES = [("minilm", 32, 128, 2)]  # the offline pretrained BERT-family encoder
METHODS = ["baseline", "oelm-freeze", "oelm-qk-ffn"]


def _make(model_name: str, method: str, num_labels: int | None, device: torch.device):
    torch.manual_seed(0)
    model = build_model(model_name, num_labels).to(device)
    apply_method(model, method, seed=0)
    return model


def _step_fn(model, batch: int, seq: int, num_labels: int | None, device: torch.device):
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    y = torch.randint(0, num_labels, (batch,), generator=g).to(device) if num_labels else None

    def loss() -> torch.Tensor:
        if isinstance(model, GPT):
            return model(x, x, return_logits=False)[1]  # as `oelm train` calls it
        if isinstance(model, GPTClassifier):
            return model(x, labels=y)[1]
        return model(input_ids=x, labels=y if num_labels else x).loss

    return loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Arm:
    """One (model, method) built from the same seed, ready to step."""

    def __init__(
        self, model_name: str, method: str, batch: int, seq: int, num_labels: int | None, device: torch.device
    ) -> None:
        self.model = _make(model_name, method, num_labels, device)
        self.loss = _step_fn(self.model, batch, seq, num_labels, device)
        self.flops = executed_flops(lambda: self.loss().backward())
        self.model.zero_grad(set_to_none=True)
        self.opt = torch.optim.AdamW(optimizer_groups(self.model, 0.1), lr=1e-4)
        self.theoretical = theoretical_saving(self.model, seq)
        self.times: list[float] = []

    def step(self, device: torch.device, record: bool) -> None:
        _sync(device)
        t0 = time.perf_counter()
        self.loss().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        _sync(device)
        if record:
            self.times.append(time.perf_counter() - t0)


def run(
    scale: float, steps: int, warmup: int, device: torch.device, only: list[str] | None, control: bool = False
) -> list[dict]:
    """Rows of model x method with the three savings side by side."""
    rows = []
    for name, batch, seq, labels in CASES + OPTIONAL_CASES:
        if (only and name not in only) or (not only and (name, batch, seq, labels) in OPTIONAL_CASES):
            continue
        b = max(1, round(batch * scale))
        arms = {m: Arm(name, m, b, seq, labels, device) for m in METHODS}
        if control:  # A/A control: a second baseline shows the timing noise floor
            arms["baseline (A/A control)"] = Arm(name, "baseline", b, seq, labels, device)
        order = list(arms.values())
        # Interleave the arms step by step so drift (thermal, other load) hits them alike, in a
        # carryover-balanced order (every arm takes every position and follows every other arm
        # equally often, so no arm always pays for what one neighbour leaves behind); warm-up
        # steps (allocator, lazy optimizer state, kernel choice) are excluded.
        orders = balanced_orders(len(order))
        for i in range(warmup + steps):
            for k in orders[i % len(orders)]:
                order[k].step(device, record=i >= warmup)
        base = arms["baseline"]
        for m in list(arms)[1:]:
            r = arms[m]
            executed = 1 - r.flops / base.flops
            rows.append(
                {
                    "model": name,
                    "method": m,
                    "batch": b,
                    "seq_len": seq,
                    "theoretical_saving": r.theoretical,
                    "executed_saving": executed,
                    "executed_over_theoretical": executed / r.theoretical if r.theoretical else None,
                    "time_ratio": statistics.median(r.times) / statistics.median(base.times),
                    "baseline_step_time": statistics.median(base.times),
                    "method_step_time": statistics.median(r.times),
                    "device": str(device),
                }
            )
        del arms
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every batch size (quick CPU runs)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--control", action="store_true", help="add an A/A row: baseline timed against itself")
    p.add_argument("--models", nargs="*", help="subset of: " + ", ".join(c[0] for c in CASES + OPTIONAL_CASES))
    args = p.parse_args(argv)
    rows = run(args.scale, args.steps, args.warmup, torch.device(args.device), args.models, args.control)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'model':<18} {'method':<24} {'theoretical':>11} {'executed':>9} {'exec/theo':>9} {'time ratio':>10}")
        for r in rows:
            ratio = r["executed_over_theoretical"]
            print(
                f"{r['model']:<18} {r['method']:<24} {100 * r['theoretical_saving']:>10.2f}% "
                f"{100 * r['executed_saving']:>8.2f}% {'n/a' if ratio is None else f'{ratio:.3f}':>9} "
                f"{r['time_ratio']:>10.3f}"
            )
    bad = [r for r in rows if r["executed_over_theoretical"] is not None and r["executed_over_theoretical"] < 0.95]
    if bad:
        print(f"executed saving below 95% of theory for: {[(r['model'], r['method']) for r in bad]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
