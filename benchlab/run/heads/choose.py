"""The step's loss function for the `loss` knob: the model under a wrapper (torch.compile, DDP) with its head.

What each head does to the output layer is its catalog entry's (`benchlab.core.loss_heads`): a head that does not
multiply by the output weight itself runs the model's own forward; one that does runs after the model's body,
`Features`. loss=onepass's module is imported only when that head is chosen: importing it registers a custom op with
torch.library, which no other head needs.
"""

from collections.abc import Callable

import torch
import torch.nn as nn

from benchlab.core.loss_heads import LOSS_HEADS, LossKind
from benchlab.run.heads.chunked import chunked_loss
from benchlab.run.heads.library import library_loss
from benchlab.run.heads.shared import Features, LossFn
from benchlab.run.heads.standard import BodyThenHead, LossOnly
from model.gpt import GPT

__all__ = ["BodyThenHead", "LossFn", "loss_fn"]  # what benchlab.run.apply_knobs applies


def loss_fn(model: GPT, kind: LossKind, wrap: Callable[[nn.Module], nn.Module], *, compile_chunks: bool,
            chunk: int | None = None, hidden_dtype: torch.dtype | None = None) -> LossFn:
    """The step's loss function: the model under `wrap` (torch.compile or identity) with the chosen head;
    `compile_chunks`: the chunked head's per-chunk arithmetic compiled (torch.compile's default mode: CUDA
    graphs would hand back outputs that the next chunk's replay overwrites); `chunk`: the chunked head's tokens
    per chunk (default `CHUNK_TOKENS`); `hidden_dtype`: autocast's dtype, which the body's output is cast to
    before a chunked, library or one-pass head (None without autocast)."""
    if not LOSS_HEADS[kind].owns_output_matmul:  # the model's own forward: standard keeps its logits, inline not
        if kind == "inline":
            return wrap(LossOnly(model))
        body = wrap(model)
        return lambda idx, targets: body(idx, targets)[1]
    if kind == "onepass":
        from benchlab.run.heads.onepass import OnePassLoss

        return wrap(OnePassLoss(model, hidden_dtype))
    features = wrap(Features(model, hidden_dtype))
    if kind == "chunked":
        return chunked_loss(model, features, compile_chunks=compile_chunks, chunk=chunk)
    return library_loss(model, features, kind)
