"""params.yaml into typed params: each knob's device checks (a skip: "this machine cannot"), each combination
refused when params load (naming the key and the fix), the knob table's rows, and loading a file. No torch here."""

import os
import subprocess
from dataclasses import MISSING, asdict, fields
from pathlib import Path

import pytest
import yaml

from benchlab.core.errors import LabError
from benchlab.core.knob_row import STEPS, applied_at, knob
from benchlab.core.knobs import (
    KNOBS,
    TOP_LEVEL_KNOBS,
    RunSettings,
    check_combination,
    knobs_in_group,
    searched,
    unoptimized,
    unsupported_reason,
)
from benchlab.core.loss_heads import LOSS_HEADS
from benchlab.core.old_names import from_old_knobs
from benchlab.core.params import load_params, parse_params, variant_from
from benchlab.core.skips import DeviceFacts
from tests.conftest import ROOT, micro_params

LIGER_VERSION = LOSS_HEADS["onepass"].pinned

CPU = DeviceFacts(kind="cpu", name="cpu", cxx=True)
V100 = DeviceFacts(kind="cuda", name="Tesla V100-SXM2-16GB", capability=(7, 0), bf16=False, triton=True)
A100 = DeviceFacts(kind="cuda", name="NVIDIA A100", capability=(8, 0), bf16=True, triton=True, torchao=True, liger=True,
                  liger_version=LIGER_VERSION)
H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", capability=(9, 0), bf16=True, triton=True, torchao=True, liger=True,
                  liger_version=LIGER_VERSION, cce=True)


def refused(message: str, **knobs: object) -> None:
    """params.yaml with these knobs (`with_knobs`) is refused when it loads, with exactly this message after the
    variant's prefix."""
    with pytest.raises(LabError) as err:
        parse_params(with_knobs(**knobs))
    assert str(err.value).removeprefix("variants.mine.") == message


def with_knobs(**knobs: object) -> dict:
    """params.yaml with these knobs at the top level where the train stage honours them all, else in a variant
    (`variants.mine`: the knobs of a run over several processes are a variant's alone)."""
    if set(knobs) <= set(TOP_LEVEL_KNOBS):
        return micro_params(**knobs)
    data = micro_params()
    data["variants"]["mine"] = knobs
    return data


# --- the knob table's rows --------------------------------------------------------------------------------------

def test_every_knob_carries_its_doc_where_it_is_applied_and_its_default() -> None:
    for f in fields(RunSettings):
        assert isinstance(f.metadata["doc"], str) and f.metadata["doc"], f.name
        assert applied_at(f), f.name
        assert "skip" in f.metadata and f.default is not MISSING, f.name
    assert RunSettings().precision == "fp32" and RunSettings().ddp_bucket_mb == 25
    assert applied_at(fields(RunSettings)[0]) == "2. matmul flags; 8. autocast and GradScaler"


def test_a_knobs_steps_are_numbered_by_their_place_in_apply_s_order() -> None:
    # tests/test_optimize.py holds apply to STEPS; here, the table's numbers come from STEPS alone.
    by_name = {f.name: f for f in fields(RunSettings)}
    assert applied_at(by_name["attention"]).startswith(f"{STEPS.index('constructor')}. ") and STEPS[0] == "constructor"
    assert applied_at(by_name["loss"]) == f"{STEPS.index('loss_head')}. the loss head"
    assert applied_at(by_name["optimizer"]).startswith(f"{STEPS.index('optimizer')}. the optimizer")
    assert applied_at(by_name["batch_size"]) == "the batch stream"  # outside apply: no number
    for f in fields(RunSettings):
        applied = f.metadata["applied"]
        assert isinstance(applied, str) or set(applied) <= set(STEPS), f.name


def test_each_knob_declares_its_group_whether_it_is_searched_and_its_unoptimized_value() -> None:
    # scaling.PARALLEL_KNOBS is the parallel group; the search reads `searched` and `unoptimized`.
    assert knobs_in_group("parallel") == ("parallel", "nproc", "ddp_bucket_mb", "ddp_grad_as_bucket_view",
                                          "ddp_comm_hook", "fsdp_reshard_after_forward", "fsdp_param_dtype",
                                          "fsdp_blocks_per_unit", "nccl_max_ctas")
    assert knobs_in_group("batch") == ("batch_size", "grad_accum")
    assert all(not searched(k) for k in knobs_in_group("parallel")) and searched("loss") and searched("grad_accum")
    assert unoptimized("precision") == "fp32" and unoptimized("fused_clip") is False
    assert unoptimized("grad_accum") is None  # no value is slower by itself: the search moves it by its goal
    with pytest.raises(ValueError, match="knob group 'speed'; the groups: precision, "):
        knob(1, "a doc", "somewhere", group="speed")  # type: ignore[arg-type]


def test_every_knob_is_one_documented_row_usable_at_the_top_level_and_in_a_variant() -> None:
    data = micro_params(activation_checkpointing="full", loss="chunked", grad_accum=2)
    data["variants"]["mine"] = {"activation_checkpointing": "selective", "batch_size": 8, "grad_accum": 4}
    p = parse_params(data)
    assert p.run.activation_checkpointing == "full" and p.run.loss == "chunked" and p.run.grad_accum == 2
    assert p.variants["mine"].activation_checkpointing == "selective" and p.batch_size(p.variants["mine"]) == 8
    assert "batch_size" in KNOBS and "compile_mode" in KNOBS and "optimizer" in KNOBS


# --- skips: what a device cannot run ----------------------------------------------------------------------------

def test_bf16_and_tf32_refused_on_a_gpu_without_them() -> None:
    assert "has no bf16; use fp16" in unsupported_reason(RunSettings(precision="bf16"), V100)
    assert "compute capability 7.x" in unsupported_reason(RunSettings(precision="tf32"), V100)
    assert unsupported_reason(RunSettings(precision="fp16"), V100) is None


def test_tf32_runs_on_ampere_exactly() -> None:
    a100 = DeviceFacts(kind="cuda", name="NVIDIA A100", capability=(8, 0), bf16=True, triton=True)
    assert unsupported_reason(RunSettings(precision="tf32"), a100) is None


def test_everything_allowed_on_a_hopper_gpu() -> None:
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        everything = RunSettings(precision=precision, attention="sdpa", optimizer="adamw_fused",  # type: ignore[arg-type]
                                 compile=True, fp8="all", compile_mode="reduce-overhead", loss="fused",
                                 activation_checkpointing="selective")
        assert unsupported_reason(everything, H200) is None


def test_fp8_needs_ada_or_hopper_and_torchao() -> None:
    assert unsupported_reason(RunSettings(fp8="blocks"), A100) == (
        "fp8=blocks needs compute capability 8.9 or newer; NVIDIA A100 is (8, 0)")
    no_torchao = DeviceFacts(**{**H200.__dict__, "torchao": False})
    assert unsupported_reason(RunSettings(fp8="head"), no_torchao) == (
        "fp8=head needs torchao (pip install -r requirements-gpu.txt); or set fp8=none")
    assert unsupported_reason(RunSettings(fp8="all"), CPU) == (
        "fp8=all needs a GPU with float8 tensor cores (Ada or Hopper, compute capability 8.9+); not on CPU")
    assert unsupported_reason(RunSettings(fp8="head"), DeviceFacts(**{**H200.__dict__, "capability": (8, 9)})) is None
    assert unsupported_reason(RunSettings(fp8="none"), DeviceFacts(kind="cpu")) is None


def test_8bit_adam_needs_torchao_on_a_gpu() -> None:
    assert unsupported_reason(RunSettings(optimizer="adamw_8bit"), H200) is None
    no_torchao = DeviceFacts(**{**H200.__dict__, "torchao": False})
    assert unsupported_reason(RunSettings(optimizer="adamw_8bit"), no_torchao) == (
        "optimizer=adamw_8bit needs torchao (pip install -r requirements-gpu.txt); or set optimizer=adamw")
    assert unsupported_reason(RunSettings(optimizer="adamw_8bit"), CPU) == (
        "optimizer=adamw_8bit (torchao's AdamW8bit) is timed on CUDA GPUs only; use optimizer=adamw on CPU")
    assert unsupported_reason(RunSettings(optimizer="adamw_fused"), no_torchao) is None


def test_fused_loss_needs_liger_on_a_gpu() -> None:
    no_liger = DeviceFacts(**{**H200.__dict__, "liger": False})
    assert unsupported_reason(RunSettings(loss="fused"), no_liger) == (
        "loss=fused needs liger-kernel (pip install -r requirements-gpu.txt); or use loss=chunked")
    assert unsupported_reason(RunSettings(loss="cce"), no_liger) is None


def test_onepass_loss_needs_liger_on_a_gpu_and_nothing_on_a_cpu() -> None:
    no_liger = DeviceFacts(**{**H200.__dict__, "liger": False, "liger_version": None})
    assert unsupported_reason(RunSettings(loss="onepass"), no_liger) == (
        f"loss=onepass runs liger-kernel {LIGER_VERSION}'s cross-entropy kernel on CUDA, and liger-kernel is not "
        "installed (pip install -r requirements-gpu.txt); or use loss=inline")
    assert unsupported_reason(RunSettings(loss="onepass"), H200) is None
    assert unsupported_reason(RunSettings(loss="onepass"), CPU) is None  # torch's arithmetic there


@pytest.mark.parametrize("installed", ["0.8.4", "0.9.0", LIGER_VERSION + ".post1"])
def test_onepass_loss_skips_under_another_liger_version_naming_both(installed: str) -> None:
    # onepass calls an internal liger kernel by keyword; another release may take other arguments.
    other = DeviceFacts(**{**H200.__dict__, "liger_version": installed})
    assert unsupported_reason(RunSettings(loss="onepass"), other) == (
        f"loss=onepass calls liger-kernel {LIGER_VERSION}'s internal cross-entropy kernel; liger-kernel {installed} "
        "is installed (pip install -r requirements-gpu.txt); or use loss=inline")
    assert unsupported_reason(RunSettings(loss="fused"), other) is None  # its public API, any version
    cpu_with_it = DeviceFacts(**{**CPU.__dict__, "liger_version": installed})
    assert unsupported_reason(RunSettings(loss="onepass"), cpu_with_it) is None


def test_cce_loss_needs_cut_cross_entropy_on_a_gpu() -> None:
    no_cce = DeviceFacts(**{**H200.__dict__, "cce": False})
    assert "loss=cce needs cut-cross-entropy (pip install -r requirements-gpu.txt)" in unsupported_reason(
        RunSettings(loss="cce"), no_cce)
    assert unsupported_reason(RunSettings(loss="fused"), no_cce) is None
    assert unsupported_reason(RunSettings(loss="cce"), H200) is None


@pytest.mark.parametrize("settings, words", [
    ({"precision": "fp16"}, "precision=fp16 with loss scaling needs a CUDA GPU"),
    ({"fp8": "blocks"}, "fp8=blocks needs a GPU with float8 tensor cores"),
    ({"fp8": "all"}, "fp8=all needs a GPU with float8 tensor cores"),
    ({"loss": "fused"}, "loss=fused is a Triton kernel (liger-kernel) that needs a CUDA GPU"),
    ({"loss": "cce"}, "loss=cce is a Triton kernel (cut-cross-entropy) that needs a CUDA GPU"),
    ({"compile": True, "compile_mode": "reduce-overhead"}, "compile_mode=reduce-overhead tunes or graphs CUDA kernels"),
    ({"compile": True, "compile_mode": "max-autotune-no-cudagraphs"}, "on CPU use compile_mode=default"),
    ({"compile": True, "compile_mode": "max-autotune"}, "compile_mode=max-autotune tunes or graphs CUDA kernels"),
    ({"parallel": "ddp", "ddp_comm_hook": "bf16"}, "bf16_compress_hook, which needs NCCL on CUDA GPUs"),
    ({"parallel": "fsdp2", "nccl_max_ctas": 4}, "nccl_max_ctas=4 limits NCCL's thread blocks, which needs NCCL on CUDA "
                                                "GPUs; on CPU use nccl_max_ctas=0"),
])
def test_cpu_skips_gpu_only_knobs_with_the_reason(settings: dict, words: str) -> None:
    assert words in unsupported_reason(RunSettings(**settings), CPU)


def test_bf16_gradient_compression_needs_nccl() -> None:
    bf16 = RunSettings(parallel="ddp", ddp_comm_hook="bf16")
    assert unsupported_reason(bf16, CPU) == ("ddp_comm_hook=bf16 is torch's bf16_compress_hook, which needs NCCL on "
                                             "CUDA GPUs; on CPU use ddp_comm_hook=none")
    assert unsupported_reason(bf16, H200) is None
    assert unsupported_reason(RunSettings(parallel="ddp"), CPU) is None


def test_cpu_runs_the_knobs_it_can() -> None:
    for settings in ({"precision": "bf16", "optimizer": "adamw_fused"}, {"activation_checkpointing": "full"},
                     {"loss": "chunked"}, {"loss": "inline"}, {"compile": True}, {"grad_accum": 2},
                     {"optimizer": "adamw_fused", "fused_clip": True}, {"compile": True, "optimizer": "adamw_compiled"}):
        assert unsupported_reason(RunSettings(**settings), CPU) is None
    assert "needs a C++ compiler" in unsupported_reason(RunSettings(compile=True), DeviceFacts(kind="cpu"))


def test_device_checks_at_their_boundaries() -> None:
    gpu2 = DeviceFacts(kind="cuda", name="T4", capability=(7, 5), gpu_count=2, cpu_count=64)
    cpu2 = DeviceFacts(kind="cpu", name="cpu", cxx=True, cpu_count=2, gpu_count=0)
    ddp = {"parallel": "ddp"}
    assert unsupported_reason(RunSettings(nproc=2, **ddp), gpu2) is None  # exactly as many GPUs as processes
    assert unsupported_reason(RunSettings(nproc=3, **ddp), gpu2) == "nproc=3 asks for 3 GPUs per node; this machine has 2"
    assert unsupported_reason(RunSettings(nproc=2, **ddp), cpu2) is None  # exactly as many cores
    assert unsupported_reason(RunSettings(nproc=3, **ddp), cpu2) == (
        "nproc=3 gloo processes on a CPU of 2 cores would time each other's waiting")
    assert unsupported_reason(RunSettings(parallel="fsdp2", nproc=2, fsdp_param_dtype="bf16"), gpu2) == (
        "fsdp_param_dtype=bf16 needs an Ampere or newer GPU; T4 has no bf16")
    assert unsupported_reason(RunSettings(parallel="fsdp2", fsdp_param_dtype="bf16"), cpu2) is None
    no_triton = DeviceFacts(kind="cuda", name="A100", capability=(8, 0), bf16=True, gpu_count=1)
    assert unsupported_reason(RunSettings(compile=True), no_triton) == (
        "compile=true on CUDA needs triton (pip install triton); or set compile=false")
    assert unsupported_reason(RunSettings(compile=True), DeviceFacts(kind="cpu")) == (
        "compile=true on CPU needs a C++ compiler (g++) for inductor; install one or set compile=false")


def test_bf16_weights_need_a_gpu_with_bf16() -> None:
    assert unsupported_reason(RunSettings(precision="bf16", weight_dtype="bf16"), H200) is None
    assert unsupported_reason(RunSettings(precision="bf16", weight_dtype="bf16"), CPU) is None
    assert unsupported_reason(RunSettings(weight_dtype="bf16"), V100) == (
        "weight_dtype=bf16 needs an Ampere or newer GPU; Tesla V100-SXM2-16GB has no bf16; use weight_dtype=fp32")
    assert unsupported_reason(RunSettings(weight_dtype="fp32"), V100) is None


def test_stochastic_rounding_needs_torchao_and_a_compiler() -> None:
    sr = RunSettings(precision="bf16", weight_dtype="bf16", optimizer="adamw_bf16_sr")
    assert unsupported_reason(sr, H200) is None
    assert unsupported_reason(sr, DeviceFacts(kind="cpu", name="cpu", cxx=True, torchao=True)) is None
    assert unsupported_reason(sr, DeviceFacts(**{**H200.__dict__, "torchao": False})) == (
        "optimizer=adamw_bf16_sr needs torchao (pip install -r requirements-gpu.txt); or set optimizer=adamw_fused "
        "(bf16 weights rounded to nearest)")
    assert unsupported_reason(sr, DeviceFacts(kind="cpu", name="cpu", cxx=True)) == (
        "optimizer=adamw_bf16_sr needs torchao (pip install -r requirements.txt); or set optimizer=adamw_fused "
        "(bf16 weights rounded to nearest)")
    assert unsupported_reason(sr, DeviceFacts(kind="cpu", name="cpu", cxx=False, torchao=True)) == (
        "optimizer=adamw_bf16_sr compiles torchao's optimizer step, which on CPU needs a C++ compiler (g++)")
    assert "has no bf16" in unsupported_reason(sr, V100)


# --- combinations refused when params load, on every device ----------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    ({"compile_mode": "reduce-overhead"}, "compile_mode='reduce-overhead' is not valid; expected default unless compile=true"),
    ({"grad_accum": 3}, "grad_accum=3 is not valid; expected a divisor of the batch size 4"),
    ({"grad_accum": 0}, "grad_accum=0 is not valid; expected 1 or more"),
    ({"activation_checkpointing": "some"}, "expected one of: none, full, selective"),
    ({"loss": "focal"}, "expected one of: standard, inline, chunked, fused, cce, onepass"),
    ({"weight_dtype": "fp16"}, "weight_dtype='fp16' is not valid; expected one of: fp32, bf16"),
    ({"optimizer": "sgd"}, "optimizer='sgd' is not valid; expected one of: adamw, adamw_fused, adamw_compiled, "
                           "adamw_8bit, adamw_bf16_sr"),
    ({"nccl_max_ctas": -1}, "nccl_max_ctas=-1 is not valid; expected 0 (NCCL's choice) or a positive count"),
    ({"fsdp_blocks_per_unit": -2}, "fsdp_blocks_per_unit=-2 is not valid; expected 0 (the whole model in the root "
                                   "unit) or a positive count of blocks"),
    ({"fsdp_blocks_per_unit": 4}, "parallel='none' is not valid; expected fsdp2 when fsdp_reshard_after_forward, "
                                  "fsdp_param_dtype or fsdp_blocks_per_unit is set"),
    ({"nccl_max_ctas": 8}, "parallel='none' is not valid; expected ddp or fsdp2 when nccl_max_ctas is set"),
    ({"loss": "chunked", "loss_chunk_tokens": 0}, "loss_chunk_tokens=0 is not valid; expected a positive count of tokens"),
    ({"loss": "onepass", "parallel": "fsdp2", "nproc": 2}, "loss='onepass' is not valid; expected standard, inline, chunked or cce "
                                                          "with parallel=fsdp2 (the onepass head reads the output "
                                                          "weight outside the sharded module)"),
    ({"loss_chunk_tokens": 1024}, "loss='standard' is not valid; expected chunked when loss_chunk_tokens is set"),
    ({"fp8": "head", "loss": "chunked"}, "loss='chunked' is not valid; expected standard or inline with fp8=head "
                                         "(the chunked, fused, cce and onepass heads multiply by the output weight themselves, "
                                         "so the float8 output layer would be bypassed; or set fp8=blocks)"),
])
def test_impossible_knob_values_are_refused_with_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(LabError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_params(with_knobs(**overrides))



def test_a_bad_knob_in_a_variant_names_the_variant() -> None:
    data = micro_params()
    data["variants"]["odd"] = {"batch_size": 6, "grad_accum": 4}
    with pytest.raises(LabError, match="variants.odd.grad_accum=4 is not valid; expected a divisor of the batch size 6"):
        parse_params(data)


def test_bf16_weights_need_bf16_matmuls_and_no_fsdp2() -> None:
    for precision in ("fp32", "tf32", "fp16"):
        with pytest.raises(LabError, match=f"precision='{precision}' is not valid; expected bf16 with weight_dtype=bf16"):
            parse_params(micro_params(weight_dtype="bf16", precision=precision))
    with pytest.raises(LabError, match="parallel='fsdp2' is not valid; expected none or ddp with weight_dtype=bf16"):
        parse_params(with_knobs(weight_dtype="bf16", precision="bf16", parallel="fsdp2", nproc=2))
    ddp = parse_params(with_knobs(weight_dtype="bf16", precision="bf16", parallel="ddp", nproc=2)).variants["mine"]
    assert ddp.weight_dtype == "bf16"


def test_the_compiled_update_needs_compile_and_neither_fp16_nor_fsdp2() -> None:
    refused("compile=False is not valid; expected true with optimizer=adamw_compiled, which compiles the update in "
            "compile's mode (or set optimizer=adamw)", optimizer="adamw_compiled")
    refused("precision='fp16' is not valid; expected fp32, tf32 or bf16 with optimizer=adamw_compiled (fp16's "
            "GradScaler reads its inf checks on the host, outside the compiled update; or set optimizer=adamw)",
            optimizer="adamw_compiled", compile=True, precision="fp16")
    refused("parallel='fsdp2' is not valid; expected none or ddp with optimizer=adamw_compiled (the compiled update is "
            "not wired for fsdp2's sharded gradients; or set optimizer=adamw)",
            optimizer="adamw_compiled", compile=True, parallel="fsdp2", nproc=2)
    graphed = parse_params(micro_params(optimizer="adamw_compiled", compile=True, compile_mode="reduce-overhead",
                                        precision="bf16"))
    assert graphed.run.optimizer == "adamw_compiled"
    ddp = parse_params(with_knobs(optimizer="adamw_compiled", compile=True, parallel="ddp", nproc=2)).variants["mine"]
    assert ddp.parallel == "ddp"


def test_stochastic_rounding_needs_bf16_weights() -> None:
    refused("weight_dtype='fp32' is not valid; expected bf16 with optimizer=adamw_bf16_sr (it rounds each update "
            "stochastically into bf16 weights; or set optimizer=adamw)", optimizer="adamw_bf16_sr", precision="bf16")
    sr = parse_params(micro_params(optimizer="adamw_bf16_sr", weight_dtype="bf16", precision="bf16")).run
    assert (sr.optimizer, sr.weight_dtype) == ("adamw_bf16_sr", "bf16")


def test_fused_clip_needs_the_fused_kernel_and_its_grad_scale_free() -> None:
    for optimizer in ("adamw", "adamw_8bit"):
        refused(f"fused_clip=True is not valid; expected false with optimizer={optimizer} (the clipping scale is "
                "handed to fused AdamW's kernel as its grad_scale; set optimizer=adamw_fused with it)",
                fused_clip=True, optimizer=optimizer)
    refused("precision='fp16' is not valid; expected fp32, tf32 or bf16 with fused_clip=true (fp16's GradScaler sets "
            "the fused kernel's grad_scale itself; or set fused_clip=false)",
            fused_clip=True, optimizer="adamw_fused", precision="fp16")
    refused("parallel='fsdp2' is not valid; expected none or ddp with fused_clip=true (not wired for fsdp2's sharded "
            "gradients; or set fused_clip=false)", fused_clip=True, optimizer="adamw_fused", parallel="fsdp2", nproc=2)
    clipped = parse_params(with_knobs(fused_clip=True, optimizer="adamw_fused", parallel="ddp", nproc=2)).variants["mine"]
    assert clipped.fused_clip and clipped.optimizer == "adamw_fused"


def test_a_combination_rule_in_a_variant_names_the_variant() -> None:
    data = micro_params()
    data["variants"]["graphed"] = {"optimizer": "adamw_compiled"}
    with pytest.raises(LabError, match=r"^variants\.graphed\.compile=False is not valid; expected true with "
                                       r"optimizer=adamw_compiled"):
        parse_params(data)


def test_every_committed_variant_and_preset_loads() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    for preset in ["cpu", *data["presets"]]:
        assert parse_params({**data, "preset": preset}).variants


# --- the knobs that `optimizer` replaced ------------------------------------------------------------------------

@pytest.mark.parametrize("knob, value, write", [
    ("fused_adamw", True, "optimizer: adamw_fused"),
    ("fused_adamw", False, "nothing (optimizer: adamw is the default)"),
    ("adam_state", "8bit", "optimizer: adamw_8bit"),
    ("compile_update", True, "optimizer: adamw_compiled"),
    ("weight_dtype", "bf16_sr", "weight_dtype: bf16 with optimizer: adamw_bf16_sr"),
])
def test_an_old_optimizer_knob_is_refused_naming_what_to_write(knob: str, value: object, write: str) -> None:
    replaced = "the optimizer knob replaced fused_adamw, adam_state, compile_update and weight_dtype=bf16_sr"
    refused(f"{knob}={value!r} is not valid: {replaced}; write {write}", **{knob: value})
    data = micro_params()
    data["variants"]["old"] = {knob: value}
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert str(err.value) == f"variants.old.{knob}={value!r} is not valid: {replaced}; write {write}"


@pytest.mark.parametrize("old, new", [
    ({"fused_adamw": True, "adam_state": "fp32", "compile_update": False, "weight_dtype": "fp32"},
     {"optimizer": "adamw_fused", "weight_dtype": "fp32"}),
    ({"fused_adamw": False, "adam_state": "fp32", "compile_update": False, "weight_dtype": "bf16"},
     {"optimizer": "adamw", "weight_dtype": "bf16"}),
    ({"fused_adamw": False, "adam_state": "8bit", "compile_update": False}, {"optimizer": "adamw_8bit"}),
    ({"fused_adamw": False, "compile_update": True, "compile": True}, {"optimizer": "adamw_compiled", "compile": True}),
    ({"weight_dtype": "bf16_sr", "precision": "bf16"},
     {"optimizer": "adamw_bf16_sr", "weight_dtype": "bf16", "precision": "bf16"}),
    ({"precision": "bf16"}, {"precision": "bf16"}),  # none of them: as it is
])
def test_a_committed_runs_old_knobs_read_as_the_optimizer_that_trains_the_same(old: dict, new: dict) -> None:
    assert from_old_knobs(old) == new


# params.yaml's variants before the `optimizer` knob, as committed at 5ab632e.
OLD_VARIANTS = """
fp32_baseline: {attention: manual, compile: false, fused_adamw: false, precision: fp32}
recipe: {attention: sdpa, compile: true, fused_adamw: true, precision: bf16}
fastest: {attention: sdpa, compile: true, compile_mode: reduce-overhead, loss: onepass, precision: bf16, weight_dtype: bf16_sr}
lean: {activation_checkpointing: full, attention: sdpa, compile: true, loss: chunked, precision: bf16, weight_dtype: bf16_sr}
tf32: {precision: tf32}
sdpa: {attention: sdpa}
fp16: {precision: fp16}
bf16: {precision: bf16}
fused_adamw: {fused_adamw: true}
compile: {compile: true}
ckpt_full: {activation_checkpointing: full, attention: sdpa, compile: true, fused_adamw: true, precision: bf16}
ckpt_selective: {activation_checkpointing: selective, attention: sdpa, compile: true, fused_adamw: true, precision: bf16}
loss_chunked: {attention: sdpa, compile: true, fused_adamw: true, loss: chunked, precision: bf16}
loss_inline: {attention: sdpa, compile: true, fused_adamw: true, loss: inline, precision: bf16}
loss_fused: {attention: sdpa, compile: true, fused_adamw: true, loss: fused, precision: bf16}
loss_cce: {attention: sdpa, compile: true, fused_adamw: true, loss: cce, precision: bf16}
loss_onepass: {attention: sdpa, compile: true, fused_adamw: true, loss: onepass, precision: bf16}
clip_fused: {attention: sdpa, compile: true, fused_adamw: true, fused_clip: true, precision: bf16}
weights_bf16: {attention: sdpa, compile: true, fused_adamw: true, precision: bf16, weight_dtype: bf16}
weights_bf16_sr: {attention: sdpa, compile: true, precision: bf16, weight_dtype: bf16_sr}
cuda_graphs: {attention: sdpa, compile: true, compile_mode: reduce-overhead, fused_adamw: true, precision: bf16}
update_compiled: {attention: sdpa, compile: true, compile_update: true, precision: bf16}
update_graphed: {attention: sdpa, compile: true, compile_mode: reduce-overhead, compile_update: true, precision: bf16}
fp8: {attention: sdpa, compile: true, fp8: blocks, fused_adamw: true, precision: bf16}
fp8_head: {attention: sdpa, compile: true, fp8: head, fused_adamw: true, precision: bf16}
adam_8bit: {adam_state: 8bit, attention: sdpa, compile: true, precision: bf16}
accum_4: {attention: sdpa, batch_size: 16, compile: true, fused_adamw: true, grad_accum: 4, precision: bf16}
batch_4: {attention: sdpa, batch_size: 4, compile: true, fused_adamw: true, precision: bf16}
batch_64: {attention: sdpa, batch_size: 64, compile: true, fused_adamw: true, precision: bf16}
ddp_2: {attention: manual, batch_size: 16, compile: false, fused_adamw: false, nproc: 2, parallel: ddp, precision: fp32}
fsdp2_2: {attention: manual, batch_size: 16, compile: false, fused_adamw: false, nproc: 2, parallel: fsdp2, precision: fp32}
"""


def test_the_variants_before_the_optimizer_knob_mean_what_params_yaml_says_now() -> None:
    old = {n: from_old_knobs(v) for n, v in yaml.safe_load(OLD_VARIANTS).items()}
    data = micro_params()
    now = parse_params(data).variants
    old_params = parse_params({**data, "variants": old})
    assert {n: asdict(s) for n, s in old_params.variants.items()} == {n: asdict(s) for n, s in now.items()}


# --- the variant to run, and the file ---------------------------------------------------------------------------

def test_variant_comes_from_the_flag_or_the_dvc_stage_name() -> None:
    p = parse_params(micro_params())
    name = next(iter(p.variants))
    assert variant_from(name, None, p) == name
    assert variant_from(None, f"bench@{name}", p) == name
    assert variant_from(None, f"profile@{name}", p, kind="profile") == name
    assert variant_from(name, "bench@not_this_one", p) == name  # the flag wins
    with pytest.raises(LabError) as err:
        variant_from(None, None, p)
    assert str(err.value) == "no variant given: pass --variant NAME, or run as the DVC stage bench@NAME"
    with pytest.raises(LabError, match="run as the DVC stage profile@NAME"):
        variant_from(None, f"bench@{name}", p, kind="profile")
    with pytest.raises(LabError) as err:
        variant_from("nope", None, p)
    assert str(err.value) == f"variant 'nope' is not in params.yaml; valid: {', '.join(p.variants)}"


def test_load_params_reads_a_file_and_names_the_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "params.yaml"
    good.write_text(yaml.safe_dump(micro_params(seed=7)))
    assert load_params(good).seed == 7 and load_params(str(good)).train.block_size == 32
    with pytest.raises(LabError) as err:
        load_params(tmp_path / "missing.yaml")
    assert str(err.value) == f"{tmp_path / 'missing.yaml'} not found; run from the repository root"
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\ntrain: {batch_size: 4\n")
    with pytest.raises(LabError) as err:
        load_params(bad)
    assert str(err.value).startswith(f"{bad} is not valid YAML: ") and str(err.value).endswith("; fix that line")
    assert "at line 3, column 1" in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("seed: 1\ntrain: {steps: 5}\nseed: 2\n", "gives seed twice (lines 1 and 3)"),
    ("variants:\n  recipe: {}\n  fast: {}\n  recipe: {precision: bf16}\n", "gives variants.recipe twice (lines 2 and 4)"),
    ("parity:\n  seeds: [1, 2]\nlist:\n  - {a: 1, a: 2}\n", "gives list[0].a twice (lines 4 and 4)"),
], ids=["top level", "a variant", "inside a list"])
def test_a_key_given_twice_is_refused_naming_its_path_and_both_lines(tmp_path: Path, text: str, message: str) -> None:
    """Issue 46: YAML lets the second of two equal keys win silently (`seed` twice trained with the second)."""
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(LabError) as err:
        load_params(path)
    assert str(err.value) == f"{path} {message}: YAML would silently keep the second; delete one"


def test_params_yaml_is_read_as_utf8_and_other_bytes_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("# caf\u00e9\n" + yaml.safe_dump(micro_params(seed=3)), encoding="utf-8")
    assert load_params(path).seed == 3
    path.write_bytes(b"# caf\xe9 in latin-1\nseed: 1\n")
    with pytest.raises(LabError) as err:
        load_params(path)
    assert str(err.value) == f"{path} is not UTF-8 text (invalid continuation byte at byte 5); save it as UTF-8"


def test_a_long_key_in_a_variant_path_is_cut() -> None:
    data = micro_params()
    data["variants"]["v" * 1000] = {"precision": "int8"}
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert str(err.value) == (f"variants.{'v' * 80}... (1,000 chars).precision='int8' is not valid; expected one of: "
                              "fp32, tf32, fp16, bf16")


def committed_params(folder: Path, **overrides: object) -> Path:
    """params.yaml (the micro params with `overrides`) committed in a fresh git checkout at `folder`."""
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(micro_params(**overrides), sort_keys=False))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "params.yaml"], ["commit", "-qm", "params"]):
        subprocess.run(["git", *args], cwd=folder, env=env, check=True, capture_output=True)
    return path


def set_in(path: Path, **values: object) -> None:
    """What `dvc exp run -S a.b=v` does: params.yaml rewritten with each value in place."""
    data = yaml.safe_load(path.read_text())
    for dotted, value in values.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("committed, given", [
    ({"preset": "gpt2_124m"}, {"train__steps": 50}),
    ({}, {"preset": "gpt2_124m", "train__steps": 50}),
], ids=["preset committed", "preset given too"])
def test_a_value_set_where_the_preset_replaces_it_is_refused_naming_both(tmp_path: Path, committed: dict,
                                                                         given: dict) -> None:
    """Issue 45 item 7: under -S preset=gpt2_124m, -S train.steps=50 lost to the preset's value silently."""
    path = committed_params(tmp_path, **committed)
    set_in(path, **given)
    with pytest.raises(LabError) as err:
        load_params(path)
    assert str(err.value) == ("train.steps=50 is set in params.yaml (committed: 12), but preset=gpt2_124m replaces it "
                              "with presets.gpt2_124m.train.steps=100; set presets.gpt2_124m.train.steps instead (dvc "
                              "exp run -S presets.gpt2_124m.train.steps=...), or leave train.steps as committed")


def test_the_preset_s_own_key_a_key_it_leaves_and_its_own_value_are_taken(tmp_path: Path) -> None:
    path = committed_params(tmp_path)
    set_in(path, preset="gpt2_124m", presets__gpt2_124m__train__lr=0.001, train__batch_size=8, train__steps=100)
    p = load_params(path)
    assert p.preset == "gpt2_124m" and p.train.lr == 0.001  # set where the preset reads it
    assert p.train.batch_size == 8  # the preset does not replace batch_size: params.yaml's own value holds
    assert p.train.steps == 100  # the same value as the preset's: nothing is lost
    uncommitted = tmp_path / "elsewhere" / "params.yaml"
    uncommitted.parent.mkdir()
    uncommitted.write_text(path.read_text())
    set_in(uncommitted, train__steps=50)
    assert load_params(uncommitted).train.steps == 100  # no committed file to compare with: the preset's, unseen


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
    ({"train__batch_size": 0}, "train.batch_size=0 is not valid; expected a positive integer"),
    ({"train__block_size": 0}, "train.block_size=0 is not valid; expected a positive integer"),
    ({"train__steps": 0}, "train.steps=0 is not valid; expected a positive integer"),
    ({"train__lr": 0.0}, "train.lr=0.0 is not valid; expected a positive number"),
    ({"train__lr": 1e-3, "train__min_lr": 2e-3}, "train.min_lr=0.002 is not valid; expected between 0 and train.lr=0.001"),
    ({"train__min_lr": -0.1}, None),  # the message names train.lr: checked above
    ({"train__lr_warmup_steps": -1}, "train.lr_warmup_steps=-1 is not valid; expected 0 or more"),
    ({"train__weight_decay": -0.1}, "train.weight_decay=-0.1 is not valid; expected 0 or more"),
    ({"train__grad_clip": -1.0}, "train.grad_clip=-1.0 is not valid; expected 0 (off) or more"),
    ({"bench__warmup_steps": 0}, "bench.warmup_steps=0 is not valid; expected 1 or more"),
    ({"bench__warmup_steps": 2, "bench__steps": 3},
     "bench.steps=3 is not valid; expected at least bench.warmup_steps + 2 = 4, so that two or more steps are timed"),
    ({"bench__repeats": 0}, "bench.repeats=0 is not valid; expected 1 or more"),
    ({"bench__steady_tolerance": 0.0}, "bench.steady_tolerance=0.0 is not valid; expected a positive fraction"),
    ({"eval__batches": 0}, "eval.batches=0 is not valid; expected a positive integer"),
    ({"aggregate__loss_tolerance": 0.0}, "aggregate.loss_tolerance=0.0 is not valid; expected a positive number"),
    ({"aggregate__repeat_tolerance": -0.01}, "aggregate.repeat_tolerance=-0.01 is not valid; expected 0 or more"),
    ({"profile__steps": 0}, "profile.steps=0 is not valid; expected a positive integer"),
]
GOOD_PARAMS = [  # the last good value of each check above
    {"data__vocab_size": 257}, {"data__vocab_size": 2**32}, {"data__val_fraction": 0.49}, {"data__val_fraction": 1e-9},
    {"data__tokenizer_sample_bytes": 0}, {"train__batch_size": 1, "train__block_size": 1, "train__steps": 1},
    {"train__lr": 1e-3, "train__min_lr": 1e-3}, {"train__min_lr": 0.0}, {"train__lr_warmup_steps": 0},
    {"train__weight_decay": 0.0}, {"train__grad_clip": 0.0}, {"bench__warmup_steps": 1, "bench__steps": 3},
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
    ("TrainParams", {"batch_size": 0}, "train.batch_size=0 is not valid; expected a positive integer"),
    ("TrainParams", {"block_size": 0}, "train.block_size=0 is not valid; expected a positive integer"),
    ("TrainParams", {"steps": 0}, "train.steps=0 is not valid; expected a positive integer"),
    ("TrainParams", {"batch_size": 1, "block_size": 1, "steps": 1}, None),
    ("TrainParams", {"lr": 0.0}, "train.lr=0.0 is not valid; expected a positive number"),
    ("TrainParams", {"min_lr": -0.1}, "train.min_lr=-0.1 is not valid; expected between 0 and train.lr=0.002"),
    ("TrainParams", {"min_lr": 3e-3}, "train.min_lr=0.003 is not valid; expected between 0 and train.lr=0.002"),
    ("TrainParams", {"min_lr": 2e-3}, None),
    ("TrainParams", {"lr_warmup_steps": -1}, "train.lr_warmup_steps=-1 is not valid; expected 0 or more"),
    ("TrainParams", {"weight_decay": -0.1}, "train.weight_decay=-0.1 is not valid; expected 0 or more"),
    ("TrainParams", {"grad_clip": -0.1}, "train.grad_clip=-0.1 is not valid; expected 0 (off) or more"),
    ("TrainParams", {"grad_clip": 0.0, "weight_decay": 0.0, "lr_warmup_steps": 0, "min_lr": 0.0}, None),
    ("BenchParams", {"warmup_steps": 0}, "bench.warmup_steps=0 is not valid; expected 1 or more"),
    ("BenchParams", {"steps": 11, "warmup_steps": 10}, "bench.steps=11 is not valid; expected at least bench.warmup_steps "
                                                       "+ 2 = 12, so that two or more steps are timed"),
    ("BenchParams", {"steps": 3, "warmup_steps": 1}, None),
    ("BenchParams", {"repeats": 0}, "bench.repeats=0 is not valid; expected 1 or more"),
    ("BenchParams", {"steady_tolerance": 0.0}, "bench.steady_tolerance=0.0 is not valid; expected a positive fraction"),
    ("BenchParams", {"memory_cap_gib": -1.0}, "bench.memory_cap_gib=-1.0 is not valid; expected 0 (no cap) or the GiB "
                                              "of the card to answer for, e.g. 24"),
    ("BenchParams", {"memory_cap_gib": 0.0, "repeats": 1}, None),
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
    from benchlab.core import sections

    make = getattr(sections, section)
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
        (micro_params(train__lr=True), "train.lr=True is not valid; expected a number"),
        (micro_params(train__lr="fast"), "train.lr='fast' is not valid; expected a number"),
        (micro_params(data__corpus=5), "data.corpus=5 is not valid; expected a string"),
        (micro_params(profile__variants="recipe"), "profile.variants='recipe' is not valid; expected a list"),
        (micro_params(profile__variants=["recipe", 3]), "profile.variants[1]=3 is not valid; expected a string"),
        ({**data, "variants": ["a"]}, "variants=['a'] is not valid; expected a mapping"),
        ({**data, "variants": {**data["variants"], "x": {"compile": "no"}}},
         "variants.x.compile='no' is not valid; expected true or false"),
        ([1], "params.yaml must be a mapping, got [1]"),
        ({**data, "presets": {**data["presets"], "gpt2_124m": {"train": {"lr": "x"}}}},
         "presets.gpt2_124m: train.lr='x' is not valid; expected a number"),
        ({**data, "batch_size": 4}, "batch_size=4 at the top level is not valid; set train.batch_size (variants set "
                                    "batch_size)"),
        ({**data, "run": {}}, ("unknown key 'run'; set the train stage's knobs at the top level: "
                               f"{', '.join(TOP_LEVEL_KNOBS)}")),
        ({**data, "variants": {**data["variants"], "x": {"batch_size": "a"}}},
         "variants.x.batch_size='a' is not valid; expected an integer"),  # an optional field names its own key
        (micro_params(train__nope=1), "unknown key 'train.nope'; valid keys under train: batch_size, block_size, "
                                       "steps, lr, min_lr, lr_warmup_steps, weight_decay, grad_clip"),
        (micro_params(train__fused_adamw=True), "unknown key 'train.fused_adamw'; valid keys under train: "
         "batch_size, block_size, steps, lr, min_lr, lr_warmup_steps, weight_decay, grad_clip")]:  # not a knob there
        with pytest.raises(LabError) as err:
            parse_params(bad)
        assert str(err.value) == message
    assert parse_params(micro_params(train__lr="2e-3")).train.lr == 2e-3  # YAML reads 2e-3 as text
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
    assert str(err.value).startswith("unknown key 'nope'; valid keys: batch_size, ")
    with pytest.raises(LabError) as err:
        parse(TrainParams, {"steps": "x"}, "")
    assert str(err.value) == "steps='x' is not valid; expected an integer"
