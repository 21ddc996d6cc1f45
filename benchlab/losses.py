"""The training loss heads, applied from outside the model (knob `loss`).

- standard: the model's own forward, logits then cross-entropy; the logits
  are returned with the loss, exactly as the public recipe (nanoGPT) does.
- inline: the same forward, but only the loss is returned, so under
  torch.compile the logits are no output of the graph: the compiler may fuse
  the cross-entropy into the output layer's epilogue and keep only what
  backward needs.
- chunked: the model's body runs (compiled, if asked) up to the final hidden
  states; then the output layer and cross-entropy run over chunks of
  `loss_chunk_tokens` tokens (knob; `CHUNK_TOKENS` by default), each chunk's gradients made as soon as its loss
  (softmax minus one-hot, then the two products), so only one chunk's
  logits ever live and backward merely scales the stored gradients: the
  standard head's matrix products, none repeated. Each chunk's loss and
  logits' gradient are one compiled function under compile; the output
  weight's gradient is summed over the chunks in fp32 (on CUDA inside the
  weight-gradient matmul, `add_weight_grad`). The head runs outside the
  compiled region: inside it (tried on the H200, 2026-12-01) the compiled
  graph did not lower the peak, while a head outside it (liger's) did.
  Until 2026-12-01 `chunked` checkpointed each chunk inside the compiled
  region instead (its logits recomputed in backward); the H200 figures of
  `loss_chunked` and of the old `lean` are of that path.
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
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchlab.config import LossKind, RunSettings
from model.gpt import GPT

# A 2048-token chunk's logits at GPT-2's 50,304-token vocabulary are 206 MB in bf16 (as much again for their
# gradient), against 1.6 GB for a 16 x 1024 batch's; 2048 rows fill the H200's tensor cores. Each chunk reads and
# writes the fp32 sum of the output weight's gradient once: 8 chunks' separate adds took 1.13 ms per step on the
# H200 (`results/h200-ours-1/`), which `add_weight_grad` moves into the matmul on CUDA. The knob's default.
CHUNK_TOKENS = RunSettings.loss_chunk_tokens

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ChunkStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool],
                     "tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]"]

# Devices whose addmm can take bf16 or fp16 operands and add their product into an fp32 sum in place
# (torch's `out_dtype`): cuBLAS on CUDA; meta only checks shapes and dtypes (the tests use it).
FP32_SUM_DEVICES = ("cuda", "meta")


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
    kernel) the product is made in the operands' dtype and then added: on the H200 that add took 1.13 ms of a
    39.55 ms step (`results/h200-ours-1/`, before this function); with it, `lean` went from 84.5% to 85.8%
    of the recipe's tokens/s (`results/h200-knobs/lean-addmm/`), and cuBLAS's error against an fp32 reference sum fell
    from 0.5 to 6e-4 (a 2048-token probe, `results/h200-knobs/lean-addmm/addmm_probe.txt`)."""
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


class Features(nn.Module):
    """The model's body only: forward(idx) returns the final hidden states (B, T, C), in `dtype` when given.

    The heads after it multiply in autocast's dtype; casting here puts the cast inside the compiled body (where
    the body is compiled as a whole, not under FSDP2), so the final LayerNorm writes its output once in that dtype;
    either way no fp32 copy lives while the head runs."""

    def __init__(self, model: GPT, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        hidden = self.model.features(idx)
        return hidden if self.dtype is None else hidden.to(self.dtype)


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


def loss_fn(model: GPT, kind: LossKind, wrap: Callable[[nn.Module], nn.Module], *, compile_chunks: bool,
            chunk: int | None = None, hidden_dtype: torch.dtype | None = None) -> LossFn:
    """The step's loss function: the model under `wrap` (torch.compile or identity) with the chosen head;
    `compile_chunks`: the chunked head's per-chunk arithmetic compiled (torch.compile's default mode: CUDA
    graphs would hand back outputs that the next chunk's replay overwrites); `chunk`: the chunked head's tokens
    per chunk (default `CHUNK_TOKENS`); `hidden_dtype`: autocast's dtype, which the body's output is cast to
    before a chunked or library head (None without autocast)."""
    if kind == "standard":
        body = wrap(model)
        return lambda idx, targets: body(idx, targets)[1]
    if kind == "inline":
        return wrap(LossOnly(model))
    if kind == "onepass":
        from benchlab.onepass import OnePassLoss  # it imports this module

        return wrap(OnePassLoss(model, hidden_dtype))
    features = wrap(Features(model, hidden_dtype))
    if kind == "chunked":
        step = torch.compile(chunk_loss_and_grads, dynamic=False) if compile_chunks else chunk_loss_and_grads

        def chunked_loss(idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            hidden = features(idx).flatten(0, 1)  # (B*T, C)
            return chunked_cross_entropy(hidden, model.lm_head.weight, targets.flatten(), chunk=chunk, step=step)

        return chunked_loss
    kernel = _liger_loss() if kind == "fused" else _cce_loss()

    def library_loss(idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = features(idx).flatten(0, 1)  # (B*T, C); in hidden_dtype, else fp32 (LayerNorm runs in fp32)
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
        raise RuntimeError("loss=fused needs liger-kernel: pip install -r requirements-gpu.txt") from err
    liger = LigerFusedLinearCrossEntropyLoss()
    return lambda hidden, weight, targets: liger(weight, hidden, targets)


def _cce_loss() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as err:  # checked by the knob's device check; kept for direct callers
        raise RuntimeError("loss=cce needs cut-cross-entropy: pip install -r requirements-gpu.txt") from err
    return lambda hidden, weight, targets: linear_cross_entropy(hidden, weight, targets, filter_eps=None)
