"""The sections of params.yaml that dvc.yaml's stages read, as frozen dataclasses (the search's and the time-to-loss
track's are in `benchlab.core.track_sections`). params.yaml is grouped by the stage that reads it: a section a stage
reads whole is one line of its params in dvc.yaml (tests/unit/test_dvc_params.py checks each stage against what it read).

Each checks its own values in `__post_init__` and refuses a bad one naming its key, the value and what would be
valid. `benchlab.core.params` puts them together into `Params` and reads params.yaml. No torch, no model here.

params.yaml owns the values: each default here is params.yaml's own (tests/unit/test_sections.py fails where one
drifts), so a key left out of a section means what the file says. A list or mapping that names variants defaults
to none: a section cannot know the matrix.
"""

import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from benchlab.core.errors import check
from benchlab.core.param_reads import Traced

DeviceChoice = Literal["auto", "cpu", "cuda"]
LockMode = Literal["wait", "fail"]

# Variant names become file names and DVC stage names; they must be plain
# identifiers. They never reach a shell: stages learn their variant from
# DVC_STAGE (see stages/bench.py), not from the command line.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class DataParams(Traced):
    """The prepare stage's own: the corpus and its tokenizer."""

    SECTION: ClassVar[str] = "data"
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
class ShapeParams(Traced):
    """What every stage that runs the model feeds it: train, evaluate, bench, profile, parity, search, ttl."""

    SECTION: ClassVar[str] = "shape"
    batch_size: int = 16
    """Sequences per step (a variant may set its own batch_size)."""
    block_size: int = 128
    """Tokens per sequence; at most the preset's context."""

    def __post_init__(self) -> None:
        for key in ("batch_size", "block_size"):
            check(getattr(self, key) > 0, f"shape.{key}", getattr(self, key), "a positive integer")


@dataclass(frozen=True)
class OptimParams(Traced):
    """How every training stage optimizes: train, bench, profile, parity, search (ttl sweeps lr and warm-up)."""

    SECTION: ClassVar[str] = "optim"
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
        check(self.lr > 0, "optim.lr", self.lr, "a positive number")
        check(0 <= self.min_lr <= self.lr, "optim.min_lr", self.min_lr, f"between 0 and optim.lr={self.lr}")
        check(self.lr_warmup_steps >= 0, "optim.lr_warmup_steps", self.lr_warmup_steps, "0 or more")
        check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "0 or more")
        check(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "0 (off) or more")


@dataclass(frozen=True)
class TrainParams(Traced):
    """The train stage's own."""

    SECTION: ClassVar[str] = "train"
    steps: int = 100
    """Optimizer steps of the train stage."""

    def __post_init__(self) -> None:
        check(self.steps > 0, "train.steps", self.steps, "a positive integer")


@dataclass(frozen=True)
class HarnessParams(Traced):
    """How every timed stage times: train, bench, profile and the search."""

    SECTION: ClassVar[str] = "harness"
    warmup_steps: int = 6
    """Steps left out of the timing (compilation, allocator and cache warm-up)."""
    steady_tolerance: float = 0.05
    """Largest relative gap between the medians of the timed window's halves before a warning."""
    lock: LockMode = "wait"
    """Another timing holds this device: wait for it, or fail at once with a message naming its holder."""
    memory_cap_gib: float = 0.0
    """GiB of GPU memory each timing may use (torch.cuda.set_per_process_memory_fraction), so a larger GPU
    answers for a smaller card; 0: no cap. What torch's allocator may hold: on a real card of that size the
    CUDA context takes a few hundred MiB more."""

    def __post_init__(self) -> None:
        check(self.warmup_steps >= 1, "harness.warmup_steps", self.warmup_steps, "1 or more")
        check(self.steady_tolerance > 0, "harness.steady_tolerance", self.steady_tolerance, "a positive fraction")
        check(self.memory_cap_gib >= 0, "harness.memory_cap_gib", self.memory_cap_gib,
               "0 (no cap) or the GiB of the card to answer for, e.g. 24")


@dataclass(frozen=True)
class BenchParams(Traced):
    """The bench stages' own (one per variant)."""

    SECTION: ClassVar[str] = "bench"
    steps: int = 20
    """Optimizer steps of each variant run, harness.warmup_steps included."""
    repeats: int = 1
    """Independent runs per variant, each in a fresh process (fresh model, same seed); 2 or more give intervals."""

    def __post_init__(self) -> None:
        check(self.steps >= 3, "bench.steps", self.steps, "3 or more (harness.warmup_steps, then 2 or more timed)")
        check(self.repeats >= 1, "bench.repeats", self.repeats, "1 or more")


@dataclass(frozen=True)
class EvalParams(Traced):
    """Every stage that takes a validation loss."""

    SECTION: ClassVar[str] = "eval"
    batches: int = 8
    """Batches of shape.batch_size fixed validation windows, evenly spaced over the split."""

    def __post_init__(self) -> None:
        check(self.batches > 0, "eval.batches", self.batches, "a positive integer")


# Defaults of aggregate.fallback_baselines and aggregate.ours. Left at its default, a list may name variants a
# matrix does not have (a subset run); a list the user sets must name variants only.
DEFAULT_FALLBACKS = ("recipe",)
DEFAULT_OURS = ("fastest", "lean")


@dataclass(frozen=True)
class AggregateParams(Traced):
    SECTION: ClassVar[str] = "aggregate"
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
    """Where `baseline` did not run ok (out of memory under harness.memory_cap_gib, skipped), ratios are taken
    against the first of these that did; the summary says which and why."""
    reference: str = "recipe"
    """The variant the report's plots draw as a reference line; none where it is no variant or did not run ok."""
    ours: list[str] = field(default_factory=lambda: list(DEFAULT_OURS))
    """Variants the report groups and colours as our own, apart from the seed's matrix and the recipe's knobs."""

    def __post_init__(self) -> None:
        check(self.loss_tolerance > 0, "aggregate.loss_tolerance", self.loss_tolerance, "a positive number")
        check(self.repeat_tolerance >= 0, "aggregate.repeat_tolerance", self.repeat_tolerance, "0 or more")


@dataclass(frozen=True)
class ProfileParams(Traced):
    SECTION: ClassVar[str] = "profile"
    variants: list[str] = field(default_factory=list)
    """Variants to trace with torch.profiler; empty: none."""
    steps: int = 3
    """Steps recorded after harness.warmup_steps untraced steps."""

    def __post_init__(self) -> None:
        check(self.steps > 0, "profile.steps", self.steps, "a positive integer")


@dataclass(frozen=True)
class ParityParams(Traced):
    SECTION: ClassVar[str] = "parity"
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
