"""Stage profile@<variant>: a torch.profiler trace and a top-kernels table of one variant in profile.variants.

The traced run is bench's (benchlab/run/launch.py) with the profiler stepped after each step: harness.warmup_steps
untraced steps first (compilation and allocator warm-up stay out of the trace), then profile.steps traced ones.
The trace opens in Perfetto (ui.perfetto.dev) or chrome://tracing.
A `parallel` variant is traced under torchrun, as bench runs it: every rank
is profiled (their collectives wait on each other), rank 0 writes the trace
and the table, whose `communication` family holds the NCCL kernels.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import os
from contextlib import nullcontext
from pathlib import Path

from benchlab.core import locks
from benchlab.run import dist
from benchlab.run import launch
from benchlab.run import profiling
from benchlab.core.params import Params, load_params, variant_from
from benchlab.run.data import load_tokens
from benchlab.core.stage_main import run_main
from benchlab.core.errors import LabError
from benchlab.core.files import claim_outputs, commit_outputs
from benchlab.run.hardware import resolve_device, why_not


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
    out.mkdir(parents=True, exist_ok=True)
    settings, device = p.variants[name], resolve_device(p.device)
    reason = why_not(settings, device)
    on_ranks = settings.parallel != "none" and not dist.launched() and not reason
    if dist.writes_record() and not on_ranks:  # the process that writes them; a `parallel` variant's is its first rank
        claim_outputs(*profiling.outputs(out, name))
    if reason:
        profiling.write_not_profiled(out, name, f"Not profiled on {device.type}: {reason}\n")
    elif on_ranks:
        with locks.device_lock(device, p.harness.lock, f"profile@{name}"):
            launch.on_ranks(settings.nproc, ["stages.profile", "--variant", name, args.data_dir, str(out)])
    else:
        trace(p, name, args.data_dir, out)
    commit_outputs()
    if not dist.launched():
        print(f"profile@{name}: {profiling.outputs(out, name)[0]}")


def trace(p: Params, name: str, data_dir: str, out: Path) -> None:
    """Trace this process's run (one rank's under torchrun); the first rank writes the outputs."""
    warm, active = p.harness.warmup_steps, p.profile.steps
    with launch.rank_device(p, name) as device:
        data = load_tokens(data_dir)
        lock = nullcontext() if dist.launched() else locks.device_lock(device, p.harness.lock, f"profile@{name}")
        with lock, profiling.profiler(device, warm, active) as prof:
            rec = launch.train_variant(p, name, data, device, f"profile@{name}", warm + active, on_step=prof.step)
        if rec.status != "ok":
            raise LabError(f"profile@{name}: the run ended {rec.status}: {rec.message}")
        if dist.writes_record():
            about = (f"{p.model}, batch {p.batch_size(p.variants[name])} x {p.shape.block_size}, "
                     f"{active} traced steps after {warm} warm-up steps.")
            profiling.write_profile(prof, out, name, device, about, active)


if __name__ == "__main__":
    run_main(main)
    launch.end_process()  # run_main returned: the stage succeeded (every failure exits inside it)
