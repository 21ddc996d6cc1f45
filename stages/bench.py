"""Stage bench@<variant>: time one optimization variant, its repeats, and its validation loss.

The variant's name comes from DVC_STAGE (`bench@<name>`), which DVC sets for
every stage it runs, so no name a user wrote ever reaches a shell command
line; `--variant NAME` serves runs outside DVC. Either way the name is checked
against params.yaml before anything is written.

A variant that the device cannot run is recorded as `skipped` with the
reason, one that runs out of memory as `oom`, one whose loss turns NaN or Inf
as `diverged`; each still writes its result so the matrix goes on. With
`bench.repeats` above one, every repeat runs in a fresh process.

A `parallel` variant (ddp, fsdp2) runs every repeat under torchrun, PyTorch's
own launcher: `python -m torch.distributed.run --standalone
--nproc_per_node=N -m stages.bench --variant NAME ... --record-to FILE`.
The ranks train on their slices of the same global batch, gather their
records, and the first rank (of each node) writes the combined one for this
process, which keeps the device lock and writes the result. A rank that dies
fails the stage with nothing recorded.

A scripted run with a time limit (scripts/gpu_matrix.sh) sets BENCHLAB_DEADLINE,
a Unix time: a variant then starts no repeat that its shortest repeat so far
says would end past it, and records the repeats it has, saying how many of
`bench.repeats` ran; a variant reaching the deadline before its first repeat
fails with nothing recorded. Without it, every variant runs all its repeats.
"""

import argparse
import os
import sys
import time
from pathlib import Path

from benchlab import devlock, dist
from benchlab.build import model_shape
from benchlab.config import Params, load_params, variant_from
from benchlab.data import load_tokens
from benchlab.env import environment, provenance
from benchlab.errors import LabError, run_main
from benchlab.harness import process_age_s
from benchlab.io import remove_outputs, write_json, write_text
from benchlab.optimize import resolve_device, why_not
from benchlab.results import base_record, measured_record, skipped_record, steps_csv
from benchlab.runner import RunRecord, combine_ranks, repeat_in_fresh_process, train_once


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", help="the variant to run (default: from DVC_STAGE)")
    ap.add_argument("data_dir")
    ap.add_argument("result_dir", help="gets <variant>.json")
    ap.add_argument("steps_dir", help="gets <variant>.csv, the per-step loss and time of the first repeat")
    ap.add_argument("--record-to", help=argparse.SUPPRESS)  # repeat mode: one run, its record to this file
    args = ap.parse_args(argv)
    p = load_params()
    name = variant_from(args.variant, os.environ.get("DVC_STAGE"), p)
    if args.record_to:
        one_repeat(p, name, args.data_dir, Path(args.record_to))
        return
    result = Path(args.result_dir) / f"{name}.json"
    steps = Path(args.steps_dir) / f"{name}.csv"
    remove_outputs(result, steps)
    settings = p.variants[name]
    device = resolve_device(p.device)
    data = load_tokens(args.data_dir)
    base = base_record(name, p, settings, device.type, environment(), provenance())
    reason = why_not(settings, device)
    if reason:
        print(f"bench@{name}: skipped: {reason}")
        write_text(steps, "step,loss,lr,step_ms,timed\n")
        write_json(result, skipped_record(base, reason))
        return
    with devlock.device_lock(device, p.bench.lock, f"bench@{name}"):
        runs = run_repeats(p, name, [args.data_dir, args.result_dir, args.steps_dir])
    cfg, n_params = model_shape(p, settings, data.vocab_size)
    record = {**measured_record(base, runs, cfg, n_params, p.bench.steady_tolerance), "repeats_asked": p.bench.repeats}
    write_text(steps, steps_csv(runs[0]))
    write_json(result, record)
    if record["status"] == "ok":
        print(f"bench@{name}: {record['tokens_per_sec']:.0f} tokens/s, step {record['step_ms_median']:.2f} ms, "
              f"val loss {record['val_loss']:.4f}")


def run_repeats(p: Params, name: str, paths: list[str]) -> list[RunRecord]:
    """bench.repeats runs; in this process when there is one (DVC started it fresh), else one fresh process each.

    `paths` are the stage's data, result and steps arguments, passed on to each repeat's process.
    """
    runs: list[RunRecord] = []
    settings = p.variants[name]
    place = f"variant {list(p.variants).index(name) + 1} of {len(p.variants)}"  # the matrix's progress
    deadline, walls = deadline_from_env(), []
    if deadline is not None and time.time() >= deadline:
        raise LabError(f"bench@{name}: BENCHLAB_DEADLINE passed before its first repeat; nothing recorded")
    for i in range(p.bench.repeats):
        if deadline is not None and walls and time.time() + min(walls) > deadline:
            print(f"bench@{name}: {i} of {p.bench.repeats} repeats: another would end past BENCHLAB_DEADLINE", flush=True)
            break
        label = f"bench@{name} ({place}) repeat {i + 1}/{p.bench.repeats}"
        began = time.perf_counter()
        if settings.parallel != "none":
            rec = repeat_in_fresh_process(["stages.bench", "--variant", name, *paths], nproc=settings.nproc)
        elif p.bench.repeats == 1:
            device = resolve_device(p.device)
            rec = train_once(p, p.variants[name], load_tokens(paths[0]), device, p.bench.steps, p.bench.warmup_steps,
                             progress=label, keep_going=True)
        else:
            rec = repeat_in_fresh_process(["stages.bench", "--variant", name, *paths])
        runs.append(rec)
        walls.append(time.perf_counter() - began)
        print(f"{label}: {rec.status} {rec.message}".rstrip() + f" ({repeat_cost(rec, walls[-1])})", flush=True)
        if rec.status != "ok":
            break
    return runs


def deadline_from_env() -> float | None:
    """BENCHLAB_DEADLINE as a Unix time in seconds, or None when unset."""
    text = os.environ.get("BENCHLAB_DEADLINE", "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise LabError(f"BENCHLAB_DEADLINE={text!r} is not a Unix time in seconds; unset it or give one, "
                       "e.g. $(( $(date +%s) + 600 ))") from None


def repeat_cost(rec: RunRecord, wall_s: float) -> str:
    """Where a repeat's wall time went: what a user plans a matrix's length by (start-up counts too).

    The part not named is the process's exit and the parent's reading of its record."""
    parts = [f"{wall_s:.1f} s"]
    for label, seconds in (("start-up and build", rec.setup_s), ("warm-up and compile", rec.warmup_s),
                           ("timed", None if rec.window_wall_ms is None else rec.window_wall_ms / 1000),
                           ("evaluation", rec.eval_s), ("exit", rec.exit_s)):
        if seconds is not None:
            parts.append(f"{label} {seconds:.1f} s")
            if label == "start-up and build":
                within = [f"{what} {t:.1f} s" for what, t in (("interpreter, imports and device", rec.startup_s),
                                                                ("the model's seeded init", rec.init_s),
                                                                ("the knobs applied", rec.apply_s)) if t is not None]
                parts[-1] += f" (of which {', '.join(within)})" if within else ""
    return ", ".join(parts)


def one_repeat(p: Params, name: str, data_dir: str, record_to: Path) -> None:
    """Repeat mode: one run of the variant, its record written for the parent stage to read.

    Under torchrun this is one rank: it joins the process group, trains on its slice, and the ranks'
    records are gathered; only the first rank of each node writes the combined record.
    """
    device = resolve_device(p.device)
    if dist.launched():
        device = dist.init(device, p.variants[name].nccl_max_ctas)
    try:
        before = process_age_s()  # interpreter, imports, process group, CUDA context: what a fresh process pays
        rec = train_once(p, p.variants[name], load_tokens(data_dir), device, p.bench.steps, p.bench.warmup_steps,
                         progress=f"bench@{name}" if dist.rank() == 0 else None, keep_going=True)
        if before is not None and rec.setup_s is not None:
            rec.setup_s += before
            rec.startup_s = before
        rec = combine_ranks(dist.gather(rec))
    finally:
        dist.teardown()
    if dist.writes_record():
        record_to.write_text(rec.to_json())


def end_repeat_process() -> None:
    """A repeat's process ends as soon as its record is written. The interpreter's own teardown (inductor's
    compile workers, the CUDA context) only kept the parent waiting: 1.5 to 2 s per repeat on a 2-core CPU,
    2 to 7 s on an H200 (the `exit` part of each repeat's line). The record is written and closed, the
    process group destroyed; only the standard streams are still buffered."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run_main(main)
    if "--record-to" in sys.argv:  # run_main returned: the repeat succeeded (every failure exits inside it)
        end_repeat_process()
