"""The search: which knobs, from a start (the recipe), make this model fastest, or leanest, on this device.

Everything here is plain Python over `RunSettings`. What needs a device is handed in as one object
(protocol.Device): it screens (one short timed run of a candidate, on the stage's screening worker), repeats (one
full bench run in a fresh process), judges (the parity check) and compiles ahead; the tests hand in a scripted
machine (landscapes.Machine). What it returns is typed (outcome.Outcome).

1. **Warm starts.** The start, then the best answers known for this device: the variants of
   `aggregate.ours` and what earlier searches found on this device at other model sizes, each as its
   changes to the start. They are screened first.
2. **Moves,** for each goal around its best warm point (fastest: the most tokens/s; lean: the least peak
   memory at `lean_floor` of the start's tokens/s or more): every other value of every searched knob, one at
   a time. A search for speed never moves a knob back to its unoptimized value (the knob table's default)
   where the start has left it, nor splits the batch into more micro-batches; a search for memory may. A
   move the knobs' rules refuse for a missing partner is retried with the partner the refusal names.
3. **Combine,** greedily: from the best move, add each other move that helped, best first; keep a change
   when it helps again.
3b. **Explore the front** (`explore.py`): passes of moves around every point of the measured front, each
   priced by what it is predicted to add to the front and screened best first, until a pass adds no point.
3c. **Sample globally** (`sampler.py`): what budget is left goes to Optuna's multivariate TPE, seeded with every
   run so far, which proposes whole configurations (where knobs interact, no one-knob move leads there); a point
   it adds to the front starts another exploration around it. The search stops with budget left only when it
   has measured every configuration the rules allow. What 3b and 3c find joins each goal's finalists.
4. **Confirm.** The best `confirm` candidates of each goal run `repeats` times more, each in a fresh process;
   their median ranks them.
5. **Parity.** Down that ranking, the first that learns the same as the reference is the goal's answer.
6. **The front.** Every measured candidate not beaten on both tokens/s and peak memory by another (`pareto.py`:
   speeds within the measured spread are ties), those that failed parity left out; its points are judged for
   parity while the budget lasts. `lean` is never an answer the other answer beats on both figures.

`budget_s` bounds the whole search: screening stops early enough to leave the confirmation and parity runs
their measured (or, before any, estimated) cost. Every run is appended to the journal as it ends, so a search
that is stopped and started again repeats nothing it finished and keeps the budget it had spent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from benchlab.search import pareto
from benchlab.search.budget import Budget, Limits, median_or_zero
from benchlab.search.confirm import Confirmation
from benchlab.search.explore import EXPLORE, Effects, Explorer, point
from benchlab.search.journal import PRECOMPILE, SCREENING, Journal, Entry
from benchlab.search.moves import (FINALIST_ONLY, Candidate, Problem, Warm, changes_from, knob_values, moves, partner,
                                   space)
from benchlab.search.outcome import GOALS, Outcome
from benchlab.search.protocol import Device
from benchlab.search.sampler import GLOBAL, Sampler

FINALIST = "finalist"  # the journal's phase for the finalist-only values' screening runs


class Search(Confirmation):
    """One search: `problem` (start, rules, batch) answered by measuring on `device` (protocol.Device), every run in
    `journal`, within `limits`; `warm` known answers screened first, `log` each line the search prints."""

    def __init__(self, problem: Problem, device: Device, journal: Journal, limits: Limits,
                 warm: list[Warm] | None = None, log: Callable[[str], None] = print) -> None:
        self.problem, self.device, self.journal, self.limits = problem, device, journal, limits
        self.start, self.rules, self.batch = problem.start, problem.rules, problem.batch
        self.warm, self.log = warm or [], log
        self.prepared: set[str] = set()  # the candidates this process has compiled ahead
        self.held = tuple(FINALIST_ONLY) if limits.finalist_only else ()
        self.paths: dict[str, list[Entry]] = {}
        self.tried: dict[str, list[Entry]] = {}
        self.budget = Budget(journal, limits)
        self.order: list[Entry] = []  # the screening runs as this search met them: replayed the same on a resume
        self.met: set[str] = set()

    # ---- one candidate ----

    def screen(self, cand: Candidate, phase: str, start: Entry | None, cost_s: float | None = None) -> Entry | None:
        """The candidate's screening run: from the journal (any screening phase), refused by the rules, or
        measured now. None when the budget (at `cost_s` for this run, or the median screening run's) is spent."""
        run = self.journal.screened(cand.name)
        if run is None:
            settings = cand.settings(self.start)
            reason = self.rules(settings)
            if reason:
                run = self.journal.add(Entry(cand.name, dict(cand.changes), phase, "refused", message=reason))
            elif (start is not None and not self.budget.can_screen(start, cost_s, phase == FINALIST)) or \
                    (start is None and self.journal.spent_s() >= self.limits.budget_s):
                return None
            else:
                self.log(f"search: {phase} #{self.journal.measured() + 1}: {cand.name}")
                run = self.record(self.device.screen(cand, settings), cand, phase, cand.name)
        if run.name not in self.met:
            self.met.add(run.name)
            self.order.append(run)
        return run

    def record(self, run: Entry, cand: Candidate, phase: str, key: str) -> Entry:
        """A run just made, journaled under its phase and key (a repeat's key numbers it)."""
        return self.journal.add(replace(run, name=key, changes=dict(cand.changes), phase=phase))

    def prepare(self, cands: list[Candidate], start: Entry | None) -> None:
        """Compile ahead, at once, the candidates about to be screened (each refused one as its partner), but those
        screened already and those beyond the runs the budget has left; journaled as a precompile entry."""
        todo: dict[str, Candidate] = {}
        for cand in cands:
            reason = self.rules(cand.settings(self.start))
            cand = cand if reason is None else partner(cand, reason, self.start, self.rules)  # type: ignore[assignment]
            if cand is not None and self.journal.screened(cand.name) is None and cand.name not in self.prepared:
                todo.setdefault(cand.name, cand)
        left = self.budget.runs_left(start) if start is not None else self.limits.max_candidates
        batch = [(c, c.settings(self.start)) for c in list(todo.values())[:left]]
        self.prepared |= {c.name for c, _ in batch}
        run = self.device.prepare(batch) if batch else None
        if run is not None:
            number = 1 + sum(1 for phase, _ in self.journal.runs if phase == PRECOMPILE)
            self.record(run, Candidate(), PRECOMPILE, f"batch {number}")

    def screen_or_partner(self, cand: Candidate, phase: str, start: Entry) -> list[Entry]:
        """Screen a move; a refused one is retried with the partner its refusal names."""
        run = self.screen(cand, phase, start)
        if run is None:
            return []
        if run.status != "refused":
            return [run]
        paired = partner(cand, run.message, self.start, self.rules)
        again = self.screen(paired, phase, start) if paired is not None else None
        return [run] + ([again] if again is not None else [])

    # ---- the phases ----

    def run(self) -> Outcome:
        known = [c for w in self.warm if (c := changes_from(self.start, w.settings)) is not None]
        first = [m for goal in GOALS for m in moves(Candidate(), self.start, goal, self.batch, self.held)]
        self.prepare([Candidate(), *known, *([] if known else first)], None)  # cold: the moves around the start too
        start = self.screen(Candidate(), "warm", None)
        if start is None or start.status != "ok":
            why = "the budget allowed no run" if start is None else f"{start.status}: {start.message}"
            return Outcome("failed", f"the start itself did not run ({why})")
        confirmed = self.confirmed_start(start)  # first: a fresh process's cost is then measured, not guessed
        self.log(self.budget.plan_line(start))
        warm = [start]
        for known in self.warm:
            cand = changes_from(self.start, known.settings)
            if cand is not None and (run := self.screen(cand, "warm", start)) is not None:
                warm.append(run)
        ranked = {goal: self.around(goal, start, warm) for goal in GOALS}  # all screening first: one worker
        ranked["lean"] += self.leaner(start)
        explored = self.explore(start)
        explored += self.sample(start)
        ranked = {goal: self.finalists(goal, start, ranked[goal] + explored) for goal in GOALS}
        ranked["fastest"] = self.finalists("fastest", start, ranked["fastest"] + self.finalist_values(start, ranked))
        answers = self.undominated({goal: self.confirm(goal, confirmed, ranked[goal]) for goal in GOALS})
        for goal, answer in answers.items():
            if answer.found and self.journal.get("found", goal) is None:
                settings = answer.settings(self.start)
                self.journal.add(Entry(goal, knob_values(settings), "found", "ok"))  # a warm start for other sizes
        return Outcome("ok", start=confirmed, answers=answers, paths=self.paths, front=self.front(confirmed))

    def tie(self) -> float:
        """The measured spread of a screening run's speed, as a share (the median over the runs that record it):
        speeds closer than this are ties on the front."""
        return median_or_zero([float(r.extra["tps_spread"]) for r in self.order if r.extra.get("tps_spread")])

    def front(self, start: Entry) -> list[Entry]:
        """The measured candidates no other beats on both tokens/s and peak memory (ties within the spread both
        kept), fastest first; each point is judged for parity while the budget has room for a verdict, and one
        that fails leaves the front."""
        while True:
            failed = {n for (phase, n), r in self.journal.runs.items() if phase == "parity" and not r.passed}
            points = pareto.front([r for r in self.journal.runs.values()
                                   if r.phase in SCREENING and r.status == "ok" and r.name not in failed],
                                  point, tie=self.tie())
            unjudged = [r for r in points if self.journal.get("parity", r.name) is None]
            if not unjudged or self.journal.spent_s() + self.budget.verdict_s(start) > self.limits.budget_s:
                return points
            self.verdict(Candidate(tuple(unjudged[0].changes.items())))

    def around(self, goal: str, start: Entry, warm: list[Entry]) -> list[Entry]:
        """Moves around the goal's best warm point, then the greedy combination; the best runs, ranked."""
        points = [r for r in warm if self.eligible(goal, r, start)]
        base = max(points, key=lambda r: self.score(goal, r)) if points else start
        base_cand = Candidate(tuple(base.changes.items()))
        tried: list[Entry] = []
        goal_moves = moves(base_cand, self.start, goal, self.batch, self.held)
        self.prepare(goal_moves, start)
        for cand in goal_moves:
            tried += self.screen_or_partner(cand, "moves", start)
        better = sorted((r for r in tried if self.eligible(goal, r, start) and self.score(goal, r) > self.score(goal, base)),
                        key=lambda r: self.score(goal, r), reverse=True)
        current = better[0] if better else base
        path = [base] + ([current] if better else [])
        for other in better[1:]:
            cand = Candidate(tuple(current.changes.items())).plus(*other.changes.items())
            if cand.name == current.name:
                continue
            run = self.screen(cand, goal, start)
            if run is None:
                break
            tried.append(run)
            if self.eligible(goal, run, start) and self.score(goal, run) > self.score(goal, current):
                current = run
                path.append(run)
        self.paths[goal] = path
        self.tried[goal] = tried
        return self.finalists(goal, start, [*points, *tried])

    def leaner(self, start: Entry) -> list[Entry]:
        """Fastest's answer made leaner: each one-knob move that cut memory around lean's base, most first, added to
        the end of fastest's path and kept where it stays at lean's floor and cuts memory again. A move too slow on
        its own (checkpointing alone below the floor) can pay its way on a faster base; the points between the
        goals' answers come from here. A move the fitted effects (explore.Effects) predict below the floor, or no
        leaner, costs no run."""
        fastest = (self.paths.get("fastest") or [None])[-1]
        if fastest is None or not self.eligible("lean", fastest, start):
            return []
        base_mem = float((self.paths.get("lean") or [start])[0].peak_mem_mb or 0)
        savers = sorted((r for r in self.tried.get("lean", []) if r.phase == "moves" and r.status == "ok"
                         and r.peak_mem_mb is not None and float(r.peak_mem_mb) < base_mem),
                        key=lambda r: float(r.peak_mem_mb or 0))  # one-knob moves (with partners), leanest first
        current, out = fastest, []
        for saver in savers:
            cand = Candidate(tuple(current.changes.items())).plus(*saver.changes.items())
            if cand.name == current.name or self.rules(cand.settings(self.start)) is not None:
                continue
            guess = Effects(self.order).predict(cand, current)
            if guess is not None and (guess[0] < self.floor_tps(start) or guess[1] >= float(current.peak_mem_mb or 0)):
                continue  # predicted below the floor, or no leaner: no run
            run = self.screen(cand, "lean", start)
            if run is None:
                break
            out.append(run)
            if self.eligible("lean", run, start) and self.score("lean", run) > self.score("lean", current):
                current = run
        self.paths["fastest, made leaner"] = [fastest] + [r for r in out if r is current or r.name == current.name][:1]
        return out

    def explore(self, start: Entry) -> list[Entry]:
        """The exploration of the front, from the screening runs met so far (the same on a resumed search: its own
        runs come from the journal as it asks for them again, in the order it first made them)."""
        return Explorer(list(self.order), lambda cand: self.screen(cand, EXPLORE, start), self.start, self.rules,
                        self.batch, self.floor_tps(start), self.log, self.tie(), self.held,
                        lambda cands: self.prepare(cands, start)).run()

    def sample(self, start: Entry) -> list[Entry]:
        """The global phase (sampler.py) while the budget lasts: each proposal screened; one that joins the front
        starts another exploration around it. Ends when the budget does, or when every configuration the rules
        allow has been measured."""
        sampler = Sampler(space(self.batch, self.held), self.start, self.rules, self.floor_tps(start), self.limits.seed)
        out: list[Entry] = []
        self.log("search: global phase: Optuna's TPE, seeded with the "
                 f"{sum(1 for r in self.order if r.status != 'refused')} runs so far")
        while True:
            sampler.tell(self.order)
            cand = sampler.propose(self.met)
            if cand is None:
                self.log("search: every configuration the rules allow has been measured")
                return out
            run = self.screen(cand, GLOBAL, start)
            if run is None:
                return out
            out.append(run)
            if run in pareto.front(self.order, point, self.floor_tps(start), self.tie()):
                out += self.explore(start)

    def finalist_values(self, start: Entry, ranked: dict[str, list[Entry]]) -> list[Entry]:
        """moves.FINALIST_ONLY's values (CUDA graphs, max-autotune), each tried on the fastest finalist where its
        cost (a multiple of a fresh whole-model run's) fits the budget: screened there alone, never on every
        candidate."""
        top = ranked["fastest"][:1]
        out: list[Entry] = []
        for (knob, value), factor in (FINALIST_ONLY.items() if self.held and top else ()):
            cand = Candidate(tuple(top[0].changes.items())).plus((knob, value))
            if cand.name == top[0].name or self.rules(cand.settings(self.start)) is not None:
                continue
            run = self.screen(cand, FINALIST, start, cost_s=factor * self.budget.fresh_s(start))
            if run is not None:
                out.append(run)
                self.log(f"search: finalist {cand.name}: " + (f"{float(run.tokens_per_sec or 0) / float(top[0].tokens_per_sec or 1):.3f}x "
                         f"the finalist without it" if run.status == "ok" else run.status))
        return out

    def floor_tps(self, start: Entry) -> float:
        return self.limits.lean_floor * float(start.tokens_per_sec or 0)

    def finalists(self, goal: str, start: Entry, runs: list[Entry]) -> list[Entry]:
        """The goal's best `confirm` runs, each once."""
        pool = {r.name: r for r in runs if self.eligible(goal, r, start)}
        return sorted(pool.values(), key=lambda r: self.score(goal, r), reverse=True)[: self.limits.confirm]

    def eligible(self, goal: str, run: Entry, start: Entry) -> bool:
        if run.status != "ok" or run.tokens_per_sec is None:
            return False
        if goal == "lean":
            return run.peak_mem_mb is not None and \
                run.tokens_per_sec >= self.limits.lean_floor * float(start.tokens_per_sec or 0)
        return True

    def score(self, goal: str, run: Entry) -> tuple[float, float]:
        """Larger is better: tokens/s for fastest, then less memory; less peak memory for lean, then tokens/s."""
        tps, mem = float(run.tokens_per_sec or 0), -float(run.peak_mem_mb or 0)
        return (tps, mem) if goal == "fastest" else (mem, tps)
