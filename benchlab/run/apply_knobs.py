"""Every optimization is applied here, from outside the model, in one fixed order: `benchlab.core.knob_row.STEPS`, the
one list of it (the knob table numbers each knob's steps by their place there). `STEP_FUNCTIONS` names the function
that takes each step, checked against STEPS on import, and a test holds `apply` to calling them in that order.

The attention kernel is the model's constructor's (`benchlab.run.build_model`); then `apply` places the model on its
device in the weights' dtype, sets the TF32 matmul flags, swaps in float8 Linear layers (torchao), checkpoints each
block (and chooses how compiled backward replays random ops: `benchlab.run.activation_checkpointing`), applies data
parallelism (FSDP2's fully_shard on every block and on the model; DDP goes around the loss head's module), builds
the loss head, wrapped whole by torch.compile (with its mode), makes the optimizer (for-loop, fused, compiled, 8-bit
or stochastically rounding AdamW, over the sharded parameters, with gradient clipping folded into the fused kernel
when asked, the update compiled for adamw_compiled), and last the fp16 GradScaler (autocast itself is entered around
each step's forward).

The order is torchtitan's: float8 swaps modules before checkpointing wraps them, fully_shard wraps the checkpointed
blocks, and compile sees the final module tree, calling through DDP (whose graph it splits at bucket boundaries, so
all-reduce overlaps backward). Under FSDP2, compile goes on each block's forward just before fully_shard instead, so
that FSDP2's hooks stay outside the graphs (torchtitan's order too), and on the output layer with its cross-entropy,
called after the model's body. DDP must wrap the module the step calls, the loss head, since the chunked and fused
heads call the model's body, not its forward."""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch
import torch._functorch.config
import torch.distributed
import torch.nn as nn

from benchlab.core.errors import LabError
from benchlab.core.knob_row import STEPS
from benchlab.core.knobs import RunSettings
from benchlab.core.loss_heads import LOSS_HEADS
from benchlab.core.sections import OptimParams
from benchlab.run.activation_checkpointing import checkpoint_blocks, rng_replay
from benchlab.run.hardware import why_not
from benchlab.run.heads.choose import BodyThenHead, LossFn, loss_fn
from benchlab.run.optimizers import make_optimizer
from model.gpt import GPT


def place(model: GPT, settings: RunSettings, device: torch.device) -> GPT:
    """The model on its device, its parameters in weight_dtype."""
    return model.to(device, dtype=None if settings.weight_dtype == "fp32" else torch.bfloat16)


def set_tf32(settings: RunSettings, device: torch.device) -> None:
    """TF32 off only for the pure-fp32 recipe; on for tf32, and for what autocast leaves in fp32. CUDA's flag: on a
    CPU nothing is set."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest" if settings.precision == "fp32" else "high")


# Which Linear layers `fp8` swaps, by their name in the model (torchao's module_filter_fn sees the fqn).
FP8_LAYERS: dict[str, Callable[[str], bool]] = {
    "blocks": lambda fqn: fqn.startswith("blocks."),
    "head": lambda fqn: fqn == "lm_head",
    "all": lambda fqn: fqn.startswith("blocks.") or fqn == "lm_head",
}


def to_float8(model: GPT, which: str) -> None:
    """The chosen Linear layers compute in float8 (tensorwise scales). torchao's swap keeps the module's own
    weight Parameter, so the output head stays tied to the token embedding."""
    from torchao.float8 import convert_to_float8_training

    chosen = FP8_LAYERS[which]
    convert_to_float8_training(model, module_filter_fn=lambda module, fqn: chosen(fqn))


def compiler(settings: RunSettings) -> "partial[nn.Module] | None":
    """torch.compile with the run's mode, or None for eager."""
    return in_mode(settings) if settings.compile else None


def in_mode(settings: RunSettings) -> "partial[nn.Module]":
    """torch.compile with the run's compile_mode."""
    return partial(torch.compile, mode=None if settings.compile_mode == "default" else settings.compile_mode)


def blocks_compiled(settings: RunSettings) -> bool:
    """Each block compiled on its own: regional compilation (compile_scope=blocks), or FSDP2 with compile."""
    return settings.compile and (settings.parallel == "fsdp2" or settings.compile_scope == "blocks")


def compile_blocks(model: GPT, settings: RunSettings) -> None:
    """Each block's forward compiled on its own (regional compilation; under FSDP2, before fully_shard, as
    torchtitan does), the loss head apart (`loss_head`). The blocks run one code, so dynamo compiles it once and
    reuses it for every block whatever the depth (parameters are the graph's inputs, not constants). Compiled from outside, the model's graph broke at FSDP2's hooks around every block; on two
    H200s that run reached 39% of DDP's tokens/s with 58% of kernel time in waiting NCCL kernels. Compiling
    `forward`, not the module's call, keeps FSDP2's hooks (in `__call__`) outside the graph and the
    state_dict's keys unchanged."""
    compile_fn = compiler(settings)
    assert compile_fn is not None
    for block in model.blocks:
        block.forward = compile_fn(block.forward)


def block_units(blocks: list[nn.Module], per_unit: int) -> list[list[nn.Module]]:
    """Consecutive blocks, `per_unit` to a unit (the last one may hold fewer); none for 0."""
    if per_unit == 0:
        return []
    return [blocks[i : i + per_unit] for i in range(0, len(blocks), per_unit)]


def shard(model: GPT, settings: RunSettings, device: torch.device) -> None:
    """FSDP2: every `fsdp_blocks_per_unit` consecutive blocks are one all-gather / reduce-scatter unit (each
    block its own by default; 0: none), the model's remaining layers the root unit.

    Parameters are gathered in `fsdp_param_dtype` and gradients reduced in fp32.
    The chunked and fused heads call `features`, not `forward`; it is registered
    so that it, too, gathers the root's parameters.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    param_dtype = torch.bfloat16 if settings.fsdp_param_dtype == "bf16" else None
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for unit in block_units(list(model.blocks), settings.fsdp_blocks_per_unit):
        fully_shard(unit[0] if len(unit) == 1 else unit, mesh=mesh, mp_policy=policy, reshard_after_forward=settings.fsdp_reshard_after_forward)
    # The root's layers (embeddings, tied output head) stay gathered from forward into backward: `forward`
    # calls `features`, and a reshard when `features` returned would leave the head with its shard only.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    register_fsdp_forward_method(model, "features")


def ddp(settings: RunSettings, device: torch.device) -> Callable[[nn.Module], nn.Module]:
    """DistributedDataParallel with the run's bucket size and communication hook; the model's buffers (attention
    masks) never change, so they are not broadcast every step."""
    from torch.nn.parallel import DistributedDataParallel

    def wrap(module: nn.Module) -> nn.Module:
        wrapped = DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=settings.ddp_bucket_mb,
            gradient_as_bucket_view=settings.ddp_grad_as_bucket_view, broadcast_buffers=False)
        if settings.ddp_comm_hook == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

            wrapped.register_comm_hook(None, bf16_compress_hook)  # state None: the default process group
        return wrapped

    return wrap


def wrapper(settings: RunSettings, device: torch.device) -> "Callable[[nn.Module], nn.Module]":
    """What wraps the loss head's module: DDP (ddp), then torch.compile (compile), each only when asked; under
    FSDP2 nothing (its blocks were compiled one by one, `compile_blocks`, and a standard or inline head is
    compiled apart from the body, `BodyThenHead`)."""
    outer = compiler(settings) if not blocks_compiled(settings) else None
    outer = outer or (lambda module: module)
    if settings.parallel != "ddp":
        return outer
    inner = ddp(settings, device)
    return lambda module: outer(inner(module))


def autocast_dtype(settings: RunSettings) -> torch.dtype | None:
    """The dtype autocast runs matmuls in under these settings; None where there is no autocast."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(settings.precision)


@dataclass
class TrainingRun:
    """A model ready to train: the raw module to save and evaluate, the loss to step through, and how to step."""

    model: GPT  # raw module (sharded in place under FSDP2): save and evaluate this one
    loss: LossFn  # (idx, targets) -> mean loss, compiled or eager, with the run's loss head
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    device: torch.device
    settings: RunSettings
    update: Callable[[float], None] = field(init=False)  # the training step's update: clip_and_step, or compiled

    def __post_init__(self) -> None:
        self.update = self.clip_and_step  # `apply` compiles it for optimizer=adamw_compiled

    def clip_gradients(self, max_norm: float) -> None:
        """Limit the gradients' global 2-norm to max_norm (0: no clipping), as torch's clip_grad_norm_ does.

        With fused_clip the factor is not applied here: fused AdamW's kernel divides each gradient by its
        `grad_scale` as it reads it (the attribute torch's GradScaler sets for the fp16 case), so the pass that
        rescales every gradient in memory is saved. clip_grad_norm_ multiplies by max_norm / (norm + 1e-6) where
        that is below 1; the kernel divides by the inverse, which differs from it by rounding only."""
        if max_norm <= 0:
            return
        if not self.settings.fused_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True).float()  # the kernel takes an fp32 scale
        self.optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)  # type: ignore[attr-defined]

    def clip_and_step(self, max_norm: float) -> None:
        """The optimizer update without a GradScaler: clip the gradients, then step. optimizer=adamw_compiled
        compiles this (dynamo splits it at the optimizer's own graph breaks: clipping and the step become two graphs)."""
        self.clip_gradients(max_norm)
        self.optimizer.step()

    def autocast(self) -> AbstractContextManager:
        dtype = autocast_dtype(self.settings)
        if dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)


def make_scaler(settings: RunSettings, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling (its 5-bit exponent underflows small gradients); nothing else does."""
    return torch.amp.GradScaler(device.type) if settings.precision == "fp16" else None


def parallelize(model: GPT, settings: RunSettings, device: torch.device) -> None:
    """FSDP2: compile each block's forward (with compile), then shard the model; DDP wraps the loss head's module
    later (`wrapper`). A parallel run needs the process group torchrun's ranks joined."""
    if settings.parallel != "none" and not torch.distributed.is_initialized():
        raise LabError(f"parallel={settings.parallel} runs under torchrun (the bench stage starts it); "
                       "this process joined no process group")
    if blocks_compiled(settings):
        compile_blocks(model, settings)
    if settings.parallel == "fsdp2":
        shard(model, settings, device)


def loss_head(model: GPT, settings: RunSettings, device: torch.device) -> LossFn:
    """The loss the step calls: the chosen head, wrapped by DDP and torch.compile as asked (under FSDP2 with
    compile, a standard or inline head is compiled apart from the body)."""
    head = LOSS_HEADS[settings.loss]
    if blocks_compiled(settings) and not head.owns_output_matmul:
        return BodyThenHead(model, settings.loss, compiler(settings))  # type: ignore[arg-type]
    return loss_fn(model, settings.loss, wrapper(settings, device), compile_chunks=settings.compile,
                   chunk=settings.loss_chunk_tokens, hidden_dtype=autocast_dtype(settings))


def apply(model: GPT, settings: RunSettings, device: torch.device, optim: OptimParams) -> TrainingRun:
    """Apply the settings to a freshly built model, one step of STEPS after another (STEP_FUNCTIONS)."""
    reason = why_not(settings, device)
    if reason:
        raise LabError(reason)
    model = place(model, settings, device)
    set_tf32(settings, device)
    if settings.fp8 != "none":
        to_float8(model, settings.fp8)
    if settings.activation_checkpointing != "none":
        checkpoint_blocks(model, settings.activation_checkpointing)
    rng_replay(settings)
    parallelize(model, settings, device)
    loss = loss_head(model, settings, device)
    optimizer = make_optimizer(model, settings, optim)
    run = TrainingRun(model, loss, optimizer, make_scaler(settings, device), device, settings)
    if settings.optimizer == "adamw_compiled":
        run.update = in_mode(settings)(run.clip_and_step)
    return run


# The function that takes each step of STEPS after the constructor's, as `apply` calls them (rng_replay aside).
STEP_FUNCTIONS: dict[str, Callable[..., object]] = {
    "placement": place, "matmul_flags": set_tf32, "float8": to_float8, "checkpointing": checkpoint_blocks,
    "parallel": parallelize, "loss_head": loss_head, "optimizer": make_optimizer, "autocast": make_scaler}
if tuple(STEP_FUNCTIONS) != STEPS[1:]:  # a bug in this module, found on import
    raise ValueError(f"STEP_FUNCTIONS {tuple(STEP_FUNCTIONS)} must name the steps of STEPS after the first: {STEPS[1:]}")
