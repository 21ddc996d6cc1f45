"""`benchlab.run.apply_knobs`: apply takes its steps in the order the knob table numbers them, and what is applied is
applied (the optimizer each knob value makes, checkpointing, float8, autocast, clipping, bf16 weights)."""

import re
import sys
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
import torch._functorch.config
from torch.utils._python_dispatch import TorchDispatchMode

from benchlab.core.attention_kernels import ATTENTION_KERNELS
from benchlab.core.errors import LabError
from benchlab.core.files import atomic_path, write_json
from benchlab.core.knob_row import STEPS
from benchlab.core.knobs import Optimizer, RunSettings
from benchlab.core.sections import OptimParams
from benchlab.run import activation_checkpointing, apply_knobs, hardware
from benchlab.run.apply_knobs import apply, to_float8
from benchlab.run.hardware import device_facts
from benchlab.run.optimizers import make_optimizer, set_lr
from benchlab.run.step import train_step
from model.gpt import GPT, GPTConfig
from tests.conftest import ROOT


def test_apply_takes_its_steps_in_the_order_the_knob_table_numbers_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # The table's "applied at" numbers are places in STEPS; apply must call each step's function (its
    # STEP_FUNCTIONS, which name the steps of STEPS on import) in that order.
    names = {step: function.__name__ for step, function in apply_knobs.STEP_FUNCTIONS.items()}
    assert tuple(names) == STEPS[1:]
    called: list[str] = []
    monkeypatch.setattr(apply_knobs, "why_not", lambda settings, device: None)
    for name in names.values():
        real = getattr(apply_knobs, name)

        def spy(*args: Any, _name: str = name, _real: Callable = real, **kwargs: Any) -> Any:
            called.append(_name)
            return None if _name in ("to_float8", "parallelize") else _real(*args, **kwargs)

        monkeypatch.setattr(apply_knobs, name, spy)
    every_step = RunSettings(fp8="blocks", activation_checkpointing="full")
    apply(_tiny(), every_step, torch.device("cpu"), OptimParams())
    assert called == [names[step] for step in STEPS[1:]]


def test_the_architecture_diagram_numbers_apply_s_steps_and_their_functions_as_the_code_does() -> None:
    diagram = re.findall(r"^\|\s+(\d+)\. (\w+)\s+(\w+)", (ROOT / "docs/architecture.md").read_text(), re.MULTILINE)
    assert diagram == [(str(i), step, apply_knobs.STEP_FUNCTIONS[step].__name__)
                       for i, step in enumerate(STEPS) if i > 0]


def test_device_facts_of_the_cpu() -> None:
    assert device_facts(torch.device("cpu")).kind == "cpu"


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
        activation_checkpointing.rng_replay(RunSettings(**knobs))
        assert torch._functorch.config.graphsafe_rng_functionalization is graphsafe


def test_apply_sets_how_checkpointed_blocks_replay_random_ops() -> None:
    with torch._functorch.config.patch(graphsafe_rng_functionalization=True):
        apply(_tiny(), RunSettings(activation_checkpointing="full"), torch.device("cpu"), OptimParams())
        assert torch._functorch.config.graphsafe_rng_functionalization is False


def test_optimizer_is_the_for_loop_baseline_or_the_fused_kernel() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    loop = make_optimizer(model, RunSettings(), OptimParams(lr=0.25))
    fused = make_optimizer(model, RunSettings(optimizer="adamw_fused"), OptimParams(lr=0.25))
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
    opt = make_optimizer(model, RunSettings(optimizer="adamw_8bit"), OptimParams(lr=0.25))
    assert isinstance(opt, _FakeAdamW8bit) and opt.defaults["betas"] == (0.9, 0.95)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    lr_tensor = decayed["lr"]
    set_lr(opt, 0.5)
    assert decayed["lr"] is lr_tensor and float(lr_tensor) == 0.5 and float(plain["lr"]) == 0.5
    plain_opt = make_optimizer(model, RunSettings(), OptimParams())
    set_lr(plain_opt, 0.125)
    assert [g["lr"] for g in plain_opt.param_groups] == [0.125, 0.125]


def test_each_optimizer_choice_makes_its_own_adamw(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchao")
    from benchlab.run.adamw_bf16_sr import OneCallAdamW

    monkeypatch.setitem(sys.modules, "torchao.optim", types.SimpleNamespace(AdamW8bit=_FakeAdamW8bit))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    made = {choice: make_optimizer(model, RunSettings(optimizer=choice), OptimParams(lr=0.25))
            for choice in get_args(Optimizer) if choice != "muon"}  # muon is no AdamW: tests/unit/test_muon.py
    assert made["adamw"].defaults["foreach"] is False and not made["adamw"].defaults["fused"]
    assert made["adamw_fused"].defaults["fused"] is True
    compiled = made["adamw_compiled"].defaults  # torch's choice of implementation, the rate a tensor for the graph
    assert compiled["foreach"] is None and not compiled["fused"] and isinstance(compiled["lr"], torch.Tensor)
    assert type(made["adamw_8bit"]) is _FakeAdamW8bit and type(made["adamw_bf16_sr"]) is OneCallAdamW
    for opt in made.values():
        assert float(opt.defaults["lr"]) == 0.25 and opt.defaults["betas"] == (0.9, 0.95)
        assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


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
    monkeypatch.setattr(apply_knobs, "why_not", lambda settings, device: None)  # let fp16 run on the CPU
    run = apply(_tiny(), RunSettings(precision="fp16"), torch.device("cpu"), OptimParams())
    assert isinstance(run.scaler, torch.amp.GradScaler)
    calls: list[str] = []
    for name in ("scale", "unscale_", "step", "update"):
        real = getattr(run.scaler, name)
        monkeypatch.setattr(run.scaler, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
    before = run.model.blocks[0].mlp.fc.weight.detach().clone()
    train_step(run, *_batch(), grad_clip=1.0)
    assert calls == ["scale", "unscale_", "step", "update"]
    assert not torch.equal(before, run.model.blocks[0].mlp.fc.weight)  # the scaler's step moved the weights
    assert apply(_tiny(), RunSettings(precision="bf16"), torch.device("cpu"), OptimParams()).scaler is None


@pytest.mark.parametrize("mode, marks", [("reduce-overhead", 2), ("max-autotune", 2), ("max-autotune-no-cudagraphs", 0),
                                         ("default", 0)])
def test_each_micro_batch_tells_cuda_graphs_a_new_step_began(mode: str, marks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the mark, a graph replay may overwrite the outputs of the last one while they are still read.
    monkeypatch.setattr(apply_knobs, "why_not", lambda settings, device: None)
    run = apply(_tiny(), RunSettings(), torch.device("cpu"), OptimParams())
    run.settings = RunSettings(compile=mode != "default", compile_mode=mode)  # the step reads the mode only
    calls: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(1))
    train_step(run, *_batch(), grad_clip=1.0, micro_batches=2)
    assert len(calls) == marks


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_autocast_puts_the_matmuls_in_the_run_precision(precision: str, dtype: torch.dtype) -> None:
    run = apply(_tiny(), RunSettings(precision=precision), torch.device("cpu"), OptimParams())
    seen: list[torch.dtype] = []
    run.model.blocks[0].mlp.fc.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    train_step(run, *_batch(), grad_clip=1.0)
    assert seen == [dtype]


@pytest.mark.parametrize("precision, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16), ("tf32", None),
                                              ("fp32", None)])
def test_autocast_dtype_is_the_precision_half_type_or_none(precision: str, dtype: torch.dtype | None) -> None:
    assert apply_knobs.autocast_dtype(RunSettings(precision=precision)) == dtype  # type: ignore[arg-type]


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
    run = apply(_tiny(), settings, torch.device("cpu"), OptimParams(lr=0.01))
    for _ in range(steps):
        train_step(run, *_batch(), grad_clip=grad_clip)
    return [p.detach().clone() for p in run.model.parameters()]


@pytest.mark.parametrize("grad_clip", [0.05, 1e6])  # the tiny model's gradient norm is about 1: clipped, then not
def test_clipping_inside_the_fused_kernel_steps_as_clip_grad_norm_does(grad_clip: float) -> None:
    separate = _weights_after_steps(RunSettings(optimizer="adamw_fused"), grad_clip)
    folded = _weights_after_steps(RunSettings(optimizer="adamw_fused", fused_clip=True), grad_clip)
    unclipped = _weights_after_steps(RunSettings(optimizer="adamw_fused"), 0.0)
    for a, b in zip(separate, folded):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    moved_apart = max((a - b).abs().max().item() for a, b in zip(folded, unclipped))
    assert (moved_apart > 1e-4) == (grad_clip < 1.0)  # clipping at 0.05 changes the steps; at 1e6 it does not


def test_fused_clip_with_clipping_off_steps_unclipped() -> None:
    unclipped = _weights_after_steps(RunSettings(optimizer="adamw_fused"), 0.0)
    folded_off = _weights_after_steps(RunSettings(optimizer="adamw_fused", fused_clip=True), 0.0)
    for a, b in zip(unclipped, folded_off):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_fused_clip_leaves_the_gradients_to_the_kernel() -> None:
    run = apply(_tiny(), RunSettings(optimizer="adamw_fused", fused_clip=True), torch.device("cpu"), OptimParams())
    with run.autocast():
        run.loss(*_batch()).backward()
    grads = [p.grad.clone() for p in run.model.parameters()]
    norm = torch.nn.utils.get_total_norm(grads)
    run.clip_gradients(0.05)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, run.model.parameters()))  # not rescaled in memory
    assert float(run.optimizer.grad_scale) == pytest.approx(float(norm) / 0.05, rel=1e-5)
    assert torch.equal(run.optimizer.grad_scale, (norm.float() + 1e-6) / 0.05)  # clip_grad_norm_'s epsilon, exactly
    assert float(norm) > 0.05


def test_fused_adamw_leaves_the_gradients_divided_by_its_grad_scale() -> None:
    # Why fused_clip's kernel writes more than the plain fused step (README, the clip section's profile).
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 2.0)
    opt = torch.optim.AdamW([p], fused=True)
    opt.grad_scale = torch.tensor(4.0)  # type: ignore[attr-defined]
    opt.step()
    assert torch.equal(p.grad, torch.full((4,), 0.5))


@pytest.mark.parametrize("loss", ["standard", "chunked", "onepass"])
def test_bf16_weights_keep_parameters_gradients_and_moments_in_bf16(loss: str) -> None:
    settings = RunSettings(precision="bf16", weight_dtype="bf16", optimizer="adamw_fused", fused_clip=True, loss=loss)  # type: ignore[arg-type]
    run = apply(_tiny(), settings, torch.device("cpu"), OptimParams(lr=0.01))
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
        run = apply(_tiny(), RunSettings(precision="bf16", weight_dtype=dtype, optimizer="adamw_fused"),  # type: ignore[arg-type]
                    torch.device("cpu"), OptimParams(lr=0.01))
        curves[dtype] = [float(train_step(run, *_batch(), grad_clip=1.0)) for _ in range(8)]
    assert curves["fp32"][-1] < curves["fp32"][0] - 0.3  # it learns
    for a, b in zip(curves["fp32"], curves["bf16"]):
        assert abs(a - b) < 0.01 * a
    assert curves["fp32"] != curves["bf16"]  # the weights really were rounded


def test_stochastic_rounding_is_torchaos_adamw_with_the_same_groups() -> None:
    pytest.importorskip("torchao")
    from benchlab.run.adamw_bf16_sr import OneCallAdamW

    model = _tiny().to(torch.bfloat16)
    opt = make_optimizer(model, RunSettings(precision="bf16", weight_dtype="bf16", optimizer="adamw_bf16_sr"),
                         OptimParams(lr=0.01))
    assert isinstance(opt, OneCallAdamW) and opt.bf16_stochastic_round
    assert [g["weight_decay"] for g in opt.param_groups] == [OptimParams().weight_decay, 0.0]
    assert all(p.dim() >= 2 for p in opt.param_groups[0]["params"]) and all(p.dim() < 2 for p in opt.param_groups[1]["params"])
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    set_lr(opt, 0.002)
    assert [float(g["lr"]) for g in opt.param_groups] == pytest.approx([0.002, 0.002])  # fp32 tensors


@pytest.mark.parametrize("optimizer", ["adamw_fused"])  # adamw_bf16_sr: tests/integration/test_apply_knobs.py
def test_updates_below_bf16s_resolution_survive_only_stochastic_rounding(optimizer: str) -> None:
    pytest.importorskip("torchao")
    # Weights of 1.0 and a first Adam step of 0.001 (lr times a normalized moment of 1): the nearest bf16 to 0.999
    # is 1.0 (its spacing there is 2^-7 below 1), so round-to-nearest loses the step; stochastic rounding lands on
    # 0.99609375 with odds 0.001 / 2^-8, so the mean weight moves by the step.
    layer = torch.nn.Linear(64, 64, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    layer.weight.grad = torch.full_like(layer.weight, 0.5)
    settings = RunSettings(precision="bf16", weight_dtype="bf16", optimizer=optimizer)  # type: ignore[arg-type]
    make_optimizer(layer, settings, OptimParams(lr=1e-3, weight_decay=0.0)).step()
    values = set(layer.weight.float().flatten().tolist())
    mean = layer.weight.float().mean().item()
    if optimizer == "adamw_fused":
        assert values == {1.0}
    else:
        assert values == {1.0, 0.99609375} and mean == pytest.approx(0.999, abs=2e-4)


def test_compiled_update_takes_the_compile_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(apply_knobs, "why_not", lambda settings, device: None)
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: seen.append(mode) or fn)
    apply(_tiny(), RunSettings(compile=True, compile_mode="reduce-overhead", optimizer="adamw_compiled"),
          torch.device("cpu"), OptimParams())
    assert seen[-1] == "reduce-overhead" and len(seen) == 2  # the loss head, then the update
    seen.clear()
    apply(_tiny(), RunSettings(compile=True, compile_mode="reduce-overhead"), torch.device("cpu"), OptimParams())
    assert seen == ["reduce-overhead"]  # the loss head alone


def test_the_device_auto_picks_and_cuda_without_a_gpu_is_refused_naming_the_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.run.hardware import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(LabError) as err:
        resolve_device("cuda")
    assert str(err.value) == (f"device='cuda' but torch {torch.__version__} (a CPU build) sees no CUDA GPU; install a "
                              "CUDA build of torch (README, On your GPU), or use device=auto or device=cpu (preset=cpu)")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(LabError, match=r"\(built for CUDA 13.0\) sees no CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda") and resolve_device("cuda") == torch.device("cuda")


def test_selective_checkpointing_keeps_matmul_and_attention_outputs_and_recomputes_the_rest() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    from benchlab.run.activation_checkpointing import _keep_matmuls

    for op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
               torch.ops.aten._scaled_dot_product_flash_attention.default):
        assert _keep_matmuls(None, op) == CheckpointPolicy.MUST_SAVE
    for op in (torch.ops.aten.add.Tensor, torch.ops.aten.gelu.default, torch.ops.aten.native_layer_norm.default):
        assert _keep_matmuls(None, op) == CheckpointPolicy.PREFER_RECOMPUTE


class _Ops(TorchDispatchMode):
    """Counts the ops that run under it, by name ("aten.mm.default")."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("attention", [name for name, kernel in ATTENTION_KERNELS.items() if kernel.saved_ops])
def test_selective_checkpointing_keeps_the_attention_kernel_s_output_and_full_checkpointing_runs_it_again(
        attention: str) -> None:
    # Counted as they run in backward: a kept output is not recomputed. On a CPU, sdpa runs its flash port.
    again = {}
    for mode in ("full", "selective"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, attention=attention))
        activation_checkpointing.checkpoint_blocks(model, mode)
        x = torch.randint(0, 64, (2, 16))
        _, loss = model(x, x)
        with _Ops() as backward:
            loss.backward()
        again[mode] = sum(backward.counts[op] for op in ATTENTION_KERNELS[attention].saved_ops)
    assert again == {"full": 2, "selective": 0}


def test_device_facts_read_the_gpu_the_libraries_and_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchlab.core.skips import DeviceFacts

    gpu = torch.device("cuda", 1)
    asked: list = []
    present = {"triton": True, "torchao": True, "liger_kernel": False, "cut_cross_entropy": True}
    monkeypatch.setattr(hardware.importlib.util, "find_spec", lambda name: object() if present[name] else None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: asked.append(d) or "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: asked.append(d) or (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(hardware, "package_version", lambda name: {"liger-kernel": "0.8.5"}[name])
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 16)
    assert hardware.device_facts(gpu) == DeviceFacts(
        kind="cuda", name="NVIDIA H200", capability=(9, 0), bf16=True, triton=True, torchao=True, liger=False,
        liger_version="0.8.5", cce=True, gpu_count=2, cpu_count=16)
    assert asked == [gpu, gpu]
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: None)  # unknown: one core
    assert hardware.device_facts(gpu).cpu_count == 1
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 16)
    monkeypatch.setenv("CXX", "clang++")
    monkeypatch.setattr(hardware.shutil, "which", lambda name: "/usr/bin/clang++" if name == "clang++" else None)
    assert hardware.device_facts(torch.device("cpu")) == DeviceFacts(kind="cpu", name="cpu", cxx=True, torchao=True,
                                                                     cpu_count=16)
    monkeypatch.delenv("CXX")  # g++ by default
    assert hardware.device_facts(torch.device("cpu")).cxx is False
    monkeypatch.setattr(hardware.shutil, "which", lambda name: "/usr/bin/g++" if name == "g++" else None)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: None)  # unknown: one core
    assert hardware.device_facts(torch.device("cpu")) == DeviceFacts(kind="cpu", name="cpu", cxx=True, torchao=True,
                                                                     cpu_count=1)


def test_blocks_are_wrapped_for_full_or_selective_recomputation(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.algorithms._checkpoint.checkpoint_wrapper as wrapper_module
    import torch.utils.checkpoint as checkpoint_module

    wrapped: list = []
    monkeypatch.setattr(wrapper_module, "checkpoint_wrapper",
                        lambda block, **kw: wrapped.append((block, kw)) or torch.nn.Identity())
    def contexts(*args: object) -> None:  # torch's selective-checkpoint context maker
        return None

    monkeypatch.setattr(checkpoint_module, "create_selective_checkpoint_contexts", contexts)
    model = _tiny()
    blocks = list(model.blocks)
    activation_checkpointing.checkpoint_blocks(model, "full")
    assert wrapped == [(b, {"preserve_rng_state": False}) for b in blocks]
    wrapped.clear()
    model = _tiny()
    blocks = list(model.blocks)
    activation_checkpointing.checkpoint_blocks(model, "selective")
    assert [(block, kw["preserve_rng_state"]) for block, kw in wrapped] == [(b, False) for b in blocks]
    policy = wrapped[0][1]["context_fn"]
    assert (policy.func, policy.args) == (contexts, (activation_checkpointing._keep_matmuls,))
    assert all(isinstance(b, torch.nn.Identity) for b in model.blocks)  # each block replaced by its wrapper


def test_a_gpu_run_s_autocast_takes_the_run_s_dtype_not_the_device_default() -> None:
    run = apply_knobs.TrainingRun(_tiny(), None, None, None, torch.device("cuda"), RunSettings(precision="bf16"))  # type: ignore[arg-type]
    with pytest.warns(UserWarning):  # no CUDA here: autocast says it is disabled, but keeps the dtype asked
        assert run.autocast().fast_dtype == torch.bfloat16  # CUDA's own default would be fp16


def test_ddp_wraps_the_head_s_module_first_and_compile_wraps_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list = []
    gpu = torch.device("cuda", 1)
    monkeypatch.setattr(apply_knobs, "ddp", lambda settings, device: lambda m: order.append(("ddp", settings, device, m))
                        or "ddp-wrapped")
    monkeypatch.setattr(apply_knobs, "compiler", lambda settings: lambda m: order.append(("compile", m)) or "compiled")
    settings = RunSettings(parallel="ddp", nproc=2, compile=True)
    module = torch.nn.Linear(2, 2)
    assert apply_knobs.wrapper(settings, gpu)(module) == "compiled"
    assert order == [("ddp", settings, gpu, module), ("compile", "ddp-wrapped")]
    monkeypatch.setattr(apply_knobs, "compiler", lambda settings: None)
    assert apply_knobs.wrapper(RunSettings(), gpu)(module) is module  # neither asked: the module itself


@pytest.mark.parametrize(("precision", "wanted"), [("fp32", "highest"), ("tf32", "high"), ("bf16", "high")])
def test_tf32_is_set_on_a_gpu_only_and_off_only_for_pure_fp32(monkeypatch: pytest.MonkeyPatch, precision: str,
                                                               wanted: str) -> None:
    set_to: list = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", set_to.append)
    apply_knobs.set_tf32(RunSettings(precision=precision), torch.device("cpu"))
    assert set_to == []  # a CPU has no TF32 to turn on or off
    apply_knobs.set_tf32(RunSettings(precision=precision), torch.device("cuda"))
    assert set_to == [wanted]


def test_the_model_is_placed_in_its_weight_dtype_and_fp16_alone_gets_a_scaler() -> None:
    assert next(apply_knobs.place(_tiny(), RunSettings(), torch.device("cpu")).parameters()).dtype == torch.float32
    bf16 = apply_knobs.place(_tiny(), RunSettings(weight_dtype="bf16", precision="bf16"), torch.device("cpu"))
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert apply_knobs.make_scaler(RunSettings(precision="bf16"), torch.device("cpu")) is None
    scaler = apply_knobs.make_scaler(RunSettings(precision="fp16"), torch.device("cpu"))
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "cpu"


def test_apply_hands_each_step_the_model_it_built_the_settings_and_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}
    model, placed = _tiny(), _tiny()
    settings = RunSettings(fp8="blocks", activation_checkpointing="selective", compile=True)
    device = torch.device("cpu")
    monkeypatch.setattr(apply_knobs, "why_not", lambda s, d: seen.setdefault("why_not", (s, d)) and None)
    monkeypatch.setattr(apply_knobs, "place", lambda m, s, d: seen.setdefault("place", (m, s, d)) and placed)
    for name in ("set_tf32", "to_float8", "checkpoint_blocks", "rng_replay", "parallelize"):
        monkeypatch.setattr(apply_knobs, name, lambda *args, _name=name: seen.setdefault(_name, args) and None)
    real_head = apply_knobs.loss_head
    monkeypatch.setattr(apply_knobs, "loss_head", lambda m, s, d: seen.setdefault("loss_head", (m, s, d)) and
                        real_head(m, RunSettings(), d))
    run = apply(model, settings, device, OptimParams())
    assert seen == {"why_not": (settings, device), "place": (model, settings, device), "set_tf32": (settings, device),
                    "to_float8": (placed, "blocks"), "checkpoint_blocks": (placed, "selective"),
                    "rng_replay": (settings,), "parallelize": (placed, settings, device),
                    "loss_head": (placed, settings, device)}
    assert run.model is placed and run.device == device and run.settings is settings


def test_apply_refuses_what_the_device_cannot_run_by_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply_knobs, "why_not", lambda s, d: "precision=fp16 with loss scaling needs a CUDA GPU")
    with pytest.raises(LabError) as err:
        apply(_tiny(), RunSettings(), torch.device("cpu"), OptimParams())
    assert str(err.value) == "precision=fp16 with loss scaling needs a CUDA GPU"
    with pytest.raises(LabError, match="precision=fp16"):  # the real check, not a stand-in
        monkeypatch.undo()
        apply(_tiny(), RunSettings(precision="fp16"), torch.device("cpu"), OptimParams())


def test_the_loss_head_gets_the_run_s_device_and_its_compile_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    monkeypatch.setattr(apply_knobs, "wrapper", lambda s, d: seen.append(d) or (lambda m: m))
    monkeypatch.setattr(apply_knobs, "loss_fn", lambda *a, **kw: seen.append(kw["compile_chunks"]))
    apply_knobs.loss_head(_tiny(), RunSettings(loss="chunked", compile=True), torch.device("cuda", 1))
    apply_knobs.loss_head(_tiny(), RunSettings(loss="chunked"), torch.device("cpu"))
    assert seen == [torch.device("cuda", 1), True, torch.device("cpu"), False]
