"""Time to a target loss, read from the track's runs (benchlab/run/ttl.py): the target, each arm's time to it and
its loss at the reference's budget, with the test; torch-free.

A run is a dict with `status` and, where ok, `eval_steps`, `train_s` and `val_loss` (the loss after each evaluation
step and the training seconds by then). Its time to the target is the training time at its first evaluation at or
below the target: measured where it was measured, at the steps fixed in advance, never interpolated. Its loss at
the budget is taken between the two evaluations around the budget, linear in training time. The budget,
reference_s, is ttl.budget_fraction of the reference's own mean training time, so that it falls late in the
reference's run whatever the machine and its load.
"""

import math
from typing import Any

import numpy as np

from benchlab.core import stats

# The reference's files in the ttl folders; a hyphen keeps the name apart from every variant's.
REFERENCE_NAME = "reference-sweep"


def loss_at(run: dict[str, Any], seconds: float) -> float | None:
    """The run's validation loss at `seconds` of training (linear between the evaluations around it); its last
    loss where it finished sooner; None before its first evaluation or for a run that did not finish."""
    if run.get("status") != "ok":
        return None
    times, losses = run["train_s"], run["val_loss"]
    if seconds < times[0]:
        return None
    return float(np.interp(seconds, times, losses))  # past the last point np.interp holds the last loss


def time_to(run: dict[str, Any], target: float) -> float | None:
    """Training seconds at the run's first evaluation at or below `target`; None where it never got there."""
    if run.get("status") != "ok":
        return None
    return next((s for s, loss in zip(run["train_s"], run["val_loss"]) if loss <= target), None)


def at_first_evaluation(run: dict[str, Any], target: float) -> bool:
    """Whether the run is at or below `target` at its first evaluation: then its time to the target only bounds it
    from above (it got there by then, maybe much sooner), and says nothing about how fast it trains to it."""
    return run.get("status") == "ok" and run["val_loss"][0] <= target


def budget_of(runs: list[dict[str, Any]], fraction: float) -> float | None:
    """The budget, reference_s: `fraction` of the runs' mean training time (their ok ones); None where none finished.

    A budget in seconds fixed in advance fell past the reference's end on a quiet 2-core CPU and at a quarter of it
    under load (80 to 600 ms a step): a share of the reference's own time is late in its run on any machine."""
    ends = [r["train_s"][-1] for r in runs if r.get("status") == "ok"]
    return fraction * float(np.mean(ends)) if ends else None


def best_point(points: list[dict[str, Any]]) -> int | None:
    """The sweep point with the lowest loss at the budget (`loss_at_budget`); None where none has one."""
    scored = [(pt["loss_at_budget"], i) for i, pt in enumerate(points) if pt.get("loss_at_budget") is not None]
    return min(scored)[1] if scored else None


def target_of(runs: list[dict[str, Any]], reference_s: float) -> tuple[float | None, str]:
    """The target, the mean over the reference's seeds of its loss at `reference_s`, or None and why not."""
    failed = next((r for r in runs if r.get("status") != "ok"), None)
    if failed is not None:
        return None, f"a reference run {failed['status']}: {failed.get('message')}"
    early = [r for r in runs if loss_at(r, reference_s) is None]
    if early:
        return None, (f"the reference's first evaluation came after its budget, {reference_s:.3g} s of training; "
                      "lower ttl.eval_every or raise ttl.budget_fraction")
    # A run that ended sooner has its final model at the budget: its last loss is its loss there.
    short = [f"{r['train_s'][-1]:.1f} s" for r in runs if r["train_s"][-1] < reference_s]
    note = (f"{len(short)} of {len(runs)} seeds finished their {runs[0]['eval_steps'][-1]} steps before "
            f"the budget, {reference_s:.3g} s ({', '.join(short)}): their last loss is their loss at the budget") if short else ""
    return float(np.mean([loss_at(r, reference_s) for r in runs])), note


def _spread(values: list[float], key: str, unit: str) -> dict[str, float | None]:
    """Mean, sample standard deviation, min and max under `key`_<unit>_..., None where there are no values."""
    a = np.asarray(values, dtype=np.float64)
    ok = a.size > 0
    return {f"{key}_{unit}mean": float(a.mean()) if ok else None,
            f"{key}_{unit}std": float(a.std(ddof=1)) if a.size > 1 else None,
            f"{key}_{unit}min": float(a.min()) if ok else None, f"{key}_{unit}max": float(a.max()) if ok else None}


def arm_summary(runs: list[dict[str, Any]], target: float | None, reference_s: float, alpha: float,
                defines_target: bool = False) -> dict[str, Any]:
    """One arm against the target: time to it per seed and its spread, loss at the budget per seed and its spread,
    and the one-sided t-test that the mean loss at the budget is below the target (`verdict`)."""
    ok = [r for r in runs if r.get("status") == "ok"]
    out: dict[str, Any] = {"seeds_run": len(ok), "seeds_asked": len(runs), "target_loss": target}
    if target is None:
        return {**out, "reached_seeds": 0, "time_to_target_s_seeds": [], "verdict": "not judged: no target"}
    times = [time_to(r, target) for r in runs]
    losses = [loss_at(r, reference_s) for r in runs]
    reached = [t for t in times if t is not None]
    out.update({"time_to_target_s_seeds": times, "reached_seeds": len(reached),
                "loss_at_budget_seeds": losses, **_spread([x for x in losses if x is not None], "loss_at_budget", "")})
    # A time only where every seed got there: a mean over the seeds that did would flatter the arm.
    early = sum(at_first_evaluation(r, target) for r in runs)
    out["at_target_by_first_eval_seeds"] = early
    # A time only where every seed got there, and after its first evaluation: a mean over the seeds that did would
    # flatter the arm, and a run at the target by its first evaluation was timed to that evaluation, not the target.
    out.update(_spread(reached if len(reached) == len(runs) and not early else [], "time_to_target", "s_"))
    if len(reached) < len(runs):
        out["time_to_target"] = f"not reached by {len(runs) - len(reached)} of {len(runs)} seeds"
    elif early:
        first = max(t for r, t in zip(runs, times) if at_first_evaluation(r, target))
        out["time_to_target"] = (f"too easy to time: {early} of {len(runs)} seeds at the target by their first "
                                 f"evaluation (at most {first:.1f} s, maybe much less)")
    if defines_target:
        return {**out, "t_stat": None, "p_value": None, "below_target": None,
                "verdict": "defines the target (its mean loss at the budget is the target)"}
    if any(x is None for x in losses):
        return {**out, "t_stat": None, "p_value": None, "below_target": False,
                "verdict": f"not below the target: {sum(x is None for x in losses)} of {len(runs)} seeds have no loss "
                           "at the budget"}
    t, p = stats.one_sided_below([x for x in losses if x is not None], target)
    below = bool(p < alpha) if not math.isnan(p) else False
    words = "below the target" if below else "not shown below the target"
    return {**out, "t_stat": t, "p_value": p, "below_target": below,
            "verdict": f"{words} (one-sided t-test, p={p:.3g}, level {alpha:g})"}
