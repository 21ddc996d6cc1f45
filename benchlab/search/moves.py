"""The search's moves: candidates as changes to the start, and which one-knob changes a goal may make.

Plain Python over the knob table (benchlab/core/knobs.py): each knob's choices, whether it is searched and its
unoptimized value (its default) are declared there, once.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, fields, replace
from collections.abc import Collection
from typing import Any, Callable

from benchlab.core.errors import LabError
from benchlab.core.knobs import (KNOBS, RunSettings, changes_math, check_combination, searched, unoptimized,
                                 unsupported_reason)
from benchlab.core.skips import DeviceFacts

MICRO_BATCH_SPLITS = (2, 4, 8)  # grad_accum values a search for memory tries (each must divide the batch)
# Values a search screens only on its fastest finalist, never in a move, a pass or a proposal, each with what its
# run costs as a multiple of a fresh whole-model run: CUDA graphs (a whole-model compilation, the graphs captured)
# and max-autotune (matmul templates benchmarked: 348 s of compilation at GPT-2 124M on an H200). Screened on every
# candidate they would cost more than the rest of a search; on the finalist, they are tried where they fit.
FINALIST_ONLY: dict[tuple[str, Any], float] = {("compile_mode", "reduce-overhead"): 2.0,
                                                ("compile_mode", "max-autotune-no-cudagraphs"): 10.0,
                                                ("compile_mode", "max-autotune"): 10.0}

Change = tuple[str, Any]
Rules = Callable[[RunSettings], "str | None"]


@dataclass(frozen=True)
class Candidate:
    """A configuration as its changes to the start, in the knob table's order."""

    changes: tuple[Change, ...] = ()

    @property
    def name(self) -> str:
        return "+".join(f"{k}={_word(v)}" for k, v in self.changes) or "start"

    def plus(self, *changes: Change) -> Candidate:
        """This candidate with more changes (each replacing its own value of that knob)."""
        kept = dict(self.changes) | dict(changes)
        return Candidate(tuple((k, kept[k]) for k in KNOBS if k in kept))

    def settings(self, start: RunSettings) -> RunSettings:
        return replace(start, **dict(self.changes))


@dataclass(frozen=True)
class Problem:
    """What a search answers: the configurations, as changes to `start`, that the knobs' `rules` (this device's)
    accept, at the start's global `batch`."""

    start: RunSettings
    rules: Rules
    batch: int


@dataclass(frozen=True)
class Warm:
    """A known answer for a search to screen first: its label (where it came from) and its settings."""

    label: str
    settings: RunSettings


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def choices(knob: str) -> tuple[Any, ...]:
    """Every value the knob table allows for a knob with a closed set of choices (a Literal's, or a bool's), but
    those that change the math: the search asks for the same math, faster or leaner (parity judges its answers)."""
    hint = typing.get_type_hints(RunSettings)[knob]
    if hint is bool:
        return (False, True)
    values = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()
    return tuple(v for v in values if not changes_math(knob, v))


def space(batch: int, held: Collection[Change] = ()) -> dict[str, tuple[Any, ...]]:
    """Every searched knob's values: its choices (less the `held` ones, FINALIST_ONLY's in a search on a device);
    grad_accum's, 1 and the splits that divide the batch."""
    return {k: (1, *(n for n in MICRO_BATCH_SPLITS if batch % n == 0)) if k == "grad_accum"
            else tuple(v for v in choices(k) if (k, v) not in held) for k in KNOBS if searched(k)}


def changes_from(start: RunSettings, settings: RunSettings) -> Candidate | None:
    """`settings` as changes to `start`; None where it differs in a knob the search leaves alone (the batch, the
    process layout): an answer to another question."""
    diff = [(k, getattr(settings, k)) for k in KNOBS if getattr(settings, k) != getattr(start, k)]
    return None if any(not searched(k) for k, _ in diff) else Candidate(tuple(diff))


def moves(base: Candidate, start: RunSettings, goal: str, batch: int, held: Collection[Change] = ()) -> list[Candidate]:
    """Every one-knob change of `base` the goal allows, in the knob table's order (see the module's docstring), but
    the `held` values (those screened on the finalist alone)."""
    here = base.settings(start)
    out = []
    for knob in KNOBS:
        if not searched(knob):
            continue
        values = _micro_batches(here.grad_accum, goal, batch) if knob == "grad_accum" else choices(knob)
        for value in values:
            if value == getattr(here, knob) or (knob, value) in held:
                continue
            # grad_accum's values already follow the goal (fewer micro-batches for speed, more for memory).
            undo = value == unoptimized(knob) and getattr(start, knob) != value
            if goal == "fastest" and undo:
                continue
            out.append(base.plus((knob, value)))
    return out


def _micro_batches(current: int, goal: str, batch: int) -> tuple[int, ...]:
    """grad_accum at the start's global batch: more micro-batches for memory, fewer for speed."""
    if goal == "lean":
        return tuple(k for k in MICRO_BATCH_SPLITS if k > current and batch % k == 0)
    return tuple(k for k in range(1, current) if batch % k == 0)


def rules_for(device: DeviceFacts, batch: int) -> Rules:
    """The knobs' own rules: the load-time combination check, then this device's skip rules."""
    def rules(settings: RunSettings) -> str | None:
        try:
            check_combination("", settings, batch)
        except LabError as err:
            return str(err)
        return unsupported_reason(settings, device)
    return rules


def partner(cand: Candidate, reason: str, start: RunSettings, rules: Rules) -> Candidate | None:
    """The refused candidate with the partner its refusal names: the knob the refusal is about
    ("weight_dtype='fp32' is not valid; expected bf16 with optimizer=adamw_bf16_sr" names weight_dtype), or,
    where that is the move itself, a knob=value the refusal proposes ("fused_clip=True is not valid; ... set
    optimizer=adamw_fused with it"): the first the rules accept."""
    here = cand.settings(start)
    first = reason.split("=", 1)[0]
    options = [(first, v) for v in choices(first)] if first in KNOBS else []
    options += [(k, v) for k, word in re.findall(r"\b([a-z_0-9]+)=([\w-]+)", reason) if k in KNOBS
                for v in choices(k) if _word(v) == word]
    for knob, value in options:
        if not searched(knob) or value == getattr(here, knob) or (knob, value) in cand.changes:
            continue
        again = cand.plus((knob, value))
        if len(again.changes) > len(cand.changes) and rules(again.settings(start)) is None:
            return again
    return None


def knob_values(settings: RunSettings) -> dict[str, Any]:
    """The knobs a variant in params.yaml would set: those that differ from the knob table's defaults."""
    return {f.name: getattr(settings, f.name) for f in fields(RunSettings) if getattr(settings, f.name) != f.default}
