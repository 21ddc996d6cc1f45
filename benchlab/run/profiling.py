"""Top-kernel tables from a torch.profiler Chrome trace, and the profile stage's two outputs.

On a GPU the table is built from the trace's `kernel` events: each kernel's
device time counted once (op-level rows such as `aten::mm` would count the
same time again). Kernels are also grouped into coarse families so a step's
time can be read by kind of work (matmuls, attention, the optimizer, ...).
On a CPU there are no kernels: the table lists the ops with the most self CPU time.
The tables' rows and the families are `benchlab.core.profile_table`'s, which the run report reads them back with.
"""

import gzip
import json
import shutil
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from benchlab.core.files import atomic_path, write_text
from benchlab.core.profile_table import FAMILY_HEADER, KERNEL_HEADER, OP_HEADER, family, family_row, kernel_row, op_row


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


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping (start, end) intervals covering exactly the given ones."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def uncovered(spans: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Total length of `spans` that no interval of `cover` overlaps; both as `union` returns them."""
    total, j = 0.0, 0
    for start, end in spans:
        cursor = start
        while j < len(cover) and cover[j][1] <= cursor:
            j += 1
        k = j
        while k < len(cover) and cover[k][0] < end:
            total += max(0.0, cover[k][0] - cursor)
            cursor = max(cursor, cover[k][1])
            k += 1
        total += max(0.0, end - cursor)
    return total


def exposed_communication(kernels: list[dict[str, Any]]) -> tuple[float, float]:
    """(µs when any communication kernel runs, µs of that when no other kernel runs beside it).

    The second is what the step waits on communication: an all-reduce hidden under backward's matmuls costs
    (nearly) nothing, one that runs alone costs its whole length. A rank that waits for the other in a collective
    shows that wait as a long communication kernel, so it counts here too."""
    comm = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if family(e["name"]) == "communication"])
    compute = union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if family(e["name"]) != "communication"])
    return sum(end - start for start, end in comm), uncovered(comm, compute)


def kernel_summary(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per-kernel and per-family device ms per step, and the GPU time per traced step.

    Only kernels that start inside the traced window count: the CPU queues
    work ahead, so the trace also catches the tail of the untraced step
    before. Without GPU annotations, every kernel counts.
    """
    window = traced_window(events)
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    per_family: dict[str, float] = defaultdict(float)
    kernels = [e for e in events if e.get("cat") == "kernel" and (not window or window[0] <= e["ts"] < window[1])]
    comm_us, exposed_us = exposed_communication(kernels)
    for e in kernels:
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
        # Wall time with a communication kernel running, and the part of it with no other kernel beside it.
        "comm_ms_per_step": comm_us / 1000.0 / steps,
        "comm_exposed_ms_per_step": exposed_us / 1000.0 / steps,
        "gpu_step_ms": (window[1] - window[0]) / 1000.0 / steps if window else None,
    }


def kernel_markdown(summary: dict[str, Any], rows: int = 25) -> str:
    total = summary["kernel_ms_per_step"] or 1.0
    lines = [*FAMILY_HEADER, *(family_row(f, ms, 100 * ms / total) for f, ms in summary["families"])]
    lines += ["", *KERNEL_HEADER]
    lines += [kernel_row(name, calls, ms, 100 * ms / total) for name, ms, calls in summary["kernels"][:rows]]
    step = summary["gpu_step_ms"]
    tail = f"Kernel time: {summary['kernel_ms_per_step']:.2f} ms per traced step"
    if summary.get("comm_share_pct"):
        tail += f" (communication kernels {summary['comm_share_pct']:.1f}% of it, overlapped or not)"
    tail += f", in {step:.2f} ms of GPU time per traced step (the rest: gaps between kernels)." if step else "."
    if summary.get("comm_ms_per_step"):
        exposed = summary["comm_exposed_ms_per_step"]
        tail += (f" Communication kernels ran during {summary['comm_ms_per_step']:.2f} ms per step; in {exposed:.2f} ms"
                 " of it no other kernel ran beside them (exposed communication")
        tail += f", {100 * exposed / step:.1f}% of the GPU step)." if step else ")."
    return "\n".join(lines) + f"\n\n{tail}\n"


def outputs(out_dir: Path, name: str) -> tuple[Path, Path]:
    """The profile stage's outputs for variant `name`: the kernels table and the gzipped trace."""
    return out_dir / f"{name}_kernels.md", out_dir / f"{name}_trace.json.gz"


@contextmanager
def profiler(device: torch.device, warm: int, active: int) -> Iterator[Any]:
    """torch.profiler over a run's first `warm` steps untraced (compilation and allocator warm-up stay out of
    the trace), then `active` traced ones; the run steps it through its `on_step` hook (`prof.step`)."""
    from torch.profiler import ProfilerActivity, profile, schedule  # the profile stage alone needs it

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=warm, active=active, repeat=1)) as prof:
        yield prof


def write_profile(prof: Any, out_dir: Path, name: str, device: torch.device, about: str, steps: int) -> None:
    """The trace, gzipped (it opens in Perfetto or chrome://tracing), and the top-kernels table, titled with
    what was traced (`about`), per traced step of `steps`."""
    kernels, trace = outputs(out_dir, name)
    raw = out_dir / f".{name}_trace.json"
    prof.export_chrome_trace(str(raw))
    events = json.loads(raw.read_text())["traceEvents"]
    with atomic_path(trace) as tmp, raw.open("rb") as src, gzip.open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    what = "kernels by device time" if device.type == "cuda" else "ops by self CPU time"
    table = kernel_markdown(kernel_summary(events, steps)) if device.type == "cuda" else cpu_ops_markdown(prof, steps)
    write_text(kernels, f"# {name}: top {what}\n\n{about}\n\n" + table)


def write_not_profiled(out_dir: Path, name: str, why: str) -> None:
    """The outputs of a variant this device cannot run: the reason, and an empty trace."""
    kernels, trace = outputs(out_dir, name)
    write_text(kernels, why)
    with atomic_path(trace) as tmp, gzip.open(tmp, "wt") as f:
        f.write('{"traceEvents": []}')


def cpu_ops_markdown(prof: Any, steps: int, rows: int = 25) -> str:
    """On CPU there are no kernels: the ops with the most self CPU time."""
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    lines = [*OP_HEADER]
    for e in events[:rows]:
        t = e.self_cpu_time_total
        lines.append(op_row(e.key, e.count / steps, t / 1000.0 / steps, 100.0 * t / total))
    return "\n".join(lines) + f"\n\nSelf CPU time: {total / 1000.0 / steps:.2f} ms per step.\n"
