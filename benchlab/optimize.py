"""Every optimization is applied here, from outside the model, in one fixed order.

1. device placement, 2. TF32 matmul flags, 3. the optimizer (for-loop or
fused AdamW), 4. torch.compile, 5. autocast and the fp16 GradScaler. The
model itself only knows its attention kernel.
"""

import importlib.util
import os
import shutil
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn

from benchlab.config import DeviceChoice, RunSettings, TrainParams
from benchlab.errors import LabError


def resolve_device(choice: DeviceChoice) -> torch.device:
    """auto picks CUDA when there is one; asking for CUDA without one is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise LabError("device='cuda' but torch sees no CUDA GPU; use device=auto or device=cpu")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def unsupported_reason(settings: RunSettings, device: torch.device) -> str | None:
    """Why these settings cannot run on this device, or None when they can."""
    if device.type == "cpu":
        if settings.precision == "fp16":
            return "precision=fp16 with loss scaling needs a CUDA GPU; use bf16 or fp32 on CPU"
        if settings.precision == "tf32":
            return "precision=tf32 is a CUDA tensor-core mode (Ampere or newer); on CPU it would time fp32 again"
        if settings.compile and not shutil.which(os.environ.get("CXX", "g++")):
            return "compile=true on CPU needs a C++ compiler (g++) for inductor; install one or set compile=false"
        return None
    major, _ = torch.cuda.get_device_capability(device)
    if settings.precision == "bf16" and not torch.cuda.is_bf16_supported():
        return f"precision=bf16 needs an Ampere or newer GPU; {torch.cuda.get_device_name(device)} has no bf16; use fp16"
    if settings.precision == "tf32" and major < 8:
        return f"precision=tf32 needs an Ampere or newer GPU; {torch.cuda.get_device_name(device)} is compute capability {major}.x"
    if settings.compile and importlib.util.find_spec("triton") is None:
        return "compile=true on CUDA needs triton (pip install triton); or set compile=false"
    return None


def set_tf32(settings: RunSettings) -> None:
    """TF32 off only for the pure-fp32 recipe; on for tf32, and for what autocast leaves in fp32."""
    torch.set_float32_matmul_precision("highest" if settings.precision == "fp32" else "high")


def make_optimizer(model: nn.Module, settings: RunSettings, train: TrainParams) -> torch.optim.Optimizer:
    """AdamW with decay on matrices only (as GPT-2 trainers do); for-loop or fused kernel."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if settings.fused_adamw:
        return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.95), fused=True)
    # foreach=False: the plain per-parameter loop, the unoptimized baseline.
    return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.95), foreach=False, fused=False)


@dataclass
class Applied:
    """A model ready to train: what to call, what to save, and how to step."""

    model: nn.Module  # raw module: save and evaluate this one
    forward: nn.Module  # compiled or raw: train through this one
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    device: torch.device
    settings: RunSettings

    def autocast(self) -> AbstractContextManager:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.settings.precision)
        if dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)


def apply(model: nn.Module, settings: RunSettings, device: torch.device, train: TrainParams) -> Applied:
    """Apply the settings to a freshly built model, in the module docstring's order."""
    reason = unsupported_reason(settings, device)
    if reason:
        raise LabError(reason)
    model = model.to(device)
    if device.type == "cuda":
        set_tf32(settings)
    optimizer = make_optimizer(model, settings, train)
    forward = torch.compile(model) if settings.compile else model
    scaler = torch.amp.GradScaler("cuda") if settings.precision == "fp16" else None
    return Applied(model, forward, optimizer, scaler, device, settings)
