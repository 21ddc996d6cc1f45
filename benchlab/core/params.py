"""params.yaml loaded into typed dataclasses, checked before any work.

Every section is a frozen dataclass (`benchlab.core.sections`); `load_params` refuses unknown keys, wrong types
and values outside a `Literal`, naming the key, the bad value and the valid ones. The optimization knobs are one table, the fields of
`benchlab.core.knobs.RunSettings`, set by each variant, and at the top level for the train stage (those it can honour
there, `knobs.TOP_LEVEL_KNOBS`; another is refused naming where to set it). This module imports neither torch nor
the model, so a stage that only reads params (prepare) does not depend on them.
"""

import types
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from benchlab.core import param_reads, presets
from benchlab.core.errors import LabError, check, cut, shown
from benchlab.core.knobs import KNOBS, TOP_LEVEL_KNOBS, RunSettings, check_combination, math_changes, top_level_refusal
from benchlab.core.old_names import REPLACED_KNOBS, moved_key_error, old_knob_error
from benchlab.core.on_base import ttl_on_reference, variants_on_base
from benchlab.core.param_reads import Traced
from benchlab.core.sections import (
    DEFAULT_FALLBACKS,
    DEFAULT_OURS,
    FLOAT_TEXT,
    SAFE_NAME,
    AggregateParams,
    BenchParams,
    DataParams,
    DeviceChoice,
    EvalParams,
    HarnessParams,
    OptimParams,
    ParityParams,
    ProfileParams,
    ShapeParams,
    TrainParams,
)
from benchlab.core.track_sections import PythonCorpusParams, SearchParams, TtlParams
from benchlab.core.yaml_files import committed_yaml, read_yaml


@dataclass(frozen=True)
class Params(Traced):
    """The whole of params.yaml, grouped by the stages that read each section. The knobs of `run` are written as
    top-level keys."""

    seed: int = 1337
    """Seeds the initial weights and the batch order of every run."""
    device: DeviceChoice = "auto"
    """auto: CUDA when torch sees a GPU, else the CPU."""
    model: str = "tiny"
    """A preset of model/gpt.py: tiny, gpt_small, gpt2_124m, gpt2_350m, gpt2_774m, gpt2_1558m (checked by benchlab.run.build_model)."""
    run: RunSettings = field(default_factory=RunSettings)
    """The train stage's knobs, read from the top-level keys named in TOP_LEVEL_KNOBS."""
    data: DataParams = field(default_factory=DataParams)
    shape: ShapeParams = field(default_factory=ShapeParams)
    optim: OptimParams = field(default_factory=OptimParams)
    harness: HarnessParams = field(default_factory=HarnessParams)
    train: TrainParams = field(default_factory=TrainParams)
    bench: BenchParams = field(default_factory=BenchParams)
    eval: EvalParams = field(default_factory=EvalParams)
    bases: dict[str, RunSettings] = field(default_factory=dict)
    """What a variant may be written on (`base: <name>`): the base's knobs, then the variant's changes."""
    variants: dict[str, RunSettings] = field(default_factory=dict)
    aggregate: AggregateParams = field(default_factory=AggregateParams)
    profile: ProfileParams = field(default_factory=ProfileParams)
    parity: ParityParams = field(default_factory=ParityParams)
    search: SearchParams = field(default_factory=SearchParams)
    ttl: TtlParams = field(default_factory=TtlParams)
    python_corpus: PythonCorpusParams = field(default_factory=PythonCorpusParams)
    preset: str = "cpu"
    """The preset whose values replaced params.yaml's own (benchlab.core.presets); cpu: none replaced."""

    def __post_init__(self) -> None:
        check(self.bench.steps >= self.harness.warmup_steps + 2, "bench.steps", self.bench.steps,
              f"at least harness.warmup_steps + 2 = {self.harness.warmup_steps + 2}, so that two or more steps are timed")
        check(bool(self.variants), "variants", self.variants,
               "at least one variant, e.g. `fp32_baseline: {}` (the matrix the bench and aggregate stages run)")
        for name in self.variants:
            check(bool(SAFE_NAME.fullmatch(name)), "variants", name,
                   "names of letters, digits and underscores (not starting with a digit), at most 64 long")
        if self.variants:
            check(self.aggregate.baseline in self.variants, "aggregate.baseline", self.aggregate.baseline,
                   ", ".join(self.variants))
            for key, names, default in (("aggregate.fallback_baselines", self.aggregate.fallback_baselines,
                                         DEFAULT_FALLBACKS), ("aggregate.ours", self.aggregate.ours, DEFAULT_OURS)):
                for name in names if tuple(names) != default else ():
                    check(name in self.variants, key, name, ", ".join(self.variants))
        for name in self.profile.variants:
            check(name in self.variants, "profile.variants", name, ", ".join(self.variants) or "(no variants)")
        # Checked at load, so the env stage refuses it before the parity reference the search needs has run.
        if self.search.start != SearchParams.start:  # set by the user: a matrix without the default need not search
            check(self.search.start in self.variants, "search.start", self.search.start, ", ".join(self.variants))
        parity = [("parity.reference", self.parity.reference)] if self.parity.variants else []
        for key, name in [*parity, *(("parity.variants", n) for n in self.parity.variants)]:
            check(name in self.variants, key, name, ", ".join(self.variants) or "(no variants)")
            check(self.variants[name].parallel == "none", key, name,
                   "a one-process variant (parity trains in one process; run a parallel variant's one-process counterpart)")
        for key, name in [*parity, *(("parity.variants", n) for n in self.parity.variants)]:
            changes = ", ".join(math_changes(self.variants[name]))
            check(not changes, key, name, f"a variant of the same math: {name} sets {changes}, which changes the "
                  "optimization, so parity (does it learn what the reference learns, step for step) cannot judge it; "
                  "put it in ttl.variants (time to a target loss)")
        if self.ttl.variants and self.ttl.reference != TtlParams.reference:
            check(self.ttl.reference in self.variants, "ttl.reference", self.ttl.reference, ", ".join(self.variants))
        for where, settings in [("", self.run), *((f"variants.{n}.", s) for n, s in self.variants.items()),
                                *((f"ttl.variants.{n}.", s) for n, s in self.ttl.variants.items())]:
            check_combination(where, settings, self.batch_size(settings))
            check(settings.parallel == "none" or not where.startswith("ttl."), f"{where}parallel", settings.parallel,
                  "none (the time-to-loss track trains in one process)")

    def batch_size(self, settings: RunSettings) -> int:
        """Sequences per optimizer step under these settings."""
        return settings.batch_size or self.shape.batch_size


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
        moved = moved_key_error(full)
        if moved:
            raise LabError(moved)
        if instead:
            raise LabError(f"{cut(full)}={shown(value)} is not valid: the optimizer knob replaced fused_adamw, "
                           f"adam_state, compile_update and weight_dtype=bf16_sr; write {instead}")
        if key not in names:
            under = f" under {cut(prefix)}" if prefix else ""
            raise LabError(f"unknown key {shown(full)}; valid keys{under}: {', '.join(names)}")
    kwargs = {k: _convert(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)


def parse_params(data: Any) -> Params:
    """Params from params.yaml's mapping, with the chosen preset's values in place (benchlab.core.presets).

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
        raise LabError(f"unknown key 'run'; set the train stage's knobs at the top level: {', '.join(TOP_LEVEL_KNOBS)}")
    for key, value in data.items():
        if key in KNOBS and key not in TOP_LEVEL_KNOBS:  # a knob the train stage cannot honour (knob()'s top_level)
            raise LabError(top_level_refusal(key, value))
    knobs = {k: v for k, v in data.items() if k in KNOBS or k in REPLACED_KNOBS}  # the latter: to name the new one
    rest = {k: v for k, v in data.items() if k not in knobs}
    sections = {f.name for f in fields(Params)} - {"run", "preset"}
    for key in rest:
        if key not in sections:
            valid = ", ".join(sorted(sections | {"preset", "presets"} | set(TOP_LEVEL_KNOBS)))
            raise LabError(f"unknown key {shown(key)}; valid keys: {valid}")
    hints = get_type_hints(Params)
    rest = ttl_on_reference(variants_on_base(rest))
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
    params = parse_params(data)
    param_reads.start()  # where a test asks (BENCHLAB_PARAM_READS): the keys this stage reads from here on
    return params


def with_changes(p: Params, **changes: Any) -> Params:
    """`p` with some top-level values replaced (a section, the variants), checked again; not a read of the rest, and
    a later read of a replaced value (not a section: its own fields say) is none of params.yaml."""
    with param_reads.quiet():
        new = replace(p, **changes)
    param_reads.replaced(new, frozenset(k for k, v in changes.items() if not isinstance(v, Traced)))
    return new


def corpus_param(path: str | Path = "params.yaml") -> str:
    """params.yaml's data.corpus alone, checked to be a string, for a stage that reads no other param (no preset
    can set it: benchlab.core.presets.FIXED)."""
    data = read_yaml(path)
    section = data.get("data") if isinstance(data, dict) else None
    value = section.get("corpus", DataParams.corpus) if isinstance(section, dict) else DataParams.corpus
    param_reads.start()
    param_reads.note("data.corpus")
    return _convert(value, str, "data.corpus")
