"""The search's budget: what its runs have cost, what confirmation and parity will cost, and whether another
screening run fits.

`budget_s` bounds the whole search: screening stops early enough to leave the confirmation and parity runs their
measured (or, before any, estimated) cost. Every cost is read from the journal, so a search stopped and started
again keeps the budget it had spent.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchlab.search.journal import SCREENING, Entry, Journal
from benchlab.search.moves import FINALIST_ONLY
from benchlab.search.outcome import GOALS


@dataclass(frozen=True)
class Limits:
    budget_s: float
    max_candidates: int
    confirm: int
    repeats: int
    lean_floor: float
    parity_tokens: float = 0.0  # tokens one parity run trains: with the start's speed, what a verdict costs
    seed: int = 0  # the global phase's sampler
    finalist_only: bool = False  # moves.FINALIST_ONLY's values screened on the fastest finalist alone (the stage's search)


class Budget:
    """The search's costs, read from its journal against its limits."""

    def __init__(self, journal: Journal, limits: Limits) -> None:
        self.journal, self.limits = journal, limits

    def fresh_s(self, start: Entry) -> float:
        """A fresh process's cost: measured, or until one has run, the start's screening run (the worker's first:
        a process's start and a first compilation)."""
        return median_or_zero([r.wall_s for r in self.journal.runs.values() if r.phase == "confirm"]) or start.wall_s

    def verdict_s(self, start: Entry) -> float:
        """A parity verdict's cost: measured, or the start's screening overhead plus parity's tokens at its speed."""
        timed = start.extra.get("timed_s") or 0.0
        return median_or_zero([r.wall_s for r in self.journal.runs.values() if r.phase == "parity"]) or \
            start.wall_s - timed + self.limits.parity_tokens / float(start.tokens_per_sec or 1)

    def reserve_s(self, start: Entry | None) -> float:
        """What confirmation (the start's and each goal's) and parity will cost, less what has run of them."""
        if start is None or not start.tokens_per_sec:
            return 0.0
        done_confirm = sum(1 for r in self.journal.runs.values() if r.phase == "confirm")
        done_parity = sum(1 for r in self.journal.runs.values() if r.phase == "parity")
        confirms = max(0, (len(GOALS) * self.limits.confirm + 1) * self.limits.repeats - done_confirm)  # +1: start
        verdicts = max(0, len(GOALS) - done_parity)
        return confirms * self.fresh_s(start) + verdicts * self.verdict_s(start)

    def screening_s(self) -> float:
        """A screening run's cost: the median so far."""
        return median_or_zero([r.wall_s for r in self.journal.runs.values() if r.phase in SCREENING and r.status != "refused"])

    def finalist_s(self, start: Entry | None) -> float:
        """What the finalist's first FINALIST_ONLY value (the cheapest) will cost, kept until it has run (the
        global phase would spend it otherwise); 0 without finalist_only."""
        if not self.limits.finalist_only or start is None or \
                any(r.phase == "finalist" for r in self.journal.runs.values()):
            return 0.0
        return min(FINALIST_ONLY.values()) * self.fresh_s(start)

    def can_screen(self, start: Entry | None, cost_s: float | None = None, finalist: bool = False) -> bool:
        """Another screening run fits: it (at `cost_s`, or the median so far), and what confirmation and parity will
        cost, end within the budget; and, unless it is the finalist's run, what that will cost too (a run and its
        seconds)."""
        kept = 0.0 if finalist else self.finalist_s(start)
        if self.journal.measured() + (kept > 0) >= self.limits.max_candidates:
            return False
        cost = self.screening_s() if cost_s is None else cost_s
        return self.journal.spent_s() + cost + self.reserve_s(start) + kept <= self.limits.budget_s

    def runs_left(self, start: Entry | None) -> int:
        """How many more screening runs fit, at the median cost so far (before any: the start's), and the candidate
        limit: what is worth compiling ahead."""
        cost = self.screening_s() or (start.wall_s if start is not None else 0.0)
        room = self.limits.budget_s - self.journal.spent_s() - self.reserve_s(start) - self.finalist_s(start)
        fit = int(room // cost) if cost > 0 else self.limits.max_candidates
        return max(0, min(fit, self.limits.max_candidates - self.journal.measured()))

    def plan_line(self, start: Entry) -> str:
        """The first line a user reads: what the budget buys at the measured screening cost."""
        cost = max(start.wall_s, 1e-9)
        reserve = self.reserve_s(start)
        left = max(0.0, self.limits.budget_s - self.journal.spent_s() - reserve)
        return (f"search: budget {self.limits.budget_s:.0f} s: the start's screening run took {start.wall_s:.1f} s, "
                f"so about {int(left // cost)} more screening runs fit after {reserve:.0f} s kept for "
                "confirmation and parity")



def median_or_zero(values: list[float]) -> float:
    """The median; 0 where there is nothing to take it of (no run of that kind yet)."""
    return statistics.median(values) if values else 0.0
