"""Time to a target loss: the runs of one arm of the track (ttl/dvc.yaml), each a training curve on a clock.

Every run of every arm trains ttl.steps steps (the schedule spans them; no run stops early, whatever its loss)
from seed s's initial weights in seed s's batch order, so arm against arm sees the same token stream, and takes
the validation loss (the same eval.batches windows) after the same steps, `TtlParams.eval_steps`.

The clock is the harness's step clock (benchlab/run/harness.py: forward, backward and the update; on CUDA, device
time): evaluation runs outside it, and the first ttl.warmup_steps, which hold compilation, each count as the run's
median step. What those steps took beyond that is reported apart (`warmup_excess_s`), as is evaluation
(`eval_s`). A run that diverges, runs out of memory or cannot run here has no curve: the arm reports it.
"""

from typing import Any

import numpy as np
import torch

from benchlab.core.knobs import RunSettings
from benchlab.core.params import Params
from benchlab.run.data import TokenData
from benchlab.run.hardware import why_not
from benchlab.run.runner import train_once


def training_clock(step_ms: list[float], warmup: int) -> list[float]:
    """Seconds of training once each step is done: the measured steps, the first `warmup` each counted as the
    median of the others (their excess is compilation)."""
    median = float(np.median(step_ms[warmup:] or step_ms))
    counted = [median] * min(warmup, len(step_ms)) + list(step_ms[warmup:])
    return [float(s) / 1000.0 for s in np.cumsum(counted)]


def run_curve(p: Params, settings: RunSettings, data: TokenData, device: torch.device, seed: int,
              label: str) -> dict[str, Any]:
    """One run of the track: its validation losses at the evaluation steps with the training seconds at each."""
    reason = why_not(settings, device)
    if reason:
        return {"status": "skipped", "message": reason}
    warmup, steps = p.ttl.warmup_steps, p.ttl.steps
    rec = train_once(p, settings, data, device, steps, warmup, progress=label, keep_going=True, data_seed=seed,
                     memory_cap_gib=0.0, eval_steps=frozenset(p.ttl.eval_steps()))
    if rec.status != "ok":
        return {"status": rec.status, "message": rec.message}
    points = [*rec.val_curve, [steps, rec.val_loss, rec.eval_s]]
    clock = training_clock(rec.step_ms, warmup)
    timed = sum(rec.step_ms[warmup:]) / 1000.0
    return {"status": "ok", "message": "", "seed": seed, "eval_steps": [int(n) for n, _, _ in points],
            "train_s": [clock[int(n) - 1] for n, _, _ in points], "val_loss": [loss for _, loss, _ in points],
            "eval_s": sum(s for _, _, s in points), "warmup_excess_s": sum(rec.step_ms[:warmup]) / 1000.0 - clock[warmup - 1],
            "step_ms_median": float(np.median(rec.step_ms[warmup:])),
            "tokens_per_sec": (steps - warmup) * p.batch_size(settings) * p.shape.block_size / timed}
