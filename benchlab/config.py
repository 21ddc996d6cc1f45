"""params.yaml loaded into typed dataclasses, checked before any work.

Every section is a frozen dataclass; `load_params` refuses unknown keys, wrong
types and values outside a `Literal`, naming the key, the bad value and the
valid ones. The optimization knobs are one table, the fields of `RunSettings`:
each field carries its choices (its type), what it does, where
`benchlab.optimize.apply` applies it, and a check that says why a device
cannot run it. This module imports neither torch nor the model, so a stage
that only reads params (prepare) does not depend on them.
"""

import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from benchlab import presets
from benchlab.errors import LabError

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
Attention = Literal["manual", "sdpa"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
# The compile modes that capture CUDA graphs: their memory pools escape the allocator's peak, and each step must
# tell the graphs a new iteration began.
CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")
Checkpointing = Literal["none", "full", "selective"]
LossKind = Literal["standard", "inline", "chunked", "fused", "cce", "onepass"]
DeviceChoice = Literal["auto", "cpu", "cuda"]
LockMode = Literal["wait", "fail"]
Parallel = Literal["none", "ddp", "fsdp2"]
ParamDtype = Literal["fp32", "bf16"]
WeightDtype = Literal["fp32", "bf16", "bf16_sr"]
CommHook = Literal["none", "bf16"]
Float8 = Literal["none", "blocks", "head", "all"]
AdamState = Literal["fp32", "8bit"]

# Variant names become file names and DVC stage names; they must be plain
# identifiers. They never reach a shell: stages learn their variant from
# DVC_STAGE (see stages/bench.py), not from the command line.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class DeviceFacts:
    """What a device can run, read once from torch by `benchlab.optimize.device_facts`.

    Plain values, so every knob's check can be tested without a GPU.
    """

    kind: Literal["cpu", "cuda"]
    name: str = ""
    capability: tuple[int, int] | None = None
    bf16: bool = False  # CUDA: bf16 tensor cores
    triton: bool = False
    cxx: bool = False  # a C++ compiler for inductor on CPU
    torchao: bool = False
    liger: bool = False
    liger_version: str | None = None  # the installed liger-kernel's version (loss=onepass calls an internal kernel)
    cce: bool = False  # cut-cross-entropy installed
    gpu_count: int = 0
    cpu_count: int = 1  # cores: on a CPU, gloo ranks beyond them would only time each other's waiting


# What a skip for a missing extra tells the user to run: on a GPU the file with every GPU extra (it leaves the CUDA
# build of torch in place), on a CPU the plain install (torchao is all a CPU variant may lack).
GPU_INSTALL = "pip install -r requirements-gpu.txt"
CPU_INSTALL = "pip install -r requirements.txt"


def install_hint(d: DeviceFacts) -> str:
    """The command that installs what a variant lacks on this device."""
    return GPU_INSTALL if d.kind == "cuda" else CPU_INSTALL


# A knob's check: (its value, all settings, the device) -> why it cannot run, or None.
SkipCheck = Callable[[Any, "RunSettings", DeviceFacts], str | None]


def knob(default: Any, doc: str, applied: str, skip: SkipCheck | None = None) -> Any:
    """One row of the knob table: a dataclass field with its documentation and device check."""
    return field(default=default, metadata={"doc": doc, "applied": applied, "skip": skip})


def _precision_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """fp16: on CPU; bf16: GPUs without bf16; tf32: GPUs before Ampere. A CPU has no TF32 units: there tf32
    computes exactly as fp32 does (so it can serve as parity's reference on every device)."""
    if d.kind == "cpu":
        if value == "fp16":
            return "precision=fp16 with loss scaling needs a CUDA GPU; use bf16 or fp32 on CPU"
        return None
    major = d.capability[0] if d.capability else 0
    if value == "bf16" and not d.bf16:
        return f"precision=bf16 needs an Ampere or newer GPU; {d.name} has no bf16; use fp16"
    if value == "tf32" and major < 8:
        return f"precision=tf32 needs an Ampere or newer GPU; {d.name} is compute capability {major}.x"
    return None


def _compile_skip(value: bool, s: "RunSettings", d: DeviceFacts) -> str | None:
    """CPU without a C++ compiler; CUDA without triton."""
    if not value:
        return None
    if d.kind == "cpu" and not d.cxx:
        return "compile=true on CPU needs a C++ compiler (g++) for inductor; install one or set compile=false"
    if d.kind == "cuda" and not d.triton:
        return "compile=true on CUDA needs triton (pip install triton); or set compile=false"
    return None


def _compile_mode_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """reduce-overhead, max-autotune-no-cudagraphs, max-autotune: on CPU."""
    if value != "default" and d.kind == "cpu":
        return f"compile_mode={value} tunes or graphs CUDA kernels; on CPU use compile_mode=default"
    return None


def _compile_update_skip(value: bool, s: "RunSettings", d: DeviceFacts) -> str | None:
    """without compile (whose mode it takes); beside fused AdamW, torchao's optimizers or fp16's GradScaler; fsdp2."""
    if not value:
        return None
    if not s.compile:
        return "compile_update=true compiles the update in compile's mode; set compile=true with it"
    if s.precision == "fp16":
        return ("compile_update=true is not wired for precision=fp16 (the GradScaler reads its inf checks on the "
                "host); set compile_update=false or precision=bf16")
    if s.adam_state != "fp32" or s.weight_dtype == "bf16_sr":
        return ("compile_update=true compiles torch's AdamW; adam_state=8bit and weight_dtype=bf16_sr are torchao's, "
                "with steps compiled their own way; set compile_update=false with them")
    if s.fused_adamw:
        return ("compile_update=true compiles AdamW's foreach implementation, which torch.compile traces whole (fused "
                "AdamW's kernel it leaves outside the graph); set fused_adamw=false with it")
    if s.parallel == "fsdp2":
        return "compile_update=true is not wired for fsdp2's sharded gradients; set compile_update=false or parallel=ddp"
    return None


def _fp8_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """CPU; GPUs before compute capability 8.9; without torchao."""
    if value == "none":
        return None
    if d.kind == "cpu":
        return (f"fp8={value} needs a GPU with float8 tensor cores (Ada or Hopper, compute capability 8.9+); "
                "not on CPU")
    if (d.capability or (0, 0)) < (8, 9):
        return f"fp8={value} needs compute capability 8.9 or newer; {d.name} is {d.capability}"
    if not d.torchao:
        return f"fp8={value} needs torchao ({GPU_INSTALL}); or set fp8=none"
    return None


def _adam_state_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """8bit: on CPU, without torchao, and beside fused_adamw (two optimizers asked for)."""
    if value == "fp32":
        return None
    if s.fused_adamw:
        return "adam_state=8bit is torchao's AdamW8bit, its own compiled step; set fused_adamw=false with it"
    if d.kind == "cpu":
        return "adam_state=8bit (torchao's AdamW8bit) is timed on CUDA GPUs only; use adam_state=fp32 on CPU"
    if not d.torchao:
        return f"adam_state=8bit needs torchao ({GPU_INSTALL}); or set adam_state=fp32"
    return None


def _fused_clip_skip(value: bool, s: "RunSettings", d: DeviceFacts) -> str | None:
    """without fused_adamw; with fp16 (the GradScaler hands the kernel its own scale); under fsdp2 (sharded norms)."""
    if not value:
        return None
    if not s.fused_adamw:
        return "fused_clip=true hands the clipping scale to fused AdamW's kernel; set fused_adamw=true with it"
    if s.precision == "fp16":
        return "fused_clip=true and precision=fp16 both need the fused kernel's grad_scale (the GradScaler's); set fused_clip=false"
    if s.parallel == "fsdp2":
        return "fused_clip=true is not wired for fsdp2's sharded gradients; set fused_clip=false or parallel=ddp"
    return None


def _loss_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """fused, cce: on CPU, and without their library; onepass: on CUDA without liger-kernel, or with another
    version of it than the one its internal kernel call was written for (its CPU path is torch's)."""
    if value == "onepass":
        return _onepass_liger_skip(d) if d.kind == "cuda" else None
    library = {"fused": ("liger-kernel", d.liger), "cce": ("cut-cross-entropy", d.cce)}.get(value)
    if library is None:
        return None
    name, installed = library
    if d.kind == "cpu":
        return f"loss={value} is a Triton kernel ({name}) that needs a CUDA GPU; use loss=chunked on CPU"
    if not installed:
        return f"loss={value} needs {name} ({GPU_INSTALL}); or use loss=chunked"
    return None


# The liger-kernel release benchlab/onepass.py was written against: it calls an internal kernel of it by keyword,
# whose arguments change between releases. Declared here, with the skip rule that reads it, and imported by
# onepass.py: this module may not import onepass (torch and the model would become every stage's dependencies).
# requirements-gpu.txt pins the same release (tests/test_requirements.py holds them equal).
ONEPASS_LIGER_VERSION = "0.8.5"


def _onepass_liger_skip(d: DeviceFacts) -> str | None:
    """Why loss=onepass cannot call liger-kernel's kernel on this CUDA device: not installed, or not the release
    whose internal kernel signature benchlab/onepass.py calls (another one may take other arguments)."""
    wanted = ONEPASS_LIGER_VERSION
    if not d.liger:
        return (f"loss=onepass runs liger-kernel {wanted}'s cross-entropy kernel on CUDA, and liger-kernel is "
                f"not installed ({GPU_INSTALL}); or use loss=inline")
    if d.liger_version != wanted:
        installed = d.liger_version or "of unknown version"
        return (f"loss=onepass calls liger-kernel {wanted}'s internal cross-entropy kernel; liger-kernel {installed} "
                f"is installed ({GPU_INSTALL}); or use loss=inline")
    return None


def _comm_hook_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """bf16: on CPU (torch's bf16_compress_hook refuses gloo)."""
    if value == "bf16" and d.kind == "cpu":
        return "ddp_comm_hook=bf16 is torch's bf16_compress_hook, which needs NCCL on CUDA GPUs; on CPU use ddp_comm_hook=none"
    return None


def _max_ctas_skip(value: int, s: "RunSettings", d: DeviceFacts) -> str | None:
    """any limit on CPU (gloo has no thread blocks to limit)."""
    if value and d.kind == "cpu":
        return f"nccl_max_ctas={value} limits NCCL's thread blocks, which needs NCCL on CUDA GPUs; on CPU use nccl_max_ctas=0"
    return None


def _nproc_skip(value: int, s: "RunSettings", d: DeviceFacts) -> str | None:
    """more processes than GPUs (CUDA) or cores (CPU)."""
    if value == 1:  # one process runs wherever the device does
        return None
    if d.kind == "cuda" and value > d.gpu_count:
        return f"nproc={value} asks for {value} GPUs per node; this machine has {d.gpu_count}"
    if d.kind == "cpu" and value > d.cpu_count:
        return f"nproc={value} gloo processes on a CPU of {d.cpu_count} cores would time each other's waiting"
    return None


def _weight_dtype_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """bf16, bf16_sr: GPUs without bf16; bf16_sr: without torchao, beside fused_adamw or adam_state=8bit (two
    optimizers asked for), on CPU without a C++ compiler (its step is compiled)."""
    if value == "fp32":
        return None
    if d.kind == "cuda" and not d.bf16:
        return f"weight_dtype={value} needs an Ampere or newer GPU; {d.name} has no bf16; use weight_dtype=fp32"
    if value != "bf16_sr":
        return None
    if s.fused_adamw or s.adam_state != "fp32":
        return ("weight_dtype=bf16_sr is torchao's AdamW with stochastic rounding, its own compiled step; set "
                "fused_adamw=false and adam_state=fp32 with it")
    if not d.torchao:
        return f"weight_dtype=bf16_sr needs torchao ({install_hint(d)}); or set weight_dtype=bf16"
    if d.kind == "cpu" and not d.cxx:
        return "weight_dtype=bf16_sr compiles torchao's optimizer step, which on CPU needs a C++ compiler (g++)"
    return None


def _param_dtype_skip(value: str, s: "RunSettings", d: DeviceFacts) -> str | None:
    """bf16: GPUs without bf16."""
    if value == "bf16" and d.kind == "cuda" and not d.bf16:
        return f"fsdp_param_dtype=bf16 needs an Ampere or newer GPU; {d.name} has no bf16"
    return None


@dataclass(frozen=True)
class RunSettings:
    """The knob table. Top-level keys of params.yaml set the train stage's; each variant sets its own.

    A variant's unset knobs keep these defaults: the unoptimized baseline.
    """

    precision: Precision = knob(
        "fp32", "fp32 (TF32 off), tf32 (fp32 with TF32 matmuls; fp32 on a CPU), fp16 (autocast + GradScaler), bf16 (autocast)",
        "2. matmul flags; 7. autocast and GradScaler", _precision_skip)
    weight_dtype: WeightDtype = knob(
        "fp32", "the dtype the model's parameters are kept in, and so their gradients and AdamW's moments: fp32 "
        "(autocast casts each weight to bf16 for its matmul, every step); bf16 (with precision=bf16): no fp32 copy, "
        "so no casts, the residual stream in bf16, half the bytes for the optimizer and the elementwise kernels; "
        "each update is rounded to the nearest bf16 (8 significant bits), so changes below 0.2 to 0.4% of a weight "
        "(weight decay's, late small steps) are lost; bf16_sr: the same, stepped by torchao's AdamW with "
        "stochastic rounding (each weight rounds up or down with odds that make the update right on average), its "
        "per-parameter step run over every parameter in one compiled call (benchlab/sr_adamw.py)",
        "1. device placement (model.to); 6. the optimizer (bf16_sr)", _weight_dtype_skip)
    attention: Attention = knob(
        "manual", "manual: explicit causal-masked softmax; sdpa: torch's scaled_dot_product_attention",
        "0. the model's constructor (the one switch the model knows)")
    activation_checkpointing: Checkpointing = knob(
        "none", "none; full: every block recomputed in backward; selective: keep matmul and attention outputs, "
        "recompute the cheap ops between them", "4. wraps each block")
    loss: LossKind = knob(
        "standard", "standard: logits then cross-entropy, as the public recipe (logits returned); inline: the same "
        "logits and cross-entropy, but only the loss leaves the compiled region; chunked: after the compiled body, "
        "the output layer and cross-entropy over chunks of tokens, each chunk's gradients made in forward so only "
        "one chunk's logits live; fused: liger-kernel's fused linear + cross-entropy, after the "
        "compiled body; cce: cut-cross-entropy's kernel there instead (logits never stored, no gradient filtering); "
        "onepass: inside the compiled graph, one op makes the logits, then liger-kernel's cross-entropy kernel writes "
        "the loss and the logits' gradient in one pass over them and the gradient products follow in forward (on CPU "
        "the same arithmetic in torch)",
        "5. the loss head",
        _loss_skip)
    loss_chunk_tokens: int = knob(
        2048, "tokens per chunk of the chunked loss head (loss=chunked only): smaller chunks keep less of the logits "
        "and their gradient alive at once, larger ones launch fewer, larger matmuls", "5. the loss head")
    fp8: Float8 = knob(
        "none", "float8 matmuls (torchao, tensorwise scaling): none; blocks: every block's Linear layers; head: the "
        "tied output head only; all: both", "3. swaps the Linear layers", _fp8_skip)
    fused_adamw: bool = knob(False, "AdamW's fused kernel instead of the for-loop implementation", "6. the optimizer")
    fused_clip: bool = knob(
        False, "gradient clipping inside fused AdamW's kernel: the global norm's clipping factor is handed to the "
        "kernel as its grad_scale, which divides each gradient as it reads it, so the separate pass that rescales "
        "every gradient is gone (train.grad_clip 0: nothing to clip, no change)", "6. the optimizer",
        _fused_clip_skip)
    adam_state: AdamState = knob(
        "fp32", "AdamW's two moments: fp32; 8bit: torchao's AdamW8bit (block-wise quantized moments, a quarter "
        "of the memory)", "6. the optimizer", _adam_state_skip)
    compile: bool = knob(False, "torch.compile the model and its loss",
                         "5. torch.compile around model and loss head (under fsdp2: each block's forward, before "
                         "fully_shard, and the output layer with its loss)", _compile_skip)
    compile_mode: CompileMode = knob(
        "default", "torch.compile mode: default; reduce-overhead (CUDA graphs); max-autotune-no-cudagraphs "
        "(matmul templates and Triton launch configs tuned by benchmarking them); max-autotune (both)",
        "5. torch.compile", _compile_mode_skip)
    compile_update: bool = knob(
        False, "torch.compile the optimizer update as well, in compile_mode: gradient clipping and torch's AdamW "
        "(its foreach implementation, which inductor fuses across the parameters; the learning rate held in a "
        "tensor so the schedule does not recompile it); under reduce-overhead they are replayed as CUDA graphs too, "
        "so the host no longer launches them one by one",
        "6. the optimizer; the training step calls the compiled update", _compile_update_skip)
    batch_size: int | None = knob(
        None, "sequences per optimizer step; unset: train.batch_size (at the top level, set train.batch_size)",
        "the batch stream")
    grad_accum: int = knob(
        1, "micro-batches per optimizer step; each holds batch_size / grad_accum sequences", "the training step")
    parallel: Parallel = knob(
        "none", "none: one process; ddp: DistributedDataParallel (gradients all-reduced in buckets during "
        "backward); fsdp2: torch.distributed.fsdp.fully_shard on every block and the root (parameters, "
        "gradients and optimizer state sharded over the ranks). ddp and fsdp2 run under torchrun",
        "5. wraps the model: fully_shard per block, then DDP or fully_shard around the loss head's module")
    nproc: int = knob(
        1, "processes per node (one per GPU; gloo ranks on a CPU); batch_size stays the global batch, each rank "
        "takes batch_size / (nproc x nodes) of it", "the stage's torchrun launch; the batch stream's rank slice",
        _nproc_skip)
    ddp_bucket_mb: int = knob(25, "DDP's gradient bucket size in MiB (bucket_cap_mb): smaller buckets start "
                              "all-reducing sooner in backward, larger ones launch fewer collectives", "5. DDP")
    ddp_grad_as_bucket_view: bool = knob(
        False, "DDP gradient_as_bucket_view: gradients are views into the all-reduce buckets (no copy, less memory)",
        "5. DDP")
    ddp_comm_hook: CommHook = knob(
        "none", "DDP's gradient all-reduce: none (in fp32, the gradients' dtype); bf16: torch's bf16_compress_hook "
        "(each bucket cast to bf16 for the all-reduce, half the bytes, then back to fp32)", "5. DDP",
        _comm_hook_skip)
    fsdp_reshard_after_forward: bool = knob(
        True, "FSDP2: free each block's gathered parameters after its forward (gather again in backward); false "
              "keeps them until backward, trading memory for one all-gather per block", "5. fully_shard")
    fsdp_param_dtype: ParamDtype = knob(
        "fp32", "FSDP2 MixedPrecisionPolicy param dtype: the dtype parameters are gathered and computed in; "
                "gradients are reduced in fp32 either way", "5. fully_shard", _param_dtype_skip)
    fsdp_blocks_per_unit: int = knob(
        1, "FSDP2: transformer blocks per fully_shard unit (one all-gather and one reduce-scatter each); 1: every "
           "block its own unit; 0: no block units, the root unit holds the whole model. Fewer units mean fewer hooks "
           "for the host to run per step and less overlap of communication with compute", "5. fully_shard")
    nccl_max_ctas: int = knob(
        0, "the most thread blocks (CTAs, each on one SM) an NCCL collective may use: 0 leaves it to NCCL; a small "
           "limit leaves more SMs to the matmuls that run beside an overlapped all-reduce, and slows the all-reduce",
        "the process group (torch.distributed.ProcessGroupNCCL.Options, config.max_ctas)", _max_ctas_skip)



KNOBS: tuple[str, ...] = tuple(f.name for f in fields(RunSettings))


def unsupported_reason(settings: RunSettings, device: DeviceFacts) -> str | None:
    """Why these settings cannot run on this device, or None when they can: the first knob that says so."""
    for f in fields(RunSettings):
        skip = f.metadata["skip"]
        reason = skip(getattr(settings, f.name), settings, device) if skip else None
        if reason:
            return reason
    return None


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
class Params:
    """The whole of params.yaml. The knobs of `run` are written as top-level keys."""

    seed: int = 1337
    """Seeds the initial weights and the batch order of every run."""
    device: DeviceChoice = "auto"
    """auto: CUDA when torch sees a GPU, else the CPU."""
    model: str = "tiny"
    """A preset of model/gpt.py: tiny, gpt_small, gpt2_124m, gpt2_350m (checked by benchlab.build)."""
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
        parity = [("parity.reference", self.parity.reference)] if self.parity.variants else []
        for key, name in [*parity, *(("parity.variants", n) for n in self.parity.variants)]:
            _check(name in self.variants, key, name, ", ".join(self.variants) or "(no variants)")
            _check(self.variants[name].parallel == "none", key, name,
                   "a one-process variant (parity trains in one process; run a parallel variant's one-process counterpart)")
        for where, settings in [("", self.run), *((f"variants.{n}.", s) for n, s in self.variants.items())]:
            _check_combination(where, settings, self.batch_size(settings))

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
        raise LabError(f"variant {name!r} is not in params.yaml; valid: {', '.join(p.variants)}")
    return name


def _check_combination(where: str, s: RunSettings, batch: int) -> None:
    """Knob values that are each valid but impossible together; `where` prefixes the key ("variants.x.")."""
    _check(s.compile or s.compile_mode == "default", f"{where}compile_mode", s.compile_mode,
           "default unless compile=true (set compile=true to use another mode)")
    _check(s.batch_size is None or s.batch_size > 0, f"{where}batch_size", s.batch_size, "a positive integer")
    _check(s.grad_accum >= 1, f"{where}grad_accum", s.grad_accum, "1 or more")
    _check(batch % s.grad_accum == 0, f"{where}grad_accum", s.grad_accum, f"a divisor of the batch size {batch}")
    _check(s.nproc >= 1, f"{where}nproc", s.nproc, "1 or more")
    _check(s.parallel != "none" or s.nproc == 1, f"{where}nproc", s.nproc,
           "1 with parallel=none (set parallel=ddp or parallel=fsdp2 to run more processes)")
    _check(batch % (s.nproc * s.grad_accum) == 0, f"{where}nproc", s.nproc,
           f"a count whose product with grad_accum={s.grad_accum} divides the global batch size {batch}")
    _check(s.ddp_bucket_mb >= 1, f"{where}ddp_bucket_mb", s.ddp_bucket_mb, "1 or more (MiB)")
    _check(s.parallel == "ddp" or (s.ddp_bucket_mb == 25 and not s.ddp_grad_as_bucket_view
                                   and s.ddp_comm_hook == "none"),
           f"{where}parallel", s.parallel, "ddp when ddp_bucket_mb, ddp_grad_as_bucket_view or ddp_comm_hook is set")
    _check(s.fsdp_blocks_per_unit >= 0, f"{where}fsdp_blocks_per_unit", s.fsdp_blocks_per_unit,
           "0 (the whole model in the root unit) or a positive count of blocks")
    _check(s.parallel == "fsdp2" or (s.fsdp_reshard_after_forward and s.fsdp_param_dtype == "fp32"
                                     and s.fsdp_blocks_per_unit == 1),
           f"{where}parallel", s.parallel,
           "fsdp2 when fsdp_reshard_after_forward, fsdp_param_dtype or fsdp_blocks_per_unit is set")
    _check(s.nccl_max_ctas >= 0, f"{where}nccl_max_ctas", s.nccl_max_ctas, "0 (NCCL's choice) or a positive count")
    _check(s.parallel != "none" or s.nccl_max_ctas == 0, f"{where}parallel", s.parallel,
           "ddp or fsdp2 when nccl_max_ctas is set")
    _check(s.weight_dtype == "fp32" or s.precision == "bf16", f"{where}precision", s.precision,
           f"bf16 with weight_dtype={s.weight_dtype} (the matmuls run in the weights' dtype; fp16 loss scaling needs "
           "fp32 weights)")
    _check(s.weight_dtype == "fp32" or s.parallel != "fsdp2", f"{where}parallel", s.parallel,
           f"none or ddp with weight_dtype={s.weight_dtype} (under fsdp2, fsdp_param_dtype=bf16 gathers bf16 copies "
           "of fp32 shards)")
    _check(s.loss_chunk_tokens >= 1, f"{where}loss_chunk_tokens", s.loss_chunk_tokens, "a positive count of tokens")
    _check(s.loss == "chunked" or s.loss_chunk_tokens == RunSettings.loss_chunk_tokens, f"{where}loss", s.loss,
           "chunked when loss_chunk_tokens is set")
    _check(s.fp8 not in ("head", "all") or s.loss in ("standard", "inline"), f"{where}loss", s.loss,
           f"standard or inline with fp8={s.fp8} (the chunked, fused, cce and onepass heads multiply by the output weight "
           "themselves, so the float8 output layer would be bypassed; or set fp8=blocks)")
    _check(s.parallel != "fsdp2" or s.loss not in ("fused", "onepass"), f"{where}loss", s.loss,
           f"standard or chunked with parallel=fsdp2 (the {s.loss} head reads the output weight outside the sharded "
           "module)")


def _check(ok: bool, key: str, value: object, valid: str) -> None:
    if not ok:
        raise LabError(f"{key}={value!r} is not valid; expected {valid}")


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


def parse_params(data: Any) -> Params:
    """Params from params.yaml's mapping, with the chosen preset's values in place (benchlab.presets).

    params.yaml's own values are checked, then each preset's as they would be used, so a bad value in any
    preset is named (`presets.<name>: ...`) before any work, whichever preset is chosen.
    """
    if not isinstance(data, dict):
        raise LabError(f"params.yaml must be a mapping, got {data!r}")
    name, resolved, _ = presets.resolve(data)
    base = {k: v for k, v in data.items() if k not in ("preset", "presets")}
    chosen = _parse_resolved(base, "cpu")
    for other, values in (data.get("presets") or {}).items():
        try:
            parsed = _parse_resolved(presets.merged(base, values or {}), str(other))
        except LabError as err:
            raise LabError(f"presets.{other}: {err}") from None
        if other == name:
            chosen = parsed
    return chosen


def _parse_resolved(data: dict, preset: str) -> Params:
    """Params from a mapping with no preset keys left: the knobs at the top level are gathered into `run`."""
    if "run" in data:
        raise LabError(f"unknown key 'run'; set the train stage's knobs at the top level: {', '.join(KNOBS)}")
    if "batch_size" in data:
        raise LabError("batch_size=... at the top level is not valid; set train.batch_size (variants set batch_size)")
    knobs = {k: v for k, v in data.items() if k in KNOBS}
    rest = {k: v for k, v in data.items() if k not in KNOBS}
    sections = {f.name for f in fields(Params)} - {"run", "preset"}
    for key in rest:
        if key not in sections:
            valid = ", ".join(sorted(sections | {"preset", "presets"} | set(KNOBS) - {"batch_size"}))
            raise LabError(f"unknown key {key!r}; valid keys: {valid}")
    hints = get_type_hints(Params)
    kwargs = {k: _convert(v, hints[k], k) for k, v in rest.items()}
    return Params(run=parse(RunSettings, knobs), preset=preset, **kwargs)


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
    return parse_params(data)
