"""What several loss heads share: the loss function's type, the model's body alone, and the devices whose matmul
can sum half-precision products into fp32 in place."""

from collections.abc import Callable

import torch
import torch.nn as nn

from model.gpt import GPT

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Devices whose addmm can take bf16 or fp16 operands and add their product into an fp32 sum in place
# (torch's `out_dtype`): cuBLAS on CUDA; meta only checks shapes and dtypes (the tests use it).
FP32_SUM_DEVICES = ("cuda", "meta")


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
