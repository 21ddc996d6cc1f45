"""The knob table: where each knob can run, what each bad combination gets, and that what is applied is applied."""

import sys
import types
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest
import torch
import torch._functorch.config

from benchlab import optimize
from benchlab.config import KNOBS, DeviceFacts, RunSettings, TrainParams, parse_params, unsupported_reason
from benchlab.errors import LabError
from benchlab.io import atomic_path, write_json
from benchlab.onepass import LIGER_VERSION
from benchlab.optimize import apply, device_facts, make_optimizer, set_lr, to_float8
from benchlab.runner import train_step
from model.gpt import GPT, GPTConfig
from tests.conftest import micro_params

CPU = DeviceFacts(kind="cpu", name="cpu", cxx=True)
V100 = DeviceFacts(kind="cuda", name="Tesla V100-SXM2-16GB", capability=(7, 0), bf16=False, triton=True)
A100 = DeviceFacts(kind="cuda", name="NVIDIA A100", capability=(8, 0), bf16=True, triton=True, torchao=True, liger=True,
                  liger_version=LIGER_VERSION)
H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", capability=(9, 0), bf16=True, triton=True, torchao=True, liger=True,
                  liger_version=LIGER_VERSION, cce=True)


def test_bf16_and_tf32_refused_on_a_gpu_without_them() -> None:
    assert "has no bf16; use fp16" in unsupported_reason(RunSettings(precision="bf16"), V100)
    assert "compute capability 7.x" in unsupported_reason(RunSettings(precision="tf32"), V100)
    assert unsupported_reason(RunSettings(precision="fp16"), V100) is None


def test_everything_allowed_on_a_hopper_gpu() -> None:
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        everything = RunSettings(precision=precision, attention="sdpa", fused_adamw=True, compile=True, fp8="all",
                                 compile_mode="reduce-overhead", loss="fused", activation_checkpointing="selective")
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


def test_8bit_adam_needs_torchao_on_a_gpu_and_no_fused_kernel_beside_it() -> None:
    assert unsupported_reason(RunSettings(adam_state="8bit"), H200) is None
    no_torchao = DeviceFacts(**{**H200.__dict__, "torchao": False})
    assert unsupported_reason(RunSettings(adam_state="8bit"), no_torchao) == (
        "adam_state=8bit needs torchao (pip install -r requirements-gpu.txt); or set adam_state=fp32")
    assert unsupported_reason(RunSettings(adam_state="8bit", fused_adamw=True), H200) == (
        "adam_state=8bit is torchao's AdamW8bit, its own compiled step; set fused_adamw=false with it")
    assert unsupported_reason(RunSettings(adam_state="8bit"), CPU) == (
        "adam_state=8bit (torchao's AdamW8bit) is timed on CUDA GPUs only; use adam_state=fp32 on CPU")
    assert unsupported_reason(RunSettings(adam_state="fp32", fused_adamw=True), no_torchao) is None


def test_fused_clip_needs_the_fused_kernel_and_its_grad_scale_free() -> None:
    assert unsupported_reason(RunSettings(fused_adamw=True, fused_clip=True), CPU) is None
    assert unsupported_reason(RunSettings(fused_adamw=True, fused_clip=True, parallel="ddp"), H200) is None
    assert unsupported_reason(RunSettings(fused_clip=True), CPU) == (
        "fused_clip=true hands the clipping scale to fused AdamW's kernel; set fused_adamw=true with it")
    assert unsupported_reason(RunSettings(fused_adamw=True, fused_clip=True, precision="fp16"), H200) == (
        "fused_clip=true and precision=fp16 both need the fused kernel's grad_scale (the GradScaler's); "
        "set fused_clip=false")
    assert unsupported_reason(RunSettings(fused_adamw=True, fused_clip=True, parallel="fsdp2"), H200) == (
        "fused_clip=true is not wired for fsdp2's sharded gradients; set fused_clip=false or parallel=ddp")


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


@pytest.mark.parametrize(("knobs", "graphsafe"), [
    ({"activation_checkpointing": "full", "compile": True}, False),
    ({"activation_checkpointing": "selective", "compile": True}, False),
    ({"activation_checkpointing": "full", "compile": True, "compile_mode": "reduce-overhead"}, True),
    ({"activation_checkpointing": "full", "compile": True, "compile_mode": "max-autotune"}, True),
    ({"compile": True}, True),
])
def test_checkpointing_replays_random_ops_in_a_form_the_compile_cache_keeps(knobs: dict, graphsafe: bool) -> None:
    # torch 2.11's FX graph cache refuses the CUDA-graph-safe form, so a fresh process compiled `lean` again; the
    # plain form is kept except under CUDA graphs, which need the graph-safe one. Each run sets it, either way.
    with torch._functorch.config.patch(graphsafe_rng_functionalization=not graphsafe):
        optimize.rng_replay(RunSettings(**knobs))
        assert torch._functorch.config.graphsafe_rng_functionalization is graphsafe


def test_apply_sets_how_checkpointed_blocks_replay_random_ops() -> None:
    with torch._functorch.config.patch(graphsafe_rng_functionalization=True):
        apply(_tiny(), RunSettings(activation_checkpointing="full"), torch.device("cpu"), TrainParams())
        assert torch._functorch.config.graphsafe_rng_functionalization is False


def test_cpu_runs_the_knobs_it_can() -> None:
    for settings in ({"precision": "bf16", "fused_adamw": True}, {"activation_checkpointing": "full"},
                     {"loss": "chunked"}, {"loss": "inline"}, {"compile": True}, {"grad_accum": 2}):
        assert unsupported_reason(RunSettings(**settings), CPU) is None
    assert "needs a C++ compiler" in unsupported_reason(RunSettings(compile=True), DeviceFacts(kind="cpu"))
    assert device_facts(torch.device("cpu")).kind == "cpu"


def test_every_knob_is_one_documented_row_usable_at_the_top_level_and_in_a_variant() -> None:
    for f in fields(RunSettings):
        assert f.metadata["doc"] and f.metadata["applied"], f.name
    data = micro_params(activation_checkpointing="full", loss="chunked", grad_accum=2)
    data["variants"]["mine"] = {"activation_checkpointing": "selective", "batch_size": 8, "grad_accum": 4}
    p = parse_params(data)
    assert p.run.activation_checkpointing == "full" and p.run.loss == "chunked" and p.run.grad_accum == 2
    assert p.variants["mine"].activation_checkpointing == "selective" and p.batch_size(p.variants["mine"]) == 8
    assert "batch_size" in KNOBS and "compile_mode" in KNOBS


@pytest.mark.parametrize("overrides, message", [
    ({"compile_mode": "reduce-overhead"}, "compile_mode='reduce-overhead' is not valid; expected default unless compile=true"),
    ({"grad_accum": 3}, "grad_accum=3 is not valid; expected a divisor of the batch size 4"),
    ({"grad_accum": 0}, "grad_accum=0 is not valid; expected 1 or more"),
    ({"activation_checkpointing": "some"}, "expected one of: none, full, selective"),
    ({"loss": "focal"}, "expected one of: standard, inline, chunked, fused, cce, onepass"),
    ({"weight_dtype": "fp16"}, "weight_dtype='fp16' is not valid; expected one of: fp32, bf16, bf16_sr"),
    ({"batch_size": 8}, "batch_size=... at the top level is not valid; set train.batch_size"),
    ({"nccl_max_ctas": -1}, "nccl_max_ctas=-1 is not valid; expected 0 (NCCL's choice) or a positive count"),
    ({"fsdp_blocks_per_unit": -2}, "fsdp_blocks_per_unit=-2 is not valid; expected 0 (the whole model in the root "
                                   "unit) or a positive count of blocks"),
    ({"fsdp_blocks_per_unit": 4}, "parallel='none' is not valid; expected fsdp2 when fsdp_reshard_after_forward, "
                                  "fsdp_param_dtype or fsdp_blocks_per_unit is set"),
    ({"nccl_max_ctas": 8}, "parallel='none' is not valid; expected ddp or fsdp2 when nccl_max_ctas is set"),
    ({"loss": "chunked", "loss_chunk_tokens": 0}, "loss_chunk_tokens=0 is not valid; expected a positive count of tokens"),
    ({"loss": "onepass", "parallel": "fsdp2", "nproc": 2}, "loss='onepass' is not valid; expected standard or chunked "
                                                          "with parallel=fsdp2 (the onepass head reads the output "
                                                          "weight outside the sharded module)"),
    ({"loss_chunk_tokens": 1024}, "loss='standard' is not valid; expected chunked when loss_chunk_tokens is set"),
    ({"fp8": "head", "loss": "chunked"}, "loss='chunked' is not valid; expected standard or inline with fp8=head "
                                         "(the chunked, fused, cce and onepass heads multiply by the output weight themselves, "
                                         "so the float8 output layer would be bypassed; or set fp8=blocks)"),
])
def test_impossible_knob_values_are_refused_with_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(LabError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_params(micro_params(**overrides))


def test_a_bad_knob_in_a_variant_names_the_variant() -> None:
    data = micro_params()
    data["variants"]["odd"] = {"batch_size": 6, "grad_accum": 4}
    with pytest.raises(LabError, match="variants.odd.grad_accum=4 is not valid; expected a divisor of the batch size 6"):
        parse_params(data)


def test_optimizer_is_the_for_loop_baseline_or_the_fused_kernel() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    loop = make_optimizer(model, RunSettings(), TrainParams(lr=0.25))
    fused = make_optimizer(model, RunSettings(fused_adamw=True), TrainParams(lr=0.25))
    assert loop.defaults["foreach"] is False and not loop.defaults["fused"]
    assert fused.defaults["fused"] is True
    for opt in (loop, fused):
        assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["lr"] == 0.25
        decayed, plain = opt.param_groups
        assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
        # Every parameter in exactly one group: the matrix decays, the LayerNorm's vectors do not.
        assert [id(p) for p in decayed["params"]] == [id(model[0].weight)]
        assert [id(p) for p in plain["params"]] == [id(model[0].bias), id(model[1].weight), id(model[1].bias)]


class _FakeAdamW8bit(torch.optim.AdamW):
    """Stands in for torchao's AdamW8bit (CUDA only): like it, it keeps each group's learning rate as a tensor."""

    def __init__(self, params: object, lr: float, betas: tuple[float, float]) -> None:
        super().__init__(params, lr=torch.tensor(lr), betas=betas)


def test_8bit_adam_is_torchaos_with_the_same_groups_and_a_tensor_learning_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao.optim", types.SimpleNamespace(AdamW8bit=_FakeAdamW8bit))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = make_optimizer(model, RunSettings(adam_state="8bit"), TrainParams(lr=0.25))
    assert isinstance(opt, _FakeAdamW8bit) and opt.defaults["betas"] == (0.9, 0.95)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    lr_tensor = decayed["lr"]
    set_lr(opt, 0.5)
    assert decayed["lr"] is lr_tensor and float(lr_tensor) == 0.5 and float(plain["lr"]) == 0.5
    plain_opt = make_optimizer(model, RunSettings(), TrainParams())
    set_lr(plain_opt, 0.125)
    assert [g["lr"] for g in plain_opt.param_groups] == [0.125, 0.125]


BLOCK0 = {"blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "blocks.0.mlp.proj"}


@pytest.mark.parametrize("which, swapped", [
    ("blocks", BLOCK0),
    ("head", {"lm_head"}),
    ("all", BLOCK0 | {"lm_head"}),
])
def test_fp8_swaps_the_chosen_linear_layers(which: str, swapped: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[str]] = []

    def convert(model: torch.nn.Module, module_filter_fn: Callable[[torch.nn.Module, str], bool]) -> None:
        seen.append({name for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and module_filter_fn(m, name)})

    monkeypatch.setitem(sys.modules, "torchao.float8", types.SimpleNamespace(convert_to_float8_training=convert))
    torch.manual_seed(0)
    to_float8(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64)), which)
    assert seen == [swapped]


def _tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def test_fp16_creates_a_grad_scaler_and_steps_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optimize, "why_not", lambda settings, device: None)  # let fp16 run on the CPU
    run = apply(_tiny(), RunSettings(precision="fp16"), torch.device("cpu"), TrainParams())
    assert isinstance(run.scaler, torch.amp.GradScaler)
    calls: list[str] = []
    for name in ("scale", "unscale_", "step", "update"):
        real = getattr(run.scaler, name)
        monkeypatch.setattr(run.scaler, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
    before = run.model.blocks[0].mlp.fc.weight.detach().clone()
    train_step(run, *_batch(), grad_clip=1.0)
    assert calls == ["scale", "unscale_", "step", "update"]
    assert not torch.equal(before, run.model.blocks[0].mlp.fc.weight)  # the scaler's step moved the weights
    assert apply(_tiny(), RunSettings(precision="bf16"), torch.device("cpu"), TrainParams()).scaler is None


@pytest.mark.parametrize("mode, marks", [("reduce-overhead", 2), ("max-autotune", 2), ("max-autotune-no-cudagraphs", 0),
                                         ("default", 0)])
def test_each_micro_batch_tells_cuda_graphs_a_new_step_began(mode: str, marks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the mark, a graph replay may overwrite the outputs of the last one while they are still read.
    monkeypatch.setattr(optimize, "why_not", lambda settings, device: None)
    run = apply(_tiny(), RunSettings(), torch.device("cpu"), TrainParams())
    run.settings = RunSettings(compile=mode != "default", compile_mode=mode)  # the step reads the mode only
    calls: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(1))
    train_step(run, *_batch(), grad_clip=1.0, micro_batches=2)
    assert len(calls) == marks


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_autocast_puts_the_matmuls_in_the_run_precision(precision: str, dtype: torch.dtype) -> None:
    run = apply(_tiny(), RunSettings(precision=precision), torch.device("cpu"), TrainParams())
    seen: list[torch.dtype] = []
    run.model.blocks[0].mlp.fc.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    train_step(run, *_batch(), grad_clip=1.0)
    assert seen == [dtype]


@pytest.mark.parametrize("precision, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16), ("tf32", None),
                                              ("fp32", None)])
def test_autocast_dtype_is_the_precision_half_type_or_none(precision: str, dtype: torch.dtype | None) -> None:
    assert optimize.autocast_dtype(RunSettings(precision=precision)) == dtype  # type: ignore[arg-type]


def test_an_interrupted_write_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text('{"half": ')
            raise KeyboardInterrupt  # a kill in the middle of writing
    assert not target.exists() and list(tmp_path.iterdir()) == []
    write_json(target, {"ok": 1})
    assert target.read_text() == '{\n  "ok": 1\n}\n'


def _weights_after_steps(settings: RunSettings, grad_clip: float, steps: int = 3) -> list[torch.Tensor]:
    run = apply(_tiny(), settings, torch.device("cpu"), TrainParams(lr=0.01))
    for _ in range(steps):
        train_step(run, *_batch(), grad_clip=grad_clip)
    return [p.detach().clone() for p in run.model.parameters()]


@pytest.mark.parametrize("grad_clip", [0.05, 1e6])  # the tiny model's gradient norm is about 1: clipped, then not
def test_clipping_inside_the_fused_kernel_steps_as_clip_grad_norm_does(grad_clip: float) -> None:
    separate = _weights_after_steps(RunSettings(fused_adamw=True), grad_clip)
    folded = _weights_after_steps(RunSettings(fused_adamw=True, fused_clip=True), grad_clip)
    unclipped = _weights_after_steps(RunSettings(fused_adamw=True), 0.0)
    for a, b in zip(separate, folded):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    moved_apart = max((a - b).abs().max().item() for a, b in zip(folded, unclipped))
    assert (moved_apart > 1e-4) == (grad_clip < 1.0)  # clipping at 0.05 changes the steps; at 1e6 it does not


def test_fused_clip_with_clipping_off_steps_unclipped() -> None:
    unclipped = _weights_after_steps(RunSettings(fused_adamw=True), 0.0)
    folded_off = _weights_after_steps(RunSettings(fused_adamw=True, fused_clip=True), 0.0)
    for a, b in zip(unclipped, folded_off):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_fused_clip_leaves_the_gradients_to_the_kernel() -> None:
    run = apply(_tiny(), RunSettings(fused_adamw=True, fused_clip=True), torch.device("cpu"), TrainParams())
    with run.autocast():
        run.loss(*_batch()).backward()
    grads = [p.grad.clone() for p in run.model.parameters()]
    norm = torch.nn.utils.get_total_norm(grads)
    run.clip_gradients(0.05)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, run.model.parameters()))  # not rescaled in memory
    assert float(run.optimizer.grad_scale) == pytest.approx(float(norm) / 0.05, rel=1e-5)
    assert float(norm) > 0.05


def test_fused_adamw_leaves_the_gradients_divided_by_its_grad_scale() -> None:
    # Why fused_clip's kernel writes more than the plain fused step (README, the clip section's profile).
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 2.0)
    opt = torch.optim.AdamW([p], fused=True)
    opt.grad_scale = torch.tensor(4.0)  # type: ignore[attr-defined]
    opt.step()
    assert torch.equal(p.grad, torch.full((4,), 0.5))


def test_bf16_weights_need_bf16_matmuls_a_gpu_with_them_and_no_fsdp2() -> None:
    assert unsupported_reason(RunSettings(precision="bf16", weight_dtype="bf16"), H200) is None
    assert unsupported_reason(RunSettings(precision="bf16", weight_dtype="bf16"), CPU) is None
    assert unsupported_reason(RunSettings(weight_dtype="bf16"), V100) == (
        "weight_dtype=bf16 needs an Ampere or newer GPU; Tesla V100-SXM2-16GB has no bf16; use weight_dtype=fp32")
    assert unsupported_reason(RunSettings(weight_dtype="fp32"), V100) is None
    for precision in ("fp32", "tf32", "fp16"):
        with pytest.raises(LabError, match=f"precision='{precision}' is not valid; expected bf16 with weight_dtype=bf16"):
            parse_params(micro_params(weight_dtype="bf16", precision=precision))
    with pytest.raises(LabError, match="parallel='fsdp2' is not valid; expected none or ddp with weight_dtype=bf16"):
        parse_params(micro_params(weight_dtype="bf16", precision="bf16", parallel="fsdp2", nproc=2))
    assert parse_params(micro_params(weight_dtype="bf16", precision="bf16", parallel="ddp", nproc=2)).run.weight_dtype == "bf16"


@pytest.mark.parametrize("loss", ["standard", "chunked", "onepass"])
def test_bf16_weights_keep_parameters_gradients_and_moments_in_bf16(loss: str) -> None:
    settings = RunSettings(precision="bf16", weight_dtype="bf16", fused_adamw=True, fused_clip=True, loss=loss)  # type: ignore[arg-type]
    run = apply(_tiny(), settings, torch.device("cpu"), TrainParams(lr=0.01))
    params = list(run.model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    with run.autocast():
        run.loss(*_batch()).backward()
    assert [p.grad.dtype for p in params] == [torch.bfloat16] * len(params)
    train_step(run, *_batch(), grad_clip=1.0)  # (it clears the gradients after its step)
    assert {p.dtype for p in params} == {torch.bfloat16}
    moments = {t.dtype for p in params for k, t in run.optimizer.state[p].items() if k.startswith("exp_avg")}
    assert moments == {torch.bfloat16}
    assert run.model.lm_head.weight is run.model.wte.weight  # still tied after the cast


def test_bf16_weights_train_as_fp32_weights_do_up_to_bf16_rounding() -> None:
    # The same seeded model and batches under bf16 autocast: the loss curves of fp32 and bf16 weights agree to
    # within bf16's rounding (under 0.4% here), and both learn.
    curves = {}
    for dtype in ("fp32", "bf16"):
        run = apply(_tiny(), RunSettings(precision="bf16", weight_dtype=dtype, fused_adamw=True),  # type: ignore[arg-type]
                    torch.device("cpu"), TrainParams(lr=0.01))
        curves[dtype] = [float(train_step(run, *_batch(), grad_clip=1.0)) for _ in range(8)]
    assert curves["fp32"][-1] < curves["fp32"][0] - 0.3  # it learns
    for a, b in zip(curves["fp32"], curves["bf16"]):
        assert abs(a - b) < 0.01 * a
    assert curves["fp32"] != curves["bf16"]  # the weights really were rounded


def test_stochastic_rounding_needs_torchao_its_own_step_and_a_compiler() -> None:
    sr = {"precision": "bf16", "weight_dtype": "bf16_sr"}
    assert unsupported_reason(RunSettings(**sr), H200) is None
    assert unsupported_reason(RunSettings(**sr), DeviceFacts(kind="cpu", name="cpu", cxx=True, torchao=True)) is None
    for two_optimizers in ({"fused_adamw": True}, {"adam_state": "8bit"}):
        assert unsupported_reason(RunSettings(**sr, **two_optimizers), H200) == (
            "weight_dtype=bf16_sr is torchao's AdamW with stochastic rounding, its own compiled step; set "
            "fused_adamw=false and adam_state=fp32 with it")
    assert unsupported_reason(RunSettings(**sr), DeviceFacts(**{**H200.__dict__, "torchao": False})) == (
        "weight_dtype=bf16_sr needs torchao (pip install -r requirements-gpu.txt); or set weight_dtype=bf16")
    assert unsupported_reason(RunSettings(**sr), DeviceFacts(kind="cpu", name="cpu", cxx=True)) == (
        "weight_dtype=bf16_sr needs torchao (pip install -r requirements.txt); or set weight_dtype=bf16")
    assert unsupported_reason(RunSettings(**sr), DeviceFacts(kind="cpu", name="cpu", cxx=False, torchao=True)) == (
        "weight_dtype=bf16_sr compiles torchao's optimizer step, which on CPU needs a C++ compiler (g++)")
    assert "has no bf16" in unsupported_reason(RunSettings(**sr), V100)
    with pytest.raises(LabError, match="precision='fp32' is not valid; expected bf16 with weight_dtype=bf16_sr"):
        parse_params(micro_params(weight_dtype="bf16_sr"))


def test_stochastic_rounding_is_torchaos_adamw_with_the_same_groups() -> None:
    pytest.importorskip("torchao")
    from benchlab.sr_adamw import OneCallAdamW

    model = _tiny().to(torch.bfloat16)
    opt = make_optimizer(model, RunSettings(precision="bf16", weight_dtype="bf16_sr"), TrainParams(lr=0.01))
    assert isinstance(opt, OneCallAdamW) and opt.bf16_stochastic_round
    assert [g["weight_decay"] for g in opt.param_groups] == [TrainParams().weight_decay, 0.0]
    assert all(p.dim() >= 2 for p in opt.param_groups[0]["params"]) and all(p.dim() < 2 for p in opt.param_groups[1]["params"])
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    set_lr(opt, 0.002)
    assert [float(g["lr"]) for g in opt.param_groups] == pytest.approx([0.002, 0.002])  # fp32 tensors


@pytest.mark.parametrize("weight_dtype", ["bf16", "bf16_sr"])
def test_updates_below_bf16s_resolution_survive_only_stochastic_rounding(weight_dtype: str) -> None:
    pytest.importorskip("torchao")
    # Weights of 1.0 and a first Adam step of 0.001 (lr times a normalized moment of 1): the nearest bf16 to 0.999
    # is 1.0 (its spacing there is 2^-7 below 1), so round-to-nearest loses the step; stochastic rounding lands on
    # 0.99609375 with odds 0.001 / 2^-8, so the mean weight moves by the step.
    layer = torch.nn.Linear(64, 64, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    layer.weight.grad = torch.full_like(layer.weight, 0.5)
    settings = RunSettings(precision="bf16", weight_dtype=weight_dtype, fused_adamw=weight_dtype == "bf16")  # type: ignore[arg-type]
    make_optimizer(layer, settings, TrainParams(lr=1e-3, weight_decay=0.0)).step()
    values = set(layer.weight.float().flatten().tolist())
    mean = layer.weight.float().mean().item()
    if weight_dtype == "bf16":
        assert values == {1.0}
    else:
        assert values == {1.0, 0.99609375} and mean == pytest.approx(0.999, abs=2e-4)


def _one_layer() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))


def test_one_call_step_is_torchaos_step_over_every_parameter() -> None:
    # Without the rounding (fp32 weights) the one compiled call and torchao's per-parameter calls run the same
    # arithmetic, so three steps land on the same weights; each step is one call per group, not one per parameter.
    pytest.importorskip("torchao")
    from torchao.optim import _AdamW

    from benchlab.sr_adamw import OneCallAdamW

    g = torch.Generator().manual_seed(2)
    grads = [[torch.randn(p.shape, generator=g) for p in _one_layer().parameters()] for _ in range(3)]
    weights = {}
    calls: list[int] = []
    for kind in ("torchao", "one call"):
        model = _one_layer()
        params = list(model.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        if kind == "torchao":
            opt: torch.optim.Optimizer = _AdamW(groups, lr=0.01, betas=(0.9, 0.95))
        else:
            opt = OneCallAdamW(groups, lr=0.01, betas=(0.9, 0.95), bf16_stochastic_round=False)
            real = opt.step_group
            opt.step_group = lambda *a, _r=real: (calls.append(1), _r(*a))[1]  # type: ignore[attr-defined]
        for step_grads in grads:
            for p, grad in zip(params, step_grads):
                p.grad = grad.clone()
            opt.step()
        weights[kind] = [p.detach().clone() for p in params]
        assert [float(opt.state[params[0]]["step"])] == [3.0]
    assert len(calls) == 3 * 2  # three steps, two groups
    for a, b in zip(weights["torchao"], weights["one call"]):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    assert not torch.equal(weights["one call"][0], _one_layer().wte.weight)  # the steps moved the weights


def test_compile_update_needs_compile_and_torchs_adamw_without_a_scaler() -> None:
    graphed = RunSettings(precision="bf16", compile=True, compile_update=True, compile_mode="reduce-overhead")
    assert unsupported_reason(graphed, H200) is None
    assert unsupported_reason(RunSettings(compile=True, compile_update=True, parallel="ddp"), CPU) is None
    assert unsupported_reason(RunSettings(compile_update=True), CPU) == (
        "compile_update=true compiles the update in compile's mode; set compile=true with it")
    assert unsupported_reason(RunSettings(compile=True, compile_update=True, precision="fp16"), H200) == (
        "compile_update=true is not wired for precision=fp16 (the GradScaler reads its inf checks on the host); "
        "set compile_update=false or precision=bf16")
    torchao_step = ("compile_update=true compiles torch's AdamW; adam_state=8bit and weight_dtype=bf16_sr are "
                    "torchao's, with steps compiled their own way; set compile_update=false with them")
    assert unsupported_reason(RunSettings(compile=True, compile_update=True, adam_state="8bit"), H200) == torchao_step
    sr = RunSettings(precision="bf16", weight_dtype="bf16_sr", compile=True, compile_update=True)
    assert unsupported_reason(sr, H200) == torchao_step
    assert unsupported_reason(RunSettings(compile=True, compile_update=True, fused_adamw=True), H200) == (
        "compile_update=true compiles AdamW's foreach implementation, which torch.compile traces whole (fused AdamW's "
        "kernel it leaves outside the graph); set fused_adamw=false with it")
    assert unsupported_reason(RunSettings(compile=True, compile_update=True, parallel="fsdp2"), H200) == (
        "compile_update=true is not wired for fsdp2's sharded gradients; set compile_update=false or parallel=ddp")


def _weights_under_a_schedule(settings: RunSettings, lrs: tuple[float, ...]) -> tuple[list[torch.Tensor], int]:
    """The weights after one clipped step per learning rate, and how many graphs dynamo compiled meanwhile."""
    run = apply(_tiny(), settings, torch.device("cpu"), TrainParams(lr=lrs[0]))
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for lr in lrs:
        set_lr(run.optimizer, lr)
        train_step(run, *_batch(), grad_clip=0.05)  # the tiny model's gradient norm is about 1: clipped
    return [p.detach().clone() for p in run.model.parameters()], \
        torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before


def test_compiled_update_steps_as_the_eager_one_and_follows_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the update is compiled here (its check asks for compile; the model's compile would only slow the test).
    monkeypatch.setattr(optimize, "why_not", lambda settings, device: None)
    lrs = (0.01, 0.03, 0.002)
    eager, none = _weights_under_a_schedule(RunSettings(), lrs)
    compiled, graphs = _weights_under_a_schedule(RunSettings(compile_update=True), lrs)
    constant, _ = _weights_under_a_schedule(RunSettings(), (0.01, 0.01, 0.01))
    for a, b in zip(eager, compiled):  # the same arithmetic, fused by inductor: equal up to rounding
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert max((a - b).abs().max().item() for a, b in zip(compiled, constant)) > 1e-3  # the schedule was followed
    # Clipping and the step, compiled once each: a rate held as a float would be compiled again when it first changes.
    assert none == 0 and graphs == 2


def test_compiled_update_takes_the_compile_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(optimize, "why_not", lambda settings, device: None)
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: seen.append(mode) or fn)
    apply(_tiny(), RunSettings(compile=True, compile_mode="reduce-overhead", compile_update=True),
          torch.device("cpu"), TrainParams())
    assert seen[-1] == "reduce-overhead" and len(seen) == 2  # the loss head, then the update
    seen.clear()
    apply(_tiny(), RunSettings(compile=True, compile_mode="reduce-overhead"), torch.device("cpu"), TrainParams())
    assert seen == ["reduce-overhead"]  # the loss head alone
