"""Stage bench@<variant>: time one optimization variant, its repeats, and its validation loss.

A variant that the device cannot run is recorded as `skipped` with the
reason, one that runs out of memory as `oom`, one whose loss turns NaN or Inf
as `diverged`; each still writes its result so the matrix goes on.
"""

import argparse
from pathlib import Path

from benchlab.config import load_params
from benchlab.data import load_tokens
from benchlab.env import environment, provenance
from benchlab.errors import LabError, run_main
from benchlab.io import remove_outputs, write_json, write_text
from benchlab.optimize import resolve_device, unsupported_reason
from benchlab.results import base_record, measured_record, skipped_record, steps_csv
from benchlab.runner import RunRecord, model_shape, train_once


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", required=True)
    ap.add_argument("data_dir")
    ap.add_argument("result_dir", help="gets <variant>.json")
    ap.add_argument("steps_dir", help="gets <variant>.csv, the per-step loss and time of the first repeat")
    args = ap.parse_args(argv)
    result = Path(args.result_dir) / f"{args.variant}.json"
    steps = Path(args.steps_dir) / f"{args.variant}.csv"
    remove_outputs(result, steps)
    p = load_params()
    if args.variant not in p.variants:
        raise LabError(f"variant {args.variant!r} is not in params.yaml; valid: {', '.join(p.variants)}")
    settings = p.variants[args.variant]
    device = resolve_device(p.device)
    data = load_tokens(args.data_dir)
    base = base_record(args.variant, p, settings, device.type, environment(), provenance())
    reason = unsupported_reason(settings, device)
    if reason:
        print(f"bench@{args.variant}: skipped: {reason}")
        write_text(steps, "step,loss,lr,step_ms,timed\n")
        write_json(result, skipped_record(base, reason))
        return
    runs: list[RunRecord] = []
    for i in range(p.bench.repeats):
        run = train_once(p, settings, data, device, p.bench.steps, p.bench.warmup_steps)
        runs.append(run)
        print(f"bench@{args.variant} repeat {i + 1}/{p.bench.repeats}: {run.status} {run.message}".rstrip())
        if run.status != "ok":
            break
    cfg, n_params = model_shape(p, settings, data.vocab_size)
    record = measured_record(base, runs, cfg, n_params, p.bench.steady_tolerance)
    write_text(steps, steps_csv(runs[0]))
    write_json(result, record)
    if record["status"] == "ok":
        print(f"bench@{args.variant}: {record['tokens_per_sec']:.0f} tokens/s, step {record['step_ms_median']:.2f} ms, "
              f"val loss {record['val_loss']:.4f}")


if __name__ == "__main__":
    run_main(main)
