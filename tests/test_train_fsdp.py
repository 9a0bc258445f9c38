"""--strategy fsdp (FSDP2) and its sharded checkpoints (torch.distributed.checkpoint); weight decay by role."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701  (torch has no public op-counting mode)

from oelm.core.freezing import apply_method, decay_by_id, optimizer_groups
from oelm.models.gpt import GPT, gpt_config
from oelm.training import config as config_module
from oelm.training.checkpoint import SHARDED, STATE, WEIGHTS, load_state, resolve_checkpoint
from oelm.training.distributed import count_comm, fsdp_modules, gathered, shard_model
from oelm.training.loop import train
from oelm.training.runs import load_model
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config, torchrun_train

# FSDP2 reduce-scatters the mean of the ranks' gradients where one process takes the mean over the
# whole batch: the same numbers summed in another order. Measured on CPU (gloo, float32): the loss
# curves of 2 processes and 1 agree to a relative 1e-7; the bound leaves room for other CPUs.
LOSS_RTOL = 1e-5


def losses(run: Path, kind: str | None = None) -> list[tuple[str, int, float]]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["kind"], r["step"], r["loss"]) for r in recs if kind is None or r["kind"] == kind]


def assert_same_curve(a: Path, b: Path, kind: str | None = None) -> None:
    for (k1, s1, l1), (k2, s2, l2) in zip(losses(a, kind), losses(b, kind), strict=True):
        assert (k1, s1) == (k2, s2) and l1 == pytest.approx(l2, rel=LOSS_RTOL), (k1, s1)


def qk(weights: Path) -> dict[str, torch.Tensor]:
    sd = load_file(weights)
    return {k: v for k, v in sd.items() if ".q_proj." in k or ".k_proj." in k}


def test_weight_decay_is_chosen_by_role_not_by_shape() -> None:
    """Matrices of Linear maps, embeddings and low-rank adapter factors decay; biases, norm gains
    and adapter scalars do not, also when a parameter is flattened (as a sharding wrapper may)."""
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=32, n_layer=2, d_model=32, n_head=4))
    apply_method(model, "oelm-lowrank", seed=0)
    decay = decay_by_id(model)
    names = {id(p): n for n, p in model.named_parameters()}
    # On the unflattened model the role rule decays exactly the matrices.
    assert {names[i] for i, d in decay.items() if d} == {n for n, p in model.named_parameters() if p.ndim >= 2}
    # Flatten every parameter to 1-D (FSDP1-style flat views keep names, lose shapes).
    flat: dict[int, nn.Parameter] = {}  # tied tensors (lm_head / wte) stay tied
    for module in model.modules():
        for leaf, p in list(module.named_parameters(recurse=False)):
            if id(p) not in flat:
                flat[id(p)] = nn.Parameter(p.detach().reshape(-1), requires_grad=p.requires_grad)
            setattr(module, leaf, flat[id(p)])
    flat_decay, flat_names = decay_by_id(model), {id(p): n for n, p in model.named_parameters()}
    assert {flat_names[i] for i, d in flat_decay.items() if d} == {names[i] for i, d in decay.items() if d}
    decayed, plain = optimizer_groups(model, weight_decay=0.1)
    by_name = {id(p): n for n, p in model.named_parameters()}
    got = {by_name[id(p)] for p in decayed["params"]}
    assert "transformer.h.0.mlp.fc_in.weight" in got and "transformer.wte.weight" in got
    assert any(n.endswith("lora_a") for n in got) and any(n.endswith("lora_b") for n in got)
    assert not any(n.endswith("bias") or ".ln_" in n for n in got)
    # Frozen Q/K are never given to the optimizer.
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and not frozen & (got | {by_name[id(p)] for p in plain["params"]})
    assert plain["weight_decay"] == 0.0 and decayed["weight_decay"] == 0.1


def test_fsdp_is_refused_before_any_work_without_fully_shard_or_with_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tiny_config(tmp_path / "data", tmp_path / "run", strategy="fsdp")
    with pytest.raises(UserError, match="compile"):
        config_module.make_config({**cfg, "compile": True})
    monkeypatch.setattr(config_module, "fsdp_available", lambda: False)
    with pytest.raises(UserError, match=r"strategy fsdp needs torch.distributed.fsdp.fully_shard .* --strategy ddp"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_a_bad_fs_wait_is_refused_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OELM_FS_WAIT_S", "soon")
    cfg = tiny_config(synthetic_lm_dir(tmp_path / "data"), tmp_path / "run", strategy="fsdp")
    with pytest.raises(UserError, match=r"OELM_FS_WAIT_S='soon' is not a number of seconds"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_fsdp_in_one_process_matches_ddp_and_writes_whole_weights(tmp_path: Path) -> None:
    """One process shards over a group of one: same numbers as the plain loop; best/ and the last
    step hold whole weights that the downstream loader reads; earlier steps are DCP only."""
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / "fsdp", steps=8, eval_every=4, checkpoint_every=4, strategy="fsdp")
    with one_thread():
        fsdp = train(cfg)
        plain = train({**cfg, "out": str(tmp_path / "plain"), "strategy": "ddp"})
    assert fsdp["freeze_check"]["ok"] and fsdp["val_loss"] == pytest.approx(plain["val_loss"], rel=LOSS_RTOL)
    assert_same_curve(tmp_path / "fsdp", tmp_path / "plain")
    root = tmp_path / "fsdp" / "checkpoints"
    assert (root / "step_0000004" / SHARDED / ".metadata").is_file() and not (root / "step_0000004" / WEIGHTS).exists()
    assert (root / "step_0000008" / WEIGHTS).is_file() and (root / "best" / WEIGHTS).is_file()
    assert set(load_file(root / "step_0000008" / WEIGHTS)) == set(
        load_file(tmp_path / "plain" / "checkpoints" / "step_0000008" / WEIGHTS)
    )
    with pytest.raises(UserError, match="is sharded"):
        resolve_checkpoint(tmp_path / "fsdp", "4")
    model = load_model(tmp_path / "fsdp", which="last")  # the one loader of sample / export
    assert not model.transformer.h[0].attn.q_proj.weight.requires_grad
    # A DDP resume of an FSDP run is refused, naming the strategy that wrote it.
    with pytest.raises(UserError, match="--strategy fsdp"), one_thread():
        train({**cfg, "steps": 12, "resume": True, "strategy": "ddp", "allow_change": ["steps"]})


@pytest.mark.slow  # torchrun with two processes: ~15 s each
# oelm-late-freeze: Q/K train, then freeze mid-run on sharded (DTensor) parameters.
@pytest.mark.parametrize("method", ["oelm-freeze", "oelm-late-freeze"])
def test_fsdp_two_processes_match_one_process(tmp_path: Path, method: str) -> None:
    """Also an uneven evaluation: 9 validation and test windows over 2 ranks of batch 4 (rank 0
    runs 2 forwards, rank 1 one), which must neither hang nor change the numbers; and the
    communication FSDP2 counted, recorded in timing_stats.json."""
    data = synthetic_lm_dir(tmp_path / "data", n_train=3000)  # val and test: 300 tokens, 9 windows of 32
    cfg = tiny_config(data, tmp_path / "fsdp", steps=12, eval_every=6, checkpoint_every=6, method=method)
    cfg.update(strategy="fsdp", final_eval_batches=None)  # the whole test split
    # A collective left waiting (a rank in a sharded forward the other never joins) fails in 60 s.
    done = torchrun_train(cfg, tmp_path / "fsdp.yaml", 2, OELM_DIST_TIMEOUT_S="60")
    assert done.returncode == 0, done.stderr[-3000:]
    with one_thread():
        single = train({**cfg, "out": str(tmp_path / "single"), "batch_size": 8, "strategy": "ddp"})
    fsdp = json.loads((tmp_path / "fsdp" / "results.json").read_text())
    assert fsdp["world_size"] == 2 and fsdp["global_batch_size"] == single["global_batch_size"] == 8
    assert fsdp["freeze_check"]["ok"] and fsdp["freeze_check"]["n_frozen_checked"] == 2
    assert fsdp["val_loss"] == pytest.approx(single["val_loss"], rel=LOSS_RTOL)
    assert fsdp["val_windows"] == fsdp["test_windows"] == 9
    assert fsdp["test_loss"] == pytest.approx(single["test_loss"], rel=LOSS_RTOL)
    assert_same_curve(tmp_path / "fsdp", tmp_path / "single")
    # Per step: every parameter all-gathered in forward and the block's again in backward (float32,
    # no padding at these sizes); oelm-freeze reduce-scatters the trainable gradients only.
    timing = json.loads((tmp_path / "fsdp" / "timing_stats.json").read_text())
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, **cfg["model_overrides"]))
    block = sum(p.numel() for p in model.transformer.h.parameters())
    total = fsdp["trainable_params"] + fsdp["frozen_params"]
    assert total == sum(p.numel() for p in model.parameters())
    assert timing["allgather_bytes_per_step"] == 4 * (total + block)
    assert timing["allreduce_bytes_per_step"] is None  # FSDP2 all-reduces nothing
    if method == "oelm-freeze":
        assert timing["reduce_scatter_bytes_per_step"] == timing["gradient_bytes_per_step"]
        assert timing["reduce_scatter_bytes_per_step"] == 4 * fsdp["trainable_params"]
    else:  # Q/K reduce-scattered until the freeze, not after
        qk_params = sum(p.numel() for n, p in model.named_parameters() if ".q_proj." in n or ".k_proj." in n)
        assert 4 * (total - qk_params) < timing["reduce_scatter_bytes_per_step"] < 4 * total
    # Frozen Q/K: bit-identical to the one-process run's (oelm-freeze: both are the init; late
    # freeze: both are the values of the freeze step, within the curve's tolerance).
    a = qk(tmp_path / "fsdp" / "checkpoints" / "step_0000012" / WEIGHTS)
    b = qk(tmp_path / "single" / "checkpoints" / "step_0000012" / WEIGHTS)
    assert set(a) == set(b) and a
    for k in a:
        if method == "oelm-freeze":
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    if method == "oelm-late-freeze":
        sched = json.loads((tmp_path / "fsdp" / "freeze_audit.json").read_text())["start"]["schedule"]
        assert sched["switched"] and not sched["problems"]


@pytest.mark.slow  # torchrun: two processes, then three
def test_dcp_checkpoint_resumes_at_one_and_three_processes_keeping_the_global_batch(tmp_path: Path) -> None:
    """Saved by 2 processes (batch 6 each), resumed by 1 (grad_accum 2) and by 3 (batch 4): the
    same global batch of 12, the same curve as one uninterrupted process; a resume that would
    change the global batch is refused."""
    data = synthetic_lm_dir(tmp_path / "data")
    # constant LR after warmup: a 6-step run continued to 12 steps is the 12-step run
    cfg = tiny_config(data, tmp_path / "two", steps=6, batch_size=6, eval_every=3, checkpoint_every=3)
    cfg.update(strategy="fsdp", schedule="constant")
    done = torchrun_train(cfg, tmp_path / "two.yaml", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    step = tmp_path / "two" / "checkpoints" / "step_0000006"
    assert sorted(p.name for p in (step / SHARDED).iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "shards.json",  # every shard's sha256, checked on resume
    ]
    state = load_state(step)
    assert (state["world_size"], state["global_batch"], state["strategy"], state["optimizer"]) == (2, 12, "fsdp", None)
    assert (step / STATE).is_file() and (step / WEIGHTS).is_file()  # the last step: whole weights too
    for name in ("one", "three", "refused"):
        shutil.copytree(tmp_path / "two", tmp_path / name)
    more = {"steps": 12, "resume": True}
    with one_thread():
        reference = train({**cfg, "out": str(tmp_path / "ref"), "steps": 12, "batch_size": 12, "strategy": "ddp"})
        with pytest.raises(UserError, match=r"global batch of 12 .* resume with --grad-accum 2"):
            train({**cfg, **more, "out": str(tmp_path / "refused"), "allow_change": ["steps"]})
        one = train(
            {**cfg, **more, "out": str(tmp_path / "one"), "grad_accum": 2, "allow_change": ["steps", "grad_accum"]}
        )
    three_cfg = {
        **cfg,
        **more,
        "out": str(tmp_path / "three"),
        "batch_size": 4,
        "allow_change": ["steps", "batch_size"],
    }
    done = torchrun_train(three_cfg, tmp_path / "three.yaml", 3)
    assert done.returncode == 0, done.stderr[-3000:]
    three = json.loads((tmp_path / "three" / "results.json").read_text())
    # Resumed, not restarted: the log up to step 6 is the 2-process run's, byte for byte (step times too).
    saved = (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    for run in ("one", "three"):
        assert (tmp_path / run / "metrics.jsonl").read_text().splitlines()[: len(saved)] == saved, run
    assert (one["world_size"], three["world_size"]) == (1, 3)
    assert one["global_batch_size"] == three["global_batch_size"] == reference["global_batch_size"] == 12
    assert one["freeze_check"]["ok"] and three["freeze_check"]["ok"]
    # The train curve (steps 1-6 from the 2-process run, 7-12 resumed) is the uninterrupted one's.
    assert_same_curve(tmp_path / "one", tmp_path / "ref", kind="train")
    assert_same_curve(tmp_path / "three", tmp_path / "ref")  # 3 x 4 also evaluates the same windows
    ref_qk = qk(tmp_path / "ref" / "checkpoints" / "step_0000012" / WEIGHTS)
    for run in ("one", "three"):
        got = qk(tmp_path / run / "checkpoints" / "step_0000012" / WEIGHTS)
        assert all(torch.equal(got[k], ref_qk[k]) for k in ref_qk), run  # frozen Q/K bit-identical


# ---- communication bytes under FSDP2, and evaluation that issues no collective -------------------
def unit_bytes(model: nn.Module, world: int, grads_only: bool) -> list[int]:
    """Per FSDP2 unit (root last): the bytes of one collective over its own parameters, each
    sharded on dim 0 and padded to equal shards (FSDP2's layout), float32."""
    out, seen = [], set()
    for unit in fsdp_modules(model):  # children first: a unit's own parameters are those no earlier unit took
        own = [p for p in unit.parameters() if id(p) not in seen]
        seen |= {id(p) for p in own}
        own = [p for p in own if p.requires_grad or not grads_only]
        out.append(sum(math.ceil(p.shape[0] / world) * world * math.prod(p.shape[1:]) * 4 for p in own))
    return out


class CollectiveOps(TorchDispatchMode):
    """Counts the collective ops (c10d, functional collectives) dispatched inside it."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.namespace in ("c10d", "_c10d_functional")
        return func(*args, **(kwargs or {}))


def comm_worker(rank: int, world: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    found = {}
    x = torch.randint(0, 63, (2, 32), generator=torch.Generator().manual_seed(rank))
    for method in ("baseline", "oelm-freeze"):
        torch.manual_seed(0)
        # d_model 36 over 2 ranks: even; vocab 63 and ffn 144: wte's 63 rows shard unevenly (padded)
        model = GPT(gpt_config("gpt-tiny", vocab_size=63, block_size=32, n_layer=2, d_model=36, n_head=4))
        apply_method(model, method, seed=0)
        shard_model(model, torch.device("cpu"), world)
        counter = count_comm(model)
        with CommDebugMode() as mode, CollectiveOps() as train_ops:
            model(x, x, return_logits=False)[1].backward()
        ops = {str(k): v for k, v in mode.get_comm_counts().items()}
        # Evaluation: ranks run different numbers of forwards (rank r: r + 1) on the gathered model,
        # which must issue no collective (a sharded forward all-gathers: uneven counts would hang).
        counter.active = False
        with torch.no_grad(), gathered(model), CollectiveOps() as eval_ops:
            for _ in range(rank + 1):
                model(x, x, return_logits=False)
        found[method] = {
            "bytes": dict(counter.bytes),
            "calls": dict(counter.calls),
            "ops": ops,
            "train_collectives": train_ops.count,
            "eval_collectives": eval_ops.count,
            "units_all": unit_bytes(model, world, grads_only=False),
            "units_grad": unit_bytes(model, world, grads_only=True),
            "frozen_bytes": sum(4 * p.numel() for p in model.parameters() if not p.requires_grad),
        }
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(found))
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes: ~5 s
def test_fsdp_communication_is_counted_and_frozen_tensors_are_gathered_but_not_reduced(tmp_path: Path) -> None:
    """The counter's bytes are what FSDP2 sends: as many collectives as CommDebugMode sees, of
    the padded sharded sizes; oelm-freeze reduce-scatters exactly the frozen Q/K bytes less than
    baseline and all-gathers as much (frozen tensors are still gathered); evaluation's forwards on
    the gathered model run no collective, so ranks may run different numbers of them."""
    out = tmp_path / "found.json"
    mp.spawn(comm_worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2)
    found = json.loads(out.read_text())
    for f in found.values():
        assert f["calls"]["all_gather"] == sum(v for k, v in f["ops"].items() if "allgather" in k) > 0
        assert f["calls"]["reduce_scatter"] == sum(v for k, v in f["ops"].items() if "reduce_scatter" in k) > 0
        # forward gathers every unit; backward gathers the blocks again (the root stays gathered)
        assert f["bytes"]["all_gather"] == sum(f["units_all"]) + sum(f["units_all"][:-1])
        assert f["bytes"]["reduce_scatter"] == sum(f["units_grad"])
        # the same op counter sees every collective of a training step, and none in evaluation
        assert f["train_collectives"] == f["calls"]["all_gather"] + f["calls"]["reduce_scatter"]
        assert f["eval_collectives"] == 0
    base, frozen = found["baseline"], found["oelm-freeze"]
    assert base["frozen_bytes"] == 0 and frozen["frozen_bytes"] == 2 * 2 * 36 * 36 * 4  # Q and K of 2 layers
    assert frozen["bytes"]["all_gather"] == base["bytes"]["all_gather"]
    assert base["bytes"]["reduce_scatter"] - frozen["bytes"]["reduce_scatter"] == frozen["frozen_bytes"]
