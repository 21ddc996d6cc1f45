"""loss=standard and loss=inline: the model's output layer and cross-entropy as the model itself computes them.

standard is the model's own forward, its logits returned with the loss, exactly as the public recipe (nanoGPT)
does. inline is the same forward returning only the loss: under torch.compile the logits are then no output of
the graph, so the compiler may fuse the cross-entropy into the output layer's epilogue and keep only what
backward needs. Under FSDP2 both run as `BodyThenHead`, the head compiled apart from the body.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchlab.core.loss_heads import LOSS_HEADS, LossKind
from model.gpt import GPT


class LossOnly(nn.Module):
    """The model's own forward, returning only the loss: under torch.compile the logits stay inside the graph."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = self.model(idx, targets)[1]
        assert loss is not None
        return loss


class OutputLoss(nn.Module):
    """The model's output layer and cross-entropy over given final hidden states: GPT.forward after `features`.

    forward(hidden, targets) returns (logits, loss) when `keep_logits` (the standard head's outputs), else the
    loss alone (the inline head's)."""

    def __init__(self, model: GPT, keep_logits: bool) -> None:
        super().__init__()
        self.lm_head = model.lm_head
        self.keep_logits = keep_logits

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> "tuple[torch.Tensor, torch.Tensor] | torch.Tensor":
        logits = self.lm_head(hidden)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return (logits, loss) if self.keep_logits else loss


class BodyThenHead:
    """The standard or inline head as two calls: the model's body as it is (under FSDP2: eager hooks around
    blocks compiled one by one), then the output layer and cross-entropy under `wrap_head` (torch.compile) as one
    graph. Under FSDP2 the head otherwise runs eagerly, its logits and their fp32 softmax materialized: on two
    H200s that run held more memory per GPU than DDP (docs/parallelism.md)."""

    def __init__(self, model: GPT, kind: LossKind, wrap_head: Callable[[nn.Module], nn.Module]) -> None:
        if LOSS_HEADS[kind].owns_output_matmul:
            raise ValueError(f"BodyThenHead takes the standard or inline head, not {kind!r}")
        self.model, self.kind = model, kind
        self.head = wrap_head(OutputLoss(model, keep_logits=kind == "standard"))

    def __call__(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = self.head(self.model.features(idx), targets)
        return out[1] if self.kind == "standard" else out
