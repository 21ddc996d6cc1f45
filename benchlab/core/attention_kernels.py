"""The attention kernels as the lab sees them: each choice of the `attention` knob with its part of the knob's doc,
the ops selective checkpointing keeps of it, and the names its GPU kernels are profiled under, declared once.
Torch-free: the knob table (`benchlab.core.knobs`), selective checkpointing (`benchlab.run.apply_knobs`) and the
profile's kernel families (`benchlab.core.profile_table.FAMILIES`) read it. Each kernel's forward is the model's
(`model.gpt.ATTENTION`, checked against this catalog when the model is imported).
"""

from dataclasses import dataclass
from typing import Literal, get_args

Attention = Literal["manual", "sdpa"]


@dataclass(frozen=True)
class AttentionKernel:
    """One attention kernel: its part of the `attention` knob's doc and what the rest of a run must know of it."""

    doc: str
    # The ops whose outputs selective checkpointing keeps, as torch.ops names them ("aten.<op>.<overload>"; a
    # library's op under its own namespace), besides the matmuls it keeps under every kernel. Any op of the kernel
    # not named here is recomputed in backward: an attention op missing here is silently run twice.
    saved_ops: tuple[str, ...] = ()
    # Parts of its GPU kernels' names (lower case) that put them in the profile's "attention" family; a kernel
    # named by none of them is counted as a matmul, elementwise or other kernel.
    kernel_names: tuple[str, ...] = ()


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    # Its two products are aten.bmm, kept as every matmul is, and profiled as matmuls; its softmax is recomputed.
    "manual": AttentionKernel("explicit causal-masked softmax"),
    # torch picks one of its kernels per device, dtype and shape: flash, memory-efficient or cuDNN on a GPU, its
    # flash port on a CPU.
    "sdpa": AttentionKernel(
        "torch's scaled_dot_product_attention",
        saved_ops=("aten._scaled_dot_product_flash_attention.default",
                   "aten._scaled_dot_product_efficient_attention.default",
                   "aten._scaled_dot_product_cudnn_attention.default",
                   "aten._scaled_dot_product_flash_attention_for_cpu.default"),
        kernel_names=("sdpa", "flash", "fmha", "attention")),
}

if tuple(ATTENTION_KERNELS) != get_args(Attention):  # a bug in this module, found on import
    raise ValueError(f"ATTENTION_KERNELS {tuple(ATTENTION_KERNELS)} and Attention {get_args(Attention)} must name "
                     "the same kernels")


def attention_doc() -> str:
    """The `attention` knob's doc: each kernel's, in the catalog's order."""
    return "; ".join(f"{name}: {kernel.doc}" for name, kernel in ATTENTION_KERNELS.items())


def saved_ops() -> frozenset[str]:
    """Every kernel's saved ops: a model runs one kernel, so only its own ever reach the checkpointing policy."""
    return frozenset(op for kernel in ATTENTION_KERNELS.values() for op in kernel.saved_ops)


def kernel_names() -> tuple[str, ...]:
    """Every kernel's parts of GPU kernel names, in the catalog's order, each once."""
    return tuple(dict.fromkeys(part for kernel in ATTENTION_KERNELS.values() for part in kernel.kernel_names))
