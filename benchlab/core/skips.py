"""Why a device cannot run a knob's value: what the device can run (`DeviceFacts`), and one check per knob.

Each check reads only the device's facts ("this machine cannot": a CPU, a GPU without bf16, a missing library); a
rule that holds on every machine is refused when params load (`benchlab.core.knobs.check_combination`). The knob table,
`benchlab.core.knobs.RunSettings`, names each knob's check; the loss heads' needs are their catalog's
(`benchlab.core.loss_heads`). Neither torch nor the model is imported here.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from benchlab.core.loss_heads import LOSS_HEADS


@dataclass(frozen=True)
class DeviceFacts:
    """What a device can run, read once from torch by `benchlab.run.hardware.device_facts`.

    Plain values, so every knob's check can be tested without a GPU.
    """

    kind: Literal["cpu", "cuda"]
    name: str = ""
    capability: tuple[int, int] | None = None
    bf16: bool = False  # CUDA: bf16 tensor cores
    triton: bool = False
    cxx: bool = False  # a C++ compiler for inductor on CPU
    torchao: bool = False
    liger: bool = False
    liger_version: str | None = None  # the installed liger-kernel's version (loss=onepass calls an internal kernel)
    cce: bool = False  # cut-cross-entropy installed
    gpu_count: int = 0
    cpu_count: int = 1  # cores: on a CPU, gloo ranks beyond them would only time each other's waiting


# What a skip for a missing extra tells the user to run: on a GPU the file with every GPU extra (it leaves the CUDA
# build of torch in place), on a CPU the plain install (torchao is all a CPU variant may lack).
GPU_INSTALL = "pip install -r requirements-gpu.txt"
CPU_INSTALL = "pip install -r requirements.txt"


def install_hint(d: DeviceFacts) -> str:
    """The command that installs what a variant lacks on this device."""
    return GPU_INSTALL if d.kind == "cuda" else CPU_INSTALL


# A knob's check: (its value, the run's settings (a `knobs.RunSettings`, typed loosely: knobs imports this module),
# the device) -> why it cannot run, or None.
SkipCheck = Callable[[Any, object, DeviceFacts], str | None]


def precision_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """fp16: on CPU; bf16: GPUs without bf16; tf32: GPUs before Ampere. A CPU has no TF32 units: there tf32
    computes exactly as fp32 does (so it can serve as parity's reference on every device)."""
    if d.kind == "cpu":
        if value == "fp16":
            return "precision=fp16 with loss scaling needs a CUDA GPU; use bf16 or fp32 on CPU"
        return None
    major = d.capability[0] if d.capability else 0
    if value == "bf16" and not d.bf16:
        return f"precision=bf16 needs an Ampere or newer GPU; {d.name} has no bf16; use fp16"
    if value == "tf32" and major < 8:
        return f"precision=tf32 needs an Ampere or newer GPU; {d.name} is compute capability {major}.x"
    return None


def compile_skip(value: bool, s: object, d: DeviceFacts) -> str | None:
    """CPU without a C++ compiler; CUDA without triton."""
    if not value:
        return None
    if d.kind == "cpu" and not d.cxx:
        return "compile=true on CPU needs a C++ compiler (g++) for inductor; install one or set compile=false"
    if d.kind == "cuda" and not d.triton:
        return "compile=true on CUDA needs triton (pip install triton); or set compile=false"
    return None


def compile_mode_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """reduce-overhead, max-autotune-no-cudagraphs, max-autotune: on CPU."""
    if value != "default" and d.kind == "cpu":
        return f"compile_mode={value} tunes or graphs CUDA kernels; on CPU use compile_mode=default"
    return None


def fp8_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """CPU; GPUs before compute capability 8.9; without torchao."""
    if value == "none":
        return None
    if d.kind == "cpu":
        return (f"fp8={value} needs a GPU with float8 tensor cores (Ada or Hopper, compute capability 8.9+); "
                "not on CPU")
    if (d.capability or (0, 0)) < (8, 9):
        return f"fp8={value} needs compute capability 8.9 or newer; {d.name} is {d.capability}"
    if not d.torchao:
        return f"fp8={value} needs torchao ({GPU_INSTALL}); or set fp8=none"
    return None


def loss_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """fused, cce: on CPU, and without their library; onepass: on CUDA without liger-kernel, or with another
    version of it than the one its internal kernel call was written for (its CPU path is torch's)."""
    head = LOSS_HEADS[value]
    if head.library is None:
        return None
    if d.kind == "cpu":
        return None if head.runs_on_cpu else (f"loss={value} is a Triton kernel ({head.library}) that needs a CUDA "
                                              f"GPU; use loss={head.instead} on CPU")
    if head.pinned:
        return pinned_library_skip(value, d)
    if not getattr(d, head.installed):
        return f"loss={value} needs {head.library} ({GPU_INSTALL}); or use loss={head.instead}"
    return None


def pinned_library_skip(value: str, d: DeviceFacts) -> str | None:
    """Why a loss head that calls an internal kernel of its library cannot on this CUDA device: the library is not
    installed, or not the release whose kernel signature the head calls (another one may take other arguments)."""
    head = LOSS_HEADS[value]
    wanted, library, version = head.pinned, head.library, getattr(d, f"{head.installed}_version")
    if not getattr(d, head.installed):
        return (f"loss={value} runs {library} {wanted}'s cross-entropy kernel on CUDA, and {library} is "
                f"not installed ({GPU_INSTALL}); or use loss={head.instead}")
    if version != wanted:
        installed = version or "of unknown version"
        return (f"loss={value} calls {library} {wanted}'s internal cross-entropy kernel; {library} {installed} "
                f"is installed ({GPU_INSTALL}); or use loss={head.instead}")
    return None


def comm_hook_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """bf16: on CPU (torch's bf16_compress_hook refuses gloo)."""
    if value == "bf16" and d.kind == "cpu":
        return "ddp_comm_hook=bf16 is torch's bf16_compress_hook, which needs NCCL on CUDA GPUs; on CPU use ddp_comm_hook=none"
    return None


def max_ctas_skip(value: int, s: object, d: DeviceFacts) -> str | None:
    """any limit on CPU (gloo has no thread blocks to limit)."""
    if value and d.kind == "cpu":
        return f"nccl_max_ctas={value} limits NCCL's thread blocks, which needs NCCL on CUDA GPUs; on CPU use nccl_max_ctas=0"
    return None


def nproc_skip(value: int, s: object, d: DeviceFacts) -> str | None:
    """more processes than GPUs (CUDA) or cores (CPU)."""
    if value == 1:  # one process runs wherever the device does
        return None
    if d.kind == "cuda" and value > d.gpu_count:
        return f"nproc={value} asks for {value} GPUs per node; this machine has {d.gpu_count}"
    if d.kind == "cpu" and value > d.cpu_count:
        return f"nproc={value} gloo processes on a CPU of {d.cpu_count} cores would time each other's waiting"
    return None


def weight_dtype_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """bf16: GPUs without bf16."""
    if value == "bf16" and d.kind == "cuda" and not d.bf16:
        return f"weight_dtype={value} needs an Ampere or newer GPU; {d.name} has no bf16; use weight_dtype=fp32"
    return None


def param_dtype_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """bf16: GPUs without bf16."""
    if value == "bf16" and d.kind == "cuda" and not d.bf16:
        return f"fsdp_param_dtype=bf16 needs an Ampere or newer GPU; {d.name} has no bf16"
    return None


def optimizer_skip(value: str, s: object, d: DeviceFacts) -> str | None:
    """adamw_8bit: on CPU, and without torchao; adamw_bf16_sr: without torchao, and on CPU without a C++ compiler
    (its step is compiled)."""
    if value == "adamw_8bit":
        if d.kind == "cpu":
            return "optimizer=adamw_8bit (torchao's AdamW8bit) is timed on CUDA GPUs only; use optimizer=adamw on CPU"
        if not d.torchao:
            return f"optimizer=adamw_8bit needs torchao ({GPU_INSTALL}); or set optimizer=adamw"
    if value == "adamw_bf16_sr":
        if not d.torchao:
            return (f"optimizer=adamw_bf16_sr needs torchao ({install_hint(d)}); or set optimizer=adamw_fused "
                    "(bf16 weights rounded to nearest)")
        if d.kind == "cpu" and not d.cxx:
            return "optimizer=adamw_bf16_sr compiles torchao's optimizer step, which on CPU needs a C++ compiler (g++)"
    return None
