"""The knob table: the fields of `RunSettings`, each with its choices, what it does, where
`benchlab.run.apply_knobs.apply` applies it, and its check of the device (`benchlab.core.skips`); then the rules
that refuse impossible combinations. A row is declared with `benchlab.core.knob_row.knob`.

A skip (`unsupported_reason`) is for "this machine cannot": a CPU, a GPU without bf16, a missing library. A rule
that holds on every machine is checked when params.yaml loads (`check_combination`), naming the key and the fix.
The knobs the train stage reads from params.yaml's top level are `TOP_LEVEL_KNOBS`; the others are refused there
(`top_level_refusal`). This module imports neither torch nor the model, so a stage that only reads params does not
depend on them.
"""

from dataclasses import Field, dataclass, fields
from typing import Any, Literal

from benchlab.core import skips
from benchlab.core.attention_kernels import Attention, attention_doc
from benchlab.core.errors import check, shown
from benchlab.core.knob_row import Group, knob
from benchlab.core.loss_heads import LossKind, check_loss_head, loss_doc
from benchlab.core.skips import DeviceFacts

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
CompileScope = Literal["model", "blocks"]
# The compile modes that capture CUDA graphs: their memory pools escape the allocator's peak, and each step must
# tell the graphs a new iteration began.
CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")
Checkpointing = Literal["none", "full", "selective"]
Parallel = Literal["none", "ddp", "fsdp2"]
ParamDtype = Literal["fp32", "bf16"]
WeightDtype = Literal["fp32", "bf16"]
CommHook = Literal["none", "bf16"]
Float8 = Literal["none", "blocks", "head", "all"]
Schedule = Literal["cosine", "wsd"]

# knob()'s `top_level` for the knobs of how a run is spread over processes: the train stage runs in one.
IN_A_VARIANT = "set it in a variant (the train stage runs in one process; a variant's bench stage runs under torchrun)"


# ---- the optimizer: its choices and each one's own rules (what a device needs: benchlab.core.skips.optimizer_skip)

Optimizer = Literal["adamw", "adamw_fused", "adamw_compiled", "adamw_8bit", "adamw_bf16_sr", "muon"]


def _check_optimizer(where: str, s: "RunSettings") -> None:
    """The optimizer's own rules, and those of fused_clip (a modifier of adamw_fused), on every device."""
    if s.optimizer == "adamw_compiled":
        check(s.compile, f"{where}compile", s.compile,
              "true with optimizer=adamw_compiled, which compiles the update in compile's mode "
              "(or set optimizer=adamw)")
        check(s.precision != "fp16", f"{where}precision", s.precision,
              "fp32, tf32 or bf16 with optimizer=adamw_compiled (fp16's GradScaler reads its inf checks on the "
              "host, outside the compiled update; or set optimizer=adamw)")
        check(s.parallel != "fsdp2", f"{where}parallel", s.parallel,
              "none or ddp with optimizer=adamw_compiled (the compiled update is not wired for fsdp2's sharded "
              "gradients; or set optimizer=adamw)")
    if s.optimizer == "muon":
        check(s.precision != "fp16", f"{where}precision", s.precision, "fp32, tf32 or bf16 with optimizer=muon (fp16's "
              "GradScaler steps one torch optimizer; muon is two)")
        check(s.parallel != "fsdp2", f"{where}parallel", s.parallel, "none or ddp with optimizer=muon (its "
              "Newton-Schulz step needs each whole matrix; fsdp2 holds shards)")
    check(s.optimizer != "adamw_bf16_sr" or s.weight_dtype == "bf16", f"{where}weight_dtype", s.weight_dtype,
          "bf16 with optimizer=adamw_bf16_sr (it rounds each update stochastically into bf16 weights; or set "
          "optimizer=adamw)")
    if s.fused_clip:
        check(s.optimizer == "adamw_fused", f"{where}fused_clip", s.fused_clip,
              f"false with optimizer={s.optimizer} (the clipping scale is handed to fused AdamW's kernel as its "
              "grad_scale; set optimizer=adamw_fused with it)")
        check(s.precision != "fp16", f"{where}precision", s.precision,
              "fp32, tf32 or bf16 with fused_clip=true (fp16's GradScaler sets the fused kernel's grad_scale "
              "itself; or set fused_clip=false)")
        check(s.parallel != "fsdp2", f"{where}parallel", s.parallel,
              "none or ddp with fused_clip=true (not wired for fsdp2's sharded gradients; or set fused_clip=false)")


@dataclass(frozen=True)
class RunSettings:
    """The knob table. Top-level keys of params.yaml set the train stage's; each variant sets its own.

    A variant's unset knobs keep these defaults: the unoptimized baseline.
    """

    precision: Precision = knob(
        "fp32", "fp32 (TF32 off), tf32 (fp32 with TF32 matmuls; fp32 on a CPU), fp16 (autocast + GradScaler), bf16 (autocast)",
        {"matmul_flags": "matmul flags", "autocast": "autocast and GradScaler"}, skips.precision_skip,
        group="precision")
    weight_dtype: WeightDtype = knob(
        "fp32", "the dtype the model's parameters are kept in, and so their gradients and AdamW's moments: fp32 "
        "(autocast casts each weight to bf16 for its matmul, every step); bf16 (with precision=bf16): no fp32 copy, "
        "so no casts, the residual stream in bf16, half the bytes for the optimizer and the elementwise kernels; "
        "each update is rounded to the nearest bf16 (8 significant bits), so changes below 0.2 to 0.4% of a weight "
        "(weight decay's, late small steps) are lost, unless optimizer=adamw_bf16_sr rounds them stochastically",
        {"placement": "device placement (model.to)"}, skips.weight_dtype_skip, group="precision")
    attention: Attention = knob(
        "manual", attention_doc(),
        {"constructor": "the model's constructor (the one switch the model knows)"}, group="kernels")
    activation_checkpointing: Checkpointing = knob(
        "none", "none; full: every block recomputed in backward; selective: keep matmul and attention outputs, "
        "recompute the cheap ops between them", {"checkpointing": "wraps each block"}, group="memory")
    loss: LossKind = knob(
        "standard", loss_doc(), {"loss_head": "the loss head"}, skips.loss_skip, group="loss")
    loss_chunk_tokens: int = knob(
        2048, "tokens per chunk of the chunked loss head (loss=chunked only): smaller chunks keep less of the logits "
        "and their gradient alive at once, larger ones launch fewer, larger matmuls", {"loss_head": "the loss head"},
        group="loss", searched=False)
    fp8: Float8 = knob(
        "none", "float8 matmuls (torchao, tensorwise scaling): none; blocks: every block's Linear layers; head: the "
        "tied output head only; all: both", {"float8": "swaps the Linear layers"}, skips.fp8_skip,
        group="precision")
    optimizer: Optimizer = knob(
        "adamw", "AdamW (decay on matrices only): adamw: torch's for-loop implementation; adamw_fused: torch's fused "
        "kernel; adamw_compiled: gradient clipping and torch's AdamW compiled as one update in compile_mode (with "
        "compile=true; its foreach implementation, which inductor fuses across the parameters, the learning rate "
        "held in a tensor so the schedule does not recompile it; under reduce-overhead replayed as CUDA graphs too, "
        "so the host no longer launches them one by one); adamw_8bit: torchao's AdamW8bit (block-wise quantized "
        "moments, a quarter of the memory); adamw_bf16_sr: torchao's AdamW with stochastic rounding into bf16 "
        "weights (with weight_dtype=bf16: each weight rounds up or down with odds that make the update right on "
        "average), its per-parameter step run over every parameter in one compiled call (benchlab/run/adamw_bf16_sr.py); "
        "muon: torch.optim.Muon on the blocks' matrices, its momentum warmed up from 0.85 to 0.95 over 300 steps, AdamW "
        "(for-loop) on the rest (benchlab/run/muon.py)",
        {"optimizer": "the optimizer; adamw_compiled: the training step calls the compiled update"},
        skips.optimizer_skip, group="optimizer", changes_math=("muon",))
    schedule: Schedule = knob(
        "cosine", "the learning rate after its linear warm-up (optim.lr_warmup_steps): cosine to optim.min_lr at "
        "the last step; wsd (warmup-stable-decay): optim.lr until the last cooldown_fraction of the steps, then "
        "linear to optim.min_lr", "the training step's learning rate (benchlab/run/schedule.py)",
        group="optimizer", searched=False, changes_math=True)
    cooldown_fraction: float = knob(
        0.2, "schedule=wsd: the share of the steps over which the learning rate decays", "the training step's "
        "learning rate", group="optimizer", searched=False, changes_math=True)
    fused_clip: bool = knob(
        False, "gradient clipping inside fused AdamW's kernel (with optimizer=adamw_fused): the global norm's "
        "clipping factor is handed to the kernel as its grad_scale, which divides each gradient as it reads it, so "
        "the separate pass that rescales every gradient is gone (optim.grad_clip 0: nothing to clip, no change)",
        {"optimizer": "the optimizer"}, group="optimizer")
    compile: bool = knob(
        False, "torch.compile the model and its loss",
        {"parallel": "under fsdp2: each block's forward, before fully_shard",
         "loss_head": "torch.compile around model and loss head (under fsdp2: the output layer with its loss)"},
        skips.compile_skip, group="compile")
    compile_mode: CompileMode = knob(
        "default", "torch.compile mode: default; reduce-overhead (CUDA graphs); max-autotune-no-cudagraphs "
        "(matmul templates and Triton launch configs tuned by benchmarking them); max-autotune (both)",
        {"loss_head": "torch.compile", "optimizer": "the compiled update (optimizer=adamw_compiled)"},
        skips.compile_mode_skip, group="compile")
    compile_scope: CompileScope = knob(
        "model", "what torch.compile wraps (with compile=true): model: the model and its loss as one graph; blocks: "
        "each transformer block's forward on its own, and the output layer with its loss apart (regional "
        "compilation: the blocks share one code, so they compile once whatever the depth, which cuts a cold start's "
        "compile time; the search's screening runs can use it, search.screen_compile_scope)",
        {"parallel": "blocks: each block's forward compiled", "loss_head": "blocks: the output layer and its loss "
         "compiled apart"}, group="compile", searched=False)
    batch_size: int | None = knob(
        None, "sequences per optimizer step; unset: shape.batch_size (at the top level, set shape.batch_size)",
        "the batch stream", group="batch", searched=False,
        top_level="set shape.batch_size (variants set batch_size)")
    grad_accum: int = knob(
        1, "micro-batches per optimizer step; each holds batch_size / grad_accum sequences", "the training step",
        group="batch", unoptimized=None)
    parallel: Parallel = knob(
        "none", "none: one process; ddp: DistributedDataParallel (gradients all-reduced in buckets during "
        "backward); fsdp2: torch.distributed.fsdp.fully_shard on every block and the root (parameters, "
        "gradients and optimizer state sharded over the ranks). ddp and fsdp2 run under torchrun",
        {"parallel": "wraps the model: fully_shard per block, then DDP or fully_shard around the loss head's module"},
        group="parallel", searched=False, top_level=IN_A_VARIANT)
    nproc: int = knob(
        1, "processes per node (one per GPU; gloo ranks on a CPU); batch_size stays the global batch, each rank "
        "takes batch_size / (nproc x nodes) of it", "the stage's torchrun launch; the batch stream's rank slice",
        skips.nproc_skip, group="parallel", searched=False, top_level=IN_A_VARIANT)
    ddp_bucket_mb: int = knob(25, "DDP's gradient bucket size in MiB (bucket_cap_mb): smaller buckets start "
                              "all-reducing sooner in backward, larger ones launch fewer collectives",
                              {"parallel": "DDP"}, group="parallel", searched=False, top_level=IN_A_VARIANT)
    ddp_grad_as_bucket_view: bool = knob(
        False, "DDP gradient_as_bucket_view: gradients are views into the all-reduce buckets (no copy, less memory)",
        {"parallel": "DDP"}, group="parallel", searched=False, top_level=IN_A_VARIANT)
    ddp_comm_hook: CommHook = knob(
        "none", "DDP's gradient all-reduce: none (in fp32, the gradients' dtype); bf16: torch's bf16_compress_hook "
        "(each bucket cast to bf16 for the all-reduce, half the bytes, then back to fp32)", {"parallel": "DDP"},
        skips.comm_hook_skip, group="parallel", searched=False, top_level=IN_A_VARIANT)
    fsdp_reshard_after_forward: bool = knob(
        True, "FSDP2: free each block's gathered parameters after its forward (gather again in backward); false "
              "keeps them until backward, trading memory for one all-gather per block", {"parallel": "fully_shard"},
        group="parallel", searched=False, top_level=IN_A_VARIANT)
    fsdp_param_dtype: ParamDtype = knob(
        "fp32", "FSDP2 MixedPrecisionPolicy param dtype: the dtype parameters are gathered and computed in; "
                "gradients are reduced in fp32 either way", {"parallel": "fully_shard"}, skips.param_dtype_skip,
        group="parallel", searched=False, top_level=IN_A_VARIANT)
    fsdp_blocks_per_unit: int = knob(
        1, "FSDP2: transformer blocks per fully_shard unit (one all-gather and one reduce-scatter each); 1: every "
           "block its own unit; 0: no block units, the root unit holds the whole model. Fewer units mean fewer hooks "
           "for the host to run per step and less overlap of communication with compute", {"parallel": "fully_shard"},
        group="parallel", searched=False, top_level=IN_A_VARIANT)
    nccl_max_ctas: int = knob(
        0, "the most thread blocks (CTAs, each on one SM) an NCCL collective may use: 0 leaves it to NCCL; a small "
           "limit leaves more SMs to the matmuls that run beside an overlapped all-reduce, and slows the all-reduce",
        "the process group (torch.distributed.ProcessGroupNCCL.Options, config.max_ctas)", skips.max_ctas_skip,
        group="parallel", searched=False, top_level=IN_A_VARIANT)


KNOBS: tuple[str, ...] = tuple(f.name for f in fields(RunSettings))
_FIELDS: dict[str, Field] = {f.name: f for f in fields(RunSettings)}
# The train stage's knobs, read from params.yaml's top level (knob()'s `top_level` empty), in the table's order:
# params.yaml's top-level lines and dvc.yaml's train params list exactly these (tests/unit/test_knobs.py).
TOP_LEVEL_KNOBS: tuple[str, ...] = tuple(name for name, f in _FIELDS.items() if not f.metadata["top_level"])


def top_level_refusal(name: str, value: Any) -> str:
    """The line that refuses a knob the train stage cannot honour at params.yaml's top level: the key, its value,
    and where to set it instead (knob()'s `top_level`)."""
    return f"{name}={shown(value)} at the top level is not valid; {_FIELDS[name].metadata['top_level']}"


def knobs_in_group(group: Group) -> tuple[str, ...]:
    """The knobs of one group, in the table's order."""
    return tuple(name for name, f in _FIELDS.items() if f.metadata["group"] == group)


def searched(name: str) -> bool:
    """Whether the search tries the knob's values (knob()'s `searched`)."""
    return _FIELDS[name].metadata["searched"]


def unoptimized(name: str) -> Any:
    """The value a search for speed never moves the knob back to; None where no value is slower by itself."""
    return _FIELDS[name].metadata["unoptimized"]


def changes_math(name: str, value: Any) -> bool:
    """Whether this value of a knob changes the optimization itself (knob()'s `changes_math`)."""
    declared = _FIELDS[name].metadata["changes_math"]
    return value != _FIELDS[name].default and (declared is True or value in (declared or ()))


def math_changes(settings: RunSettings) -> list[str]:
    """The knob=value settings that change the optimization, in the table's order: empty for a systems-only run."""
    return [f"{k}={getattr(settings, k)}" for k in KNOBS if changes_math(k, getattr(settings, k))]


def unsupported_reason(settings: RunSettings, device: DeviceFacts) -> str | None:
    """Why these settings cannot run on this device, or None when they can: the first knob that says so."""
    for f in fields(RunSettings):
        skip = f.metadata["skip"]
        reason = skip(getattr(settings, f.name), settings, device) if skip else None
        if reason:
            return reason
    return None


def check_combination(where: str, s: RunSettings, batch: int) -> None:
    """Knob values that are each valid but impossible together, on any device; `where` prefixes the key
    ("variants.x."), `batch` is the run's global batch size."""
    check(s.compile or s.compile_mode == "default", f"{where}compile_mode", s.compile_mode,
          "default unless compile=true (set compile=true to use another mode)")
    check(s.compile or s.compile_scope == "model", f"{where}compile_scope", s.compile_scope,
          "model unless compile=true (set compile=true to compile blocks)")
    check(s.compile_scope == "model" or s.compile_mode not in CUDA_GRAPH_MODES, f"{where}compile_scope",
          s.compile_scope, f"model with compile_mode={s.compile_mode} (CUDA graphs over blocks compiled one by one "
          "are broken in torch 2.11, pytorch/pytorch#152887; or set compile_mode=default)")
    check(s.batch_size is None or s.batch_size > 0, f"{where}batch_size", s.batch_size, "a positive integer")
    check(s.grad_accum >= 1, f"{where}grad_accum", s.grad_accum, "1 or more")
    check(batch % s.grad_accum == 0, f"{where}grad_accum", s.grad_accum, f"a divisor of the batch size {batch}")
    check(s.nproc >= 1, f"{where}nproc", s.nproc, "1 or more")
    check(s.parallel != "none" or s.nproc == 1, f"{where}nproc", s.nproc,
          "1 with parallel=none (set parallel=ddp or parallel=fsdp2 to run more processes)")
    check(batch % (s.nproc * s.grad_accum) == 0, f"{where}nproc", s.nproc,
          f"a count whose product with grad_accum={s.grad_accum} divides the global batch size {batch}")
    check(s.ddp_bucket_mb >= 1, f"{where}ddp_bucket_mb", s.ddp_bucket_mb, "1 or more (MiB)")
    check(s.parallel == "ddp" or (s.ddp_bucket_mb == 25 and not s.ddp_grad_as_bucket_view
                                  and s.ddp_comm_hook == "none"),
          f"{where}parallel", s.parallel, "ddp when ddp_bucket_mb, ddp_grad_as_bucket_view or ddp_comm_hook is set")
    check(s.fsdp_blocks_per_unit >= 0, f"{where}fsdp_blocks_per_unit", s.fsdp_blocks_per_unit,
          "0 (the whole model in the root unit) or a positive count of blocks")
    check(s.parallel == "fsdp2" or (s.fsdp_reshard_after_forward and s.fsdp_param_dtype == "fp32"
                                    and s.fsdp_blocks_per_unit == 1),
          f"{where}parallel", s.parallel,
          "fsdp2 when fsdp_reshard_after_forward, fsdp_param_dtype or fsdp_blocks_per_unit is set")
    check(s.nccl_max_ctas >= 0, f"{where}nccl_max_ctas", s.nccl_max_ctas, "0 (NCCL's choice) or a positive count")
    check(s.parallel != "none" or s.nccl_max_ctas == 0, f"{where}parallel", s.parallel,
          "ddp or fsdp2 when nccl_max_ctas is set")
    check(s.weight_dtype == "fp32" or s.precision == "bf16", f"{where}precision", s.precision,
          f"bf16 with weight_dtype={s.weight_dtype} (the matmuls run in the weights' dtype; fp16 loss scaling needs "
          "fp32 weights)")
    check(s.weight_dtype == "fp32" or s.parallel != "fsdp2", f"{where}parallel", s.parallel,
          f"none or ddp with weight_dtype={s.weight_dtype} (under fsdp2, fsdp_param_dtype=bf16 gathers bf16 copies "
          "of fp32 shards)")
    _check_optimizer(where, s)
    check(0 < s.cooldown_fraction <= 1, f"{where}cooldown_fraction", s.cooldown_fraction, "a fraction in (0, 1]")
    check(s.schedule == "wsd" or s.cooldown_fraction == RunSettings.cooldown_fraction, f"{where}schedule",
          s.schedule, "wsd when cooldown_fraction is set")
    check(s.loss_chunk_tokens >= 1, f"{where}loss_chunk_tokens", s.loss_chunk_tokens, "a positive count of tokens")
    check(s.loss == "chunked" or s.loss_chunk_tokens == RunSettings.loss_chunk_tokens, f"{where}loss", s.loss,
          "chunked when loss_chunk_tokens is set")
    check_loss_head(where, s.loss, s.fp8, s.parallel)
