"""The search: which knobs, on top of the recipe, make this model fastest, or leanest, on this device.

Everything here is plain Python over `RunSettings`. The two things that need a device are handed in:
`measure` (one short timed run of a candidate, in a fresh process in the stage) and `judge` (the parity
check); the tests drive the search with fakes of both.

1. **Singles.** The recipe, then every other value of every searched knob, one change at a time, in the
   knob table's order. A candidate the rules refuse (the load-time combination check, or the device's own
   skip rules) is recorded with the rule's words and never run.
2. **Combine**, once per goal. `fastest`: start from the fastest single and add, best first, every other
   change that beat the recipe, then every single the rules refused on top of the recipe (it may need a
   change already made, bf16 weights for their optimizer); keep a change when it is faster again.
   `lean`: the same over peak memory, among runs at `lean_floor` or more of the recipe's tokens/s.
3. **Confirm.** The best `confirm` runs of each goal run `repeats` times more; their median ranks them.
4. **Parity.** Down that ranking, the first that learns the same as the reference is the goal's answer.

Screening stops at `budget_s` of measured wall time or `max_candidates` runs, whichever comes first; the
time counts what the journal holds, so a resumed search keeps the budget it had. Every run is appended to
the journal as it ends: a search that is stopped and started again repeats nothing it finished.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from benchlab.errors import LabError
from benchlab.knobs import KNOBS, RunSettings, check_combination, unsupported_reason
from benchlab.skips import DeviceFacts

# Knobs the search leaves alone: the batch and the process layout are the question's inputs, not answers.
NOT_SEARCHED = frozenset({"batch_size", "grad_accum", "loss_chunk_tokens", "parallel", "nproc", "ddp_bucket_mb",
                          "ddp_grad_as_bucket_view", "ddp_comm_hook", "fsdp_reshard_after_forward",
                          "fsdp_param_dtype", "fsdp_blocks_per_unit", "nccl_max_ctas"})
GOALS = ("fastest", "lean")

Change = tuple[str, Any]
Rules = Callable[[RunSettings], "str | None"]


@dataclass(frozen=True)
class Candidate:
    """A configuration as its changes to the recipe, in the knob table's order."""

    changes: tuple[Change, ...] = ()

    @property
    def name(self) -> str:
        return "+".join(f"{k}={_word(v)}" for k, v in self.changes) or "start"

    def plus(self, change: Change) -> Candidate:
        """This candidate with one more change (replacing its own value of that knob)."""
        kept = dict(self.changes) | {change[0]: change[1]}
        return Candidate(tuple((k, kept[k]) for k in KNOBS if k in kept))

    def settings(self, recipe: RunSettings) -> RunSettings:
        return replace(recipe, **dict(self.changes))


@dataclass
class Run:
    """One candidate's run, as the journal keeps it."""

    name: str
    changes: dict[str, Any]
    phase: str  # singles | fastest | lean | confirm | parity
    status: str  # ok | oom | diverged | skipped | failed | refused
    tokens_per_sec: float | None = None
    peak_mem_mb: float | None = None
    wall_s: float = 0.0
    message: str = ""
    passed: bool | None = None  # parity only
    extra: dict[str, Any] = field(default_factory=dict)


Measure = Callable[[Candidate, RunSettings], Run]
Judge = Callable[[Candidate, RunSettings], Run]


@dataclass(frozen=True)
class Limits:
    budget_s: float
    max_candidates: int
    confirm: int
    repeats: int
    lean_floor: float


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)



def choices(knob: str) -> tuple[Any, ...]:
    """Every value the knob table allows for a knob with a closed set of choices: a Literal's, or a bool's."""
    hint = typing.get_type_hints(RunSettings)[knob]
    if hint is bool:
        return (False, True)
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()


def singles(recipe: RunSettings) -> list[Candidate]:
    """Every one-knob change of the recipe over the searched knobs, in the knob table's order."""
    out = []
    for knob in KNOBS:
        if knob not in NOT_SEARCHED:
            out += [Candidate(((knob, v),)) for v in choices(knob) if v != getattr(recipe, knob)]
    return out


def rules_for(device: DeviceFacts, batch: int) -> Rules:
    """The knobs' own rules: the load-time combination check, then this device's skip rules."""
    def rules(settings: RunSettings) -> str | None:
        try:
            check_combination("", settings, batch)
        except LabError as err:
            return str(err)
        return unsupported_reason(settings, device)
    return rules


class Journal:
    """Every run so far, one JSON line each, for one search context (model, batch, device, steps, cap...).

    Lines from another context are set aside when it opens; a last line cut short by a kill is dropped."""

    def __init__(self, path: Path, context: dict[str, Any]) -> None:
        self.path, self.context = path, context
        self.runs: dict[tuple[str, str], Run] = {}
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # written when the process was killed
            if entry.pop("context", None) == context:
                run = Run(**entry)
                self.runs[(run.phase, run.name)] = run
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = [json.dumps({"context": context, **asdict(r)}) for r in self.runs.values()]
        path.write_text("".join(line + "\n" for line in kept))

    def get(self, phase: str, name: str) -> Run | None:
        return self.runs.get((phase, name))

    def add(self, run: Run) -> Run:
        with self.path.open("a") as f:
            f.write(json.dumps({"context": self.context, **asdict(run)}) + "\n")
            f.flush()
        self.runs[(run.phase, run.name)] = run
        return run

    def spent_s(self) -> float:
        return sum(r.wall_s for r in self.runs.values() if r.phase in ("singles", *GOALS))

    def measured(self) -> int:
        return sum(1 for r in self.runs.values() if r.phase in ("singles", *GOALS) and r.status != "refused")


class Search:
    def __init__(self, recipe: RunSettings, rules: Rules, measure: Measure, judge: Judge, journal: Journal,
                 limits: Limits, log: Callable[[str], None] = print) -> None:
        self.recipe, self.rules, self.measure, self.judge = recipe, rules, measure, judge
        self.journal, self.limits, self.log = journal, limits, log

    def screen(self, cand: Candidate, phase: str) -> Run | None:
        """The candidate's run in this phase: from the journal, refused by the rules, or measured now.
        None when the budget is spent."""
        done = self.journal.get(phase, cand.name) or self._done_elsewhere(cand)
        if done is not None:
            return done
        settings = cand.settings(self.recipe)
        reason = self.rules(settings)
        if reason:
            return self.journal.add(Run(cand.name, dict(cand.changes), phase, "refused", message=reason))
        if self.journal.spent_s() >= self.limits.budget_s or self.journal.measured() >= self.limits.max_candidates:
            return None
        self.log(f"search: {phase} #{self.journal.measured() + 1}: {cand.name}")
        run = self.measure(cand, settings)
        run.name, run.changes, run.phase = cand.name, dict(cand.changes), phase
        return self.journal.add(run)

    def _done_elsewhere(self, cand: Candidate) -> Run | None:
        """A screening run of the same candidate from another phase (the same measurement)."""
        for phase in ("singles", *GOALS):
            run = self.journal.get(phase, cand.name)
            if run is not None:
                return run
        return None

    def run(self) -> dict[str, Any]:
        recipe = self.screen(Candidate(), "singles")
        if recipe is None or recipe.status != "ok":
            why = "the budget allowed no run" if recipe is None else f"{recipe.status}: {recipe.message}"
            return {"status": "failed", "message": f"the recipe itself did not run ({why})"}
        runs = [r for c in singles(self.recipe) if (r := self.screen(c, "singles")) is not None]
        best = {goal: self.combine(goal, recipe, runs) for goal in GOALS}
        return {"status": "ok", "start": recipe, **{g: self.confirm(g, recipe, best[g]) for g in GOALS}}

    def eligible(self, goal: str, run: Run, recipe: Run) -> bool:
        if run.status != "ok" or run.tokens_per_sec is None:
            return False
        if goal == "lean":
            return run.peak_mem_mb is not None and run.tokens_per_sec >= self.limits.lean_floor * (recipe.tokens_per_sec or 0)
        return True

    def score(self, goal: str, run: Run) -> float:
        """Larger is better: tokens/s for fastest, less peak memory for lean."""
        return float(run.tokens_per_sec or 0) if goal == "fastest" else -float(run.peak_mem_mb or 0)

    def combine(self, goal: str, recipe: Run, runs: list[Run]) -> list[Run]:
        """Greedy: from the best single, add each helpful change, best first; then the refused singles."""
        good = sorted((r for r in runs if self.eligible(goal, r, recipe) and self.score(goal, r) > self.score(goal, recipe)),
                      key=lambda r: -self.score(goal, r))
        refused = [r for r in runs if r.status == "refused"]
        current = good[0] if good else recipe
        tried = [current]
        for other in good[1:] + refused:
            cand = Candidate(tuple(current.changes.items()))
            for change in other.changes.items():
                cand = cand.plus(change)
            if cand.name == current.name:
                continue
            run = self.screen(cand, goal)
            if run is None:
                break
            tried.append(run)
            if self.eligible(goal, run, recipe) and self.score(goal, run) > self.score(goal, current):
                current = run
        ranked = sorted({r.name: r for r in [*good, *tried] if self.eligible(goal, r, recipe)}.values(),
                        key=lambda r: -self.score(goal, r))
        return ranked[: self.limits.confirm]

    def confirm(self, goal: str, recipe: Run, ranked: list[Run]) -> dict[str, Any]:
        """Repeat the best runs, rank them by their medians, and give the first that passes parity."""
        confirmed = []
        for run in ranked:
            cand = Candidate(tuple(run.changes.items()))
            repeats = [run]
            for i in range(self.limits.repeats):
                key = f"{cand.name}#{i + 1}"
                again = self.journal.get("confirm", key)
                if again is None:
                    again = self.measure(cand, cand.settings(self.recipe))
                    again.name, again.changes, again.phase = key, dict(cand.changes), "confirm"
                    self.journal.add(again)
                repeats.append(again)
            ok = [r for r in repeats if r.status == "ok"]
            tps = statistics.median(float(r.tokens_per_sec or 0) for r in ok) if ok else 0.0
            floor = self.limits.lean_floor * float(recipe.tokens_per_sec or 0) if goal == "lean" else 0.0
            if len(ok) == len(repeats) and tps >= floor:
                confirmed.append((cand, tps, max(float(r.peak_mem_mb or 0) for r in ok)))
        confirmed.sort(key=lambda c: -c[1] if goal == "fastest" else c[2])
        for cand, tps, mem in confirmed:
            verdict = self.journal.get("parity", cand.name)
            if verdict is None:
                verdict = self.judge(cand, cand.settings(self.recipe))
                verdict.name, verdict.changes, verdict.phase = cand.name, dict(cand.changes), "parity"
                self.journal.add(verdict)
            if verdict.passed:
                return {"name": cand.name, "changes": dict(cand.changes), "tokens_per_sec": tps, "peak_mem_mb": mem,
                        "ratio_to_start": tps / float(recipe.tokens_per_sec or 1), "parity": verdict.message}
        return {"name": None, "message": f"none of the {len(confirmed)} confirmed candidates passed parity"
                if confirmed else "no candidate was confirmed"}


def knob_values(settings: RunSettings) -> dict[str, Any]:
    """The knobs a variant in params.yaml would set: those that differ from the knob table's defaults."""
    return {f.name: getattr(settings, f.name) for f in fields(RunSettings) if getattr(settings, f.name) != f.default}


def found_variants(result: dict[str, Any], recipe: RunSettings, model: str) -> dict[str, dict[str, Any]]:
    """params.yaml variants for what the search found, named after the goal and the model."""
    out = {}
    for goal in GOALS:
        answer = result.get(goal) or {}
        if answer.get("name"):
            out[f"{goal}_{model}"] = knob_values(replace(recipe, **answer["changes"]))
    return out


CSV_COLUMNS = ("name", "phase", "status", "tokens_per_sec", "ratio_to_start", "peak_mem_mb", "wall_s", "passed",
               "message")


def candidates_csv(journal: Journal, recipe_tokens_per_sec: float | None) -> str:
    """Every run the search made or refused, in the order it made them: what was tried, and why it was dropped."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for run in journal.runs.values():
        ratio = (run.tokens_per_sec / recipe_tokens_per_sec
                 if run.tokens_per_sec is not None and recipe_tokens_per_sec else None)
        cells = [run.name, run.phase, run.status, run.tokens_per_sec, ratio, run.peak_mem_mb, run.wall_s, run.passed,
                 run.message]
        writer.writerow(["" if c is None else f"{c:.4g}" if isinstance(c, float) else c for c in cells])
    return out.getvalue()


def summary(result: dict[str, Any], journal: Journal, limits: Limits) -> dict[str, Any]:
    """The flat metrics file: what each goal found, against the start, and what the search spent."""
    recipe = result.get("start")
    out: dict[str, Any] = {"status": result["status"], "runs": journal.measured(), "spent_s": journal.spent_s(),
                           "budget_s": limits.budget_s,
                           "refused": sum(1 for r in journal.runs.values() if r.status == "refused"),
                           "start_tokens_per_sec": recipe.tokens_per_sec if recipe else None,
                           "start_peak_mem_mb": recipe.peak_mem_mb if recipe else None}
    for goal in GOALS:
        answer = result.get(goal) or {}
        out[goal] = answer.get("name") or f"none: {answer.get('message', result.get('message', ''))}"
        for key in ("tokens_per_sec", "ratio_to_start", "peak_mem_mb"):
            out[f"{goal}_{key}"] = answer.get(key)
    return out
