"""Stage profile@<variant>: a torch.profiler trace and a top-kernels table of one variant in profile.variants.

Each traced variant runs bench.warmup_steps untraced steps first (compilation
and allocator warm-up stay out of the trace), then profile.steps traced ones.
The trace opens in Perfetto (ui.perfetto.dev) or chrome://tracing.
A `parallel` variant is traced under torchrun, as bench runs it: every rank
is profiled (their collectives wait on each other), rank 0 writes the trace
and the table, whose `communication` family holds the NCCL kernels.
"""

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

from torch.profiler import ProfilerActivity, profile, schedule

from benchlab import devlock, dist, lifeline
from benchlab.config import Params, load_params, variant_from
from benchlab.data import load_tokens
from benchlab.errors import LabError, run_main
from benchlab.io import atomic_path, remove_outputs, write_text
from benchlab.optimize import resolve_device, why_not
from benchlab.profiling import kernel_markdown, kernel_summary
from benchlab.runner import last_words, train_once


def cpu_ops_markdown(prof: profile, steps: int, rows: int = 25) -> str:
    """On CPU there are no kernels: the ops with the most self CPU time."""
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    lines = ["| op | calls per step | self CPU ms per step | share % |", "| --- | --- | --- | --- |"]
    for e in events[:rows]:
        t = e.self_cpu_time_total
        lines.append(f"| `{e.key[:100]}` | {e.count / steps:.1f} | {t / 1000.0 / steps:.3f} | {100.0 * t / total:.1f} |")
    return "\n".join(lines) + f"\n\nSelf CPU time: {total / 1000.0 / steps:.2f} ms per step.\n"


def trace_variant(p: Params, name: str, data_dir: str, out_dir: Path) -> None:
    """Profile the harness's own training run: the same step, schedule and batch feeding as bench."""
    settings = p.variants[name]
    device = resolve_device(p.device)
    reason = why_not(settings, device)
    if reason:
        write_text(out_dir / f"{name}_kernels.md", f"Not profiled on {device.type}: {reason}\n")
        with atomic_path(out_dir / f"{name}_trace.json.gz") as tmp, gzip.open(tmp, "wt") as f:
            f.write('{"traceEvents": []}')
        return
    if settings.parallel != "none" and not dist.launched():
        with devlock.device_lock(device, p.bench.lock, f"profile@{name}"):
            on_ranks(settings.nproc, ["stages.profile", "--variant", name, data_dir, str(out_dir)])
        return
    if dist.launched():
        device = dist.init(device, settings.nccl_max_ctas)
    try:
        traced(p, name, data_dir, out_dir, device)
    finally:
        dist.teardown()


def on_ranks(nproc: int, module_args: list[str]) -> None:
    """Run the stage's module on `nproc` ranks under torchrun; a failed rank fails this stage."""
    proc = subprocess.run(dist.torchrun_argv(nproc, module_args), stderr=subprocess.PIPE, text=True,
                          preexec_fn=lifeline.die_with_parent)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise LabError(f"the {nproc}-rank torchrun job failed (exit {proc.returncode}): {last_words(proc.stderr)}")


def traced(p: Params, name: str, data_dir: str, out_dir: Path, device: "torch.device") -> None:
    """Trace this process's run (one rank's under torchrun); the first rank writes the outputs."""
    settings = p.variants[name]
    data = load_tokens(data_dir)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    warm, active = p.bench.warmup_steps, p.profile.steps
    lock = nullcontext() if dist.launched() else devlock.device_lock(device, p.bench.lock, f"profile@{name}")
    with lock, profile(activities=activities, schedule=schedule(wait=0, warmup=warm, active=active, repeat=1)) as prof:
        rec = train_once(p, settings, data, device, warm + active, warm, on_step=prof.step,
                         progress=f"profile@{name}" if dist.rank() == 0 else None)
    if rec.status != "ok":
        raise LabError(f"profile@{name}: the run ended {rec.status}: {rec.message}")
    if not dist.writes_record():
        return
    raw = out_dir / f".{name}_trace.json"
    prof.export_chrome_trace(str(raw))
    events = json.loads(raw.read_text())["traceEvents"]
    with atomic_path(out_dir / f"{name}_trace.json.gz") as tmp, raw.open("rb") as src, gzip.open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    what = "kernels by device time" if device.type == "cuda" else "ops by self CPU time"
    title = (f"# {name}: top {what}\n\n{p.model}, batch {p.batch_size(settings)} x {p.train.block_size}, "
             f"{active} traced steps after {warm} warm-up steps.\n\n")
    table = kernel_markdown(kernel_summary(events, active)) if device.type == "cuda" else cpu_ops_markdown(prof, active)
    write_text(out_dir / f"{name}_kernels.md", title + table)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", help="the variant to trace (default: from DVC_STAGE)")
    ap.add_argument("data_dir")
    ap.add_argument("out_dir", help="gets <variant>_kernels.md and <variant>_trace.json.gz")
    args = ap.parse_args(argv)
    p = load_params()
    name = variant_from(args.variant, os.environ.get("DVC_STAGE"), p, kind="profile")
    if name not in p.profile.variants:
        raise LabError(f"variant {name!r} is not in profile.variants; valid: {', '.join(p.profile.variants)}")
    out = Path(args.out_dir)
    outputs = [out / f"{name}_kernels.md", out / f"{name}_trace.json.gz"]
    remove_outputs(*outputs)
    out.mkdir(parents=True, exist_ok=True)
    trace_variant(p, name, args.data_dir, out)
    if not dist.launched():
        print(f"profile@{name}: {outputs[0]}")


if __name__ == "__main__":
    run_main(main)
