"""params.yaml loaded into typed dataclasses, checked before any work.

Every section is a frozen dataclass; `load_params` refuses unknown keys, wrong
types and values outside a `Literal`, naming the key, the bad value and the
valid ones. Checks that need the hardware (fp16 on a CPU, say) live in
`benchlab.optimize.unsupported_reason`.
"""

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from benchlab.errors import LabError
from model.gpt import PRESETS, GPTConfig, padded_vocab

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
Attention = Literal["manual", "sdpa"]
DeviceChoice = Literal["auto", "cpu", "cuda"]

# Variant names are templated into a shell command by dvc.yaml (`${key}`), so
# they must be plain identifiers: `foo;rm -rf x` never reaches a shell.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class RunSettings:
    """The knobs an optimization variant turns; the top level of params.yaml holds the train stage's."""

    precision: Precision = "fp32"
    """fp32 (TF32 off), tf32 (fp32 with TF32 matmuls), fp16 (autocast + GradScaler), bf16 (autocast)."""
    attention: Attention = "manual"
    """manual: explicit causal-masked softmax; sdpa: torch's scaled_dot_product_attention."""
    compile: bool = False
    """Wrap the model in torch.compile (default mode)."""
    fused_adamw: bool = False
    """AdamW's fused kernel instead of the for-loop implementation."""


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
        _check(self.vocab_size >= 257, "data.vocab_size", self.vocab_size, "at least 257 (256 bytes + end-of-text)")
        _check(self.vocab_size <= 2**32, "data.vocab_size", self.vocab_size, "at most 4294967296 (tokens are stored as uint32)")
        _check(0.0 < self.val_fraction < 0.5, "data.val_fraction", self.val_fraction, "between 0 and 0.5, exclusive")
        _check(self.tokenizer_sample_bytes >= 0, "data.tokenizer_sample_bytes", self.tokenizer_sample_bytes,
               "0 (the whole corpus) or a positive byte count such as 100000000")
        _check(bool(self.text_field), "data.text_field", self.text_field, "the key or column holding the text, e.g. text")
        _check(bool(self.eot_token), "data.eot_token", self.eot_token, "a token such as <|endoftext|>")


@dataclass(frozen=True)
class TrainParams:
    batch_size: int = 16
    """Sequences per step."""
    block_size: int = 128
    """Tokens per sequence; at most the preset's context."""
    steps: int = 200
    """Optimizer steps of the train stage."""
    lr: float = 1e-3
    """Peak learning rate, reached after lr_warmup_steps of linear warm-up."""
    min_lr: float = 1e-4
    """Floor of the cosine decay."""
    lr_warmup_steps: int = 20
    """Steps of linear learning-rate warm-up (capped at the run's length)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay, applied to matrices only."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 turns clipping off."""

    def __post_init__(self) -> None:
        for key in ("batch_size", "block_size", "steps"):
            _check(getattr(self, key) > 0, f"train.{key}", getattr(self, key), "a positive integer")
        _check(self.lr > 0, "train.lr", self.lr, "a positive number")
        _check(0 <= self.min_lr <= self.lr, "train.min_lr", self.min_lr, f"between 0 and train.lr={self.lr}")
        _check(self.lr_warmup_steps >= 0, "train.lr_warmup_steps", self.lr_warmup_steps, "0 or more")
        _check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "0 or more")
        _check(self.grad_clip >= 0, "train.grad_clip", self.grad_clip, "0 (off) or more")


@dataclass(frozen=True)
class BenchParams:
    steps: int = 30
    """Optimizer steps of each variant run, warm-up included."""
    warmup_steps: int = 10
    """Steps left out of the timing (compilation, allocator and cache warm-up)."""
    repeats: int = 1
    """Independent runs per variant (fresh model, same seed); 2 or more give confidence intervals."""
    steady_tolerance: float = 0.05
    """Largest relative gap between the medians of the timed window's halves before a warning."""

    def __post_init__(self) -> None:
        _check(self.warmup_steps >= 1, "bench.warmup_steps", self.warmup_steps, "1 or more")
        _check(
            self.steps >= self.warmup_steps + 2, "bench.steps", self.steps,
            f"at least bench.warmup_steps + 2 = {self.warmup_steps + 2}, so that two or more steps are timed",
        )
        _check(self.repeats >= 1, "bench.repeats", self.repeats, "1 or more")
        _check(self.steady_tolerance > 0, "bench.steady_tolerance", self.steady_tolerance, "a positive fraction")


@dataclass(frozen=True)
class EvalParams:
    batches: int = 8
    """Batches of train.batch_size fixed validation windows, evenly spaced over the split."""

    def __post_init__(self) -> None:
        _check(self.batches > 0, "eval.batches", self.batches, "a positive integer")


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

    def __post_init__(self) -> None:
        _check(self.loss_tolerance > 0, "aggregate.loss_tolerance", self.loss_tolerance, "a positive number")
        _check(self.repeat_tolerance >= 0, "aggregate.repeat_tolerance", self.repeat_tolerance, "0 or more")


@dataclass(frozen=True)
class ProfileParams:
    variants: list[str] = field(default_factory=list)
    """Variants to trace with torch.profiler; empty: none."""
    steps: int = 3
    """Steps recorded after bench.warmup_steps untraced steps."""

    def __post_init__(self) -> None:
        _check(self.steps > 0, "profile.steps", self.steps, "a positive integer")


@dataclass(frozen=True)
class Params:
    """The whole of params.yaml."""

    seed: int = 1337
    """Seeds the initial weights and the batch order of every run."""
    device: DeviceChoice = "auto"
    """auto: CUDA when torch sees a GPU, else the CPU."""
    model: str = "tiny"
    """A preset of model/gpt.py: tiny, gpt_small, gpt2_124m, gpt2_350m."""
    precision: Precision = "fp32"
    """The train stage's precision (see RunSettings); variants set their own."""
    attention: Attention = "manual"
    compile: bool = False
    fused_adamw: bool = False
    data: DataParams = field(default_factory=DataParams)
    train: TrainParams = field(default_factory=TrainParams)
    bench: BenchParams = field(default_factory=BenchParams)
    eval: EvalParams = field(default_factory=EvalParams)
    variants: dict[str, RunSettings] = field(default_factory=dict)
    aggregate: AggregateParams = field(default_factory=AggregateParams)
    profile: ProfileParams = field(default_factory=ProfileParams)

    def __post_init__(self) -> None:
        _check(self.model in PRESETS, "model", self.model, ", ".join(PRESETS))
        preset = PRESETS[self.model]
        _check(
            self.train.block_size <= preset.block_size, "train.block_size", self.train.block_size,
            f"at most {preset.block_size}, the context of model={self.model}",
        )
        for name in self.variants:
            _check(bool(SAFE_NAME.fullmatch(name)), "variants", name,
                   "names of letters, digits and underscores (not starting with a digit), at most 64 long")
        if self.variants:
            _check(self.aggregate.baseline in self.variants, "aggregate.baseline", self.aggregate.baseline,
                   ", ".join(self.variants))
        for name in self.profile.variants:
            _check(name in self.variants, "profile.variants", name, ", ".join(self.variants) or "(no variants)")

    @property
    def run(self) -> RunSettings:
        """The train stage's settings, from the top-level keys."""
        return RunSettings(self.precision, self.attention, self.compile, self.fused_adamw)

    def model_config(self, settings: RunSettings, data_vocab: int) -> GPTConfig:
        """The preset with the attention kernel and the data's vocabulary filled in."""
        preset = PRESETS[self.model]
        vocab = preset.vocab_size or padded_vocab(data_vocab)
        if data_vocab > vocab:
            raise LabError(
                f"model={self.model} has {vocab} token embeddings but the data has {data_vocab} tokens; "
                f"lower data.vocab_size to at most {vocab} and rerun prepare"
            )
        return GPTConfig.from_name(self.model, vocab_size=vocab, attention=settings.attention)


def _check(ok: bool, key: str, value: object, valid: str) -> None:
    if not ok:
        raise LabError(f"{key}={value!r} is not valid; expected {valid}")


def _convert(value: Any, hint: Any, key: str) -> Any:
    """Check one YAML value against a type hint, recursing into dataclasses, lists and dicts."""
    origin = get_origin(hint)
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise LabError(f"{key}={value!r} is not valid; expected one of: {', '.join(map(str, choices))}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise LabError(f"{key}={value!r} is not valid; expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LabError(f"{key}={value!r} is not valid; expected an integer")
        return value
    if hint is float:
        # PyYAML reads YAML 1.1, where `6e-05` (no dot, as `dvc exp run -S` writes
        # it) is a string; accept what YAML 1.2 and Python call a number.
        if isinstance(value, str) and FLOAT_TEXT.fullmatch(value.strip()):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LabError(f"{key}={value!r} is not valid; expected a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise LabError(f"{key}={value!r} is not valid; expected a string")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise LabError(f"{key}={value!r} is not valid; expected a list")
        (item,) = get_args(hint)
        return [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise LabError(f"{key}={value!r} is not valid; expected a mapping")
        _, item = get_args(hint)
        return {str(k): _convert(v, item, f"{key}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and hasattr(hint, "__dataclass_fields__"):
        return parse(hint, value, key)
    raise TypeError(f"no conversion for {hint!r} at {key}")  # a bug in this module, not the user's


def parse(cls: type, data: Any, prefix: str = "") -> Any:
    """A dataclass from a mapping: unknown keys, wrong types and bad values raise LabError."""
    where = prefix or "params.yaml"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LabError(f"{where} must be a mapping, got {data!r}")
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in data:
        if key not in names:
            full = f"{prefix}.{key}" if prefix else str(key)
            raise LabError(f"unknown key {full!r}; valid keys{' under ' + prefix if prefix else ''}: {', '.join(names)}")
    kwargs = {k: _convert(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and check params.yaml; any problem raises LabError naming the key."""
    path = Path(path)
    if not path.is_file():
        raise LabError(f"{path} not found; run from the repository root")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise LabError(f"{path} is not valid YAML: {problem}{where}; fix that line") from None
    return parse(Params, data)
