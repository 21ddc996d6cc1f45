"""Each knob's device checks (benchlab/core/skips.py): a skip says "this machine cannot", with the reason."""


import pytest

from benchlab.core.knobs import (
    RunSettings,
    unsupported_reason,
)
from benchlab.core.skips import DeviceFacts
from tests.knob_cases import A100, CPU, H200, LIGER_VERSION, V100

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
