"""params.yaml loaded into typed dataclasses, checked before any work.

Every section is a frozen dataclass; `load_params` refuses unknown keys, wrong types and values outside a
`Literal`, naming the key, the bad value and the valid ones. The optimization knobs are one table, the fields of
`benchlab.knobs.RunSettings`, set at the top level for the train stage and by each variant. This module imports
neither torch nor the model, so a stage that only reads params (prepare) does not depend on them.
"""

import re
import subprocess
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from benchlab import presets
from benchlab.errors import LabError, cut, shown
from benchlab.knobs import KNOBS, REPLACED_KNOBS, RunSettings, check_combination, old_knob_error

DeviceChoice = Literal["auto", "cpu", "cuda"]
LockMode = Literal["wait", "fail"]

# Variant names become file names and DVC stage names; they must be plain
# identifiers. They never reach a shell: stages learn their variant from
# DVC_STAGE (see stages/bench.py), not from the command line.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _check(ok: bool, key: str, value: object, valid: str) -> None:
    """Refuse a value, naming its key, the value (cut where long, `errors.shown`) and what would be valid."""
    if not ok:
        raise LabError(f"{key}={shown(value)} is not valid; expected {valid}")


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
        _check(self.warmup_steps >= 1, "bench.warmup_steps", self.warmup_steps, "1 or more")
        _check(
            self.steps >= self.warmup_steps + 2, "bench.steps", self.steps,
            f"at least bench.warmup_steps + 2 = {self.warmup_steps + 2}, so that two or more steps are timed",
        )
        _check(self.repeats >= 1, "bench.repeats", self.repeats, "1 or more")
        _check(self.steady_tolerance > 0, "bench.steady_tolerance", self.steady_tolerance, "a positive fraction")
        _check(self.memory_cap_gib >= 0, "bench.memory_cap_gib", self.memory_cap_gib,
               "0 (no cap) or the GiB of the card to answer for, e.g. 24")


@dataclass(frozen=True)
class EvalParams:
    batches: int = 8
    """Batches of train.batch_size fixed validation windows, evenly spaced over the split."""

    def __post_init__(self) -> None:
        _check(self.batches > 0, "eval.batches", self.batches, "a positive integer")


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
class ParityParams:
    reference: str = "tf32"
    """The variant every parity variant is compared with; trained twice, with each of `seeds`' batch orders."""
    variants: list[str] = field(default_factory=list)
    """Variants trained for parity, one `parity@<name>` stage each (dvc.yaml reads this list itself)."""
    steps: int = 150
    """Optimizer steps of every parity run (the learning-rate schedule spans them)."""
    tail_steps: int = 30
    """The verdict compares the mean training loss over a run's last this many steps."""
    tolerance: float = 0.05
    """Nats the variant's tail loss may differ from the reference's; set it above the reference's own
    gap between its two batch orders (the stage shows both), else no verdict is given."""
    seeds: list[int] = field(default_factory=lambda: [1, 2])
    """Two batch-order seeds: the reference runs with both, each variant with the first. The initial weights
    always come from `seed`."""

    def __post_init__(self) -> None:
        _check(self.steps >= 2, "parity.steps", self.steps, "2 or more")
        _check(1 <= self.tail_steps <= self.steps, "parity.tail_steps", self.tail_steps,
               f"between 1 and parity.steps={self.steps}")
        _check(self.tolerance > 0, "parity.tolerance", self.tolerance, "a positive number of nats, e.g. 0.05")
        _check(len(self.seeds) == 2 and self.seeds[0] != self.seeds[1], "parity.seeds", self.seeds,
               "two different integers, e.g. [1, 2]")
        _check(self.reference not in self.variants, "parity.variants", self.variants,
               f"variants other than the reference {self.reference} (its two seeds are its own check)")


@dataclass(frozen=True)
class SearchParams:
    """The search (benchlab/search.py): candidates screened short on one worker process, the best repeated
    with bench.steps in fresh processes, then judged for parity."""

    start: str = "recipe"
    """The variant the search starts from and measures every ratio against."""
    budget_s: float = 1800.0
    """Seconds of the whole search (screening, confirmation and parity, start-up and compile included)."""
    screen_steps: int = 10
    """Timed steps of a screening run, after bench.warmup_steps."""
    max_candidates: int = 60
    """Screening runs at most, whichever limit comes first."""
    confirm: int = 2
    """The best this many of each goal are run `repeats` times more, then judged for parity."""
    repeats: int = 2
    lean_floor: float = 0.85
    """lean: the least peak memory among runs at this fraction of the start's tokens/s or more."""

    def __post_init__(self) -> None:
        _check(self.budget_s > 0, "search.budget_s", self.budget_s, "a positive number of seconds, e.g. 1800")
        _check(self.max_candidates >= 1, "search.max_candidates", self.max_candidates, "1 or more")
        _check(self.screen_steps >= 2, "search.screen_steps", self.screen_steps, "2 or more timed steps")
        _check(self.confirm >= 1, "search.confirm", self.confirm, "1 or more")
        _check(self.repeats >= 0, "search.repeats", self.repeats, "0 or more")
        _check(0 < self.lean_floor <= 1, "search.lean_floor", self.lean_floor, "a fraction in (0, 1], e.g. 0.85")


@dataclass(frozen=True)
class Params:
    """The whole of params.yaml. The knobs of `run` are written as top-level keys."""

    seed: int = 1337
    """Seeds the initial weights and the batch order of every run."""
    device: DeviceChoice = "auto"
    """auto: CUDA when torch sees a GPU, else the CPU."""
    model: str = "tiny"
    """A preset of model/gpt.py: tiny, gpt_small, gpt2_124m, gpt2_350m, gpt2_774m, gpt2_1558m (checked by benchlab.build)."""
    run: RunSettings = field(default_factory=RunSettings)
    """The train stage's knobs, read from the top-level keys named in KNOBS."""
    data: DataParams = field(default_factory=DataParams)
    train: TrainParams = field(default_factory=TrainParams)
    bench: BenchParams = field(default_factory=BenchParams)
    eval: EvalParams = field(default_factory=EvalParams)
    variants: dict[str, RunSettings] = field(default_factory=dict)
    aggregate: AggregateParams = field(default_factory=AggregateParams)
    profile: ProfileParams = field(default_factory=ProfileParams)
    parity: ParityParams = field(default_factory=ParityParams)
    search: SearchParams = field(default_factory=SearchParams)
    preset: str = "cpu"
    """The preset whose values replaced params.yaml's own (benchlab.presets); cpu: none replaced."""

    def __post_init__(self) -> None:
        _check(bool(self.variants), "variants", self.variants,
               "at least one variant, e.g. `fp32_baseline: {}` (the matrix the bench and aggregate stages run)")
        for name in self.variants:
            _check(bool(SAFE_NAME.fullmatch(name)), "variants", name,
                   "names of letters, digits and underscores (not starting with a digit), at most 64 long")
        if self.variants:
            _check(self.aggregate.baseline in self.variants, "aggregate.baseline", self.aggregate.baseline,
                   ", ".join(self.variants))
            for key, names, default in (("aggregate.fallback_baselines", self.aggregate.fallback_baselines,
                                         DEFAULT_FALLBACKS), ("aggregate.ours", self.aggregate.ours, DEFAULT_OURS)):
                for name in names if tuple(names) != default else ():
                    _check(name in self.variants, key, name, ", ".join(self.variants))
        for name in self.profile.variants:
            _check(name in self.variants, "profile.variants", name, ", ".join(self.variants) or "(no variants)")
        # Checked at load, so the env stage refuses it before the parity reference the search needs has run.
        if self.search.start != SearchParams.start:  # set by the user: a matrix without the default need not search
            _check(self.search.start in self.variants, "search.start", self.search.start, ", ".join(self.variants))
        parity = [("parity.reference", self.parity.reference)] if self.parity.variants else []
        for key, name in [*parity, *(("parity.variants", n) for n in self.parity.variants)]:
            _check(name in self.variants, key, name, ", ".join(self.variants) or "(no variants)")
            _check(self.variants[name].parallel == "none", key, name,
                   "a one-process variant (parity trains in one process; run a parallel variant's one-process counterpart)")
        for where, settings in [("", self.run), *((f"variants.{n}.", s) for n, s in self.variants.items())]:
            check_combination(where, settings, self.batch_size(settings))

    def batch_size(self, settings: RunSettings) -> int:
        """Sequences per optimizer step under these settings."""
        return settings.batch_size or self.train.batch_size


def variant_from(given: str | None, stage: str | None, p: Params, kind: str = "bench") -> str:
    """The variant to run: --variant, else the part of DVC_STAGE after `<kind>@`; it must be in params."""
    name = given
    if name is None:
        if not stage or f"{kind}@" not in stage:
            raise LabError(f"no variant given: pass --variant NAME, or run as the DVC stage {kind}@NAME")
        name = stage.split(f"{kind}@", 1)[1]
    if name not in p.variants:
        raise LabError(f"variant {shown(name)} is not in params.yaml; valid: {', '.join(p.variants)}")
    return name


def _convert(value: Any, hint: Any, key: str) -> Any:
    """Check one YAML value against a type hint, recursing into dataclasses, lists and dicts."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):  # `int | None`: None, or a value of the other type
        if value is None:
            return None
        (inner,) = [a for a in get_args(hint) if a is not type(None)]
        return _convert(value, inner, key)
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise LabError(f"{key}={shown(value)} is not valid; expected one of: {', '.join(map(str, choices))}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise LabError(f"{key}={shown(value)} is not valid; expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LabError(f"{key}={shown(value)} is not valid; expected an integer")
        return value
    if hint is float:
        # PyYAML reads YAML 1.1, where `6e-05` (no dot, as `dvc exp run -S` writes
        # it) is a string; accept what YAML 1.2 and Python call a number.
        if isinstance(value, str) and FLOAT_TEXT.fullmatch(value.strip()):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LabError(f"{key}={shown(value)} is not valid; expected a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise LabError(f"{key}={shown(value)} is not valid; expected a string")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise LabError(f"{key}={shown(value)} is not valid; expected a list")
        (item,) = get_args(hint)
        return [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise LabError(f"{key}={shown(value)} is not valid; expected a mapping")
        _, item = get_args(hint)
        return {str(k): _convert(v, item, f"{key}.{cut(str(k))}") for k, v in value.items()}
    if isinstance(hint, type) and hasattr(hint, "__dataclass_fields__"):
        return parse(hint, value, key)
    raise TypeError(f"no conversion for {hint!r} at {key}")  # a bug in this module, not the user's


def parse(cls: type, data: Any, prefix: str = "") -> Any:
    """A dataclass from a mapping: unknown keys, wrong types and bad values raise LabError."""
    where = prefix or "params.yaml"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LabError(f"{where} must be a mapping, got {shown(data)}")
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key, value in data.items():
        instead = old_knob_error(key, value) if cls is RunSettings else None
        full = f"{prefix}.{key}" if prefix else str(key)
        if instead:
            raise LabError(f"{cut(full)}={shown(value)} is not valid: the optimizer knob replaced fused_adamw, "
                           f"adam_state, compile_update and weight_dtype=bf16_sr; write {instead}")
        if key not in names:
            under = f" under {cut(prefix)}" if prefix else ""
            raise LabError(f"unknown key {shown(full)}; valid keys{under}: {', '.join(names)}")
    kwargs = {k: _convert(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)


def parse_params(data: Any) -> Params:
    """Params from params.yaml's mapping, with the chosen preset's values in place (benchlab.presets).

    params.yaml's own values are checked, then each preset's as they would be used, so a bad value in any
    preset is named (`presets.<name>: ...`) before any work, whichever preset is chosen.
    """
    if not isinstance(data, dict):
        raise LabError(f"params.yaml must be a mapping, got {shown(data)}")
    name, resolved, _ = presets.resolve(data)
    base = {k: v for k, v in data.items() if k not in ("preset", "presets")}
    chosen = _parse_resolved(base, "cpu")
    for other, values in (data.get("presets") or {}).items():
        try:
            parsed = _parse_resolved(presets.merged(base, values or {}), str(other))
        except LabError as err:
            raise LabError(f"presets.{cut(str(other))}: {err}") from None
        if other == name:
            chosen = parsed
    return chosen


def _parse_resolved(data: dict, preset: str) -> Params:
    """Params from a mapping with no preset keys left: the knobs at the top level are gathered into `run`."""
    if "run" in data:
        raise LabError(f"unknown key 'run'; set the train stage's knobs at the top level: {', '.join(KNOBS)}")
    if "batch_size" in data:
        raise LabError("batch_size=... at the top level is not valid; set train.batch_size (variants set batch_size)")
    knobs = {k: v for k, v in data.items() if k in KNOBS or k in REPLACED_KNOBS}  # the latter: to name the new one
    rest = {k: v for k, v in data.items() if k not in knobs}
    sections = {f.name for f in fields(Params)} - {"run", "preset"}
    for key in rest:
        if key not in sections:
            valid = ", ".join(sorted(sections | {"preset", "presets"} | set(KNOBS) - {"batch_size"}))
            raise LabError(f"unknown key {shown(key)}; valid keys: {valid}")
    hints = get_type_hints(Params)
    kwargs = {k: _convert(v, hints[k], k) for k, v in rest.items()}
    return Params(run=parse(RunSettings, knobs), preset=preset, **kwargs)


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and check params.yaml; any problem raises LabError naming the key."""
    path = Path(path)
    if not path.is_file():
        raise LabError(f"{path} not found; run from the repository root")
    data = read_yaml(path)
    if isinstance(data, dict) and data.get("preset", "cpu") != "cpu":
        presets.overruled(data, committed_yaml(path))  # a value the user set that the preset would replace
    return parse_params(data)


def committed_yaml(path: Path) -> Any:
    """A YAML file as the last commit holds it; None outside a git checkout, or where HEAD has no such file."""
    try:
        proc = subprocess.run(["git", "show", f"HEAD:./{path.name}"], cwd=path.parent, capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return yaml.safe_load(proc.stdout.decode("utf-8")) if proc.returncode == 0 else None
    except (UnicodeDecodeError, yaml.YAMLError):
        return None


def corpus_param(path: str | Path = "params.yaml") -> str:
    """params.yaml's data.corpus alone, checked to be a string, for a stage that reads no other param (no preset
    can set it: benchlab.presets.FIXED)."""
    data = read_yaml(path)
    section = data.get("data") if isinstance(data, dict) else None
    value = section.get("corpus", DataParams.corpus) if isinstance(section, dict) else DataParams.corpus
    return _convert(value, str, "data.corpus")


def read_yaml(path: str | Path) -> Any:
    """A YAML file the lab reads (params.yaml), as UTF-8 whatever the locale. Text that is not YAML is refused
    naming its line, and so is a key given twice in one mapping, which YAML would let the second silently win.

    Through DVC a key given twice never gets here: DVC reads params.yaml itself before any stage runs and
    refuses it in its own message of a dozen lines. This line is what a direct stage run says."""
    path = Path(path)
    try:
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise LabError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None
    try:
        node = loader.get_single_node()
        _refuse_twice(node, path)
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise LabError(f"{path} is not valid YAML: {problem}{where}; fix that line") from None
    finally:
        loader.dispose()


def _refuse_twice(node: yaml.Node | None, path: Path) -> None:
    """Refuse a key that one mapping under `node` gives twice, naming it by its dotted path and both lines."""
    todo, seen_nodes = [(node, "")], set()
    while todo:
        node, where = todo.pop()
        if node is None or id(node) in seen_nodes:  # an alias repeats a node: once is enough
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo += [(item, f"{where}[{i}]") for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                name = f"{where}.{key.value}" if where else str(key.value)
                line = key.start_mark.line + 1
                if name in lines and isinstance(key, yaml.ScalarNode):
                    raise LabError(f"{path} gives {cut(name)} twice (lines {lines[name]} and {line}): YAML would "
                                   "silently keep the second; delete one")
                lines[name] = line
                todo.append((value, name))
