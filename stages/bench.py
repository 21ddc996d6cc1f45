"""Stage bench@<variant>: time one optimization variant, its repeats, and its validation loss.

The variant's name comes from DVC_STAGE (`bench@<name>`), which DVC sets for
every stage it runs, so no name a user wrote ever reaches a shell command
line; `--variant NAME` serves runs outside DVC. Either way the name is checked
against params.yaml before anything is written.

A variant that the device cannot run is recorded as `skipped` with the
reason, one that runs out of memory as `oom`, one whose loss turns NaN or Inf
as `diverged`; each still writes its result so the matrix goes on. Where the
repeats run (fresh processes, torchrun's ranks for a `parallel` variant) and
when BENCHLAB_DEADLINE stops them: benchlab/run/launch.py.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import os
from pathlib import Path

from benchlab.core import locks
from benchlab.run import launch
from benchlab.run.build_model import model_shape
from benchlab.core.params import load_params, variant_from
from benchlab.run.data import load_tokens
from benchlab.run.env import environment, provenance
from benchlab.core.stage_main import run_main
from benchlab.core.files import claim_outputs, commit_outputs, write_json, write_text
from benchlab.run.hardware import resolve_device, why_not
from benchlab.run.records import base_record, measured_record, skipped_record, steps_csv


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
        launch.one_repeat(p, name, args.data_dir, Path(args.record_to))
        return
    result = Path(args.result_dir) / f"{name}.json"
    steps = Path(args.steps_dir) / f"{name}.csv"
    claim_outputs(result, steps)
    settings = p.variants[name]
    device = resolve_device(p.device)
    data = load_tokens(args.data_dir)
    base = base_record(name, p, settings, device.type, environment(), provenance())
    reason = why_not(settings, device)
    if reason:
        print(f"bench@{name}: skipped: {reason}")
        write_text(steps, "step,loss,lr,step_ms,timed\n")
        write_json(result, skipped_record(base, reason))
        commit_outputs()
        return
    repeat_mode = ["stages.bench", "--variant", name, args.data_dir, args.result_dir, args.steps_dir]
    with locks.device_lock(device, p.harness.lock, f"bench@{name}"):
        runs = launch.run_repeats(p, name, args.data_dir, repeat_mode)
    cfg, n_params = model_shape(p, settings, data.vocab_size)
    record = {**measured_record(base, runs, cfg, n_params, p.harness.steady_tolerance), "repeats_asked": p.bench.repeats}
    write_text(steps, steps_csv(runs[0]))
    write_json(result, record)
    commit_outputs()
    if record["status"] == "ok":
        print(f"bench@{name}: {record['tokens_per_sec']:.0f} tokens/s, step {record['step_ms_median']:.2f} ms, "
              f"val loss {record['val_loss']:.4f}")


if __name__ == "__main__":
    run_main(main)
    launch.end_process()  # run_main returned: the stage or its repeat succeeded (every failure exits inside it)
