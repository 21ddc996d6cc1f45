"""Stage train: train the model the top-level params describe; save it, its metrics and its full record."""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import math
from dataclasses import asdict

from benchlab.core import locks
from benchlab.run.checkpoint import save_checkpoint
from benchlab.core.params import load_params
from benchlab.run.data import load_tokens
from benchlab.run.env import environment, provenance
from benchlab.core.stage_main import run_main
from benchlab.core.errors import LabError
from benchlab.core.files import claim_outputs, commit_outputs, write_json, write_text
from benchlab.run.hardware import resolve_device, why_not
from benchlab.run.records import base_record, measured_record, metric_view, steps_csv
from benchlab.run.runner import train_once


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("data_dir")
    ap.add_argument("checkpoint")
    ap.add_argument("metrics", help="the numbers DVC compares (tokens/s, memory, losses)")
    ap.add_argument("record", help="the full record: every statistic, the environment and provenance")
    ap.add_argument("steps_csv")
    args = ap.parse_args(argv)
    claim_outputs(args.checkpoint, args.metrics, args.record, args.steps_csv)
    p = load_params()
    device = resolve_device(p.device)
    reason = why_not(p.run, device)
    if reason:
        raise LabError(reason)
    data = load_tokens(args.data_dir)
    warmup = min(p.harness.warmup_steps, p.train.steps - 2)
    if warmup < 1:
        raise LabError(f"train.steps={p.train.steps} is too few to time; use at least 3")
    print(f"train: model={p.model} {asdict(p.run)} on {device}, {p.train.steps} steps")
    with locks.device_lock(device, p.harness.lock, "train"):
        rec = train_once(p, p.run, data, device, p.train.steps, warmup, keep_model=True, progress="train")
    if rec.status != "ok":
        raise LabError(f"training stopped: {rec.message}; lower optim.lr or use another precision")
    if rec.val_loss is None or not math.isfinite(rec.val_loss):
        raise LabError(f"the trained model's validation loss is {rec.val_loss}, so nothing was recorded; "
                       "lower optim.lr or use another precision")
    assert rec.run is not None
    model = rec.run.model
    base = base_record("train", p, p.run, device.type, environment(), provenance(), own="train")
    record = measured_record(base, [rec], model.cfg, model.num_params(), p.harness.steady_tolerance)
    save_checkpoint(model, p.model, data.meta.get("tokenizer_sha256", ""), args.checkpoint)
    write_text(args.steps_csv, steps_csv(rec))
    write_json(args.record, record)
    write_json(args.metrics, metric_view(record))
    commit_outputs()  # only now do the new outputs replace the earlier ones
    print(f"train: loss {record['final_train_loss']:.4f}, val {record['val_loss']:.4f}, "
          f"{record['tokens_per_sec']:.0f} tokens/s, step {record['step_ms_median']:.1f} ms median")


if __name__ == "__main__":
    run_main(main)
