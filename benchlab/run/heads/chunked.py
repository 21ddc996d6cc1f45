"""loss=chunked: the output layer and cross-entropy over chunks of tokens, each chunk's gradients made in forward.

The model's body runs (compiled, if asked) up to the final hidden states; then the output layer and cross-entropy
run over chunks of `loss_chunk_tokens` tokens (knob; `CHUNK_TOKENS` by default), each chunk's gradients made as
soon as its loss (softmax minus one-hot, then the two products), so only one chunk's logits ever live and
backward merely scales the stored gradients: the standard head's matrix products, none repeated. Each chunk's
loss and logits' gradient are one compiled function under compile; the output weight's gradient is summed over
the chunks in fp32 (on CUDA inside the weight-gradient matmul, `add_weight_grad`). The head runs outside the
compiled region: inside it, on the H200, the compiled graph did not lower the peak, while a head outside it
(liger's) did.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from benchlab.core.knobs import RunSettings
from benchlab.run.heads.shared import FP32_SUM_DEVICES, LossFn
from model.gpt import GPT

# A 2048-token chunk's logits at GPT-2's 50,304-token vocabulary are 206 MB in bf16 (as much again for their
# gradient), against 1.6 GB for a 16 x 1024 batch's; 2048 rows fill the H200's tensor cores. Each chunk reads and
# writes the fp32 sum of the output weight's gradient once: 8 chunks' separate adds took 1.13 ms per step on the
# H200 (`results/h200-ours-1/`), which `add_weight_grad` moves into the matmul on CUDA. The knob's default.
CHUNK_TOKENS = RunSettings.loss_chunk_tokens

ChunkStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool],
                     "tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]"]


def chunk_loss_and_grads(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         with_grads: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Summed cross-entropy of one chunk's (n, C) hidden states, and that sum's gradients with respect to them
    and to its (n, V) logits (None without `with_grads`). The logits' gradient, softmax minus one-hot, is made
    in the hidden states' dtype, as the standard head's backward casts it before its two products; the output
    weight's product is left to `add_weight_grad`."""
    logits = (hidden @ weight.t()).float()  # (n, V); softmax in fp32, as F.cross_entropy runs under autocast
    lse = logits.logsumexp(dim=-1)
    loss_sum = (lse - logits.gather(1, targets[:, None]).squeeze(1)).sum()
    if not with_grads:
        return loss_sum, None, None
    # Softmax minus one-hot as one elementwise expression, so that the compiled function writes it once, in the
    # hidden states' dtype; a scatter into the fp32 softmax kept a (n, V) fp32 buffer and two more passes over it.
    probs = (logits - lse[:, None]).exp()
    target_column = torch.arange(logits.size(1), device=logits.device)[None, :] == targets[:, None]
    grad_logits = torch.where(target_column, probs - 1.0, probs).to(hidden.dtype)
    return loss_sum, grad_logits @ weight, grad_logits


def add_weight_grad(total: torch.Tensor, grad_logits: torch.Tensor, hidden: torch.Tensor) -> None:
    """total (V, C) += grad_logits (n, V)^T @ hidden (n, C). With half-precision operands on a device of
    `FP32_SUM_DEVICES` one matmul reads and writes the fp32 sum in its epilogue. Elsewhere (the CPU has no such
    kernel) the product is made in the operands' dtype and then added. On the H200 that separate add took 1.13 ms
    of a 39.55 ms step (`results/h200-ours-1/`); in the matmul, `lean` went from 84.5% to 85.8% of the recipe's
    tokens/s (`results/h200-knobs/lean-addmm/`), and cuBLAS's error against an fp32 reference sum fell from 0.5
    to 6e-4 (a 2048-token probe, `results/h200-knobs/lean-addmm/addmm_probe.txt`)."""
    if total.device.type in FP32_SUM_DEVICES and grad_logits.dtype in (torch.bfloat16, torch.float16):
        torch.addmm(total, grad_logits.t(), hidden, out_dtype=total.dtype, out=total)
    else:
        total += grad_logits.t() @ hidden


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy whose gradients are made in forward, chunk by chunk; backward scales them in place."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]
                chunk: int, step: ChunkStep) -> torch.Tensor:
        n = hidden.size(0)
        # The weight in the hidden states' dtype (autocast's, as the output layer's matmul casts it); its gradient
        # is summed in fp32 and handed back in the weight's own dtype, with no rounding to the products' dtype.
        cast = weight.to(hidden.dtype)
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for start in range(0, n, chunk):
            rows = hidden[start : start + chunk]
            loss_sum, g_hidden, g_logits = step(rows, cast, targets[start : start + chunk], True)
            assert g_hidden is not None and g_logits is not None
            total += loss_sum
            grad_hidden[start : start + chunk] = g_hidden
            add_weight_grad(grad_weight, g_logits, rows)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.n, ctx.chunk, ctx.weight_dtype, ctx.spent = n, chunk, weight.dtype, False
        return total / n

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None, None]:  # type: ignore[override]
        # The stored gradients are scaled in place: no second copy of the fp32 weight gradient at the peak.
        if ctx.spent:
            raise RuntimeError("the chunked cross-entropy's backward ran twice (retain_graph=True); its stored "
                               "gradients are scaled in place, so it supports one backward per forward")
        ctx.spent = True
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_loss / ctx.n
        # In fp32, rounded once: a bf16 copy of 1 / (tokens x micro-batches) would bias every body gradient
        # whenever that is no power of two (the weight's gradient is fp32 already). A chunk at a time, so the fp32
        # temporary is one chunk's rows, not the batch's (48 MiB at GPT-2 124M's 16 x 1024, where `lean`'s peak
        # measured 9 MiB under its bar).
        for start in range(0, ctx.n, ctx.chunk):
            rows = grad_hidden[start : start + ctx.chunk]
            rows.copy_(rows.float().mul_(scale))
        return grad_hidden, grad_weight.mul_(scale).to(ctx.weight_dtype), None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk: int | None = None, step: ChunkStep | None = None) -> torch.Tensor:
    """Mean cross-entropy of (N, C) hidden states against (N,) targets through the (V, C) output weight, one
    chunk of `chunk` (default `CHUNK_TOKENS`, read at the call) tokens' logits at a time, each chunk through
    `step` (default `chunk_loss_and_grads`; a compiled copy under compile). Under autocast the hidden states are
    cast to its dtype, as the output layer's matmul casts them; the weight always meets the hidden states in their
    dtype. The gradients come back in the tensors' own dtypes."""
    chunk, step = chunk or CHUNK_TOKENS, step or chunk_loss_and_grads
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        hidden = hidden.to(torch.get_autocast_dtype(device))
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedCrossEntropy.apply(hidden, weight, targets, chunk, step)
    weight = weight.to(hidden.dtype)
    total = sum(step(hidden[start : start + chunk], weight, targets[start : start + chunk], False)[0]
                for start in range(0, hidden.size(0), chunk))
    return total / hidden.size(0)  # no gradient wanted (evaluation): the loss alone


def chunked_loss(model: GPT, features: nn.Module, *, compile_chunks: bool, chunk: int | None) -> LossFn:
    """The chunked head after `features` (the model's body, already wrapped): `compile_chunks` compiles the
    per-chunk arithmetic (torch.compile's default mode: CUDA graphs would hand back outputs that the next chunk's
    replay overwrites); `chunk`: tokens per chunk (default `CHUNK_TOKENS`)."""
    step = torch.compile(chunk_loss_and_grads, dynamic=False) if compile_chunks else chunk_loss_and_grads

    def loss(idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = features(idx).flatten(0, 1)  # (B*T, C)
        return chunked_cross_entropy(hidden, model.lm_head.weight, targets.flatten(), chunk=chunk, step=step)

    return loss
