"""The sections of params.yaml that the search and the time-to-loss pipelines read (search/dvc.yaml, ttl/dvc.yaml):
search, ttl and python_corpus, as frozen dataclasses that check their own values (as `benchlab.core.sections`)."""

from dataclasses import dataclass, field
from typing import ClassVar

from benchlab.core.errors import check
from benchlab.core.knobs import CompileScope, RunSettings
from benchlab.core.param_reads import Traced
from benchlab.core.sections import SAFE_NAME


@dataclass(frozen=True)
class SearchParams(Traced):
    """The search (benchlab/search/strategy.py): candidates screened short on one worker process, the best repeated
    with bench.steps in fresh processes, then judged for parity."""

    SECTION: ClassVar[str] = "search"

    start: str = "recipe"
    """The variant the search starts from and measures every ratio against."""
    budget_s: float = 300.0
    """Seconds of the whole search (screening, confirmation and parity, start-up and compile included)."""
    screen_steps: int = 10
    """Timed steps of a screening run, after harness.warmup_steps."""
    max_candidates: int = 12
    """Screening runs at most, whichever limit comes first."""
    confirm: int = 2
    """The best this many of each goal are run `repeats` times more, then judged for parity."""
    repeats: int = 2
    lean_floor: float = 0.85
    """lean: the least peak memory among runs at this fraction of the start's tokens/s or more."""
    screen_compile_scope: CompileScope = "model"
    """What a screening run compiles where its candidate compiles: model (as the candidate would run), or blocks
    (regional compilation: each block once, a cold start's compile cut; compile modes with CUDA graphs keep
    model). Confirmation and parity always run the candidate as it is."""
    precompile_processes: int = 8
    """On a GPU under screen_compile_scope=blocks: how many processes compile candidates ahead at once, each on a
    one-layer model (benchlab/search/worker.py); 0: each compiles in its screening run."""

    def __post_init__(self) -> None:
        check(self.budget_s > 0, "search.budget_s", self.budget_s, "a positive number of seconds, e.g. 1800")
        check(self.max_candidates >= 1, "search.max_candidates", self.max_candidates, "1 or more")
        check(self.screen_steps >= 2, "search.screen_steps", self.screen_steps, "2 or more timed steps")
        check(self.confirm >= 1, "search.confirm", self.confirm, "1 or more")
        check(self.repeats >= 0, "search.repeats", self.repeats, "0 or more")
        check(self.precompile_processes >= 0, "search.precompile_processes", self.precompile_processes,
              "0 (none) or more, e.g. 8")
        check(0 < self.lean_floor <= 1, "search.lean_floor", self.lean_floor, "a fraction in (0, 1], e.g. 0.85")


@dataclass(frozen=True)
class TtlParams(Traced):
    """The time-to-loss track (ttl/dvc.yaml, benchlab/run/ttl.py): every arm trains `steps` steps per seed on the same
    batches, evaluated at the same steps; the target is the tuned reference's validation loss at its budget,
    `budget_fraction` of its own training time."""

    SECTION: ClassVar[str] = "ttl"

    reference: str = "recipe"
    """The variant whose learning rate and warm-up the reference's sweep tunes; the variants change it."""
    budget_fraction: float = 0.75
    """The budget, reference_s (in the reference's record): this share of the reference's mean training time over
    its seeds (compilation and evaluation not counted). The target is its mean validation loss there: late in its run,
    so a target it meets only after several evaluations, on any machine and under any load."""
    steps: int = 120
    """Optimizer steps of every run, fixed in advance (the schedule spans them); no run stops early."""
    eval_every: int = 10
    """The validation loss is taken every this many steps, and at the last."""
    warmup_steps: int = 2
    """The first steps, whose time holds compilation: each counts as the run's median step on its clock."""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """Each seed gives the initial weights and the batch order, the same for every arm."""
    sweep_lrs: list[float] = field(default_factory=lambda: [0.001, 0.002, 0.004])
    """The reference's sweep, with the first seed: each learning rate (optim.min_lr keeps its ratio to optim.lr)..."""
    sweep_warmup_steps: list[int] = field(default_factory=lambda: [10])
    """...with each warm-up length; the point with the lowest loss at budget_fraction of its training time trains on
    every seed."""
    alpha: float = 0.05
    """The one-sided t-test's level: an arm reaches the target where its mean loss at the budget is below it at
    this level."""
    variants: dict[str, RunSettings] = field(default_factory=dict)
    """name: the knobs it changes on the reference, written as that change alone (params.yaml puts it on the
    reference's knobs before they are read); one `ttl@<name>` stage each."""

    def __post_init__(self) -> None:
        check(0 < self.budget_fraction <= 1, "ttl.budget_fraction", self.budget_fraction,
              "a share of the reference's training time in (0, 1], e.g. 0.75")
        check(self.steps >= 2, "ttl.steps", self.steps, "2 or more")
        check(1 <= self.eval_every <= self.steps, "ttl.eval_every", self.eval_every, f"between 1 and ttl.steps={self.steps}")
        check(1 <= self.warmup_steps < self.steps, "ttl.warmup_steps", self.warmup_steps,
              f"between 1 and ttl.steps - 1 = {self.steps - 1}")
        check(len(self.seeds) >= 2 and len(set(self.seeds)) == len(self.seeds), "ttl.seeds", self.seeds,
              "two or more different integers, e.g. [1, 2, 3] (the test needs a spread)")
        check(bool(self.sweep_lrs) and all(lr > 0 for lr in self.sweep_lrs), "ttl.sweep_lrs", self.sweep_lrs,
              "one or more positive learning rates")
        check(bool(self.sweep_warmup_steps) and all(0 <= w < self.steps for w in self.sweep_warmup_steps),
              "ttl.sweep_warmup_steps", self.sweep_warmup_steps, f"one or more step counts below ttl.steps={self.steps}")
        check(0 < self.alpha < 0.5, "ttl.alpha", self.alpha, "a level in (0, 0.5), e.g. 0.05")
        for name in self.variants:
            check(bool(SAFE_NAME.fullmatch(name)), "ttl.variants", name, "names of letters, digits and underscores")

    def eval_steps(self) -> list[int]:
        """The steps after which the validation loss is taken (counted in steps done), the last one included."""
        return sorted({*range(self.eval_every, self.steps, self.eval_every), self.steps})


@dataclass(frozen=True)
class PythonCorpusParams(Traced):
    SECTION: ClassVar[str] = "python_corpus"
    bytes: int = 8_000_000
    """Text to take from this Python install's sources and documents (benchlab/prep/python_corpus.py)."""

    def __post_init__(self) -> None:
        check(self.bytes > 0, "python_corpus.bytes", self.bytes, "a positive byte count, e.g. 8000000")
