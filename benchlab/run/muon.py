"""optimizer=muon: torch.optim.Muon on the blocks' matrices, AdamW on everything else, stepped as one optimizer.

Muon orthogonalizes each matrix's momentum (Newton-Schulz iterations) and suits the hidden layers' 2D weights
only; embeddings, the tied output head and the LayerNorms' gains stay on AdamW, as in modded-nanogpt and torch's
own documentation. Its learning rate is adjusted to match AdamW's update RMS (`adjust_lr_fn="match_rms_adamw"`,
Moonshot's "Muon is Scalable for LLM Training"), so both halves share optim.lr, its schedule and
optim.weight_decay. The momentum warms up from 0.85 to 0.95 over its first 300 steps (benchlab/run/schedule.py).
"""

from typing import Any

import torch
import torch.nn as nn

from benchlab.run.schedule import MUON_MOMENTUM_WARMUP_STEPS, muon_momentum

BETAS = (0.9, 0.95)  # AdamW's, as make_optimizer's


def muon_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters Muon takes: the 2D weights inside the transformer blocks (their Linear layers)."""
    return [p for name, p in model.named_parameters() if p.requires_grad and name.startswith("blocks.") and p.dim() == 2]


class MuonAdamW:
    """Muon for the blocks' matrices and AdamW (for-loop, decay on matrices only) for the rest, as one optimizer:
    `param_groups` lists both halves' groups (so `set_lr` sets both), `step` and `zero_grad` do both."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float,
                 momentum_warmup: int = MUON_MOMENTUM_WARMUP_STEPS) -> None:
        chosen = {id(p) for p in muon_params(model)}
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
        self.muon = torch.optim.Muon(muon_params(model), lr=lr, weight_decay=weight_decay,
                                     momentum=muon_momentum(0, momentum_warmup), adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(
            [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
             {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
            lr=lr, betas=BETAS, foreach=False, fused=False)
        self.momentum_warmup, self.steps = momentum_warmup, 0

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        """One update of both halves, with Muon's momentum for this step."""
        for group in self.muon.param_groups:
            group["momentum"] = muon_momentum(self.steps, self.momentum_warmup)
        self.muon.step()
        self.adamw.step()
        self.steps += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict(), "steps": self.steps}
