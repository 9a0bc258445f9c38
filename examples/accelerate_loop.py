"""A plain accelerate loop with oelm-freeze on a tiny GPT, audited, on any number of processes.

    accelerate launch --config_file examples/accelerate_cpu.yaml examples/accelerate_loop.py --out /tmp/acc

Each process trains on its shard of a fixed toy batch stream (random tokens, next-token loss) and
writes `OUT/rank-N.json`: the process count accelerate saw, the per-step losses averaged over
processes, and the freeze audit's verdict on accelerate's prepared model and optimizer. Exit
code 1 when the audit failed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import oelm
from oelm.core.freezing import trainable_parameters
from oelm.models.gpt import GPT, gpt_config


def main(argv: list[str] | None = None) -> dict:
    """Train a few steps; write and return this process's summary."""
    from accelerate import Accelerator  # heavy optional dependency: imported on use

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4, help="per process")
    a = p.parse_args(argv)

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = GPT(gpt_config("gpt-tiny", vocab_size=97, block_size=32))
    oelm.apply_method(model, "oelm-freeze", seed=0)
    audit = oelm.audit_model(model)  # before prepare: the fingerprints of the unwrapped tensors
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    g = torch.Generator().manual_seed(1)
    n, rank = accelerator.num_processes, accelerator.process_index
    losses = []
    for _ in range(a.steps):
        batch = torch.randint(0, 97, (a.batch_size * n, 32), generator=g)  # the same global batch everywhere
        x = batch[rank * a.batch_size : (rank + 1) * a.batch_size].to(accelerator.device)
        _, loss = model(x, x)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    check = oelm.verify_audit(accelerator.unwrap_model(model), audit, optimizer=opt)
    summary = {"num_processes": n, "process_index": rank, "losses": losses, "audit_ok": check.ok}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(summary) + "\n")
    return summary


if __name__ == "__main__":
    raise SystemExit(0 if main()["audit_ok"] else 1)
