"""transformers.Trainer with an oelm classifier on one or several processes (DDP, DeepSpeed ZeRO).

    python examples/hf_trainer_dist.py --out /tmp/one                                   # one process
    torchrun --nproc_per_node 2 examples/hf_trainer_dist.py --batch-size 4 --out /tmp/ddp
    torchrun --nproc_per_node 2 examples/hf_trainer_dist.py --batch-size 4 \
        --deepspeed examples/deepspeed_zero3.json --out /tmp/zero3                      # pip install -e ".[deepspeed]"

A tiny BERT built offline (no download; dropout off so that runs on different process counts
compute the same thing) on a learnable toy task (label = first token mod 3), in a fixed example
order: the global batch of step s is the same rows on any process count. `--batch-size` is per
process. Rank 0 writes `OUT/summary.json`: the per-step training losses (the Trainer's, averaged
over processes), the world size, whether every frozen tensor is bit-identical to its value before
training (gathered from the shards under ZeRO-3) and whether `OUT/final` (`trainer.save_model`)
carries the method record; `oelm.from_pretrained("OUT/final")` reloads it, frozen tensors checked
against the record (in a fresh process: under ZeRO-3 transformers builds models sharded while the
job runs). Exit code 1 when a frozen tensor moved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import torch

import oelm
from oelm.hf.trainer import OELMCallback

VOCAB = 97


class Rows(torch.utils.data.Dataset):
    """A learnable toy task: label = first token mod 3 (seeded, identical on every process)."""

    def __init__(self, n: int, seq_len: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(1, VOCAB, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i, 0] % 3}


def tiny_bert() -> torch.nn.Module:
    """A 2-layer BERT classifier (hidden 64, 4 heads) from a config: no download, dropout off."""
    from transformers import AutoModelForSequenceClassification, BertConfig

    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
        pad_token_id=0,
    )
    model = AutoModelForSequenceClassification.from_config(cfg)
    # Its loss is a batch mean that ignores num_items_in_batch; a forward taking **kwargs tells the
    # Trainer otherwise, and under torchrun it then multiplies loss and gradients by the process
    # count. oelm's own classifiers (GPTClassifier, load_hf_classifier) set this already.
    model.accepts_loss_kwargs = False
    return model


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="Trainer output folder")
    p.add_argument("--method", default="oelm-freeze")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=8, help="per process")
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deepspeed", default=None, help="a DeepSpeed config (JSON), e.g. examples/deepspeed_zero3.json")
    return p.parse_args(argv)


def gathered(params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager:
    """The full tensors inside the block: ZeRO-3 keeps only a shard of each parameter on a process."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed  # heavy optional dependency: imported on use

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return contextlib.nullcontext()


def comm_bytes_callback() -> Any:
    """A callback that counts, per DeepSpeed collective, the bytes of its messages during training
    (DeepSpeed's comms logger, on when the config has `comms_logger.enabled`), in `.per_step`:
    the training steps' traffic, without initialization's or checkpoint saving's."""
    from transformers import TrainerCallback

    class CommBytes(TrainerCallback):
        per_step: dict[str, float] | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            from deepspeed.comm import comm  # heavy optional dependency: imported on use

            comm.comms_logger.reset_data()  # what initialization sent is not a training step's

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            from deepspeed.comm import comm  # heavy optional dependency: imported on use

            # read before a checkpoint save of this step gathers the weights
            data = comm.comms_logger.comms_dict
            self.per_step = {
                op: sum(size * v[0] for size, v in sizes.items()) / max(state.global_step, 1)
                for op, sizes in data.items()
            }

    return CommBytes()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train; on rank 0 write and return the summary (losses, world size, frozen check, saved record)."""
    from transformers import Trainer, TrainingArguments

    a = parse(argv)

    class InOrder(Trainer):
        """The rows in their stored order: a global batch is the same rows on any process count."""

        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> torch.utils.data.Sampler:
            return torch.utils.data.SequentialSampler(self.train_dataset)

    torch.manual_seed(a.seed)
    model = tiny_bert()
    oelm.apply_method(model, a.method, seed=a.seed)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = [p for p in model.parameters() if p.requires_grad]  # counted before ZeRO-3 shards them
    trainable_params = sum(p.numel() for p in trainable)
    gradient_bytes = sum(p.numel() * p.element_size() for p in trainable)
    out = Path(a.out)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=a.steps,
        per_device_train_batch_size=a.batch_size,
        learning_rate=a.lr,
        weight_decay=0.01,
        warmup_steps=0,
        logging_steps=1,
        save_steps=a.steps,
        save_strategy="steps",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
        seed=a.seed,
        dataloader_num_workers=0,
        deepspeed=a.deepspeed,
    )
    callbacks: list[Any] = [OELMCallback()]
    if a.deepspeed and json.loads(Path(a.deepspeed).read_text()).get("comms_logger", {}).get("enabled"):
        callbacks.append(comm_bytes_callback())
    trainer = InOrder(model=model, args=args, train_dataset=Rows(a.rows), callbacks=callbacks)
    trainer.train()
    trainer.save_model(str(out / "final"))

    frozen = [p for n, p in model.named_parameters() if n in before]
    with gathered(frozen):
        params = dict(model.named_parameters())
        moved = sorted(n for n in before if not torch.equal(params[n].detach().cpu(), before[n]))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    summary = {
        "method": a.method,
        "world_size": world,
        "deepspeed": a.deepspeed,
        "zero_stage": (trainer.accelerator.state.deepspeed_plugin.zero_stage if a.deepspeed else None),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "frozen_tensors": len(before),
        "frozen_moved": moved,
        "frozen_identical": not moved,
        "trainable_params": trainable_params,
        # the trainable tensors' gradients: what data parallelism has to reduce every step
        "gradient_bytes_per_step": gradient_bytes,
        # bytes per training step per DeepSpeed collective (this process's messages), when logged
        "comm_bytes_per_step": getattr(callbacks[-1], "per_step", None),
    }
    if trainer.is_world_process_zero():
        summary["record_saved"] = (out / "final" / "oelm_method.json").is_file()
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    return summary


def leave_process_group() -> None:
    """Leave the process group before the interpreter exits: a finished rank whose gloo and
    DeepSpeed threads are torn down at exit can abort ("terminate called without an active
    exception", SIGABRT) after its work is done, failing the whole launch."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    ok = main()["frozen_identical"]
    leave_process_group()
    raise SystemExit(0 if ok else 1)
