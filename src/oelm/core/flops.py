"""Training FLOPs: the theoretical count of a model under a method, and the count actually executed.

Convention (as in nanoGPT's MFU and the Chinchilla appendix): only matrix multiplies count, 2 FLOPs
per multiply-add. A linear layer over N tokens costs 2*N*in*out forward, the same again for the
input gradient and again for the weight gradient; a frozen weight skips the last. The attention
core costs 2*T*d_qk (Q K^T) + 2*T*d_v (A V) per token forward and twice that backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from oelm.core.adapters import iter_adapters
from oelm.core.methods import get_method
from oelm.core.state import method_state
from oelm.core.targets import find_targets, unwrap
from oelm.core.tuning import tuning_flops_per_token


def _output_head_numel(model: nn.Module) -> int:
    """in*out of the per-token output head (LM head), 0 for sequence classifiers."""
    base = unwrap(model)
    get = getattr(base, "get_output_embeddings", None)
    head = get() if callable(get) else getattr(base, "lm_head", None)
    return head.weight.numel() if head is not None else 0


def adapter_flops_per_token(model: nn.Module) -> float:
    """Forward matmul FLOPs per token of the adapters a method added (e.g. a low-rank update, LoRA)."""
    base = unwrap(model)
    return float(sum(a.flops_per_token() for _, a in iter_adapters(base))) + tuning_flops_per_token(base)


def forward_flops_per_token(model: nn.Module, seq_len: int, adapters: bool = True) -> float:
    """Forward matmul FLOPs per token: layer projections, attention core, output head (+ adapters)."""
    total = 0.0
    for layer in find_targets(model).layers:
        for _, proj in layer.by_role():
            total += 2 * proj.weight.numel()
        # Q K^T in the query width, A V in the value width of every query head (grouped K/V shared).
        d_scores = layer.q_shape[0]  # W_Q = I (no Q projection): scores still in the identity's width
        d_values = layer.v.shape_out_in[0] * layer.n_heads // layer.n_kv_heads
        total += 2 * seq_len * (d_scores + d_values)
    total += adapter_flops_per_token(model) if adapters else 0.0
    return total + 2 * _output_head_numel(model)


def _scheduled_fractions(model: nn.Module) -> dict[str, float]:
    """Projection name -> fraction of steps it is frozen, for projections a schedule switches."""

    state = method_state(model)
    if state is None or not state.scheduled:
        return {}
    return dict.fromkeys(state.scheduled, state.scheduled_frozen_fraction)


def frozen_weight_grad_flops_per_token(model: nn.Module) -> float:
    """Weight-gradient FLOPs per token that frozen layer projections do not spend.

    A projection under a schedule counts for the fraction of the steps it spends frozen (the
    saving averaged over the run), whatever its state at the moment of the call.
    """
    scheduled = _scheduled_fractions(model)
    saved = 0.0
    for layer in find_targets(model).layers:
        for _, proj in layer.by_role():
            if proj.name in scheduled:
                saved += 2 * proj.weight.numel() * scheduled[proj.name]
            elif not proj.weight.requires_grad:
                saved += 2 * proj.weight.numel()
    return saved


def training_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Theoretical forward+backward FLOPs per token under the method (adapters and schedule included)."""
    return 3 * forward_flops_per_token(model, seq_len) - frozen_weight_grad_flops_per_token(model)


def _thin_qk_extra(model: nn.Module, seq_len: int) -> float:
    """Forward FLOPs per token a thin-keys method's model spends less than the full-width model."""
    state = method_state(model)
    ratio = get_method(state.method).qk_ratio if state is not None else 1.0
    if ratio == 1.0:
        return 0.0
    extra = 0.0
    for layer in find_targets(model).layers:
        extra += 2 * (layer.q_shape[0] * layer.q_shape[1] + layer.k.weight.numel()) + 2 * seq_len * layer.q_shape[0]
    return extra * (1.0 / ratio - 1.0)


def _identity_q_extra(model: nn.Module) -> float:
    """Forward FLOPs per token of the Q projections a model with W_Q = I does not run (none otherwise)."""
    return float(
        sum(2 * layer.q_shape[0] * layer.q_shape[1] for layer in find_targets(model).layers if layer.q is None)
    )


def theoretical_saving(model: nn.Module, seq_len: int) -> float:
    """Fraction of the training FLOPs of full training (no adapters) that the method saves.

    Added adapters count as extra cost (forward, input and weight gradients), so a low-rank
    update lowers the saving; a schedule's saving is averaged over the steps. A thin-keys method
    is measured against the full-width model, so its narrower Q/K and scores count as saving; W_Q = I
    (identity-q) against the model with its Q projection, so the removed matmul (forward, input and
    weight gradient) counts as saving.
    """
    removed = _thin_qk_extra(model, seq_len) + _identity_q_extra(model)
    full = 3 * (forward_flops_per_token(model, seq_len, adapters=False) + removed)
    return 1.0 - training_flops_per_token(model, seq_len) / full


def executed_flops(step: Callable[[], None]) -> int:
    """FLOPs actually executed by `step` (e.g. forward + backward), counted by FlopCounterMode.

    The math SDPA backend is forced because the fused CPU/GPU attention kernels are not
    counted by FlopCounterMode; the math path decomposes into counted matmuls.
    """
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


# Peak dense bf16/fp16 tensor-core FLOP/s (no sparsity) of common accelerators, for MFU.
PEAK_FLOPS = {
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
    "A6000": 155e12,
    "A5000": 111e12,
    "L40S": 362e12,
    "4090": 165e12,
}


def _peak_and_note(device: torch.device | str, dtype: torch.dtype | None) -> tuple[float | None, str | None]:
    """(peak FLOP/s, None), or (None, why no peak is given)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, "no peak FLOP/s assumed on CPU: MFU not given"
    if dtype not in (torch.bfloat16, torch.float16):
        return None, "float32 compute: MFU is given against the bf16/fp16 tensor-core peak only (train with dtype bf16)"
    name = torch.cuda.get_device_name(device)
    peak = next((v for key, v in PEAK_FLOPS.items() if key in name), None)
    return (
        peak,
        None if peak else "no known peak FLOP/s for this GPU (add it to oelm.core.flops.PEAK_FLOPS): MFU not given",
    )


def device_peak_flops(device: torch.device | str, dtype: torch.dtype | None = torch.bfloat16) -> float | None:
    """Dense bf16/fp16 tensor-core peak FLOP/s of a CUDA device if known, for a run computing in `dtype`.

    None on CPU, on unlisted devices, and for float32 compute (dtype float32 or None): the table
    holds bf16/fp16 peaks only, and an MFU against them would be a different quantity.
    """
    return _peak_and_note(device, dtype)[0]


def peak_flops_note(device: torch.device | str, dtype: torch.dtype | None) -> str | None:
    """Why `device_peak_flops` gave no peak (None when it gave one)."""
    return _peak_and_note(device, dtype)[1]
