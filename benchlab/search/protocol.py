"""What the search measures through: one object that screens, repeats, judges and compiles ahead. The stage's is
runs.Runs (this machine's device); the tests' and the comparison script's is landscapes.Machine (a scripted one)."""

from __future__ import annotations

from typing import Protocol

from benchlab.core.knobs import RunSettings
from benchlab.search.journal import Entry
from benchlab.search.moves import Candidate


class Device(Protocol):
    def screen(self, cand: Candidate, settings: RunSettings) -> Entry:
        """One short timed run of the candidate (the journal's screening phases)."""
        ...

    def repeat(self, cand: Candidate, settings: RunSettings) -> Entry:
        """One full bench run of the candidate in a fresh process (a confirmation)."""
        ...

    def judge(self, cand: Candidate, settings: RunSettings) -> Entry:
        """The candidate's parity verdict: `passed` and the verdict's words."""
        ...

    def prepare(self, batch: list[tuple[Candidate, RunSettings]]) -> Entry | None:
        """Compile these candidates ahead of their screening runs, all at once; the cost as a run (phase
        precompile), or None where nothing was compiled."""
        ...
