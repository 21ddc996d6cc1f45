"""Top-kernel tables from a torch.profiler Chrome trace.

On a GPU the table is built from the trace's `kernel` events: each kernel's
device time counted once (op-level rows such as `aten::mm` would count the
same time again). Kernels are also grouped into coarse families so a step's
time can be read the way shared/GPU.md breaks the reference recipe down.
"""

from collections import defaultdict
from typing import Any

# First match wins; checked against the lower-cased kernel name.
FAMILIES: list[tuple[str, tuple[str, ...]]] = [
    # First: NCCL's all-reduce, all-gather and reduce-scatter kernels, whatever they move.
    ("communication", ("nccl",)),
    ("attention", ("sdpa", "flash", "fmha", "attention")),
    ("matmul", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "sm90_", "sm80_")),
    ("optimizer", ("adam", "multi_tensor_apply")),
    ("cross-entropy", ("log_softmax", "nll_loss", "cross_entropy")),
    ("triton fused", ("triton_",)),
    ("elementwise", ("elementwise", "vectorized", "reduce", "fill", "copy")),
]


def family(name: str) -> str:
    low = name.lower()
    for fam, needles in FAMILIES:
        if any(n in low for n in needles):
            return fam
    return "other"


def traced_window(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    """GPU-side start and end (µs) of the traced steps.

    It opens at the first `ProfilerStep` GPU annotation and closes at the end
    of the last GPU annotation: the optimizer step gets an annotation of its
    own that follows its ProfilerStep's rather than nesting inside it.
    """
    gpu = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    starts = [e["ts"] for e in gpu if str(e.get("name", "")).startswith("ProfilerStep")]
    if not starts:
        return None
    return min(starts), max(e["ts"] + e["dur"] for e in gpu)


def kernel_summary(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per-kernel and per-family device ms per step, and the GPU time per traced step.

    Only kernels that start inside the traced window count: the CPU queues
    work ahead, so the trace also catches the tail of the untraced step
    before. Without GPU annotations, every kernel counts.
    """
    window = traced_window(events)
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    per_family: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") != "kernel":
            continue
        if window and not window[0] <= e["ts"] < window[1]:
            continue
        ms = e["dur"] / 1000.0 / steps
        per_kernel[e["name"]][0] += ms
        per_kernel[e["name"]][1] += 1.0 / steps
        per_family[family(e["name"])] += ms
    kernel_ms = sum(per_family.values())
    return {
        "kernels": sorted(((n, ms, calls) for n, (ms, calls) in per_kernel.items()), key=lambda k: -k[1]),
        # Communication kernels' share of all kernel time (they may overlap compute kernels on other streams).
        "comm_share_pct": 100.0 * per_family.get("communication", 0.0) / kernel_ms if kernel_ms else None,
        "families": sorted(per_family.items(), key=lambda f: -f[1]),
        "kernel_ms_per_step": sum(per_family.values()),
        "gpu_step_ms": (window[1] - window[0]) / 1000.0 / steps if window else None,
    }


def kernel_markdown(summary: dict[str, Any], rows: int = 25) -> str:
    total = summary["kernel_ms_per_step"] or 1.0
    lines = ["| family | device ms per step | share % |", "| --- | --- | --- |"]
    lines += [f"| {f} | {ms:.2f} | {100 * ms / total:.1f} |" for f, ms in summary["families"]]
    lines += ["", "| kernel | family | calls per step | device ms per step | share % |", "| --- | --- | --- | --- | --- |"]
    for name, ms, calls in summary["kernels"][:rows]:
        short = name.replace("|", "/")
        short = short if len(short) <= 100 else short[:97] + "..."
        lines.append(f"| `{short}` | {family(name)} | {calls:.1f} | {ms:.3f} | {100 * ms / total:.1f} |")
    step = summary["gpu_step_ms"]
    tail = f"Kernel time: {summary['kernel_ms_per_step']:.2f} ms per traced step"
    if summary.get("comm_share_pct"):
        tail += f" (communication kernels {summary['comm_share_pct']:.1f}% of it, overlapped or not)"
    tail += f", in {step:.2f} ms of GPU time per traced step (the rest: gaps between kernels)." if step else "."
    return "\n".join(lines) + f"\n\n{tail}\n"
