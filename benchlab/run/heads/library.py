"""loss=fused and loss=cce: a library's fused linear + cross-entropy kernel, which never materializes the logits.

The model's body runs (compiled, if asked) up to the final hidden states; the kernel then computes the loss in
the autocast dtype (bf16), as the standard head's matmul would.

- fused: liger-kernel's Triton kernel. It runs outside the compiled region: inside it, Liger 0.8.5 failed with a
  dynamo fake-tensor error on the H200.
- cce: cut-cross-entropy's kernel (Apple's "Cut Your Losses"), which recomputes logit blocks in backward instead
  of storing them; its gradient filtering (skipping near-zero softmax terms) is turned off, so the gradients are
  the exact ones up to rounding.

The libraries are imported only when their head is built, with an error that says what to install.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

from benchlab.core.skips import GPU_INSTALL
from benchlab.run.heads.shared import LossFn
from model.gpt import GPT

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (hidden, weight, targets) -> loss


def library_loss(model: GPT, features: nn.Module, kind: str) -> LossFn:
    """The `fused` or `cce` head after `features` (the model's body, already wrapped)."""
    kernel = _liger_loss() if kind == "fused" else _cce_loss()

    def loss(idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = features(idx).flatten(0, 1)  # (B*T, C); in hidden_dtype, else fp32 (LayerNorm runs in fp32)
        device = hidden.device.type
        if torch.is_autocast_enabled(device):  # multiply in the autocast dtype, as the standard head's Linear does
            hidden = hidden.to(torch.get_autocast_dtype(device))
        # The kernels multiply in the hidden states' dtype; the casts' backward returns fp32 gradients.
        return kernel(hidden, model.lm_head.weight.to(hidden.dtype), targets.flatten())

    return loss


def _liger_loss() -> Kernel:
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as err:  # checked by the knob's device check; kept for direct callers
        raise RuntimeError(f"loss=fused needs liger-kernel: {GPU_INSTALL}") from err
    liger = LigerFusedLinearCrossEntropyLoss()
    return lambda hidden, weight, targets: liger(weight, hidden, targets)


def _cce_loss() -> Kernel:
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as err:  # checked by the knob's device check; kept for direct callers
        raise RuntimeError(f"loss=cce needs cut-cross-entropy: {GPU_INSTALL}") from err
    return lambda hidden, weight, targets: linear_cross_entropy(hidden, weight, targets, filter_eps=None)
