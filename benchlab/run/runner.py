"""One training run under given settings, timed by the harness.

The train stage, every variant stage and the profile stage call `train_once`
(the profiler through its `on_step` hook), so they share one training step
(benchlab/run/step.py), one learning-rate schedule and one way of feeding
batches. Which process a run happens in (this one, a fresh one per repeat,
torchrun's ranks) is benchlab/run/launch.py's business.

Under torchrun every rank draws the same global batch (the same seed) and
trains on its slice of it (`rank_slice`), so the ranks together see exactly
the batch one process would.
"""

import gc
import json
import math
import re
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from tqdm import tqdm

from benchlab.core import parent_watch
from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings
from benchlab.core.params import Params
from benchlab.core.record import Memory
from benchlab.run import dist, harness, power
from benchlab.run.apply_knobs import TrainingRun, apply
from benchlab.run.build_model import fresh_model
from benchlab.run.data import BatchStream, TokenData, check_fits, eval_batches
from benchlab.run.optimizers import set_lr
from benchlab.run.schedule import lr_at
from benchlab.run.step import Diverged, LossReader, rank_slice, skipped_steps, to_device, train_step


@dataclass
class Measurement:
    """What one run measured, before `benchlab.run.records` makes it a record (with its repeats). Timing fields cover
    the steps after `warmup_steps`."""

    status: str  # ok | diverged | oom | error
    message: str = ""
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)  # every step, warm-up included (device time on CUDA)
    warmup_steps: int = 0
    setup_s: float | None = None  # wall time before the first step: building the model (a repeat: from process start)
    startup_s: float | None = None  # a repeat: the part of setup_s before the run began (interpreter, imports, CUDA)
    init_s: float | None = None  # the part of setup_s that built the model and drew its seeded weights on the CPU
    apply_s: float | None = None  # the part of setup_s that applied the knobs (device, float8, wrappers, optimizer)
    warmup_s: float | None = None  # wall time of the warm-up steps (compilation included)
    eval_s: float | None = None  # wall time of the validation loss
    exit_s: float | None = None  # a repeat: from its record's writing to its process's end, as the parent saw it
    first_step_ms: float | None = None
    window_wall_ms: float | None = None  # wall clock over the timed steps, host work between steps included
    # Host wall time from each timed step's end to the next one's start (its batch, the loss read; an evaluation
    # between them left out): where a stop between two steps shows, which no step's time holds.
    gap_ms: list[float] | None = None
    memory: dict = field(default_factory=dict)  # benchlab.run.harness.peaks: the keys `peaks` reads
    mem_growth_mb: float | None = None  # memory held after the last timed step minus after the first
    skipped_steps: int | None = None  # fp16: steps the GradScaler skipped for overflow
    diverged_step: int | None = None
    val_loss: float | None = None
    # inductor's FX graph cache during the run: graphs loaded from it, and graphs compiled (None: not counted)
    compile_hits: int | None = None
    compile_misses: int | None = None
    # [steps done, validation loss, seconds it took] at each of train_once's `eval_steps`, off the step clock
    val_curve: list[list[float]] = field(default_factory=list)
    neighbours: dict = field(default_factory=dict)  # what else used the machine while we timed
    world_size: int = 1  # ranks that trained together; the figures above are combined over them
    rank_peak_mb: list[float] = field(default_factory=list)  # each rank's peak memory (allocated on CUDA, else RSS)
    # The GPU board's mean power and energy over the timed window (summed over ranks), or None where the driver
    # reports none; power_note then says why (benchlab/run/power.py).
    power_w: float | None = None
    energy_j: float | None = None
    power_note: str = ""
    run: TrainingRun | None = None  # the trained model, for the train stage to save; never serialized

    @property
    def timed_ms(self) -> list[float]:
        return self.step_ms[self.warmup_steps :]

    @property
    def peaks(self) -> Memory:
        """The memory peaks, typed: `peaks.compared()` is the figure this run is compared by."""
        return Memory.of(self.memory)

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self) if f.name != "run"})

    @classmethod
    def from_json(cls, text: str) -> "Measurement":
        return cls(**json.loads(text))


def _loop(run: TrainingRun, p: Params, data: TokenData, steps: int, warmup: int, rec: Measurement,
          progress: str | None, on_step: Callable[[], None] | None, data_seed: int,
          meter: power.EnergyMeter, eval_steps: frozenset[int] = frozenset()) -> None:
    device = run.device
    settings = run.settings
    stream = BatchStream(data.train, p.batch_size(settings), p.shape.block_size, data_seed)
    rank, world = (dist.rank(), dist.world_size()) if dist.active() else (0, 1)
    clock = harness.StepClock(device)
    reader = LossReader(device)
    neighbours = harness.Neighbours(device)
    rec.losses = reader.values
    scales: list[torch.Tensor] = []
    held: list[float] = []
    gaps: list[float] = []
    t_start = t_window = last_end = time.perf_counter()
    for step in tqdm(range(steps), desc=progress, unit="step", disable=progress is None, mininterval=5.0,
                     file=sys.stdout):
        parent_watch.at(f"step {step} of {steps}")
        if step == warmup:
            harness.reset_peaks(device)  # synchronizes: the warm-up is finished
            rec.warmup_s = time.perf_counter() - t_start
            neighbours.start()
            t_window = time.perf_counter()
            meter.start()
        lr = lr_at(step, steps, p.optim, settings)
        set_lr(run.optimizer, lr)
        x, y = to_device(rank_slice(stream.next(), rank, world), device)
        if step > warmup:  # the previous step was timed too
            gaps.append((time.perf_counter() - last_end) * 1000.0)
        clock.start()
        loss = train_step(run, x, y, p.optim.grad_clip, settings.grad_accum)
        clock.stop()
        last_end = time.perf_counter()
        if run.scaler is not None:
            scales.append(run.scaler._scale.detach().clone())  # type: ignore[union-attr]  # no public async read
        reader.push(step, loss)
        rec.lrs.append(lr)
        if step >= warmup:
            held.append(harness.current_mb(device))
        if on_step is not None:
            on_step()
        if step + 1 in eval_steps:  # after the step clock stopped: evaluation is never timed as training
            began = time.perf_counter()
            rec.val_curve.append([step + 1, evaluate(run.model, p, data, device, run.autocast()),
                                  time.perf_counter() - began])
            last_end = time.perf_counter()  # the evaluation is no gap between training steps
    reader.flush()
    harness.sync(device)
    rec.window_wall_ms = (time.perf_counter() - t_window) * 1000.0
    rec.gap_ms = gaps
    reading = meter.stop()
    rec.power_w, rec.energy_j, rec.power_note = reading.power_w, reading.energy_j, reading.note
    rec.neighbours = neighbours.finish()
    rec.step_ms = clock.times_ms()
    rec.first_step_ms = rec.step_ms[0]
    rec.memory = harness.peaks(device)
    rec.mem_growth_mb = held[-1] - held[0] if held else None
    rec.skipped_steps = skipped_steps(scales)


@torch.no_grad()
def evaluate(model: torch.nn.Module, p: Params, data: TokenData, device: torch.device,
             autocast: AbstractContextManager | None = None) -> float:
    """Mean cross-entropy over the fixed validation batches (in the given autocast, if any)."""
    model.eval()
    losses = []
    for x, y in eval_batches(data.val, p.eval.batches, p.shape.batch_size, p.shape.block_size):
        with autocast or nullcontext():
            _, loss = model(x.to(device), y.to(device))
        losses.append(loss.float().item())
    model.train()
    return float(np.mean(losses))


def train_once(p: Params, settings: RunSettings, data: TokenData, device: torch.device, steps: int, warmup: int,
               keep_model: bool = False, progress: str | None = None,
               on_step: Callable[[], None] | None = None, keep_going: bool = False,
               data_seed: int | None = None, memory_cap_gib: float | None = None,
               eval_steps: frozenset[int] = frozenset(), n_layer: int | None = None) -> Measurement:
    """Build, train and evaluate one fresh model; OOM and divergence become a status, not a crash.

    The initial weights always come from `seed`; the batch order from `data_seed` (default: `seed` too), so
    parity can train one model on two orders. `memory_cap_gib` (default: harness.memory_cap_gib; 0: none) caps
    what torch may allocate on a GPU, so a larger card answers for a smaller one; an OOM then records the
    memory at which the run stopped.

    `progress` labels a progress bar (None: quiet); `on_step` runs after every step (the profiler's hook);
    `keep_going` records a library error as status `error` instead of raising it (the matrix's variants);
    after each step done in `eval_steps` but the last the validation loss goes into `val_curve` (the last: val_loss).
    `n_layer` builds the model that deep instead (the search compiles a candidate's block ahead on one layer).
    """
    rec = Measurement(status="ok", warmup_steps=warmup, world_size=dist.world_size() if dist.active() else 1)
    if p.batch_size(settings) % (rec.world_size * settings.grad_accum):
        raise LabError(f"batch_size={p.batch_size(settings)} does not split over {rec.world_size} ranks x "
                       f"grad_accum={settings.grad_accum}; pick a global batch that is a multiple of {rec.world_size * settings.grad_accum}")
    check_fits(data.train, p.shape.block_size, "train")  # before building a model that could not train
    check_fits(data.val, p.shape.block_size, "validation")
    cap = p.harness.memory_cap_gib if memory_cap_gib is None else memory_cap_gib
    harness.cap_memory(device, cap)  # before the first allocation, so the run starts under it
    run: TrainingRun | None = None
    try:
        began = time.perf_counter()
        model = fresh_model(p, settings, data.vocab_size, n_layer)  # the same initial weights on every device
        rec.init_s = time.perf_counter() - began
        run = apply(model, settings, device, p.optim)
        rec.setup_s = time.perf_counter() - began
        rec.apply_s = rec.setup_s - rec.init_s
        with power.EnergyMeter(run.device) as meter:  # closed however the loop ends (a sampling thread, NVML)
            seed = p.seed if data_seed is None else data_seed
            _loop(run, p, data, steps, warmup, rec, progress, on_step, seed, meter, eval_steps - {steps})
        began = time.perf_counter()
        rec.val_loss = evaluate(run.model, p, data, device, run.autocast())
        rec.eval_s = time.perf_counter() - began
        if not math.isfinite(rec.val_loss):  # the last update broke the weights: no result, as for a NaN step
            loss, rec.val_loss = rec.val_loss, None
            raise Diverged(steps, loss)
        if keep_model:
            rec.run = run
    except Diverged as err:
        rec.status, rec.message, rec.diverged_step = "diverged", str(err), err.step
    except torch.OutOfMemoryError as err:
        rec.status = "oom"
        print(f"out of memory: {err}", file=sys.stderr)  # torch's whole text to the log; the record keeps one line
        rec.memory = harness.peaks(device)  # how far it got: where a smaller card stops
        rec.message = oom_message(p.batch_size(settings), cap, rec.memory, err)
    except Exception as err:  # noqa: BLE001 - recorded, not swallowed: the row shows it
        if not keep_going or isinstance(err, (LabError, parent_watch.Stopped)):
            raise
        # A library's kernel or compiler failing on this knob (torchao, liger, inductor) is a result
        # of the matrix, recorded with its first line; the other variants still run.
        rec.status, rec.message = "error", f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
    finally:
        if not keep_model:
            del run
            release(device)
    return rec


def oom_message(batch: int, cap_gib: float, memory: dict, err: Exception) -> str:
    """One line: what ran out, at which batch, under which cap, the memory held and the allocation that failed.

    e.g. "out of memory at batch size 16 under a 24 GiB cap: 22,194 MiB allocated when 3.07 GiB more was asked for".
    A part torch's text or the memory reading does not give is left out; the whole text goes to the stage's log."""
    cap = f" under a {cap_gib:g} GiB cap" if cap_gib > 0 else ""
    held = Memory.of(memory).allocated_mb
    asked = re.search(r"Tried to allocate (\S+ (?:bytes|[KMGT]iB))", str(err))  # torch's format_size
    parts = [f"{held:,.0f} MiB allocated" if held is not None else "",
             f"{asked[1]} more was asked for" if asked else ""]
    detail = " when ".join(part for part in parts if part)
    return f"out of memory at batch size {batch}{cap}" + (f": {detail}" if detail else "")


def release(device: torch.device) -> None:
    """Free what a finished run held so the next run starts from an empty device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
