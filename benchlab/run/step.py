"""One training step and what the timed loop (`benchlab.run.runner`) needs around it: the step itself (micro-batches,
loss scaling, clipping, the update), the batch copied to the device without stalling the host, a rank's share of
the global batch, each step's loss read one step late, and the steps fp16's GradScaler skipped.
"""

import math

import torch

from benchlab.core.knobs import CUDA_GRAPH_MODES
from benchlab.run.apply_knobs import TrainingRun


class Diverged(Exception):
    """The loss became NaN or Inf."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss became {loss} at step {step}")
        self.step, self.loss = step, loss


def train_step(run: TrainingRun, x: torch.Tensor, y: torch.Tensor, grad_clip: float, micro_batches: int = 1) -> torch.Tensor:
    """One optimizer step over a batch split into `micro_batches`; returns the batch's mean loss (detached)."""
    total: torch.Tensor | None = None
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        if run.settings.compile_mode in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()  # the graphs' outputs of the last step may be reused
        with run.autocast():
            loss = run.loss(xs, ys) / micro_batches
        (run.scaler.scale(loss) if run.scaler is not None else loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    if run.scaler is not None:
        run.scaler.unscale_(run.optimizer)
        run.clip_gradients(grad_clip)
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        run.update(grad_clip)
    run.optimizer.zero_grad(set_to_none=True)
    assert total is not None
    return total


def to_device(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy a batch to the device without stalling the host.

    From pageable memory a "non_blocking" copy is not: CUDA first waits for the
    stream to drain, so the host loses its lead and the next step's kernels
    start late (the step-time tail on fast GPUs). From pinned memory the copy
    is queued like a kernel.
    """
    if device.type != "cuda":
        return batch
    return tuple(t.pin_memory().to(device, non_blocking=True) for t in batch)  # type: ignore[return-value]


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


def skipped_steps(scales: list[torch.Tensor]) -> int | None:
    """fp16: how many steps the GradScaler skipped; a skipped step lowers the scale (initially 65536)."""
    if not scales:
        return None
    s = torch.stack(scales).float().cpu().numpy()
    return int((s[1:] < s[:-1]).sum() + (s[0] < 65536.0))


def rank_slice(batch: tuple[torch.Tensor, torch.Tensor], rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous share of the global batch: rows rank*B/world up to (rank+1)*B/world."""
    share = batch[0].size(0) // world
    return tuple(t[rank * share : (rank + 1) * share] for t in batch)  # type: ignore[return-value]
