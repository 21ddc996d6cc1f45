"""The search's last steps (strategy.py's 4 to 6): the finalists repeated in fresh processes and ranked by the
repeats' median, parity down that ranking, and the answers checked against each other.

A part of `strategy.Search` (its base class): it uses the search's journal, limits, start, device and `record`.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable

from benchlab.core.knobs import RunSettings
from benchlab.search import pareto
from benchlab.search.budget import Limits
from benchlab.search.journal import Entry, Journal
from benchlab.search.moves import Candidate
from benchlab.search.outcome import Answer
from benchlab.search.protocol import Device


class Confirmation:
    journal: Journal
    limits: Limits
    start: RunSettings
    device: Device
    record: Callable[[Entry, Candidate, str, str], Entry]

    @staticmethod
    def undominated(answers: dict[str, Answer]) -> dict[str, Answer]:
        """The answers, lean replaced by fastest's where fastest (which passed parity too) beats it on both figures:
        as fast or faster, and as lean or leaner."""
        fast, lean = answers.get("fastest", Answer()), answers.get("lean", Answer())
        if fast.found and lean.found and fast.name != lean.name and pareto.beats(
                (fast.tokens_per_sec, fast.peak_mem_mb), (lean.tokens_per_sec, lean.peak_mem_mb)):
            return {**answers, "lean": fast}
        return answers

    def repeats_of(self, cand: Candidate) -> list[Entry]:
        """The candidate's fresh-process repeats, from the journal or run now."""
        out = []
        for i in range(self.limits.repeats):
            key = f"{cand.name}#{i + 1}"
            again = self.journal.get("confirm", key)
            out.append(again or self.record(self.device.repeat(cand, cand.settings(self.start)), cand, "confirm", key))
        return out

    def confirmed_start(self, start: Entry) -> Entry:
        """The start as its answers are compared with it: the median of its own fresh-process repeats (its
        screening run where there are none), so a ratio never sets a screening run against a fresh process."""
        ok = [r for r in self.repeats_of(Candidate()) if r.status == "ok"]
        if not ok:
            return start
        return replace(start, tokens_per_sec=statistics.median(float(r.tokens_per_sec or 0) for r in ok),
                       peak_mem_mb=max(float(r.peak_mem_mb or 0) for r in ok))

    def confirm(self, goal: str, start: Entry, ranked: list[Entry]) -> Answer:
        """Repeat the best runs in fresh processes, rank them by the repeats' median, give the first that passes
        parity."""
        confirmed = []
        for run in ranked:
            cand = Candidate(tuple(run.changes.items()))
            repeats = self.repeats_of(cand)
            ok = [r for r in repeats if r.status == "ok"] if repeats else [run]
            if len(ok) < max(1, len(repeats)):
                continue
            tps = statistics.median(float(r.tokens_per_sec or 0) for r in ok)
            mem = max(float(r.peak_mem_mb or 0) for r in ok)
            floor = self.limits.lean_floor * float(start.tokens_per_sec or 0) if goal == "lean" else 0.0
            if tps >= floor:
                confirmed.append((cand, tps, mem))
        confirmed.sort(key=lambda c: (-c[1], c[2]) if goal == "fastest" else (c[2], -c[1]))
        for cand, tps, mem in confirmed:
            verdict = self.verdict(cand)
            if verdict.passed:
                return Answer(cand.name, dict(cand.changes), tps, mem, tps / float(start.tokens_per_sec or 1),
                              verdict.message)
        return Answer(message=f"none of the {len(confirmed)} confirmed candidates passed parity" if confirmed
                      else "no candidate was confirmed")

    def verdict(self, cand: Candidate) -> Entry:
        """The candidate's parity verdict, from the journal or judged now."""
        done = self.journal.get("parity", cand.name)
        return done or self.record(self.device.judge(cand, cand.settings(self.start)), cand, "parity", cand.name)
