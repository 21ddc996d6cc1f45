"""Stages ttl_reference and ttl@<variant>: time to a target loss (benchlab/run/ttl.py, benchlab/analysis/ttl.py).

ttl_reference sweeps ttl.reference's learning rate and warm-up with the first seed, trains the point with the
lowest loss at its budget (ttl.budget_fraction of its training time) on the other seeds, and sets the target: its
mean validation loss at reference_s, ttl.budget_fraction of its mean training time over the seeds.
ttl@<name> trains the reference plus ttl.variants.<name>'s changes on every seed with the tuned learning rate and
warm-up, and gives its time to the target and its loss at the budget, with the test. The variant comes from
DVC_STAGE, as for bench; `--variant NAME` or `--reference` serve runs outside DVC. Each writes <name>.json to the
record folder and <name>.csv (every seed's validation loss against training seconds) to the curve folder.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchlab.analysis import ttl as judge
from benchlab.analysis.ttl import REFERENCE_NAME
from benchlab.core import locks
from benchlab.core.errors import LabError, shown
from benchlab.core.files import flat, claim_outputs, commit_outputs, write_json, write_text
from benchlab.core.knobs import KNOBS, RunSettings, math_changes
from benchlab.core.params import Params, load_params
from benchlab.core.stage_main import run_main
from benchlab.run.data import load_tokens
from benchlab.run.env import environment, provenance
from benchlab.run.hardware import resolve_device
from benchlab.run.ttl import run_curve, tuned



def kind(settings: RunSettings) -> str:
    """The row's track: systems-only, or which knobs change the optimization."""
    changes = math_changes(settings)
    return f"changes the optimization: {', '.join(changes)}" if changes else "systems-only"


def settings_record(p: Params) -> dict[str, Any]:
    """The params every ttl record carries, and a variant's must share with the reference's."""
    return {"reference": p.ttl.reference, "budget_fraction": p.ttl.budget_fraction, "steps": p.ttl.steps,
            "eval_steps": p.ttl.eval_steps(), "warmup_steps": p.ttl.warmup_steps, "seeds": list(p.ttl.seeds),
            "alpha": p.ttl.alpha, "model": p.model, "batch_size": p.train.batch_size, "block_size": p.train.block_size,
            "eval_batches": p.eval.batches, "min_lr_ratio": p.train.min_lr / p.train.lr,
            "reference_settings": {k: getattr(p.variants[p.ttl.reference], k) for k in KNOBS}}


def curve_csv(runs: list[dict[str, Any]]) -> str:
    """Each ok run's validation loss against its training seconds, a column pair per seed, a row per evaluation."""
    ok = [r for r in runs if r.get("status") == "ok"]
    head = ["step"] + [f"{col}_{r['seed']}" for r in ok for col in ("train_s", "val_loss")]
    rows = [",".join(head)]
    for i, step in enumerate(ok[0]["eval_steps"] if ok else []):
        rows.append(",".join([str(step)] + [f"{r[col][i]:.6f}" for r in ok for col in ("train_s", "val_loss")]))
    return "\n".join(rows) + "\n"


def reference(p: Params, data: Any, device: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The sweep with the first seed, the best point on the other seeds, and the target."""
    settings, first = p.variants[p.ttl.reference], p.ttl.seeds[0]
    points, sweep_runs = [], []
    for lr in p.ttl.sweep_lrs:
        for warm in p.ttl.sweep_warmup_steps:
            run = run_curve(tuned(p, lr, warm, first), settings, data, device, first, f"ttl sweep: lr {lr:g}, warm-up {warm}")
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
    runs = [sweep_runs[best]] + [run_curve(tuned(p, lr, warm, s), settings, data, device, s, f"ttl reference: seed {s}")
                                 for s in p.ttl.seeds[1:]]
    budget = judge.budget_of(runs, p.ttl.budget_fraction)
    target, why = judge.target_of(runs, budget) if budget is not None else (None, "no reference run finished")
    return {**out, "lr": lr, "lr_warmup_steps": warm, "status": "ok" if target is not None else "no target",
            "message": why, "reference_s": budget,
            **judge.arm_summary(runs, target, budget or 0.0, p.ttl.alpha, defines_target=True),
            **_speed(runs), "runs": runs}, runs


def variant(p: Params, name: str, ref: dict[str, Any], data: Any, device: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The variant on every seed with the reference's tuned learning rate and warm-up, against its target."""
    settings = p.ttl.variants[name]
    base = p.variants[p.ttl.reference]
    out = {"arm": name, "variant": name, "kind": kind(settings),
           "changes": ", ".join(f"{k}={getattr(settings, k)}" for k in KNOBS if getattr(settings, k) != getattr(base, k))}
    if ref.get("status") != "ok":
        return {**out, "status": "not judged", "message": f"the reference has no target: {ref.get('message')}",
                **judge.arm_summary([], None, 0.0, p.ttl.alpha)}, []
    runs = [run_curve(tuned(p, ref["lr"], ref["lr_warmup_steps"], s), settings, data, device, s, f"ttl@{name}: seed {s}")
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", help="the variant to time (default: from DVC_STAGE)")
    ap.add_argument("--reference", action="store_true", help="sweep and time the reference")
    ap.add_argument("data_dir")
    ap.add_argument("record_dir", help="gets <name>.json")
    ap.add_argument("curve_dir", help="gets <name>.csv")
    args = ap.parse_args(argv)
    p = load_params()
    if p.ttl.reference not in p.variants:
        raise LabError(f"ttl.reference={shown(p.ttl.reference)} is not valid; expected one of: {', '.join(p.variants)}")
    is_ref = args.reference or os.environ.get("DVC_STAGE", "").endswith("ttl_reference")
    stage = os.environ.get("DVC_STAGE", "")
    name = REFERENCE_NAME if is_ref else args.variant or (stage.split("ttl@", 1)[1] if "ttl@" in stage else None)
    if name is None:
        raise LabError("no variant given: pass --variant NAME or --reference, or run as the DVC stage ttl@NAME")
    if not is_ref and name not in p.ttl.variants:
        raise LabError(f"variant {shown(name)} is not in ttl.variants; valid: {', '.join(p.ttl.variants) or '(none)'}")
    record, curve = Path(args.record_dir) / f"{name}.json", Path(args.curve_dir) / f"{name}.csv"
    claim_outputs(record, curve)
    ref = None if is_ref else read_reference(Path(args.record_dir) / f"{REFERENCE_NAME}.json", p)
    data, device = load_tokens(args.data_dir), resolve_device(p.device)
    with locks.device_lock(device, p.bench.lock, f"ttl@{name}"):
        out, runs = reference(p, data, device) if ref is None else variant(p, name, ref, data, device)
    write_text(curve, curve_csv(runs))
    write_json(record, {**settings_record(p), **out, **flat("env", environment()), **provenance()})
    commit_outputs()
    time = out.get("time_to_target_s_mean")
    print(f"ttl@{name}: target {out.get('target_loss') or '-'}; time to it "
          + (f"{time:.1f} s" if time is not None else out.get("time_to_target", "-")) + f"; {out['verdict']}")


if __name__ == "__main__":
    run_main(main)
