"""The time-to-loss track's report: both tracks side by side for each arm, the sweep, what stayed off the clock,
and a plot of every seed's validation loss against training time with the target."""

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402

from benchlab.analysis.plots import save_png  # noqa: E402

DASH = "–"
# Why parity leaves a row to this track: what it asks cannot be asked of a change to the math.
PARITY_WHY = ("Parity asks whether a variant learns what the reference learns, step for step; a knob that changes the "
              "optimization (the knob table marks it: optimizer=muon, schedule=wsd, ...) is meant to learn "
              "differently, so parity refuses it and this track judges it: by the training time to the target.")


def _num(value: Any, spec: str, suffix: str = "") -> str:
    return DASH if value is None else format(value, spec) + suffix


def _spread(r: dict[str, Any], key: str, spec: str) -> str:
    """'mean ± sd (min to max)' of a per-seed figure."""
    mean = r.get(f"{key}_mean")
    if mean is None:
        return DASH
    return (f"{format(mean, spec)} ± {_num(r.get(f'{key}_std'), spec)} "
            f"({format(r[f'{key}_min'], spec)} to {format(r[f'{key}_max'], spec)})")


def _time(r: dict[str, Any]) -> str:
    """The arm's time to the target, or why it has none: never a time for an arm a seed did not bring there."""
    if r.get("time_to_target_s_mean") is not None:
        return _spread(r, "time_to_target_s", ".1f")
    return r.get("time_to_target") or ("not judged" if r.get("target_loss") is None else "not reached")


def _budget_where(ref: dict[str, Any]) -> str:
    """Where the budget fell in the reference's own runs: a target met at an arm's first evaluation times nothing."""
    share = ref.get("budget_fraction")
    where = f" ({share:.0%} of its mean training time, ttl.budget_fraction)" if share is not None else ""
    if ref.get("at_target_by_first_eval_seeds"):
        where += (". **The target is too easy to time:** the reference is at it by its first evaluation, so no time "
                  "to it says how fast an arm trains; raise ttl.budget_fraction or ttl.steps")
    return where


def tracks_table(arms: list[dict[str, Any]]) -> str:
    """Each arm with its track, its same-math speed and its time to the target."""
    head = ["arm", "track", "changes on the reference", "tokens/s", "speed vs reference", "time to target s, mean ± sd "
            "(min to max)", "seeds at target", "loss at budget, mean ± sd (min to max)", "test", "parity"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in arms:
        math = r.get("kind", "").startswith("changes")
        ratio = 1.0 if r["arm"] == arms[0]["arm"] else r.get("speed_vs_reference_x")
        cells = [r["variant"] if r is arms[0] else r["arm"], r.get("kind", DASH), r.get("changes") or DASH,
                 _num(r.get("tokens_per_sec"), ",.0f"), _num(ratio, ".2f", "x"), _time(r),
                 f"{r.get('reached_seeds', 0)} of {r.get('seeds_asked', 0)}", _spread(r, "loss_at_budget", ".4f"),
                 r.get("verdict", DASH), "not judged: changes the optimization" if math else "judged (same math)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sweep_table(ref: dict[str, Any]) -> str:
    lines = ["| lr | warm-up steps | loss at budget (first seed) | status |", "| --- | --- | --- | --- |"]
    for pt in ref.get("sweep", []):
        chosen = " (chosen)" if pt["lr"] == ref.get("lr") and pt["lr_warmup_steps"] == ref.get("lr_warmup_steps") else ""
        lines.append(f"| {pt['lr']:g}{chosen} | {pt['lr_warmup_steps']} | {_num(pt['loss_at_budget'], '.4f')} | "
                     f"{pt['status']}{': ' + pt['message'] if pt['message'] else ''} |")
    return "\n".join(lines) + "\n"


def off_clock(arms: list[dict[str, Any]]) -> str:
    lines = ["| arm | step ms median | warm-up beyond its steps, s per run | evaluation s per run |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {r['arm']} | {_num(r.get('step_ms_median'), '.1f')} | {_num(r.get('warmup_excess_s_per_run'), '.1f')} "
              f"| {_num(r.get('eval_s_per_run'), '.1f')} |" for r in arms]
    return "\n".join(lines) + "\n"


def plot_curves(arms: list[dict[str, Any]], target: float | None, budget_s: float | None, png: Path) -> None:
    """Every seed's validation loss against training seconds, an arm a colour, the target and the budget dashed."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, r in enumerate(arms):
        for j, run in enumerate(x for x in r.get("runs", []) if x.get("status") == "ok"):
            ax.plot(run["train_s"], run["val_loss"], color=f"C{i}", alpha=0.8, marker=".",
                    label=(r["arm"] if j == 0 else None))
    if target is not None:
        ax.axhline(target, color="0.3", linestyle="--", linewidth=1, label=f"target {target:.4f}")
    if budget_s is not None:
        ax.axvline(budget_s, color="0.6", linestyle=":", linewidth=1, label=f"reference budget {budget_s:.1f} s")
    ax.set_xlabel("training time (s; compilation and evaluation off the clock)")
    ax.set_ylabel("validation loss (nats)")
    ax.legend()
    save_png(fig, png)  # written whole or not at all, and only into place when the stage succeeds


def report(ref: dict[str, Any], variants: list[dict[str, Any]], png_link: str) -> str:
    """The markdown report of the track."""
    arms = [ref, *variants]
    setup = (f"Model {ref.get('model')}, batch {ref.get('batch_size')} x {ref.get('block_size')} tokens, "
             f"{ref.get('steps')} steps per run (fixed in advance, the schedule spans them; no run stops early), "
             f"validation loss ({ref.get('eval_batches')} batches, the same windows for every arm) after steps "
             f"{', '.join(map(str, ref.get('eval_steps', [])))}; seeds {', '.join(map(str, ref.get('seeds', [])))} "
             "(each the initial weights and the batch order, the same for every arm).")
    target = (f"The reference, {ref.get('variant')}, tuned on the first seed (sweep below): lr {_num(ref.get('lr'), 'g')}, "
              f"warm-up {ref.get('lr_warmup_steps', DASH)} steps. **Target: {_num(ref.get('target_loss'), '.4f')}**, its "
              f"mean validation loss over the seeds at {_num(ref.get('reference_s'), '.1f')} s of training time"
              + _budget_where(ref) + (f" ({ref['message']})" if ref.get("message") else "")
              + ". Every variant trains with the reference's tuned learning rate and warm-up.")
    test = ("Time to target: the training time at a run's first evaluation at or below the target; an arm has a time "
            "only where every seed got there, after its first evaluation (a run at the target by then is too easy to "
            "time: its time only bounds it from above). Loss at budget: a run's validation loss at the reference's budget, "
            "linear in training time between the evaluations around it. Test: one-sided one-sample t-test that the "
            f"mean loss at the budget over the seeds is below the target, at level {ref.get('alpha')} (the t "
            "distribution in closed form, benchlab/core/stats.py).")
    return "\n".join([
        "# Time to a target loss\n", setup + "\n", target + "\n",
        "## Two tracks side by side\n",
        "Same-math speed is the matrix's track (tokens/s against the reference, judged by parity); time to a target "
        "loss is this one, where changes to the optimization compete too. Each row says which kind it is.\n",
        tracks_table(arms), test + "\n", PARITY_WHY + "\n",
        f"![validation loss against training time]({png_link})\n",
        "## The reference's sweep\n", sweep_table(ref),
        "## Off the clock\n",
        "The first steps (compilation) count on the clock as the run's median step; what they took beyond that, and "
        "the evaluations, are here, per run:\n", off_clock(arms)])
