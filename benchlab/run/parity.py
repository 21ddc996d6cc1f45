"""Does it still learn the same: a variant's training-loss curve against a reference's, from the same start.

The reference variant (parity.reference) trains twice from the same initial weights (`seed`), once with
each of two batch orders (parity.seeds). How far apart those two runs end is what the order of the data
alone moves the loss: the noise a verdict has to clear. Each parity variant then trains once with the first
batch order, so it sees exactly the batches the reference's first run saw, and its verdict compares the
mean training loss over the last parity.tail_steps with that run's:

- same: the gap is within parity.tolerance nats;
- worse / better by X nats: outside it;
- not judged: the reference or the variant did not run, or the tolerance is below the reference's own gap
  between its two orders (a verdict that tight would be the data order's, not the optimization's).

Parity asks about learning, not speed: its runs are not timed and take no memory cap.
"""

import json
import math
from pathlib import Path
from typing import Any

import torch

from benchlab.core.errors import LabError
from benchlab.core.params import Params
from benchlab.core.record import tail_loss
from benchlab.run.data import TokenData
from benchlab.run.hardware import why_not
from benchlab.run.runner import Measurement, train_once


def data_passes(p: Params, name: str, data: TokenData) -> float:
    """How many times a parity run goes through the training split (above 1: it sees batches again)."""
    tokens = p.parity.steps * p.batch_size(p.variants[name]) * p.shape.block_size
    return tokens / max(1, len(data.train))


def verdict(gap: float, noise: float, tolerance: float) -> tuple[bool | None, str]:
    """learns_same and its words, from the tail-loss gap (variant minus reference) and the reference's noise."""
    if noise > tolerance:
        return None, (f"not judged: the reference's two batch orders end {noise:.3f} nats apart, more than "
                      f"parity.tolerance={tolerance:g}; raise the tolerance above that or train longer")
    if abs(gap) <= tolerance:
        return True, "same"
    return False, f"{'worse' if gap > 0 else 'better'} by {abs(gap):.3f} nats"


def train_curve(p: Params, name: str, data: TokenData, device: torch.device, data_seed: int) -> Measurement:
    """One parity run of a variant: parity.steps steps from `seed`'s weights in `data_seed`'s batch order."""
    reason = why_not(p.variants[name], device)
    if reason:
        return Measurement(status="skipped", message=reason)
    return train_once(p, p.variants[name], data, device, p.parity.steps, 1, progress=f"parity: {name}, order {data_seed}",
                      keep_going=True, data_seed=data_seed, memory_cap_gib=0.0)


def settings_record(p: Params) -> dict[str, Any]:
    """The parity params every record carries."""
    return {"reference": p.parity.reference, "steps": p.parity.steps, "tail_steps": p.parity.tail_steps,
            "tolerance": p.parity.tolerance, "seeds": list(p.parity.seeds), "model": p.model,
            "batch_size": p.shape.batch_size, "block_size": p.shape.block_size, "train_lr": p.optim.lr}


def reference_record(p: Params, runs: list[Measurement], passes: float) -> dict[str, Any]:
    """The reference's two runs: their tail losses, the gap between them (the noise), and the first curve."""
    out = {**settings_record(p), "data_passes": passes}
    failed = next((r for r in runs if r.status != "ok"), None)
    if failed is not None:
        return {**out, "status": failed.status, "message": failed.message}
    tails = [tail_loss(r.losses, p.parity.tail_steps) for r in runs]
    return {**out, "status": "ok", "message": "", "tail_losses": tails, "noise_nats": abs(tails[0] - tails[1]),
            "val_losses": [r.val_loss for r in runs], "seed_a_losses": runs[0].losses, "seed_b_losses": runs[1].losses}


def check_reference(p: Params, ref: dict[str, Any]) -> None:
    """The reference record was made with these parity params (a manual run could pair stale files)."""
    mine = settings_record(p)
    stale = [k for k in mine if ref.get(k) != mine[k]]
    if stale:
        raise LabError(f"the parity reference was run with other params ({', '.join(stale)}); rerun "
                       "`dvc repro parity_reference` first")


def variant_record(p: Params, name: str, run: Measurement, ref: dict[str, Any], passes: float) -> dict[str, Any]:
    """A variant's parity: its tail loss against the reference's first order, and the verdict."""
    out = {**settings_record(p), "variant": name, "data_passes": passes, "status": run.status,
           "message": run.message, "learns_same": None}
    if run.status != "ok":
        return {**out, "verdict": f"not judged: {name} {run.status}: {run.message}"}
    tail = tail_loss(run.losses, p.parity.tail_steps)
    out.update({"tail_loss": tail, "val_loss": run.val_loss, "losses": run.losses})
    if ref.get("status") != "ok":
        return {**out, "verdict": f"not judged: the reference {p.parity.reference} {ref.get('status')}: "
                                  f"{ref.get('message')}"}
    gap = tail - ref["tail_losses"][0]
    same, words = verdict(gap, ref["noise_nats"], p.parity.tolerance)
    return {**out, "reference_tail_loss": ref["tail_losses"][0], "gap_nats": gap, "noise_nats": ref["noise_nats"],
            "reference_val_loss": ref["val_losses"][0], "learns_same": same, "verdict": words}


def curve_csv(columns: dict[str, list[float]]) -> str:
    """Per-step losses side by side (`step` first); a run that stopped early leaves its later cells empty."""
    names = list(columns)
    rows = ["step," + ",".join(names)]
    for step in range(max((len(v) for v in columns.values()), default=0)):
        cells = [f"{v[step]:.6f}" if step < len(v) and math.isfinite(v[step]) else "" for v in columns.values()]
        rows.append(f"{step}," + ",".join(cells))
    return "\n".join(rows) + "\n"


def read_reference(path: Path) -> dict:
    """The reference's record, which every variant's verdict needs."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LabError(f"{path} is missing or unreadable ({type(err).__name__}); run `dvc repro parity_reference` "
                       "first") from None
