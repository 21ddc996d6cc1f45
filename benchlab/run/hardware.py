"""The device a run uses, what it can run (`DeviceFacts`, read from torch once), and why a run's knobs cannot run on
it: the stage's first question, before any model is built."""

import importlib.util
import os
import shutil

import torch

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings, unsupported_reason
from benchlab.core.sections import DeviceChoice
from benchlab.core.skips import DeviceFacts
from benchlab.run.env import package_version


def resolve_device(choice: DeviceChoice) -> torch.device:
    """auto picks CUDA when there is one; asking for CUDA without one is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise LabError(f"device='cuda' but torch {torch.__version__} ({build}) sees no CUDA GPU; install a CUDA build "
                       "of torch (README, On your GPU), or use device=auto or device=cpu (preset=cpu)")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def device_facts(device: torch.device) -> DeviceFacts:
    """What this device and this Python can run, for the knobs' checks."""
    installed = {name: importlib.util.find_spec(name) is not None for name in ("triton", "torchao", "liger_kernel",
                                                                             "cut_cross_entropy")}
    if device.type == "cpu":
        return DeviceFacts(kind="cpu", name="cpu", cxx=shutil.which(os.environ.get("CXX", "g++")) is not None,
                           torchao=installed["torchao"], cpu_count=os.cpu_count() or 1)
    return DeviceFacts(
        kind="cuda", name=torch.cuda.get_device_name(device), capability=torch.cuda.get_device_capability(device),
        bf16=torch.cuda.is_bf16_supported(), triton=installed["triton"], torchao=installed["torchao"],
        liger=installed["liger_kernel"], liger_version=package_version("liger-kernel"),
        cce=installed["cut_cross_entropy"], gpu_count=torch.cuda.device_count(), cpu_count=os.cpu_count() or 1,
    )


def why_not(settings: RunSettings, device: torch.device) -> str | None:
    """Why these settings cannot run on this device, or None when they can."""
    return unsupported_reason(settings, device_facts(device))
