"""The sections of params.yaml (data, train, bench, eval, aggregate, profile, parity, search) as frozen dataclasses.

Each checks its own values in `__post_init__` and refuses a bad one naming its key, the value and what would be
valid. `benchlab.core.params` puts them together into `Params` and reads params.yaml. No torch, no model here.

params.yaml owns the values: each default here is params.yaml's own (tests/unit/test_sections.py fails where one
drifts), so a key left out of a section means what the file says. A list or mapping that names variants defaults
to none: a section cannot know the matrix.
"""

import re
from dataclasses import dataclass, field
from typing import Literal

from benchlab.core.errors import check
from benchlab.core.knobs import CompileScope, RunSettings

DeviceChoice = Literal["auto", "cpu", "cuda"]
LockMode = Literal["wait", "fail"]

# Variant names become file names and DVC stage names; they must be plain
# identifiers. They never reach a shell: stages learn their variant from
# DVC_STAGE (see stages/bench.py), not from the command line.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class DataParams:
    corpus: str = "data/corpus/python_docs.txt"
    """A corpus file, or a folder whose files of data.format are read recursively in sorted order."""
    format: Literal["auto", "text", "jsonl", "parquet"] = "auto"
    """text (each file one document), jsonl (.jsonl/.jsonl.gz, one JSON object a line) or parquet (one row a
    document); auto picks by each file's suffix and, in a folder, reads *.txt, *.jsonl, *.jsonl.gz and *.parquet."""
    text_field: str = "text"
    """The JSON key or parquet column holding a document's text."""
    tokenizer: str = ""
    """A pretrained `tokenizers` tokenizer.json to encode with; empty: train a byte-level BPE on the corpus."""
    vocab_size: int = 4096
    """Byte-level BPE vocabulary to train (ignored with data.tokenizer); the model pads it to a multiple of 64."""
    tokenizer_sample_bytes: int = 100_000_000
    """Train the tokenizer on about this many bytes, taken as every Nth piece across the corpus; 0: all of it."""
    eot_token: str = "<|endoftext|>"
    """The end-of-text token appended after each document; a pretrained tokenizer must have it."""
    val_fraction: float = 0.1
    """Share of the tokens (taken from the end) held out for validation."""

    def __post_init__(self) -> None:
        check(self.vocab_size >= 257, "data.vocab_size", self.vocab_size, "at least 257 (256 bytes + end-of-text)")
        check(self.vocab_size <= 2**32, "data.vocab_size", self.vocab_size, "at most 4294967296 (tokens are stored as uint32)")
        check(0.0 < self.val_fraction < 0.5, "data.val_fraction", self.val_fraction, "between 0 and 0.5, exclusive")
        check(self.tokenizer_sample_bytes >= 0, "data.tokenizer_sample_bytes", self.tokenizer_sample_bytes,
               "0 (the whole corpus) or a positive byte count such as 100000000")
        check(bool(self.text_field), "data.text_field", self.text_field, "the key or column holding the text, e.g. text")
        check(bool(self.eot_token), "data.eot_token", self.eot_token, "a token such as <|endoftext|>")


@dataclass(frozen=True)
class TrainParams:
    batch_size: int = 16
    """Sequences per step."""
    block_size: int = 128
    """Tokens per sequence; at most the preset's context."""
    steps: int = 100
    """Optimizer steps of the train stage."""
    lr: float = 2e-3
    """Peak learning rate, reached after lr_warmup_steps of linear warm-up."""
    min_lr: float = 2e-4
    """Floor of the cosine decay."""
    lr_warmup_steps: int = 20
    """Steps of linear learning-rate warm-up (capped at the run's length)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay, applied to matrices only."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 turns clipping off."""

    def __post_init__(self) -> None:
        for key in ("batch_size", "block_size", "steps"):
            check(getattr(self, key) > 0, f"train.{key}", getattr(self, key), "a positive integer")
        check(self.lr > 0, "train.lr", self.lr, "a positive number")
        check(0 <= self.min_lr <= self.lr, "train.min_lr", self.min_lr, f"between 0 and train.lr={self.lr}")
        check(self.lr_warmup_steps >= 0, "train.lr_warmup_steps", self.lr_warmup_steps, "0 or more")
        check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "0 or more")
        check(self.grad_clip >= 0, "train.grad_clip", self.grad_clip, "0 (off) or more")


@dataclass(frozen=True)
class BenchParams:
    steps: int = 20
    """Optimizer steps of each variant run, warm-up included."""
    warmup_steps: int = 6
    """Steps left out of the timing (compilation, allocator and cache warm-up)."""
    repeats: int = 1
    """Independent runs per variant, each in a fresh process (fresh model, same seed); 2 or more give intervals."""
    steady_tolerance: float = 0.05
    """Largest relative gap between the medians of the timed window's halves before a warning."""
    lock: LockMode = "wait"
    """Another timing holds this device: wait for it, or fail at once with a message naming its holder."""
    memory_cap_gib: float = 0.0
    """GiB of GPU memory each timing may use (torch.cuda.set_per_process_memory_fraction), so a larger GPU
    answers for a smaller card; 0: no cap. What torch's allocator may hold: on a real card of that size the
    CUDA context takes a few hundred MiB more."""

    def __post_init__(self) -> None:
        check(self.warmup_steps >= 1, "bench.warmup_steps", self.warmup_steps, "1 or more")
        check(
            self.steps >= self.warmup_steps + 2, "bench.steps", self.steps,
            f"at least bench.warmup_steps + 2 = {self.warmup_steps + 2}, so that two or more steps are timed",
        )
        check(self.repeats >= 1, "bench.repeats", self.repeats, "1 or more")
        check(self.steady_tolerance > 0, "bench.steady_tolerance", self.steady_tolerance, "a positive fraction")
        check(self.memory_cap_gib >= 0, "bench.memory_cap_gib", self.memory_cap_gib,
               "0 (no cap) or the GiB of the card to answer for, e.g. 24")


@dataclass(frozen=True)
class EvalParams:
    batches: int = 8
    """Batches of train.batch_size fixed validation windows, evenly spaced over the split."""

    def __post_init__(self) -> None:
        check(self.batches > 0, "eval.batches", self.batches, "a positive integer")


# Defaults of aggregate.fallback_baselines and aggregate.ours. Left at its default, a list may name variants a
# matrix does not have (a subset run); a list the user sets must name variants only.
DEFAULT_FALLBACKS = ("recipe",)
DEFAULT_OURS = ("fastest", "lean")


@dataclass(frozen=True)
class AggregateParams:
    loss_tolerance: float = 0.1
    """Largest allowed gap (nats) between a variant's validation loss and the baseline's."""
    repeat_tolerance: float = 0.02
    """Largest allowed spread (nats) of validation loss across one variant's repeats; same seed,
    so on a CPU it is 0, on a GPU only kernel non-determinism moves it."""
    baseline: str = "fp32_baseline"
    """The variant every speedup and memory change is measured against."""
    allow_mixed_env: bool = False
    """Let one table hold results measured in different environments."""
    allow_mixed_source: bool = False
    """Let one table hold results measured from different source code. Code with uncommitted changes, the same
    for every row, is not refused: each such row is flagged in the summary and the report."""
    fallback_baselines: list[str] = field(default_factory=lambda: list(DEFAULT_FALLBACKS))
    """Where `baseline` did not run ok (out of memory under bench.memory_cap_gib, skipped), ratios are taken
    against the first of these that did; the summary says which and why."""
    reference: str = "recipe"
    """The variant the report's plots draw as a reference line; none where it is no variant or did not run ok."""
    ours: list[str] = field(default_factory=lambda: list(DEFAULT_OURS))
    """Variants the report groups and colours as our own, apart from the seed's matrix and the recipe's knobs."""

    def __post_init__(self) -> None:
        check(self.loss_tolerance > 0, "aggregate.loss_tolerance", self.loss_tolerance, "a positive number")
        check(self.repeat_tolerance >= 0, "aggregate.repeat_tolerance", self.repeat_tolerance, "0 or more")


@dataclass(frozen=True)
class ProfileParams:
    variants: list[str] = field(default_factory=list)
    """Variants to trace with torch.profiler; empty: none."""
    steps: int = 3
    """Steps recorded after bench.warmup_steps untraced steps."""

    def __post_init__(self) -> None:
        check(self.steps > 0, "profile.steps", self.steps, "a positive integer")


@dataclass(frozen=True)
class ParityParams:
    reference: str = "tf32"
    """The variant every parity variant is compared with; trained twice, with each of `seeds`' batch orders."""
    variants: list[str] = field(default_factory=list)
    """Variants trained for parity, one `parity@<name>` stage each (dvc.yaml reads this list itself)."""
    steps: int = 60
    """Optimizer steps of every parity run (the learning-rate schedule spans them)."""
    tail_steps: int = 20
    """The verdict compares the mean training loss over a run's last this many steps."""
    tolerance: float = 0.1
    """Nats the variant's tail loss may differ from the reference's; set it above the reference's own
    gap between its two batch orders (the stage shows both), else no verdict is given."""
    seeds: list[int] = field(default_factory=lambda: [1, 2])
    """Two batch-order seeds: the reference runs with both, each variant with the first. The initial weights
    always come from `seed`."""

    def __post_init__(self) -> None:
        check(self.steps >= 2, "parity.steps", self.steps, "2 or more")
        check(1 <= self.tail_steps <= self.steps, "parity.tail_steps", self.tail_steps,
               f"between 1 and parity.steps={self.steps}")
        check(self.tolerance > 0, "parity.tolerance", self.tolerance, "a positive number of nats, e.g. 0.05")
        check(len(self.seeds) == 2 and self.seeds[0] != self.seeds[1], "parity.seeds", self.seeds,
               "two different integers, e.g. [1, 2]")
        check(self.reference not in self.variants, "parity.variants", self.variants,
               f"variants other than the reference {self.reference} (its two seeds are its own check)")


@dataclass(frozen=True)
class SearchParams:
    """The search (benchlab/search/strategy.py): candidates screened short on one worker process, the best repeated
    with bench.steps in fresh processes, then judged for parity."""

    start: str = "recipe"
    """The variant the search starts from and measures every ratio against."""
    budget_s: float = 300.0
    """Seconds of the whole search (screening, confirmation and parity, start-up and compile included)."""
    screen_steps: int = 10
    """Timed steps of a screening run, after bench.warmup_steps."""
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
class TtlParams:
    """The time-to-loss track (ttl/dvc.yaml, benchlab/run/ttl.py): every arm trains `steps` steps per seed on the same
    batches, evaluated at the same steps; the target is the tuned reference's validation loss at its budget,
    `budget_fraction` of its own training time."""

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
    """The reference's sweep, with the first seed: each learning rate (train.min_lr keeps its ratio to train.lr)..."""
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
class PythonCorpusParams:
    bytes: int = 8_000_000
    """Text to take from this Python install's sources and documents (benchlab/prep/python_corpus.py)."""

    def __post_init__(self) -> None:
        check(self.bytes > 0, "python_corpus.bytes", self.bytes, "a positive byte count, e.g. 8000000")
