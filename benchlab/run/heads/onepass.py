"""loss=onepass: the output layer and its cross-entropy as one custom op that torch.compile keeps in its graph.

Forward makes the logits (one matmul); one Triton kernel, liger-kernel's cross-entropy, then reads each row of
them twice (its running max and sum, then its softmax) and writes over them the summed loss's gradient, softmax
minus one-hot; the two products backward would make (the hidden states' and the output weight's gradients, in
fp32) follow at once, and the logits' buffer is gone when the op returns. Backward only scales the two stored
gradients. The compiled recipe instead makes one pass over the logits for the loss and another in backward for
their gradient (1.12 and 0.98 ms per step in `fastest`'s profile, GPT-2 124M at 16 x 1024 on the H200) and keeps
the logits from forward to backward.

The op is registered with torch.library, so the compiler calls it as one opaque kernel inside the compiled graph
(liger's own autograd function broke under torch.compile on the H200), and CUDA graphs can capture it: it
reads nothing back to the host (liger's Python wrapper counts the targets with `.item()`; the kernel is called
directly with the count known here). Without CUDA (the CPU) the same arithmetic runs in torch, so the head's
wiring is tested there; the kernel against it on CUDA (tests/unit/test_onepass.py).
"""

import torch
import torch.nn as nn
from torch import Tensor

from benchlab.core.loss_heads import LOSS_HEADS
from benchlab.run.heads.shared import FP32_SUM_DEVICES
from model.gpt import GPT

# The liger-kernel release this module was written against (`rows_in_triton` calls an internal kernel of it by
# keyword, whose arguments change between releases). loss=onepass skips on CUDA under any other version; the
# release is declared in the loss heads' catalog, which the skip reads (benchlab/core/loss_heads.py).
LIGER_VERSION = LOSS_HEADS["onepass"].pinned
# liger-kernel 0.8.5's launch for a CUDA GPU: at most 32,768 columns per block of its row loop (its MAX_FUSED_SIZE),
# 32 warps per row on Hopper and earlier (its choice for bandwidth-bound rows; 8 on Blackwell for 16-bit inputs).
LIGER_BLOCK = 32768
LIGER_WARPS = 32
NO_TARGET = -100  # liger's ignore_index; the lab's targets are token ids, never negative


def rows_in_torch(logits: Tensor, targets: Tensor) -> Tensor:
    """Each row's cross-entropy against its target, in fp32; softmax minus one-hot written over `logits`."""
    wide = logits.float()
    lse = wide.logsumexp(dim=-1)
    loss_rows = lse - wide.gather(1, targets[:, None]).squeeze(1)
    grad = (wide - lse[:, None]).exp_()
    grad[torch.arange(targets.numel(), device=targets.device), targets] -= 1.0
    logits.copy_(grad)
    return loss_rows


def rows_in_triton(logits: Tensor, targets: Tensor) -> Tensor:
    """As `rows_in_torch`, by liger-kernel's cross-entropy kernel: one program per row, softmax in fp32."""
    import triton
    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel

    n, vocab = logits.shape
    loss_rows = torch.empty(n, dtype=torch.float32, device=logits.device)
    liger_cross_entropy_kernel[(n,)](
        X_ptr=logits, X_stride=logits.stride(0), Y_ptr=targets, Y_stride=targets.stride(0), weight_ptr=None,
        loss_ptr=loss_rows, z_loss_ptr=None, loss_stride=1, token_accuracy_ptr=None, token_accuracy_stride=0,
        predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=vocab, n_non_ignore=n,
        sum_non_ignore_weight=n, weight_sum=0.0, ignore_index=NO_TARGET, lse_square_scale=0.0,
        label_smoothing=0.0, reduction="sum", softcap=None, RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False,
        RETURN_PREDICTED_TOKENS=False, BLOCK_SIZE=min(LIGER_BLOCK, triton.next_power_of_2(vocab)),
        HAS_WEIGHT=False, HAS_SOFTCAPPING=False, HAS_GRADIENTS=True, num_warps=LIGER_WARPS)
    return loss_rows


def product_fp32(a: Tensor, b: Tensor) -> Tensor:
    """a @ b in fp32: from half-precision operands one cuBLAS call that writes fp32 where the device has it
    (`FP32_SUM_DEVICES`), else the product of fp32 copies."""
    if a.device.type in FP32_SUM_DEVICES and a.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


@torch.library.custom_op("benchlab::onepass_head", mutates_args=())
def onepass_head(hidden: Tensor, weight: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The summed cross-entropy of (N, C) hidden states through the (V, C) output weight against (N,) targets,
    and its gradients with respect to the hidden states and the weight, both in fp32. The weight meets the
    hidden states in their dtype, as the output layer's matmul casts it under autocast."""
    with torch.autocast(hidden.device.type, enabled=False):
        cast = weight.to(hidden.dtype)
        logits = hidden @ cast.t()
        rows = rows_in_triton if logits.device.type == "cuda" else rows_in_torch
        loss = rows(logits, targets).sum()
        return loss, product_fp32(logits, cast), product_fp32(logits.t(), hidden)


@onepass_head.register_fake
def _(hidden: Tensor, weight: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return (hidden.new_empty((), dtype=torch.float32), hidden.new_empty(hidden.shape, dtype=torch.float32),
            weight.new_empty(weight.shape, dtype=torch.float32))


def _keep_gradients(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    hidden, weight, _ = inputs
    _, grad_hidden, grad_weight = output
    ctx.save_for_backward(grad_hidden, grad_weight)
    ctx.dtypes = (hidden.dtype, weight.dtype)  # type: ignore[attr-defined]


def _scale_gradients(ctx: torch.autograd.function.FunctionCtx, grad_loss: Tensor, *_: Tensor) -> tuple:
    # Scaled in fp32 and rounded once to each input's dtype.
    grad_hidden, grad_weight = ctx.saved_tensors  # type: ignore[attr-defined]
    hidden_dtype, weight_dtype = ctx.dtypes  # type: ignore[attr-defined]
    return (grad_hidden * grad_loss).to(hidden_dtype), (grad_weight * grad_loss).to(weight_dtype), None


onepass_head.register_autograd(_scale_gradients, setup_context=_keep_gradients)


class OnePassLoss(nn.Module):
    """The model's body, then `onepass_head` over its final hidden states (in `dtype` when given, autocast's):
    forward(idx, targets) returns the mean loss. Compiled as a whole, the op sits inside the body's graph."""

    def __init__(self, model: GPT, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        hidden = self.model.features(idx).flatten(0, 1)
        if self.dtype is not None:
            hidden = hidden.to(self.dtype)
        loss_sum = onepass_head(hidden, self.model.lm_head.weight, targets.flatten())[0]
        return loss_sum / targets.numel()
