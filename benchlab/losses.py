"""The training loss heads, applied from outside the model (knob `loss`).

- standard: the model's own forward, logits then cross-entropy; the logits
  are returned with the loss, exactly as the public recipe (nanoGPT) does.
- inline: the same forward, but only the loss is returned, so under
  torch.compile the logits are no output of the graph: the compiler may fuse
  the cross-entropy into the output layer's epilogue and keep only what
  backward needs.
- chunked: cross-entropy over chunks of `CHUNK_TOKENS` tokens, each chunk's
  logits recomputed in backward, so the (tokens x vocab) logits tensor never
  lives whole; the module returns only the loss, so under torch.compile no
  logits leave the compiled region.
- fused: the model's body runs (compiled, if asked) up to the final hidden
  states; liger-kernel's fused linear + cross-entropy Triton kernel then
  computes the loss without materializing logits, in the autocast dtype
  (bf16) as the standard head's matmul would. Until 2026-11-30 it got the
  LayerNorm's fp32 output and multiplied in fp32 (TF32): the H200 figures of
  `loss_fused` before then are of that slower path. It runs outside the
  compiled region: inside it, Liger 0.8.5 failed with a dynamo fake-tensor
  error (shared/GPU.md).
- cce: as fused, with cut-cross-entropy's kernel (Apple's "Cut Your Losses"),
  which recomputes logit blocks in backward instead of storing them; its
  gradient filtering (skipping near-zero softmax terms) is turned off, so the
  gradients are the exact ones up to rounding.
"""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from benchlab.config import LossKind
from model.gpt import GPT

# 2048 tokens x 50304 vocabulary in fp32 is 412 MB per live chunk, against
# 3.3 GB for a 16 x 1024 batch's whole logits.
CHUNK_TOKENS = 2048

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weight.t()  # (chunk, vocab)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of (N, C) hidden states against (N,) targets, one chunk of `chunk` (default
    `CHUNK_TOKENS`, read at the call) tokens' logits at a time."""
    chunk = chunk or CHUNK_TOKENS
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.size(0), chunk):
        end = start + chunk
        total = total + checkpoint(_chunk_loss_sum, hidden[start:end], weight, targets[start:end],
                                   use_reentrant=False)
    return total / hidden.size(0)


class ChunkedLoss(nn.Module):
    """The model with a chunked loss head: forward(idx, targets) returns only the mean loss."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = self.model.features(idx)  # (B, T, C)
        return chunked_cross_entropy(hidden.flatten(0, 1), self.model.lm_head.weight, targets.flatten())


class Features(nn.Module):
    """The model's body only: forward(idx) returns the final hidden states (B, T, C)."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model.features(idx)


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
    H200s that run held more memory per GPU than DDP (README "Past one GPU")."""

    def __init__(self, model: GPT, kind: LossKind, wrap_head: Callable[[nn.Module], nn.Module]) -> None:
        if kind not in ("standard", "inline"):
            raise ValueError(f"BodyThenHead takes the standard or inline head, not {kind!r}")
        self.model, self.kind = model, kind
        self.head = wrap_head(OutputLoss(model, keep_logits=kind == "standard"))

    def __call__(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = self.head(self.model.features(idx), targets)
        return out[1] if self.kind == "standard" else out


def loss_fn(model: GPT, kind: LossKind, wrap: Callable[[nn.Module], nn.Module]) -> LossFn:
    """The step's loss function: the model under `wrap` (torch.compile or identity) with the chosen head."""
    if kind == "standard":
        body = wrap(model)
        return lambda idx, targets: body(idx, targets)[1]
    if kind == "inline":
        return wrap(LossOnly(model))
    if kind == "chunked":
        return wrap(ChunkedLoss(model))
    features = wrap(Features(model))
    kernel = _liger_loss() if kind == "fused" else _cce_loss()

    def library_loss(idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = features(idx).flatten(0, 1)  # (B*T, C); fp32 even under autocast (LayerNorm runs in fp32)
        device = hidden.device.type
        if torch.is_autocast_enabled(device):  # multiply in the autocast dtype, as the standard head's Linear does
            hidden = hidden.to(torch.get_autocast_dtype(device))
        # The kernels multiply in the hidden states' dtype; the casts' backward returns fp32 gradients.
        return kernel(hidden, model.lm_head.weight.to(hidden.dtype), targets.flatten())

    return library_loss


def _liger_loss() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as err:  # checked by the knob's device check; kept for direct callers
        raise RuntimeError("loss=fused needs liger-kernel: pip install liger-kernel") from err
    liger = LigerFusedLinearCrossEntropyLoss()
    return lambda hidden, weight, targets: liger(weight, hidden, targets)


def _cce_loss() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as err:  # checked by the knob's device check; kept for direct callers
        raise RuntimeError("loss=cce needs cut-cross-entropy: pip install cut-cross-entropy") from err
    return lambda hidden, weight, targets: linear_cross_entropy(hidden, weight, targets, filter_eps=None)
