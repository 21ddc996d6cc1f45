"""What a search hands on: every candidate with where its wall time went, the front of speed against memory,
the flat metrics file, a report and the front's plot.

Each figure comes from a run in the journal; a point never measured is never drawn.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

import yaml

from benchlab.core.files import write_json, write_text
from benchlab.core.knobs import RunSettings
from benchlab.core.params import Params
from benchlab.run.env import environment

from benchlab.search.budget import Limits
from benchlab.search.journal import PRECOMPILE, SCREENING, Journal, Entry
from benchlab.search.outcome import GOALS, Outcome

# What the stage writes beside the journal, in its out_dir.
OUTPUTS = ("candidates.csv", "front.csv", "found.yaml", "report.md", "front.png")
# Where a run's wall time went (runs.breakdown fills `Entry.extra` with these, in seconds).
BREAKDOWN = ("startup_s", "build_s", "apply_s", "warmup_s", "timed_s", "eval_s")
# inductor's FX graph cache during a screening run: graphs loaded from it, graphs compiled.
CACHE = ("compile_hits", "compile_misses")
CSV_COLUMNS = ("name", "phase", "status", "tokens_per_sec", "ratio_to_start", "peak_mem_mb", "wall_s", *BREAKDOWN,
               *CACHE, "passed", "message")
FRONT_COLUMNS = ("name", "tokens_per_sec", "ratio_to_start", "peak_mem_mb", "parity", "answer")


def _cell(value: Any) -> Any:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else value


def _ratio(run: Entry, start_tps: float | None) -> float | None:
    return run.tokens_per_sec / start_tps if run.tokens_per_sec is not None and start_tps else None


def _csv(header: tuple[str, ...], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[_cell(c) for c in row] for row in rows])
    return out.getvalue()


def candidates_csv(journal: Journal, start_tps: float | None) -> str:
    """Every run the search made or refused, in the order it made them, with where its wall time went."""
    rows = [[r.name, r.phase, r.status, r.tokens_per_sec, _ratio(r, start_tps), r.peak_mem_mb, r.wall_s,
             *(r.extra.get(k) for k in (*BREAKDOWN, *CACHE)), r.passed, r.message] for r in journal.runs.values()]
    return _csv(CSV_COLUMNS, rows)


def parity_word(journal: Journal, name: str) -> str:
    verdict = journal.get("parity", name)
    return "not judged" if verdict is None else "passed" if verdict.passed else "failed"


def front_csv(outcome: Outcome, journal: Journal) -> str:
    """The front, fastest first: each point's screening figures, its parity verdict, and which answer it is."""
    tps = outcome.start.tokens_per_sec if outcome.start else None
    answers = outcome.goals_of()
    rows = [[r.name, r.tokens_per_sec, _ratio(r, tps), r.peak_mem_mb, parity_word(journal, r.name),
             " ".join(answers.get(r.name, []))] for r in outcome.front]
    return _csv(FRONT_COLUMNS, rows)


def breakdown(journal: Journal) -> dict[str, float]:
    """The median of each part of a screening run's wall time, and of the whole."""
    runs = [r for r in journal.runs.values() if r.phase in SCREENING and r.status != "refused"]
    out = {"wall_s": statistics.median(r.wall_s for r in runs)} if runs else {}
    for key in BREAKDOWN:
        values = [r.extra[key] for r in runs if r.extra.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    return out


def summary(outcome: Outcome, journal: Journal, limits: Limits) -> dict[str, Any]:
    """The flat metrics file: what each goal found, against the start, and what the search spent."""
    start = outcome.start
    screens = breakdown(journal)
    out: dict[str, Any] = {"status": outcome.status, "runs": journal.measured(), "spent_s": journal.spent_s(),
                           "budget_s": limits.budget_s,
                           "refused": sum(1 for r in journal.runs.values() if r.status == "refused"),
                           "screening_run_s_median": screens.get("wall_s"),
                           "precompile_s": sum(r.wall_s for r in journal.runs.values() if r.phase == PRECOMPILE),
                           "front_points": len(outcome.front),
                           "start_tokens_per_sec": start.tokens_per_sec if start else None,
                           "start_peak_mem_mb": start.peak_mem_mb if start else None}
    for goal in GOALS:
        answer = outcome.answer(goal)
        out[goal] = answer.name if answer.found else f"none: {answer.message}"
        for key in ("tokens_per_sec", "ratio_to_start", "peak_mem_mb"):
            out[f"{goal}_{key}"] = getattr(answer, key) if answer.found else None
    return out


def path_lines(outcome: Outcome) -> list[str]:
    """What each change added to a goal's answer bought along the way, from the goal's best warm point."""
    start = outcome.start
    lines = []
    for goal, path in outcome.paths.items():
        if not path or start is None or not start.tokens_per_sec:
            continue
        lines.append(f"- **{goal}**, from `{path[0].name}`:")
        for before, after in zip([None, *path[:-1]], path):
            added = [f"{k}={v}" for k, v in after.changes.items() if before is None or before.changes.get(k) != v]
            if before is None:
                added = ["(the best warm start)"] if after.changes else ["(the start)"]
            lines.append(f"  - {' + '.join(added)}: {after.tokens_per_sec / start.tokens_per_sec:.3f}x the start, "
                         f"{after.peak_mem_mb:,.0f} MiB")
    return lines


def compile_lines(journal: Journal) -> list[str]:
    """What compiling ahead cost, and how many of the screening runs' graphs came from inductor's cache."""
    ahead = [r for r in journal.runs.values() if r.phase == PRECOMPILE]
    screens = [r for r in journal.runs.values() if r.phase in SCREENING and r.extra.get("compile_hits") is not None]
    lines = []
    if ahead:
        count = sum(int(r.extra.get("precompiled") or 0) for r in ahead)
        lines.append(f"\nCompiled ahead: {count} candidates in {len(ahead)} batches, "
                     f"{sum(r.wall_s for r in ahead):.0f} s in all (in the budget, nothing timed meanwhile).")
    if screens:
        hits = sum(int(r.extra["compile_hits"]) for r in screens)
        misses = sum(int(r.extra.get("compile_misses") or 0) for r in screens)
        lines.append(f"{'' if ahead else chr(10)}The screening runs loaded {hits} graphs from inductor's cache and "
                     f"compiled {misses}.")
    return lines


def exp_command(found: dict[str, dict[str, Any]], preset: str) -> str:
    """The `dvc exp run` that adds the found variants to the matrix and times them beside the others."""
    def value(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else f'"{v}"' if isinstance(v, str) else str(v)
    sets = [f"-S '++variants.{name}={{{', '.join(f'{k}: {value(v)}' for k, v in knobs.items())}}}'"
            for name, knobs in found.items()]
    return " ".join([f"dvc exp run -n found -S preset={preset}", *sets])


def report_md(outcome: Outcome, journal: Journal, limits: Limits, machine: str, plot_name: str,
              command: str = "") -> str:
    """The search's report: the answers, the front and its plot, the paths, where the screening time went, and
    the command that times the answers in the matrix."""
    facts = summary(outcome, journal, limits)
    parts = [f"# Search on {machine}", "",
             f"{facts['runs']} screening runs; {facts['spent_s']:.0f} s of the {limits.budget_s:.0f} s budget spent "
             "(screening, fresh-process confirmation and parity)."]
    if outcome.status != "ok":
        return "\n".join([*parts, "", f"The search stopped: {outcome.message}", ""])
    parts += ["", "| goal | answer | tokens/s | vs start | peak MiB |", "| --- | --- | --- | --- | --- |"]
    for goal in GOALS:
        a = outcome.answer(goal)
        parts.append(f"| {goal} | `{a.name}` | {a.tokens_per_sec:,.0f} | {a.ratio_to_start:.3f}x | "
                     f"{a.peak_mem_mb:,.0f} |" if a.found else f"| {goal} | none: {a.message} | | | |")
    parts += ["", "Confirmed figures: the median of fresh-process repeats. The front's figures are screening runs.",
              "", "## The front", "", f"![front]({plot_name})", "",
              "| candidate | tokens/s | vs start | peak MiB | parity |", "| --- | --- | --- | --- | --- |"]
    tps = facts["start_tokens_per_sec"]
    for r in outcome.front:
        parts.append(f"| `{r.name}` | {r.tokens_per_sec:,.0f} | {r.tokens_per_sec / tps:.3f}x | {r.peak_mem_mb:,.0f} | "
                     f"{parity_word(journal, r.name)} |")
    parts += ["", "## What each change bought", "", *path_lines(outcome), "", "## Where a screening run's time went",
              "", "| part | median s |", "| --- | --- |"]
    parts += [f"| {k.removesuffix('_s')} | {v:.1f} |" for k, v in breakdown(journal).items()]
    parts += compile_lines(journal)
    if command:
        parts += ["", "## Time the answers in the matrix", "", "```bash", command, "```"]
    return "\n".join(parts) + "\n"


def plot_front(outcome: Outcome, journal: Journal, path: Path) -> None:
    """Every measured candidate (grey), the front (a line), and the two answers marked."""
    import matplotlib.pyplot as plt

    from benchlab.analysis.plots import save_png  # sets matplotlib's Agg backend

    fig, ax = plt.subplots(figsize=(7, 4.5))
    runs = [r for r in journal.runs.values() if r.phase in SCREENING and r.status == "ok" and r.peak_mem_mb]
    ax.scatter([r.peak_mem_mb for r in runs], [r.tokens_per_sec for r in runs], color="0.7", s=18, label="measured")
    front = sorted(outcome.front, key=lambda r: r.peak_mem_mb or 0)
    ax.plot([r.peak_mem_mb for r in front], [r.tokens_per_sec for r in front], "o-", color="tab:blue", label="front")
    for name, goals in outcome.goals_of().items():
        run = journal.screened(name)
        if run is not None and run.peak_mem_mb:
            ax.scatter([run.peak_mem_mb], [run.tokens_per_sec], s=90, marker="*", color="tab:red", zorder=3)
            ax.annotate(" / ".join(goals), (run.peak_mem_mb, run.tokens_per_sec), textcoords="offset points",
                        xytext=(6, 4))
    ax.set_xlabel("peak memory (MiB)")
    ax.set_ylabel("tokens/s")
    ax.set_title("The search's front: speed against memory")
    ax.legend(loc="lower right")
    save_png(fig, path)


def write(outcome: Outcome, journal: Journal, limits: Limits, out: Path, summary_path: Path, p: Params,
          start: RunSettings) -> None:
    """Every output but the journal: the candidates, the front and its plot, the found variants, the report, the
    metrics file."""
    env = environment()
    machine = f"{env.get('gpu') or env.get('cpu')} (torch {env.get('torch')})"
    write_text(out / "candidates.csv", candidates_csv(journal, outcome.start.tokens_per_sec if outcome.start else None))
    write_text(out / "front.csv", front_csv(outcome, journal))
    found = outcome.found_variants(start, p.model) if outcome.status == "ok" else {}
    write_text(out / "found.yaml", yaml.safe_dump({"variants": found}, sort_keys=False))
    plot_front(outcome, journal, out / "front.png")
    command = exp_command(found, p.preset) if found else ""
    write_text(out / "report.md", report_md(outcome, journal, limits, machine, "front.png", command))
    if command:
        print(f"search: to time the answers in the matrix: {command}")
    write_json(summary_path, summary(outcome, journal, limits))


def closing_lines(outcome: Outcome, journal: Journal, out: Path, start_name: str) -> list[str]:
    """What the stage prints last: each goal's answer against the start, and where the outputs are."""
    lines = []
    for goal in GOALS:
        a = outcome.answer(goal)
        lines.append(f"search: {goal}: " + (f"{a.name} ({a.ratio_to_start:.3f}x {start_name}, {a.peak_mem_mb:,.0f} "
                                            "MiB)" if a.found else a.message))
    return [*lines, f"search: {journal.measured()} screening runs, {journal.spent_s():.0f} s in all; found variants "
                    f"in {out / 'found.yaml'}, the front in {out / 'front.csv'}"]
