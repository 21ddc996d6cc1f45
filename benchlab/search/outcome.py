"""What a search hands back (strategy.Search.run): each goal's answer, the start it is compared with, the paths to
the answers and the front, as typed records rather than dicts."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from benchlab.core.knobs import RunSettings
from benchlab.search.journal import Entry
from benchlab.search.moves import knob_values

GOALS = ("fastest", "lean")


@dataclass(frozen=True)
class Answer:
    """A goal's answer: a candidate confirmed in fresh processes that passed parity, with its confirmed figures; or
    none, and why (`message`)."""

    name: str | None = None
    changes: dict[str, Any] = field(default_factory=dict)
    tokens_per_sec: float = 0.0
    peak_mem_mb: float = 0.0
    ratio_to_start: float = 0.0
    parity: str = ""  # the verdict's words
    message: str = ""  # why there is no answer

    @property
    def found(self) -> bool:
        return self.name is not None

    def settings(self, start: RunSettings) -> RunSettings:
        return replace(start, **self.changes)


@dataclass(frozen=True)
class Outcome:
    """The search's result. `status` ok, or failed with `message` (the start itself did not run)."""

    status: str
    message: str = ""
    start: Entry | None = None  # the start's figures as the answers are compared with them (its fresh-process median)
    answers: dict[str, Answer] = field(default_factory=dict)  # by goal
    paths: dict[str, list[Entry]] = field(default_factory=dict)  # each goal's path of kept changes, from its base
    front: list[Entry] = field(default_factory=list)  # the measured front, fastest first

    def answer(self, goal: str) -> Answer:
        """The goal's answer; none (with the search's message) where the search stopped before it."""
        return self.answers.get(goal) or Answer(message=self.message)

    def goals_of(self) -> dict[str, list[str]]:
        """Each answered candidate's name and the goals it answers."""
        out: dict[str, list[str]] = {}
        for goal in GOALS:
            if self.answer(goal).found:
                out.setdefault(str(self.answer(goal).name), []).append(goal)
        return out

    def found_variants(self, start: RunSettings, model: str) -> dict[str, dict[str, Any]]:
        """params.yaml variants for what the search found, named after the goal and the model."""
        return {f"{goal}_{model}": knob_values(self.answer(goal).settings(start))
                for goal in GOALS if self.answer(goal).found}
