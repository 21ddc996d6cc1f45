"""params.yaml owns the values of its sections: each dataclass default in `benchlab.core.sections` (and `Params`'
own fields) is the value params.yaml gives, so a key left out means what the file says. Only what names variants
defaults to none, since a section cannot know the matrix. Each section's own checks refuse a bad value naming its
key, the value and the valid ones, and take their edge."""


from dataclasses import MISSING, Field, fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchlab.core.errors import LabError
from benchlab.core.knobs import (
    TOP_LEVEL_KNOBS,
    RunSettings,
    check_combination,
    unsupported_reason,
)
from benchlab.core.params import Params, load_params, parse_params
from benchlab.core.skips import DeviceFacts
from tests.conftest import ROOT, micro_params
from tests.knob_cases import CPU, H200, LIGER_VERSION

# The fields that name variants of the matrix (and the bases they are written on): empty by default
# (params.yaml's are its own matrix).
NAMES_VARIANTS = {"bases", "variants", "profile.variants", "parity.variants", "ttl.variants"}


def default(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def defaults_and_values(data: dict) -> list[tuple[str, Any, Any]]:
    """(key, dataclass default, params.yaml's value) for each field of Params and of each of its sections."""
    out = []
    for f in fields(Params):
        if f.name == "run":  # the knobs: their defaults are the unoptimized baseline (tests/unit/test_knobs.py)
            continue
        value = default(f)
        if is_dataclass(value):
            out += [(f"{f.name}.{g.name}", default(g), data[f.name].get(g.name, "(missing)")) for g in fields(value)]
        else:
            out.append((f.name, value, data.get(f.name, "(missing)")))
    return out


def test_every_section_default_is_params_yaml_s_value() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    rows = defaults_and_values(data)
    drifted = {key: (mine, theirs) for key, mine, theirs in rows if key not in NAMES_VARIANTS and mine != theirs}
    assert drifted == {}, "set these defaults in benchlab/core/sections.py to params.yaml's values (default, yaml)"
    assert all(not mine for key, mine, _ in rows if key in NAMES_VARIANTS)


def test_a_default_that_drifts_is_found() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["train"]["steps"] += 1
    data["search"].pop("budget_s")
    drifted = {key for key, mine, theirs in defaults_and_values(data) if mine != theirs}
    assert {"train.steps", "search.budget_s"} <= drifted


# --- each section's own checks ----------------------------------------------------------------------------------

BAD_PARAMS = [  # (override, the exact message); each check's first bad value next to its last good one
    ({"data__vocab_size": 256}, "data.vocab_size=256 is not valid; expected at least 257 (256 bytes + end-of-text)"),
    ({"data__vocab_size": 2**32 + 1},
     "data.vocab_size=4294967297 is not valid; expected at most 4294967296 (tokens are stored as uint32)"),
    ({"data__val_fraction": 0.5}, "data.val_fraction=0.5 is not valid; expected between 0 and 0.5, exclusive"),
    ({"data__val_fraction": 0.0}, "data.val_fraction=0.0 is not valid; expected between 0 and 0.5, exclusive"),
    ({"data__tokenizer_sample_bytes": -1}, ("data.tokenizer_sample_bytes=-1 is not valid; expected 0 (the whole "
                                            "corpus) or a positive byte count such as 100000000")),
    ({"data__text_field": ""}, "data.text_field='' is not valid; expected the key or column holding the text, e.g. text"),
    ({"data__eot_token": ""}, "data.eot_token='' is not valid; expected a token such as <|endoftext|>"),
    ({"shape__batch_size": 0}, "shape.batch_size=0 is not valid; expected a positive integer"),
    ({"shape__block_size": 0}, "shape.block_size=0 is not valid; expected a positive integer"),
    ({"train__steps": 0}, "train.steps=0 is not valid; expected a positive integer"),
    ({"optim__lr": 0.0}, "optim.lr=0.0 is not valid; expected a positive number"),
    ({"optim__lr": 1e-3, "optim__min_lr": 2e-3}, "optim.min_lr=0.002 is not valid; expected between 0 and optim.lr=0.001"),
    ({"optim__min_lr": -0.1}, None),  # the message names optim.lr: checked above
    ({"optim__lr_warmup_steps": -1}, "optim.lr_warmup_steps=-1 is not valid; expected 0 or more"),
    ({"optim__weight_decay": -0.1}, "optim.weight_decay=-0.1 is not valid; expected 0 or more"),
    ({"optim__grad_clip": -1.0}, "optim.grad_clip=-1.0 is not valid; expected 0 (off) or more"),
    ({"harness__warmup_steps": 0}, "harness.warmup_steps=0 is not valid; expected 1 or more"),
    ({"harness__warmup_steps": 2, "bench__steps": 3},
     "bench.steps=3 is not valid; expected at least harness.warmup_steps + 2 = 4, so that two or more steps are timed"),
    ({"bench__repeats": 0}, "bench.repeats=0 is not valid; expected 1 or more"),
    ({"harness__steady_tolerance": 0.0}, "harness.steady_tolerance=0.0 is not valid; expected a positive fraction"),
    ({"eval__batches": 0}, "eval.batches=0 is not valid; expected a positive integer"),
    ({"aggregate__loss_tolerance": 0.0}, "aggregate.loss_tolerance=0.0 is not valid; expected a positive number"),
    ({"aggregate__repeat_tolerance": -0.01}, "aggregate.repeat_tolerance=-0.01 is not valid; expected 0 or more"),
    ({"profile__steps": 0}, "profile.steps=0 is not valid; expected a positive integer"),
]
GOOD_PARAMS = [  # the last good value of each check above
    {"data__vocab_size": 257}, {"data__vocab_size": 2**32}, {"data__val_fraction": 0.49}, {"data__val_fraction": 1e-9},
    {"data__tokenizer_sample_bytes": 0}, {"shape__batch_size": 1, "shape__block_size": 1, "train__steps": 1},
    {"optim__lr": 1e-3, "optim__min_lr": 1e-3}, {"optim__min_lr": 0.0}, {"optim__lr_warmup_steps": 0},
    {"optim__weight_decay": 0.0}, {"optim__grad_clip": 0.0}, {"harness__warmup_steps": 1, "bench__steps": 3},
    {"bench__repeats": 1}, {"eval__batches": 1}, {"aggregate__repeat_tolerance": 0.0}, {"profile__steps": 1},
]


@pytest.mark.parametrize("override, message", BAD_PARAMS)
def test_each_section_check_names_the_key_the_value_and_the_valid_ones(override: dict, message: str | None) -> None:
    with pytest.raises(LabError) as err:
        parse_params(micro_params(**override))
    if message is not None:
        assert str(err.value) == message


@pytest.mark.parametrize("override", GOOD_PARAMS)
def test_each_section_check_accepts_its_boundary(override: dict) -> None:
    parse_params(micro_params(**override))


@pytest.mark.parametrize("key, value, words", [
    ("budget_s", 0, "search.budget_s=0.0 is not valid; expected a positive number of seconds"),
    ("max_candidates", 0, "search.max_candidates=0 is not valid; expected 1 or more"),
    ("confirm", 0, "search.confirm=0 is not valid; expected 1 or more"),
    ("repeats", -1, "search.repeats=-1 is not valid; expected 0 or more"),
    ("precompile_processes", -1, "search.precompile_processes=-1 is not valid; expected 0 (none) or more, e.g. 8"),
    ("screen_steps", 0, "search.screen_steps=0 is not valid; expected 2 or more timed steps"),
    ("lean_floor", 1.5, "search.lean_floor=1.5 is not valid; expected a fraction in (0, 1]"),
    ("budget", 60, "search.budget"),
])
def test_bad_search_params_get_one_line_errors(key: str, value: object, words: str) -> None:
    data = micro_params()
    data["search"] = {**data["search"], key: value}
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_search_start_that_is_not_a_variant_is_refused_at_load_and_the_default_where_the_search_starts() -> None:
    from benchlab.search.worker import start_of

    data = micro_params()
    data["search"]["start"] = "nope"  # set by the user: refused before any stage runs (the env stage loads params)
    with pytest.raises(LabError, match=r"^search.start='nope' is not valid; expected fp32_baseline, recipe, "):
        parse_params(data)
    data["search"]["start"] = "recipe"  # the default, in a matrix without it: only the search refuses it
    data["variants"] = {"fp32_baseline": {}}
    data["profile"]["variants"] = []
    p = parse_params(data)
    with pytest.raises(LabError, match=r"^search.start='recipe' is not valid; expected fp32_baseline$"):
        start_of(p)


def test_a_liger_of_unknown_version_and_fp16_on_a_cpu_are_refused_in_full() -> None:
    unknown = DeviceFacts(**{**H200.__dict__, "liger_version": None})
    assert unsupported_reason(RunSettings(loss="onepass"), unknown) == (
        f"loss=onepass calls liger-kernel {LIGER_VERSION}'s internal cross-entropy kernel; liger-kernel of unknown "
        "version is installed (pip install -r requirements-gpu.txt); or use loss=inline")
    assert unsupported_reason(RunSettings(precision="fp16"), CPU) == (
        "precision=fp16 with loss scaling needs a CUDA GPU; use bf16 or fp32 on CPU")
    no_capability = DeviceFacts(kind="cuda", name="a GPU", bf16=True, triton=True)  # the driver told nothing
    assert unsupported_reason(RunSettings(precision="tf32"), no_capability) == (
        "precision=tf32 needs an Ampere or newer GPU; a GPU is compute capability 0.x")


def test_a_yaml_error_is_named_by_its_problem_and_line_or_by_its_kind(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\ntrain: {batch_size: 4\n")
    with pytest.raises(LabError) as err:
        load_params(bad)
    assert str(err.value) == (f"{bad} is not valid YAML: expected ',' or '}}', but got '<stream end>' at line 3, "
                              "column 1; fix that line")

    def unmarked(loader: yaml.SafeLoader) -> None:
        raise yaml.YAMLError()  # no problem text, no position: not even the attributes

    monkeypatch.setattr(yaml.SafeLoader, "get_single_node", unmarked)
    with pytest.raises(LabError) as err:
        load_params(bad)
    assert str(err.value) == f"{bad} is not valid YAML: YAMLError; fix that line"


_DDP = "ddp when ddp_bucket_mb, ddp_grad_as_bucket_view or ddp_comm_hook is set"
_FSDP = "fsdp2 when fsdp_reshard_after_forward, fsdp_param_dtype or fsdp_blocks_per_unit is set"
_FP8 = ("(the chunked, fused, cce and onepass heads multiply by the output weight themselves, so the float8 output "
        "layer would be bypassed; or set fp8=blocks)")


@pytest.mark.parametrize(("knobs", "batch", "message"), [
    ({"batch_size": 0}, 8, "batch_size=0 is not valid; expected a positive integer"),
    ({"batch_size": 1}, 8, None),
    ({"nproc": 0, "parallel": "ddp"}, 8, "nproc=0 is not valid; expected 1 or more"),
    ({"nproc": 2}, 8, "nproc=2 is not valid; expected 1 with parallel=none (set parallel=ddp or parallel=fsdp2 to run "
                      "more processes)"),
    ({"nproc": 2, "parallel": "ddp", "grad_accum": 2}, 6,
     "nproc=2 is not valid; expected a count whose product with grad_accum=2 divides the global batch size 6"),
    ({"nproc": 2, "parallel": "ddp", "grad_accum": 2}, 12, None),
    ({"ddp_bucket_mb": 0, "parallel": "ddp"}, 8, "ddp_bucket_mb=0 is not valid; expected 1 or more (MiB)"),
    ({"ddp_bucket_mb": 1, "parallel": "ddp"}, 8, None),
    ({"ddp_bucket_mb": 24}, 8, f"parallel='none' is not valid; expected {_DDP}"),
    ({"ddp_grad_as_bucket_view": True}, 8, f"parallel='none' is not valid; expected {_DDP}"),
    ({"ddp_comm_hook": "bf16_compress"}, 8, f"parallel='none' is not valid; expected {_DDP}"),
    ({"fsdp_blocks_per_unit": -1, "parallel": "fsdp2"}, 8,
     "fsdp_blocks_per_unit=-1 is not valid; expected 0 (the whole model in the root unit) or a positive count of blocks"),
    ({"fsdp_blocks_per_unit": 0, "parallel": "fsdp2"}, 8, None),
    ({"fsdp_reshard_after_forward": False}, 8, f"parallel='none' is not valid; expected {_FSDP}"),
    ({"fsdp_param_dtype": "bf16"}, 8, f"parallel='none' is not valid; expected {_FSDP}"),
    ({"fsdp_blocks_per_unit": 2}, 8, f"parallel='none' is not valid; expected {_FSDP}"),
    ({"weight_dtype": "bf16", "precision": "fp16"}, 8,
     "precision='fp16' is not valid; expected bf16 with weight_dtype=bf16 (the matmuls run in the weights' dtype; fp16 "
     "loss scaling needs fp32 weights)"),
    ({"weight_dtype": "bf16", "precision": "bf16", "parallel": "fsdp2"}, 8,
     "parallel='fsdp2' is not valid; expected none or ddp with weight_dtype=bf16 (under fsdp2, fsdp_param_dtype=bf16 "
     "gathers bf16 copies of fp32 shards)"),
    ({"loss_chunk_tokens": 0, "loss": "chunked"}, 8, "loss_chunk_tokens=0 is not valid; expected a positive count of tokens"),
    ({"loss_chunk_tokens": 1, "loss": "chunked"}, 8, None),
    ({"loss_chunk_tokens": 4096}, 8, "loss='standard' is not valid; expected chunked when loss_chunk_tokens is set"),
    ({"fp8": "head", "loss": "chunked"}, 8, f"loss='chunked' is not valid; expected standard or inline with fp8=head {_FP8}"),
    ({"fp8": "all", "loss": "chunked"}, 8, f"loss='chunked' is not valid; expected standard or inline with fp8=all {_FP8}"),
    ({"fp8": "all", "loss": "inline"}, 8, None),
    ({"parallel": "fsdp2", "nproc": 2, "loss": "fused"}, 8, "loss='fused' is not valid; expected standard, inline, chunked or cce "
     "with parallel=fsdp2 (the fused head reads the output weight outside the sharded module)"),
])
def test_each_impossible_combination_is_refused_in_full_and_its_edge_allowed(knobs: dict, batch: int,
                                                                             message: str | None) -> None:
    if message is None:
        check_combination("variants.x.", RunSettings(**knobs), batch)
        return
    with pytest.raises(LabError) as err:
        check_combination("variants.x.", RunSettings(**knobs), batch)
    assert str(err.value) == "variants.x." + message


def test_the_matrix_s_own_refusals_read_in_full() -> None:
    data = micro_params()
    names = ", ".join(data["variants"])
    for change, message in [
        ({"variants": {}}, "variants={} is not valid; expected at least one variant, e.g. `fp32_baseline: {}` (the "
                           "matrix the bench and aggregate stages run)"),
        ({"variants": {**data["variants"], "9bad": {}}},
         "variants='9bad' is not valid; expected names of letters, digits and underscores (not starting with a "
         "digit), at most 64 long"),
        ({"aggregate": {**data.get("aggregate", {}), "baseline": "nope"}},
         f"aggregate.baseline='nope' is not valid; expected {names}")]:
        with pytest.raises(LabError) as err:
            parse_params({**data, **change})
        assert str(err.value) == message


def test_every_name_the_other_sections_give_must_be_a_variant_and_parity_s_one_process() -> None:
    data = micro_params()
    names = ", ".join(data["variants"])
    one = ("is not valid; expected a one-process variant (parity trains in one process; run a parallel variant's "
           "one-process counterpart)")
    for change, message in [
        ({"aggregate": {**data["aggregate"], "fallback_baselines": ["bf16", "nope"]}},
         f"aggregate.fallback_baselines='nope' is not valid; expected {names}"),
        ({"aggregate": {**data["aggregate"], "ours": ["nope"]}}, f"aggregate.ours='nope' is not valid; expected {names}"),
        ({"profile": {**data["profile"], "variants": ["nope"]}}, f"profile.variants='nope' is not valid; expected {names}"),
        ({"parity": {**data["parity"], "variants": ["bf16"], "reference": "nope"}},
         f"parity.reference='nope' is not valid; expected {names}"),
        ({"parity": {**data["parity"], "variants": ["nope"]}}, f"parity.variants='nope' is not valid; expected {names}"),
        ({"parity": {**data["parity"], "variants": ["ddp_2"]}}, f"parity.variants='ddp_2' {one}"),
        ({"parity": {**data["parity"], "variants": ["bf16"], "reference": "ddp_2"}}, f"parity.reference='ddp_2' {one}")]:
        with pytest.raises(LabError) as err:
            parse_params({**data, **change})
        assert str(err.value) == message
    # Without parity variants the reference is never trained, so it is not checked; the default fallbacks and
    # ours name variants a matrix need not have.
    parse_params({**data, "parity": {**data["parity"], "variants": [], "reference": "nope"}})
    small = {k: data["variants"][k] for k in ("fp32_baseline", "bf16")}
    parse_params({**data, "variants": small, "profile": {**data["profile"], "variants": []}})


@pytest.mark.parametrize(("section", "values", "message"), [
    ("DataParams", {"vocab_size": 256}, "data.vocab_size=256 is not valid; expected at least 257 (256 bytes + end-of-text)"),
    ("DataParams", {"vocab_size": 257}, None),
    ("DataParams", {"vocab_size": 2**32 + 1},
     "data.vocab_size=4294967297 is not valid; expected at most 4294967296 (tokens are stored as uint32)"),
    ("DataParams", {"vocab_size": 2**32}, None),
    ("DataParams", {"val_fraction": 0.0}, "data.val_fraction=0.0 is not valid; expected between 0 and 0.5, exclusive"),
    ("DataParams", {"val_fraction": 0.5}, "data.val_fraction=0.5 is not valid; expected between 0 and 0.5, exclusive"),
    ("DataParams", {"val_fraction": 0.49}, None),
    ("DataParams", {"tokenizer_sample_bytes": -1}, "data.tokenizer_sample_bytes=-1 is not valid; expected 0 (the whole "
                                                   "corpus) or a positive byte count such as 100000000"),
    ("DataParams", {"tokenizer_sample_bytes": 0}, None),
    ("DataParams", {"text_field": ""}, "data.text_field='' is not valid; expected the key or column holding the text, e.g. text"),
    ("DataParams", {"eot_token": ""}, "data.eot_token='' is not valid; expected a token such as <|endoftext|>"),
    ("ShapeParams", {"batch_size": 0}, "shape.batch_size=0 is not valid; expected a positive integer"),
    ("ShapeParams", {"block_size": 0}, "shape.block_size=0 is not valid; expected a positive integer"),
    ("ShapeParams", {"batch_size": 1, "block_size": 1}, None),
    ("TrainParams", {"steps": 0}, "train.steps=0 is not valid; expected a positive integer"),
    ("TrainParams", {"steps": 1}, None),
    ("OptimParams", {"lr": 0.0}, "optim.lr=0.0 is not valid; expected a positive number"),
    ("OptimParams", {"min_lr": -0.1}, "optim.min_lr=-0.1 is not valid; expected between 0 and optim.lr=0.002"),
    ("OptimParams", {"min_lr": 3e-3}, "optim.min_lr=0.003 is not valid; expected between 0 and optim.lr=0.002"),
    ("OptimParams", {"min_lr": 2e-3}, None),
    ("OptimParams", {"lr_warmup_steps": -1}, "optim.lr_warmup_steps=-1 is not valid; expected 0 or more"),
    ("OptimParams", {"weight_decay": -0.1}, "optim.weight_decay=-0.1 is not valid; expected 0 or more"),
    ("OptimParams", {"grad_clip": -0.1}, "optim.grad_clip=-0.1 is not valid; expected 0 (off) or more"),
    ("OptimParams", {"grad_clip": 0.0, "weight_decay": 0.0, "lr_warmup_steps": 0, "min_lr": 0.0}, None),
    ("HarnessParams", {"warmup_steps": 0}, "harness.warmup_steps=0 is not valid; expected 1 or more"),
    ("HarnessParams", {"warmup_steps": 1}, None),
    ("BenchParams", {"steps": 2}, "bench.steps=2 is not valid; expected 3 or more (harness.warmup_steps, then 2 or "
                                  "more timed)"),
    ("BenchParams", {"steps": 3}, None),
    ("BenchParams", {"repeats": 0}, "bench.repeats=0 is not valid; expected 1 or more"),
    ("HarnessParams", {"steady_tolerance": 0.0}, "harness.steady_tolerance=0.0 is not valid; expected a positive fraction"),
    ("HarnessParams", {"memory_cap_gib": -1.0}, "harness.memory_cap_gib=-1.0 is not valid; expected 0 (no cap) or the "
                                                "GiB of the card to answer for, e.g. 24"),
    ("HarnessParams", {"memory_cap_gib": 0.0}, None),
    ("BenchParams", {"repeats": 1}, None),
    ("EvalParams", {"batches": 0}, "eval.batches=0 is not valid; expected a positive integer"),
    ("EvalParams", {"batches": 1}, None),
    ("AggregateParams", {"loss_tolerance": 0.0}, "aggregate.loss_tolerance=0.0 is not valid; expected a positive number"),
    ("AggregateParams", {"repeat_tolerance": -0.1}, "aggregate.repeat_tolerance=-0.1 is not valid; expected 0 or more"),
    ("AggregateParams", {"repeat_tolerance": 0.0}, None),
    ("ProfileParams", {"steps": 0}, "profile.steps=0 is not valid; expected a positive integer"),
    ("ProfileParams", {"steps": 1}, None),
    ("ParityParams", {"steps": 1, "tail_steps": 1}, "parity.steps=1 is not valid; expected 2 or more"),
    ("ParityParams", {"steps": 2, "tail_steps": 2}, None),
    ("ParityParams", {"tail_steps": 0}, "parity.tail_steps=0 is not valid; expected between 1 and parity.steps=60"),
    ("ParityParams", {"steps": 10, "tail_steps": 11}, "parity.tail_steps=11 is not valid; expected between 1 and "
                                                      "parity.steps=10"),
    ("ParityParams", {"tail_steps": 1}, None),
    ("ParityParams", {"tolerance": 0.0}, "parity.tolerance=0.0 is not valid; expected a positive number of nats, e.g. 0.05"),
    ("ParityParams", {"seeds": [1]}, "parity.seeds=[1] is not valid; expected two different integers, e.g. [1, 2]"),
    ("ParityParams", {"seeds": [1, 1]}, "parity.seeds=[1, 1] is not valid; expected two different integers, e.g. [1, 2]"),
    ("ParityParams", {"seeds": [1, 2, 3]}, "parity.seeds=[1, 2, 3] is not valid; expected two different integers, e.g. "
                                           "[1, 2]"),
    ("ParityParams", {"reference": "a", "variants": ["a"]},
     "parity.variants=['a'] is not valid; expected variants other than the reference a (its two seeds are its own check)"),
    ("SearchParams", {"budget_s": 0.0}, "search.budget_s=0.0 is not valid; expected a positive number of seconds, e.g. 1800"),
    ("SearchParams", {"max_candidates": 0}, "search.max_candidates=0 is not valid; expected 1 or more"),
    ("SearchParams", {"confirm": 0}, "search.confirm=0 is not valid; expected 1 or more"),
    ("SearchParams", {"repeats": -1}, "search.repeats=-1 is not valid; expected 0 or more"),
    ("SearchParams", {"repeats": 0, "max_candidates": 1, "confirm": 1}, None),
    ("SearchParams", {"screen_steps": 1}, "search.screen_steps=1 is not valid; expected 2 or more timed steps"),
    ("SearchParams", {"screen_steps": 2}, None),
    ("SearchParams", {"lean_floor": 0.0}, "search.lean_floor=0.0 is not valid; expected a fraction in (0, 1], e.g. 0.85"),
    ("SearchParams", {"lean_floor": 1.0, "budget_s": 0.5}, None),
    ("SearchParams", {"lean_floor": 1.01}, "search.lean_floor=1.01 is not valid; expected a fraction in (0, 1], e.g. 0.85"),
])
def test_each_section_refuses_a_bad_value_in_full_and_takes_its_edge(section: str, values: dict,
                                                                     message: str | None) -> None:
    from benchlab.core import sections, track_sections

    make = getattr(sections, section, None) or getattr(track_sections, section)
    if message is None:
        assert all(getattr(make(**values), k) == v for k, v in values.items())
        return
    with pytest.raises(LabError) as err:
        make(**values)
    assert str(err.value) == message


def test_each_mistyped_value_is_refused_by_its_key_and_the_type_it_wants() -> None:
    data = micro_params()
    for bad, message in [
        ({**data, "compile": "yes"}, "compile='yes' is not valid; expected true or false"),
        (micro_params(train__steps=True), "train.steps=True is not valid; expected an integer"),
        (micro_params(train__steps="5"), "train.steps='5' is not valid; expected an integer"),
        (micro_params(optim__lr=True), "optim.lr=True is not valid; expected a number"),
        (micro_params(optim__lr="fast"), "optim.lr='fast' is not valid; expected a number"),
        (micro_params(data__corpus=5), "data.corpus=5 is not valid; expected a string"),
        (micro_params(profile__variants="recipe"), "profile.variants='recipe' is not valid; expected a list"),
        (micro_params(profile__variants=["recipe", 3]), "profile.variants[1]=3 is not valid; expected a string"),
        ({**data, "variants": ["a"]}, "variants=['a'] is not valid; expected a mapping"),
        ({**data, "variants": {**data["variants"], "x": {"compile": "no"}}},
         "variants.x.compile='no' is not valid; expected true or false"),
        ([1], "params.yaml must be a mapping, got [1]"),
        ({**data, "presets": {**data["presets"], "gpt2_124m": {"optim": {"lr": "x"}}}},
         "presets.gpt2_124m: optim.lr='x' is not valid; expected a number"),
        ({**data, "batch_size": 4}, "batch_size=4 at the top level is not valid; set shape.batch_size (variants set "
                                    "batch_size)"),
        ({**data, "run": {}}, ("unknown key 'run'; set the train stage's knobs at the top level: "
                               f"{', '.join(TOP_LEVEL_KNOBS)}")),
        ({**data, "variants": {**data["variants"], "x": {"batch_size": "a"}}},
         "variants.x.batch_size='a' is not valid; expected an integer"),  # an optional field names its own key
        (micro_params(optim__nope=1), "unknown key 'optim.nope'; valid keys under optim: lr, min_lr, "
                                       "lr_warmup_steps, weight_decay, grad_clip"),
        (micro_params(train__fused_adamw=True), "unknown key 'train.fused_adamw'; valid keys under train: steps"),
        # a key that moved when params.yaml was grouped by stage names its new place
        (micro_params(train__lr=0.1), "train.lr has moved to optim.lr (params.yaml is grouped by the stage that reads "
                                      "each section, README \"The pipeline\"): write it there, e.g. `dvc exp run -S "
                                      "optim.lr=...`"),
        (micro_params(bench__lock="fail"), "bench.lock has moved to harness.lock (params.yaml is grouped by the stage "
                                           "that reads each section, README \"The pipeline\"): write it there, e.g. "
                                           "`dvc exp run -S harness.lock=...`"),
        (micro_params(train__block_size=64), "train.block_size has moved to shape.block_size (params.yaml is grouped by "
                                             "the stage that reads each section, README \"The pipeline\"): write it "
                                             "there, e.g. `dvc exp run -S shape.block_size=...`")]:  # not a knob there
        with pytest.raises(LabError) as err:
            parse_params(bad)
        assert str(err.value) == message
    assert parse_params(micro_params(optim__lr="2e-3")).optim.lr == 2e-3  # YAML reads 2e-3 as text
    assert parse_params(data).preset == "cpu"
    assert parse_params({**data, "preset": "gpt2_124m"}).preset == "gpt2_124m"
    assert parse_params({k: v for k, v in data.items() if k not in ("preset", "presets")}).preset == "cpu"


def test_params_yaml_is_read_from_the_working_folder_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(micro_params(seed=11)))
    monkeypatch.chdir(tmp_path)
    assert load_params().seed == 11


def test_an_unknown_top_level_key_lists_every_valid_one_sorted() -> None:
    with pytest.raises(LabError) as err:
        parse_params({**micro_params(), "nope": 1})
    head, valid = str(err.value).split("; valid keys: ")
    keys = valid.split(", ")
    assert head == "unknown key 'nope'" and keys == sorted(keys)
    assert {"preset", "presets", "train", "variants", "device", "seed", "compile", "precision"} <= set(keys)
    assert "batch_size" not in keys and "run" not in keys and len(keys) == len(set(keys))
    assert set(TOP_LEVEL_KNOBS) <= set(keys) and not {"parallel", "nproc"} & set(keys)


def test_a_section_is_a_mapping_or_empty() -> None:
    from benchlab.core.params import parse
    from benchlab.core.sections import EvalParams, TrainParams

    assert parse(EvalParams, None, "eval") == EvalParams()  # `eval:` with nothing under it: the defaults
    with pytest.raises(LabError) as err:
        parse(TrainParams, [1], "train")
    assert str(err.value) == "train must be a mapping, got [1]"
    with pytest.raises(LabError) as err:
        parse(TrainParams, [1], "")
    assert str(err.value) == "params.yaml must be a mapping, got [1]"
    with pytest.raises(LabError) as err:
        parse(TrainParams, {"nope": 1}, "")
    assert str(err.value) == "unknown key 'nope'; valid keys: steps"
    with pytest.raises(LabError) as err:
        parse(TrainParams, {"steps": "x"}, "")
    assert str(err.value) == "steps='x' is not valid; expected an integer"
