"""The search's global phase: where the moves one knob at a time have stopped finding front points, Optuna's
multivariate TPE proposes whole configurations, seeded with every run the search has made.

Moves one knob at a time find a front whose knobs add up. Where knobs interact (a basin that is good only with
three changes together, each worse alone), every one-knob move out of the known front looks bad, and the
exploration stops with part of the front. A sampler that models the joint distribution of the good
configurations (multivariate TPE: Watanabe 2023, "Tree-structured Parzen estimator: understanding its algorithm
components") finds such combinations, and seeded with the runs already made it starts where the local phases
ended instead of from nothing. Optuna's is a well-kept implementation of it (pinned in requirements-base.txt).

- **The study** maximizes tokens/s and minimizes peak memory, each searched knob a categorical parameter
  (moves.space), with lean's floor a constraint (a run below it is infeasible). Every screening run the search
  has made is told to it as a finished trial; a configuration the knobs' rules refuse, or one that did not run
  (oom, error), as the worst point, infeasible, so the sampler learns to leave it.
- **A proposal** the rules refuse is retried with the partner its refusal names (moves.partner), as the moves
  are: a refused configuration and its repair cost one screening run, not two. A proposal already measured is
  told its figures again and costs no run.
- **Never stuck:** after `STUCK` proposals in a row that measure nothing new, the phase takes the configurations
  no run has measured in turn, in an order drawn from the seed, until none is left: a search with budget left
  stops only when it has measured every allowed configuration.

Every proposal depends only on the seed and the runs told before it, in order, so a search stopped and started
again proposes what it proposed before (its runs come back from the journal) and repeats no run.
"""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Iterator
from typing import Any

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings
from benchlab.search.journal import Entry
from benchlab.search.moves import Candidate, Rules, partner

GLOBAL = "global"  # the journal's phase for the global phase's screening runs
STUCK = 200  # proposals in a row that measure nothing new before the phase takes the unmeasured configurations in turn
ENUMERATE_AT_MOST = 2_000_000  # a larger space is drawn from at random (this many draws), never listed whole


class Sampler:
    """Optuna's multivariate TPE over `space`, told the search's runs (see the module's docstring)."""

    def __init__(self, space: dict[str, tuple[Any, ...]], start: RunSettings, rules: Rules, floor_tps: float,
                 seed: int) -> None:
        try:
            import optuna
        except ImportError:
            raise LabError("the search's global phase needs optuna; install it with "
                           "`pip install -r requirements.txt`") from None
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # the search prints its own lines
        self.optuna, self.space, self.start, self.rules, self.floor_tps = optuna, space, start, rules, floor_tps
        self.seed = seed
        self.dists = {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in space.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate TPE is marked experimental
            sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
        self.study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        self.told: dict[str, Entry] = {}
        self.worst_mb = 1.0
        self.misses = 0
        self.rest: Iterator[Candidate] | None = None

    def candidate(self, values: dict[str, Any]) -> Candidate:
        """A configuration as its changes to the start."""
        return Candidate().plus(*((k, v) for k, v in values.items() if getattr(self.start, k) != v))

    def values(self, cand: Candidate) -> dict[str, Any]:
        settings = cand.settings(self.start)
        return {k: getattr(settings, k) for k in self.space}

    def tell(self, runs: list[Entry]) -> None:
        """Every run not told yet, as a finished trial."""
        for run in runs:
            if run.name in self.told or run.phase == "found":
                continue
            self.told[run.name] = run
            self.worst_mb = max(self.worst_mb, float(run.peak_mem_mb or 0))
            cand = Candidate(tuple(run.changes.items()))
            if any(v not in self.space.get(k, (v,)) for k, v in run.changes.items()):
                continue  # a knob or value outside the space (a warm start's): not a point of this study
            tps, mem, violation = self.figures(run)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.study.add_trial(self.optuna.trial.create_trial(
                    params=self.values(cand), distributions=self.dists, values=[tps, mem],
                    constraints={"lean_floor": violation}))

    def figures(self, run: Entry) -> tuple[float, float, float]:
        """A run's objectives and its floor constraint (feasible at 0 or below); a run without figures is the worst
        point, infeasible."""
        if run.status != "ok" or not run.tokens_per_sec or not run.peak_mem_mb:
            return 0.0, 2 * self.worst_mb, 1.0
        tps = float(run.tokens_per_sec)
        return tps, float(run.peak_mem_mb), max(0.0, self.floor_tps - tps) / max(self.floor_tps, 1.0)

    def propose(self, known: set[str]) -> Candidate | None:
        """A configuration the rules allow that is not in `known` (the names measured or refused so far); None when
        none is left."""
        while self.misses < STUCK:
            cand = self.ask(known)
            if cand is not None:
                self.misses = 0
                return cand
            self.misses += 1
        return self.next_unmeasured(known)

    def ask(self, known: set[str]) -> Candidate | None:
        """One TPE proposal, repaired with its partner where the rules refuse it; None (and told to the study) where
        it is refused without a repair or is known already."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = self.study.ask(self.dists)
        cand = self.candidate(trial.params)
        reason = self.rules(cand.settings(self.start))
        if reason is not None:
            self.tell_worst(trial)  # the refused configuration itself
            repaired = partner(cand, reason, self.start, self.rules)
            return None if repaired is None or repaired.name in known else repaired
        if cand.name in known:
            run = self.told.get(cand.name)
            if run is None:
                self.tell_worst(trial)
                return None
            tps, mem, violation = self.figures(run)
            trial.set_constraint("lean_floor", violation)
            self.study.tell(trial, [tps, mem])
            return None
        self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)  # measured next, and told then
        return cand

    def tell_worst(self, trial: Any) -> None:
        trial.set_constraint("lean_floor", 1.0)
        self.study.tell(trial, [0.0, 2 * self.worst_mb])

    def next_unmeasured(self, known: set[str]) -> Candidate | None:
        """The next configuration in turn that the rules allow and no run has measured; None when none is left."""
        if self.rest is None:
            self.rest = self._in_turn()
        for cand in self.rest:
            if cand.name not in known and self.rules(cand.settings(self.start)) is None:
                return cand
        return None

    def _in_turn(self) -> Iterator[Candidate]:
        """Every configuration of the space, in an order drawn from the seed: the whole product where it is small
        enough to list, else random draws."""
        rng = random.Random(self.seed)
        size = 1
        for values in self.space.values():
            size *= len(values)
        if size > ENUMERATE_AT_MOST:
            for _ in range(ENUMERATE_AT_MOST):
                yield self.candidate({k: rng.choice(v) for k, v in self.space.items()})
            return
        combos = list(itertools.product(*self.space.values()))
        rng.shuffle(combos)
        for combo in combos:
            yield self.candidate(dict(zip(self.space, combo)))
