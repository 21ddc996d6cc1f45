"""The search's journal: every run it made, one JSON line each, so a stopped search resumes and later searches
start from what earlier ones found.

Each line carries the context its run is valid for (`runs.context`: model, batch, steps, cap, device,
versions, code). A search reads its own context's runs; the other contexts' lines stay in the file, and their
answers (phase `found`) warm-start searches of other model sizes on the same device.

The journal is checked, not trusted: a figure in it becomes an answer without being measured again. Every line must
be a run as the search writes it, and, given the search's `Problem` (its start and rules), each of this context's
runs must be a combination the knob rules accept, named as its changes name it, and come after the runs it rests on
(a confirmation or a parity verdict after the candidate's screening run, an answer after its passed verdict). A line
that is not is refused in one line naming the journal and the line, and how to start over. A last line cut short by
a kill is reported, set aside in `<journal>.cut`, and its run made again.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchlab.core.errors import LabError
from benchlab.core.knobs import KNOBS, RunSettings, searched
from benchlab.search.moves import Candidate, Problem, changes_from, choices

# The phases whose runs are screening runs (one short run each, on the screening worker).
SCREENING = ("warm", "moves", "fastest", "lean", "explore", "global", "finalist")
# The phases of the runs that rest on a screening run: fresh-process repeats, parity verdicts, answers.
AFTER_SCREENING = ("confirm", "parity", "found")
# The phase of the time spent compiling candidates ahead of their screening runs (runs.Runs.prepare): no candidate,
# a cost the budget counts. Named `batch <n>`, it holds the candidates' names and the compile processes' walls.
PRECOMPILE = "precompile"
# What makes two contexts the same machine: answers found on another device or software are not used.
SAME_MACHINE = ("device", "torch", "memory_cap_gib")


@dataclass(frozen=True)
class Entry:
    """A journal entry: one run of a candidate, as the journal keeps it (made whole: never edited once made)."""

    name: str
    changes: dict[str, Any]
    phase: str  # warm | moves | fastest | lean | explore | global | finalist (screening) | confirm | parity | found
    #             | precompile
    status: str  # ok | oom | diverged | error | refused (| passed, failed for parity)
    tokens_per_sec: float | None = None
    peak_mem_mb: float | None = None
    wall_s: float = 0.0
    message: str = ""
    passed: bool | None = None  # parity only
    extra: dict[str, Any] = field(default_factory=dict)  # where the wall time went; parity's gap


class Journal:
    """The runs of one search context, read from (and appended to) a file that may hold other contexts too."""

    def __init__(self, path: Path, context: dict[str, Any], checks: Problem | None = None) -> None:
        self.path, self.context = path, context
        self.runs: dict[tuple[str, str], Entry] = {}
        self.others: list[tuple[dict[str, Any], Entry]] = []
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        lines, cut = text.splitlines(), False
        for number, line in enumerate(lines, 1):
            try:
                ctx, run = _parsed(line)
            except ValueError as err:
                cut = number == len(lines) and not text.endswith("\n")  # being written when the process was killed
                if not cut:
                    raise self.refused(number, str(err)) from None
                self._set_aside(lines[:-1], line, number)
                break
            if ctx == context:
                if checks is not None:
                    why = self.unfounded(run, checks)
                    if why:
                        raise self.refused(number, why)
                self.runs[(run.phase, run.name)] = run
            else:
                self.others.append((ctx, run))
        path.parent.mkdir(parents=True, exist_ok=True)
        if text and not text.endswith("\n") and not cut:
            _rewrite(path, text + "\n")  # a whole last line whose end of line a kill cut: the next line follows it

    def refused(self, number: int, why: str) -> LabError:
        return LabError(f"{self.path}, line {number}: {why}; the search wrote no such line. Delete that line (or "
                        f"the whole file, to start the search over) and rerun")

    def _set_aside(self, kept: list[str], cut: str, number: int) -> None:
        """Report a last line a kill cut short, keep it in `<journal>.cut` and leave the journal without it."""
        aside = self.path.with_name(self.path.name + ".cut")
        _rewrite(aside, cut + "\n")
        _rewrite(self.path, "".join(line + "\n" for line in kept))
        print(f"search: warning: {self.path}, line {number} was cut short (the search was stopped while writing "
              f"it); set aside in {aside}, and its run is made again", flush=True)

    def unfounded(self, run: Entry, checks: Problem) -> str | None:
        """Why this context's run cannot be one the search made, or None: checked by the knob rules, and against
        the runs before it."""
        if run.phase == "found":
            return self._unfounded_answer(run, checks)
        if run.phase == PRECOMPILE:
            return None if not run.changes and run.name.startswith("batch ") else \
                f"a precompile entry named {run.name!r} with changes {run.changes}, not `batch <n>` with none"
        base, _, repeat = run.name.rpartition("#") if run.phase == "confirm" else (run.name, "", "1")
        if not repeat.isdigit() or int(repeat) < 1:
            return f"a confirmation named {run.name!r}, not <candidate>#<repeat>"
        why = _unknown_knobs(run.changes, searched_only=True)
        if why:
            return why
        cand = Candidate(tuple((k, run.changes[k]) for k in KNOBS if k in run.changes))
        if cand.name != base:
            return f"a run named {base!r} whose changes are {cand.name!r}"
        reason = checks.rules(cand.settings(checks.start))
        if reason and run.status != "refused":
            return f"{cand.name} is a combination the knob rules refuse ({reason})"
        if run.phase in AFTER_SCREENING and self.screened(base) is None:
            return f"a {run.phase} run of {base} that no screening run of it comes before"
        return None

    def _unfounded_answer(self, run: Entry, checks: Problem) -> str | None:
        """An answer (phase found) holds its knob values; it must be a combination the rules accept whose parity
        verdict passed before it."""
        why = _unknown_knobs(run.changes, searched_only=False)
        if why:
            return why
        settings = replace(RunSettings(), **run.changes)
        reason = checks.rules(settings)
        if reason:
            return f"the answer {run.name} is a combination the knob rules refuse ({reason})"
        cand = changes_from(checks.start, settings)
        verdict = self.get("parity", cand.name) if cand is not None else None
        if verdict is None or verdict.passed is not True:
            return f"the answer {run.name} without a passed parity verdict of it before it"
        return None

    def get(self, phase: str, name: str) -> Entry | None:
        return self.runs.get((phase, name))

    def screened(self, name: str) -> Entry | None:
        """The candidate's screening run from any screening phase (the same measurement)."""
        return next((run for phase in SCREENING if (run := self.get(phase, name)) is not None), None)

    def add(self, run: Entry) -> Entry:
        with self.path.open("a") as f:
            f.write(json.dumps({"context": self.context, **asdict(run)}) + "\n")
            f.flush()
        self.runs[(run.phase, run.name)] = run
        return run

    def spent_s(self) -> float:
        """Wall time of every run this search made: screening, confirmation and parity, and its compiling ahead."""
        return sum(r.wall_s for r in self.runs.values())

    def measured(self) -> int:
        return sum(1 for r in self.runs.values() if r.phase in SCREENING and r.status != "refused")

    def found_elsewhere(self) -> list[tuple[str, dict[str, Any]]]:
        """Answers of searches at other model sizes on this machine: (label, knob values), newest last."""
        here = {k: self.context.get(k) for k in SAME_MACHINE}
        return [(f"{run.name} ({ctx.get('model')})", run.changes) for ctx, run in self.others
                if run.phase == "found" and {k: ctx.get(k) for k in SAME_MACHINE} == here
                and ctx.get("model") != self.context.get("model")]


def _parsed(line: str) -> tuple[dict[str, Any], Entry]:
    """A journal line's context and run; ValueError saying what is wrong with it."""
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(entry, dict) or not isinstance(entry.get("context"), dict):
        raise ValueError("not a journal line (no context)")
    ctx = entry.pop("context")
    try:
        run = Entry(**entry)
    except TypeError:
        raise ValueError(f"not a journal line (its fields are {', '.join(sorted(entry))})") from None
    phases = (*SCREENING, *AFTER_SCREENING, PRECOMPILE)
    if run.phase not in phases:
        raise ValueError(f"phase={run.phase!r} is not one the search writes; expected one of: {', '.join(phases)}")
    kinds = {"name": str, "status": str, "message": str, "changes": dict, "extra": dict}
    wrong = [k for k, kind in kinds.items() if not isinstance(getattr(run, k), kind)]
    wrong += [k for k in ("tokens_per_sec", "peak_mem_mb", "wall_s") if not _figure(getattr(run, k), k != "wall_s")]
    wrong += ["passed"] if run.passed not in (None, True, False) else []
    if wrong or not run.name:
        raise ValueError(f"{', '.join(wrong) or 'name'} not as the search writes it")
    if run.status == "ok" and run.phase in (*SCREENING, "confirm") and not run.tokens_per_sec:
        raise ValueError(f"a run that ended ok with no tokens/s ({run.name})")
    return ctx, run


def _figure(value: Any, empty_ok: bool) -> bool:
    """A measured figure: a finite number, not negative (or None where none was measured)."""
    if value is None:
        return empty_ok
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _unknown_knobs(changes: dict[str, Any], searched_only: bool) -> str | None:
    """Why these knob values are not ones the search writes: a knob it does not know (or, for a run, one it
    leaves alone), or a value not among the knob's choices (True is not 1)."""
    for knob, value in changes.items():
        if knob not in KNOBS or searched_only and not searched(knob):
            return f"changes {knob}, which the search does not move"
        options = choices(knob)
        if options and not any(value == o and type(value) is type(o) for o in options):
            return f"{knob}={value!r} is not one of its choices"
        if not options and searched(knob) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f"{knob}={value!r} is not a positive integer"
    return None


def _rewrite(path: Path, text: str) -> None:
    """Replace the file whole (a temporary sibling renamed over it), so a kill leaves the old or the new text."""
    tmp = path.with_name(f".{path.name}.rewrite")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
