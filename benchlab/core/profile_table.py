"""The profile stage's tables (`plots/profiles/<variant>_kernels.md`) as one format: `benchlab.run.profiling` writes
their rows and `benchlab.analysis.run_report` reads them back, both through this module, so the writer and the
reader cannot drift. Also the kernel families a GPU profile groups its kernels into (the attention family's names
are the attention kernels' own, `benchlab.core.attention_kernels`). Torch-free.

A GPU profile holds a family table (each family's device ms per traced step and share of the kernel time) and a
kernel table; a CPU profile, which has no kernels, a table of the ops with the most self CPU time.
"""

import re
from typing import NamedTuple

from benchlab.core.attention_kernels import kernel_names

# First match wins; checked against the lower-cased kernel name.
FAMILIES: list[tuple[str, tuple[str, ...]]] = [
    # First: NCCL's all-reduce, all-gather and reduce-scatter kernels, whatever they move.
    ("communication", ("nccl",)),
    ("attention", kernel_names()),
    ("matmul", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "sm90_", "sm80_")),
    ("optimizer", ("adam", "multi_tensor_apply")),
    ("cross-entropy", ("log_softmax", "nll_loss", "cross_entropy")),
    ("triton fused", ("triton_",)),
    ("elementwise", ("elementwise", "vectorized", "reduce", "fill", "copy")),
]

FAMILY_HEADER = ["| family | device ms per step | share % |", "| --- | --- | --- |"]
KERNEL_HEADER = ["| kernel | family | calls per step | device ms per step | share % |", "| --- | --- | --- | --- | --- |"]
OP_HEADER = ["| op | calls per step | self CPU ms per step | share % |", "| --- | --- | --- | --- |"]
_FAMILY_ROW = re.compile(r"^\| ([^|`]+?) \| ([0-9.]+) \| ([0-9.]+) \|$")  # reads what family_row writes


def family(name: str) -> str:
    """A kernel's family by its name (FAMILIES), or "other"."""
    low = name.lower()
    for fam, needles in FAMILIES:
        if any(n in low for n in needles):
            return fam
    return "other"


def family_row(fam: str, ms: float, share_pct: float) -> str:
    return f"| {fam} | {ms:.2f} | {share_pct:.1f} |"


def kernel_row(name: str, calls: float, ms: float, share_pct: float) -> str:
    """A kernel's row: its name (pipes replaced, cut at 100 characters), family, calls, device ms and share."""
    short = name.replace("|", "/")
    short = short if len(short) <= 100 else short[:97] + "..."
    return f"| `{short}` | {family(name)} | {calls:.1f} | {ms:.3f} | {share_pct:.1f} |"


def op_row(op: str, calls: float, ms: float, share_pct: float) -> str:
    """A CPU op's row: its name (cut at 100 characters), calls, self CPU ms and share."""
    return f"| `{op[:100]}` | {calls:.1f} | {ms:.3f} | {share_pct:.1f} |"


class Profile(NamedTuple):
    """What the run report reads back from a profile's tables."""

    header: str  # the line under the title: what was traced
    families: dict[str, tuple[float, float]]  # a GPU profile's: family -> (device ms per step, share %)
    top_ops: list[str]  # a CPU profile's first three ops, as "`op` share%"


def read_profile(text: str) -> Profile:
    """A profile's `<variant>_kernels.md` read back: its header line, its family rows and its first three op rows."""
    lines = [line.strip() for line in text.splitlines()]
    header = next((line for line in lines if line and not line.startswith(("#", "|"))), "").rstrip(".")
    families, ops = {}, []
    for line in lines:
        if line == KERNEL_HEADER[0]:
            break
        if m := _FAMILY_ROW.match(line):
            families[m[1].strip()] = (float(m[2]), float(m[3]))
        elif line.startswith("| `") and len(ops) < 3:
            cells = [c.strip() for c in line.strip("|").split("|")]
            ops.append(f"{cells[0]} {cells[-1]}%")
    return Profile(header, families, ops)
