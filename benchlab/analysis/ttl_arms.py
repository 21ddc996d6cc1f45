"""The time-to-loss track's two kinds of arm (stages ttl_reference and ttl@<variant>): the reference's sweep, its best
point on every seed and the target; a variant on every seed against that target. The runs are measured by the
`Curve` the stage hands in (benchlab/run/ttl.py's run_curve on its device); what they mean is judged by
benchlab/analysis/ttl.py. Torch-free, so the tests drive it with stand-in curves.
"""

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchlab.analysis import ttl as judge
from benchlab.analysis.ttl import REFERENCE_NAME
from benchlab.core.errors import LabError
from benchlab.core.knobs import KNOBS, RunSettings, math_changes
from benchlab.core.params import Params, with_changes

# One run of the track: the params (tuned: learning rate, warm-up, seed), the arm's settings, the seed of its batch
# order, its progress label; the curve's record (run.ttl.run_curve's).
Curve = Callable[[Params, RunSettings, int, str], dict[str, Any]]


def tuned(p: Params, lr: float, warmup_steps: int, seed: int) -> Params:
    """p with a point of the reference's sweep and a seed: optim.lr (optim.min_lr keeps its ratio to it),
    optim.lr_warmup_steps, and the seed of the initial weights."""
    optim = replace(p.optim, lr=lr, min_lr=lr * p.optim.min_lr / p.optim.lr, lr_warmup_steps=warmup_steps)
    return with_changes(p, seed=seed, optim=optim)


def kind(settings: RunSettings) -> str:
    """The row's track: systems-only, or which knobs change the optimization."""
    changes = math_changes(settings)
    return f"changes the optimization: {', '.join(changes)}" if changes else "systems-only"


def settings_record(p: Params) -> dict[str, Any]:
    """The params every ttl record carries, and a variant's must share with the reference's."""
    return {"reference": p.ttl.reference, "budget_fraction": p.ttl.budget_fraction, "steps": p.ttl.steps,
            "eval_steps": p.ttl.eval_steps(), "warmup_steps": p.ttl.warmup_steps, "seeds": list(p.ttl.seeds),
            "alpha": p.ttl.alpha, "model": p.model, "batch_size": p.shape.batch_size, "block_size": p.shape.block_size,
            "eval_batches": p.eval.batches, "min_lr_ratio": p.optim.min_lr / p.optim.lr,
            "reference_settings": {k: getattr(p.variants[p.ttl.reference], k) for k in KNOBS}}


def curve_csv(runs: list[dict[str, Any]]) -> str:
    """Each ok run's validation loss against its training seconds, a column pair per seed, a row per evaluation."""
    ok = [r for r in runs if r.get("status") == "ok"]
    head = ["step"] + [f"{col}_{r['seed']}" for r in ok for col in ("train_s", "val_loss")]
    rows = [",".join(head)]
    for i, step in enumerate(ok[0]["eval_steps"] if ok else []):
        rows.append(",".join([str(step)] + [f"{r[col][i]:.6f}" for r in ok for col in ("train_s", "val_loss")]))
    return "\n".join(rows) + "\n"


def reference(p: Params, curve: Curve) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The sweep with the first seed, the best point on the other seeds, and the target."""
    settings, first = p.variants[p.ttl.reference], p.ttl.seeds[0]
    points, sweep_runs = [], []
    for lr in p.ttl.sweep_lrs:
        for warm in p.ttl.sweep_warmup_steps:
            run = curve(tuned(p, lr, warm, first), settings, first, f"ttl sweep: lr {lr:g}, warm-up {warm}")
            sweep_runs.append(run)
            points.append({"lr": lr, "lr_warmup_steps": warm, "status": run["status"], "message": run["message"],
                           "loss_at_budget": _loss_at_own_budget(run, p.ttl.budget_fraction)})
    best = judge.best_point(points)
    out = {"arm": REFERENCE_NAME, "variant": p.ttl.reference, "kind": kind(settings), "sweep": points}
    if best is None:
        why = next((r["message"] for r in sweep_runs if r["status"] != "ok"), "lower ttl.eval_every or raise "
                   "ttl.budget_fraction")
        return {**out, "status": "no target", "reference_s": None,
                "message": f"no point of the sweep has a loss at its budget: {why}",
                **judge.arm_summary([], None, 0.0, p.ttl.alpha)}, []
    lr, warm = points[best]["lr"], points[best]["lr_warmup_steps"]
    runs = [sweep_runs[best]] + [curve(tuned(p, lr, warm, s), settings, s, f"ttl reference: seed {s}")
                                 for s in p.ttl.seeds[1:]]
    budget = judge.budget_of(runs, p.ttl.budget_fraction)
    target, why = judge.target_of(runs, budget) if budget is not None else (None, "no reference run finished")
    return {**out, "lr": lr, "lr_warmup_steps": warm, "status": "ok" if target is not None else "no target",
            "message": why, "reference_s": budget,
            **judge.arm_summary(runs, target, budget or 0.0, p.ttl.alpha, defines_target=True),
            **_speed(runs), "runs": runs}, runs


def variant(p: Params, name: str, ref: dict[str, Any], curve: Curve) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The variant on every seed with the reference's tuned learning rate and warm-up, against its target."""
    settings = p.ttl.variants[name]
    base = p.variants[p.ttl.reference]
    out = {"arm": name, "variant": name, "kind": kind(settings),
           "changes": ", ".join(f"{k}={getattr(settings, k)}" for k in KNOBS if getattr(settings, k) != getattr(base, k))}
    if ref.get("status") != "ok":
        return {**out, "status": "not judged", "message": f"the reference has no target: {ref.get('message')}",
                **judge.arm_summary([], None, 0.0, p.ttl.alpha)}, []
    runs = [curve(tuned(p, ref["lr"], ref["lr_warmup_steps"], s), settings, s, f"ttl@{name}: seed {s}")
            for s in p.ttl.seeds]
    speed = _speed(runs)
    ratio = speed["tokens_per_sec"] / ref["tokens_per_sec"] if speed["tokens_per_sec"] and ref.get("tokens_per_sec") else None
    failed = next((r for r in runs if r["status"] != "ok"), None)
    return {**out, "lr": ref["lr"], "lr_warmup_steps": ref["lr_warmup_steps"], "status": "ok",
            "message": f"seed {p.ttl.seeds[runs.index(failed)]} {failed['status']}: {failed['message']}" if failed else "",
            **judge.arm_summary(runs, ref["target_loss"], ref["reference_s"], p.ttl.alpha), **speed,
            "speed_vs_reference_x": ratio, "runs": runs}, runs


def _loss_at_own_budget(run: dict[str, Any], fraction: float) -> float | None:
    """A sweep point's score: its loss at `fraction` of its own training time, as the target is the reference's."""
    budget = judge.budget_of([run], fraction)
    return judge.loss_at(run, budget) if budget is not None else None


def _speed(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The arm's mean training throughput over its ok runs, and its evaluation and warm-up seconds apart."""
    ok = [r for r in runs if r.get("status") == "ok"]
    mean = (lambda key: sum(r[key] for r in ok) / len(ok) if ok else None)
    return {"tokens_per_sec": mean("tokens_per_sec"), "step_ms_median": mean("step_ms_median"),
            "eval_s_per_run": mean("eval_s"), "warmup_excess_s_per_run": mean("warmup_excess_s")}


def read_reference(path: Path, p: Params) -> dict[str, Any]:
    """The reference's record, made with these params."""
    try:
        ref = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LabError(f"{path} is missing or unreadable ({type(err).__name__}); run `dvc repro "
                       "ttl/dvc.yaml:ttl_reference` first") from None
    stale = [k for k, v in settings_record(p).items() if ref.get(k) != v]
    if stale:
        raise LabError(f"{path} was made with other params ({', '.join(stale)}); rerun `dvc repro "
                       "ttl/dvc.yaml:ttl_reference` first")
    return ref
