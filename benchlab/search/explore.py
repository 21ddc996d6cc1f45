"""The search's exploration of the front: after the goals' moves and combinations, moves around every point of the
measured front while the budget lasts.

The goals' paths each end at one point. The front between them (a little slower for much less memory) is made of
their answers with a few changes more or less: a memory change added to the fastest point, a speed change to the
lean one. So the exploration goes in **passes**. A pass takes every point of the front as it stands (the
measured runs at `lean_floor` of the start's speed or more that no other beats on both tokens/s and peak memory)
and every one-knob change of it that either goal may make: speed moves, memory moves (activation checkpointing,
more or fewer micro-batches, the unoptimized values), each refused move retried with the partner its refusal
names.

Screening every such move would cost tens of runs a point. Instead each is priced first. `Effects` fits, over
every run measured so far, what each knob=value does (tokens/s multiply, memory adds: a least-squares fit with
one term per knob=value, runs at the memory's floor left out of the memory fit); a move's predicted point is its
front point's measured figures moved by the fitted difference, and its price the area that point would add to
the front (its hypervolume gain). The pass screens the move with the largest gain, refits, prices the rest again against the
grown front, and so on, best first, until no move of the pass is predicted to add at least `MIN_GAIN` of the
front's area. A move whose change was never measured cannot be priced; it is screened after the priced ones,
once, which measures it. A configuration already in the journal is never screened again.

A pass that leaves a new point on the front starts another, around the new front; one that leaves none ends the
exploration. So does the budget: each screening run starts only where it and the reserve for confirmation and
parity fit (the `screen` handed in says None when they do not). On a device the exploration usually ends there:
what it spends is what the front's other points would otherwise get for their parity verdicts (Search.front).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from benchlab.core.knobs import RunSettings
from benchlab.search import pareto
from benchlab.search.pareto import area
from benchlab.search.journal import Entry
from benchlab.search.moves import Candidate, Change, Rules, moves, partner

EXPLORE = "explore"  # the journal's phase for the exploration's screening runs
FLOOR_SHARE = 0.01  # runs within this share of the least memory measured are at the memory's floor
MIN_GAIN = 1e-6  # a predicted gain smaller than this share of the front's area is rounding, not a gain

Term = tuple[str, Any]
Point = tuple[float, float]  # (tokens/s, peak MiB)
Screen = Callable[[Candidate], "Entry | None"]
Prepare = Callable[[list[Candidate]], None]  # compile these ahead of their screening runs (runs.Runs.prepare)


def measured(run: Entry) -> bool:
    return run.status == "ok" and bool(run.tokens_per_sec) and bool(run.peak_mem_mb)


def point(run: Entry) -> pareto.Point | None:
    """A run's point on the front: None where it did not run or lacks either figure."""
    return (float(run.tokens_per_sec or 0), float(run.peak_mem_mb or 0)) if measured(run) else None


def front_of(runs: list[Entry], floor_tps: float, tie: float = 0.0) -> list[Entry]:
    """The measured runs at floor_tps or more that no other beats (pareto.front), fastest first."""
    return pareto.front(runs, point, floor_tps, tie)


class Effects:
    """What each change to the start does, fitted over the measured runs: log tokens/s and peak memory, each a sum
    of one term per knob=value the run sets plus a constant (least squares; where the runs cannot tell two terms
    apart, the smallest solution, whose sum is still right for the configurations measured).

    Memory has a floor (the weights, what no knob removes): where two or more runs sit at the least memory
    measured (within FLOOR_SHARE), they say only that the floor was reached, so they are left out of the memory
    fit and no prediction goes below them."""

    def __init__(self, runs: list[Entry]) -> None:
        ok = [r for r in runs if measured(r)]
        least = min((float(r.peak_mem_mb or 0) for r in ok), default=0.0)
        above = [r for r in ok if float(r.peak_mem_mb or 0) > least * (1 + FLOOR_SHARE)]
        self.floor = least if len(ok) - len(above) >= 2 else None
        self.terms: dict[Term, int] = {}
        for run in ok:
            for term in run.changes.items():
                self.terms.setdefault(term, len(self.terms) + 1)  # column 0 is the constant
        self.speed = self._fit(ok, lambda r: math.log(float(r.tokens_per_sec or 1)))
        self.memory = self._fit(ok if self.floor is None else above, lambda r: float(r.peak_mem_mb or 0))

    def _fit(self, runs: list[Entry], figure: Callable[[Entry], float]) -> np.ndarray:
        rows = np.zeros((len(runs), len(self.terms) + 1))
        rows[:, 0] = 1.0
        for i, run in enumerate(runs):
            for term in run.changes.items():
                rows[i, self.terms[term]] = 1.0
        values = np.array([figure(r) for r in runs])
        return np.linalg.lstsq(rows, values, rcond=None)[0] if runs else np.zeros(len(self.terms) + 1)

    def _sum(self, weights: np.ndarray, changes: list[Term]) -> float:
        return float(sum(weights[self.terms[t]] for t in changes))

    def predict(self, cand: Candidate, base: Entry) -> Point | None:
        """The candidate's tokens/s and peak MiB: the measured base's, moved by the fitted difference between the
        two (so what the fit misses about the base cancels out); None where one of its changes was never measured."""
        if any(term not in self.terms for term in cand.changes):
            return None
        was = list(base.changes.items())
        tps = float(base.tokens_per_sec or 0) * math.exp(self._sum(self.speed, list(cand.changes)) -
                                                         self._sum(self.speed, was))
        mem = float(base.peak_mem_mb or 0) + self._sum(self.memory, list(cand.changes)) - self._sum(self.memory, was)
        return tps, mem if self.floor is None else max(mem, self.floor)


def around(point: Entry, start: RunSettings, rules: Rules, batch: int, held: Collection[Change] = ()) -> list[Candidate]:
    """Every one-knob change of a front point that either goal may make, each refused one replaced by its partner
    (or left out where it has none): in the knob table's order, each configuration once, a knob moved back to the
    start's value no longer a change."""
    base = Candidate(tuple(point.changes.items()))
    out: dict[str, Candidate] = {}
    for goal in ("fastest", "lean"):
        for cand in moves(base, start, goal, batch, held):
            reason = rules(cand.settings(start))
            paired = cand if reason is None else partner(cand, reason, start, rules)
            if paired is not None:
                paired = Candidate(tuple((k, v) for k, v in paired.changes if getattr(start, k) != v))
                out.setdefault(paired.name, paired)
    return list(out.values())


Move = tuple[Candidate, Entry]  # a candidate and the front point it is one change from


class Explorer:
    """The passes (see the module's docstring) over the runs measured before them, `seen`."""

    def __init__(self, seen: list[Entry], screen: Screen, start: RunSettings, rules: Rules, batch: int,
                 floor_tps: float, log: Callable[[str], None], tie: float = 0.0, held: Collection[Change] = (),
                 prepare: Prepare | None = None) -> None:
        self.seen, self.screen, self.start, self.rules, self.batch = list(seen), screen, start, rules, batch
        self.floor_tps, self.log, self.tie, self.held, self.prepare = floor_tps, log, tie, held, prepare
        self.explored: list[Entry] = []

    def run(self) -> list[Entry]:
        """Pass after pass until one adds no point to the front or the budget ends; the runs it screened."""
        number = 0
        while True:
            number += 1
            front = front_of(self.seen, self.floor_tps, self.tie)
            names = {r.name for r in self.seen}
            pool: dict[str, Move] = {}
            for point in front:
                for cand in around(point, self.start, self.rules, self.batch, self.held):
                    if cand.name not in names:
                        pool.setdefault(cand.name, (cand, point))
            self.log(f"search: explore pass {number}: {len(pool)} moves around the front's {len(front)} points")
            if self.prepare is not None:
                self.prepare([cand for cand, _ in self.ranked(list(pool.values()))])
            before = len(self.explored)
            if not self.one_pass(list(pool.values())):
                return self.explored  # the budget ended
            new = {r.name for r in self.explored[before:]}
            if not new & {r.name for r in front_of(self.seen, self.floor_tps, self.tie)}:
                return self.explored

    def one_pass(self, pool: list[Move]) -> bool:
        """Screen the pool's moves best first while one is predicted to add to the front (the unpriced last);
        False where the budget ended the pass."""
        while (move := self.best(pool)) is not None:
            pool.remove(move)
            run = self.screen(move[0])
            if run is None:
                return False
            self.seen.append(run)
            self.explored.append(run)
        return True

    def ranked(self, pool: list[Move]) -> list[Move]:
        """The pool in the order one pass would screen it if no run changed the fit: priced moves by predicted gain
        (those predicted to add nothing left out), then the unpriced."""
        out, left = [], list(pool)
        while (move := self.best(left)) is not None:
            left.remove(move)
            out.append(move)
        return out

    def best(self, pool: list[Move]) -> Move | None:
        """The move predicted to add the most to the front, if that is at least MIN_GAIN of the front's area; else
        the first whose change was never measured; else None."""
        effects = Effects(self.seen)
        front = [(float(r.tokens_per_sec or 0), float(r.peak_mem_mb or 0)) for r in front_of(self.seen, self.floor_tps, self.tie)]
        top_mem = 2 * max((m for _, m in front), default=0.0)  # room for a faster point that takes more memory
        now = area(front, self.floor_tps, top_mem)
        best, best_gain, unpriced = None, 0.0, None
        for move in pool:
            guess = effects.predict(*move)
            if guess is None:
                unpriced = unpriced or move
                continue
            gain = area([*front, guess], self.floor_tps, top_mem) - now
            if gain >= MIN_GAIN * now and (best is None or gain > best_gain):
                best, best_gain = move, gain
        return best or unpriced
