"""One training run under given settings, timed by the harness.

The train stage and every variant stage call `train_once`; a variant's
repeats call it again with a fresh model and the same seed, so runs differ
only in their settings.
"""

import gc
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from benchlab import harness
from benchlab.config import Params, RunSettings
from benchlab.data import BatchStream, TokenData, check_fits, eval_batches
from benchlab.optimize import Applied, apply
from model.gpt import GPT, GPTConfig


class Diverged(Exception):
    """The loss became NaN or Inf."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss became {loss} at step {step}")
        self.step, self.loss = step, loss


@dataclass
class RunRecord:
    """What one run measured. Timing fields cover the steps after `warmup_steps`."""

    status: str  # ok | diverged | oom
    message: str = ""
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)  # every step, warm-up included
    warmup_steps: int = 0
    warmup_s: float | None = None  # wall time of the warm-up steps (compilation included)
    first_step_ms: float | None = None
    memory: dict = field(default_factory=dict)
    mem_growth_mb: float | None = None  # memory held after the last timed step minus after the first
    skipped_steps: int | None = None  # fp16: steps the GradScaler skipped for overflow
    diverged_step: int | None = None
    val_loss: float | None = None
    applied: Applied | None = None  # the trained model, for the train stage to save

    @property
    def timed_ms(self) -> list[float]:
        return self.step_ms[self.warmup_steps :]


def lr_at(step: int, total: int, p: Params) -> float:
    """Linear warm-up to train.lr, then cosine decay to train.min_lr at the last step."""
    warm = min(p.train.lr_warmup_steps, total - 1)
    if step < warm:
        return p.train.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - 1 - warm)
    return p.train.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (p.train.lr - p.train.min_lr)


def build(p: Params, settings: RunSettings, data: TokenData, device: torch.device) -> Applied:
    """The same initial weights on every device: seeded init on CPU, then moved."""
    torch.manual_seed(p.seed)
    model = GPT(p.model_config(settings, data.vocab_size))
    return apply(model, settings, device, p.train)


def model_shape(p: Params, settings: RunSettings, data_vocab: int) -> tuple[GPTConfig, int]:
    """The model's config and non-embedding parameter count, without allocating weights."""
    cfg = p.model_config(settings, data_vocab)
    with torch.device("meta"):
        return cfg, GPT(cfg).num_params()


def train_step(a: Applied, x: torch.Tensor, y: torch.Tensor, grad_clip: float) -> torch.Tensor:
    with a.autocast():
        _, loss = a.forward(x, y)
    if a.scaler is not None:
        a.scaler.scale(loss).backward()
        a.scaler.unscale_(a.optimizer)
    else:
        loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(a.model.parameters(), grad_clip)
    if a.scaler is not None:
        a.scaler.step(a.optimizer)
        a.scaler.update()
    else:
        a.optimizer.step()
    a.optimizer.zero_grad(set_to_none=True)
    return loss.detach()


class LossReader:
    """Reads each step's loss one step late, so the host never stalls the GPU queue.

    On CUDA the loss is copied into pinned host memory behind an event; waiting
    on that event waits for that step only, not for the step queued after it
    (a plain `.item()` would, being stream-ordered). A NaN or Inf still stops
    the run one step after it appears.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: tuple[int, torch.Tensor, torch.cuda.Event | None] | None = None
        self.values: list[float] = []

    def push(self, step: int, loss: torch.Tensor) -> None:
        """Queue this step's loss, then read the previous one."""
        if self.cuda:
            host = torch.empty((), dtype=loss.dtype, pin_memory=True)
            host.copy_(loss, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            entry = (step, host, event)
        else:
            entry = (step, loss, None)
        self.flush()
        self.pending = entry

    def flush(self) -> None:
        if self.pending is None:
            return
        step, value, event = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        self.values.append(float(value.item()))
        if not math.isfinite(self.values[-1]):
            raise Diverged(step, self.values[-1])


def _loop(a: Applied, p: Params, data: TokenData, steps: int, warmup: int, rec: RunRecord, progress: bool) -> None:
    device = a.device
    stream = BatchStream(data.train, p.train.batch_size, p.train.block_size, p.seed)
    clock = harness.StepClock(device)
    reader = LossReader(device)
    rec.losses = reader.values
    scales: list[torch.Tensor] = []
    held: list[float] = []
    t_start = time.perf_counter()
    for step in tqdm(range(steps), desc="train", unit="step", disable=not progress, mininterval=2.0):
        if step == warmup:
            harness.reset_peaks(device)  # synchronizes: the warm-up is finished
            rec.warmup_s = time.perf_counter() - t_start
        lr = lr_at(step, steps, p)
        for group in a.optimizer.param_groups:
            group["lr"] = lr
        x, y = stream.next()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        clock.start()
        loss = train_step(a, x, y, p.train.grad_clip)
        clock.stop()
        if a.scaler is not None:
            scales.append(a.scaler._scale.detach().clone())  # type: ignore[union-attr]  # no public async read
        reader.push(step, loss)
        rec.lrs.append(lr)
        if step >= warmup:
            held.append(harness.current_mb(device))
    reader.flush()
    rec.step_ms = clock.times_ms()
    rec.first_step_ms = rec.step_ms[0]
    rec.memory = harness.peaks(device)
    rec.mem_growth_mb = held[-1] - held[0] if held else None
    if scales:
        s = torch.stack(scales).float().cpu().numpy()
        rec.skipped_steps = int((s[1:] < s[:-1]).sum() + (s[0] < 65536.0))  # a drop marks a skipped step


@torch.no_grad()
def evaluate(model: torch.nn.Module, p: Params, data: TokenData, device: torch.device,
             autocast: AbstractContextManager | None = None) -> float:
    """Mean cross-entropy over the fixed validation batches (in the given autocast, if any)."""
    model.eval()
    losses = []
    for x, y in eval_batches(data.val, p.eval.batches, p.train.batch_size, p.train.block_size):
        with autocast or nullcontext():
            _, loss = model(x.to(device), y.to(device))
        losses.append(loss.float().item())
    model.train()
    return float(np.mean(losses))


def train_once(p: Params, settings: RunSettings, data: TokenData, device: torch.device,
               steps: int, warmup: int, keep_model: bool = False, progress: bool = False) -> RunRecord:
    """Build, train and evaluate one fresh model; OOM and divergence become a status, not a crash."""
    rec = RunRecord(status="ok", warmup_steps=warmup)
    check_fits(data.train, p.train.block_size, "train")  # before building a model that could not train
    check_fits(data.val, p.train.block_size, "validation")
    a: Applied | None = None
    try:
        a = build(p, settings, data, device)
        _loop(a, p, data, steps, warmup, rec, progress)
        rec.val_loss = evaluate(a.model, p, data, device, a.autocast())
        if keep_model:
            rec.applied = a
    except Diverged as err:
        rec.status, rec.message, rec.diverged_step = "diverged", str(err), err.step
    except torch.OutOfMemoryError as err:
        rec.status = "oom"
        rec.message = f"out of memory at train.batch_size={p.train.batch_size}: {str(err).splitlines()[0]}"
    finally:
        if not keep_model:
            del a
            release(device)
    return rec


def release(device: torch.device) -> None:
    """Free what a finished run held so the next run starts from an empty device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
