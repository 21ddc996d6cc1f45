"""The optimizer each value of the `optimizer` knob makes (step 7 of `benchlab.run.apply_knobs.apply`), and how
the learning-rate schedule sets its rate each step."""

import torch
from torch import nn

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings
from benchlab.core.sections import OptimParams


def make_optimizer(model: nn.Module, settings: RunSettings, optim: OptimParams) -> torch.optim.Optimizer:
    """AdamW with decay on matrices only (as GPT-2 trainers do), the implementation `settings.optimizer` names (or
    muon: Muon on the blocks' matrices, AdamW on the rest).
    torchao's optimizers and the compiled update keep the learning rate as a tensor, which `set_lr` fills."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    betas = (0.9, 0.95)
    match settings.optimizer:
        case "adamw":  # foreach=False: the plain per-parameter loop, the unoptimized baseline
            return torch.optim.AdamW(groups, lr=optim.lr, betas=betas, foreach=False, fused=False)
        case "adamw_fused":
            return torch.optim.AdamW(groups, lr=optim.lr, betas=betas, fused=True)
        case "adamw_compiled":
            # For torch.compile (`apply` compiles the update): torch picks the implementation (foreach on a GPU,
            # which dynamo traces whole and makes capturable), and the learning rate is a tensor on the device: as
            # a float it would be a constant of the graph, compiled again each time the schedule changes it.
            return torch.optim.AdamW(groups, lr=torch.tensor(optim.lr, device=params[0].device), betas=betas)
        case "adamw_8bit":
            from torchao.optim import AdamW8bit

            return AdamW8bit(groups, lr=optim.lr, betas=betas)
        case "adamw_bf16_sr":
            from benchlab.run.adamw_bf16_sr import (
                OneCallAdamW,  # torchao's AdamW, its per-parameter step in one compiled call
            )

            return OneCallAdamW(groups, lr=optim.lr, betas=betas)
        case "muon":  # not an AdamW: it changes the optimization (the knob table says so)
            from benchlab.run.muon import MuonAdamW

            return MuonAdamW(model, optim.lr, optim.weight_decay)  # type: ignore[return-value]
    raise LabError(f"optimizer={settings.optimizer!r} is not one this lab makes")  # params.yaml's check refuses it


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate; torchao's optimizers keep it as a tensor (so their step is not recompiled
    when it changes) and refuse a plain float."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
