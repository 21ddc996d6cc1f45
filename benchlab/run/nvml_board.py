"""The board of the GPU torch uses, as NVML sees it: NVML started (the `nvidia-ml-py` package, imported only here and
only on a GPU) and the board's handle found. `benchlab.run.power` reads the board's energy through them.
"""

import os
from types import ModuleType
from typing import Any

import torch

from benchlab.core.skips import GPU_INSTALL


def start() -> ModuleType | str:
    """The started pynvml module, or why there is none."""
    try:
        import pynvml
    except ImportError:
        return f"nvidia-ml-py is not installed: {GPU_INSTALL}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:  # no NVIDIA driver (a ROCm GPU, a container without NVML)
        return f"NVML did not start ({err}): no board power reading"
    return pynvml


def pci_address(device: torch.device) -> str | None:
    """The PCI address ("0000:3b:00.0") of the GPU torch uses as `device`, or None where torch does not say."""
    props = torch.cuda.get_device_properties(_index(device))
    if getattr(props, "pci_bus_id", None) is None:
        return None
    return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def find_handle(nvml: ModuleType, device: torch.device) -> Any | None:
    """NVML's handle for the GPU torch uses: by PCI address, since NVML numbers every GPU of the machine in bus
    order while CUDA numbers those CUDA_VISIBLE_DEVICES leaves, fastest first. By index only where the two must
    agree: no CUDA_VISIBLE_DEVICES, and one GPU or CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    address = pci_address(device)
    if address is not None:
        return nvml.nvmlDeviceGetHandleByPciBusId(address)
    same_order = torch.cuda.device_count() == 1 or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    if "CUDA_VISIBLE_DEVICES" not in os.environ and same_order:
        return nvml.nvmlDeviceGetHandleByIndex(_index(device))
    return None
