"""The GPU board's energy and mean power over a run's timed window, where the driver reports them (NVML).

Users pay for energy as well as hours, so every GPU result records what the board drew while the timed steps
ran. NVML (the `nvidia-ml-py` package; `benchlab.run.nvml_board` starts it and finds the board) gives it two ways:
- the board's total-energy counter (mJ since the driver loaded; Volta and newer). The driver advances it in
  steps, about every 100 ms on the H200, so two plain reads at a window's edges are off by up to a step at each
  edge: a 34 ms window read 1,804 W on a 700 W card. A thread therefore reads the counter every `POLL_S`
  during the warm-up, and again from the window's end, keeping each (time, value) at which it moved. The
  counter at the opening edge is extended from its last two moves before it (the warm-up's rate), and at the
  closing edge taken back from its first two moves after it (the idle rate that follows). Nothing reads it
  inside the window, so no thread takes the GIL from the timed steps. On the H200 (2026-12-03, bf16 matmuls
  back to back) windows of 0.33 s read 740 to 748 W, of 0.66 s 712 W, of 1.6 s 703 W and of 5 s 694 W: a window
  under a second may read a few percent above a long one (a constant 15 to 20 J, or a real early surge);
- else the board's power draw (mW), sampled every `SAMPLE_S` by a thread and integrated over the window
  (trapezoids between samples, one sample taken at each edge).
Mean power is the energy over the window's wall time. Where neither can be read (a CPU, no nvidia-ml-py, a
driver that reports no power, a GPU NVML cannot find) the reading is None with a one-line note saying why: a
figure that was not measured is never recorded.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from types import ModuleType
from typing import Any

import torch

from benchlab.run import nvml_board

# Between reads of the energy counter, outside the timed window: a move is seen within 5 ms, which at 700 W is
# at most 3.5 J of a window's hundreds.
POLL_S = 0.005
# Between power samples when there is no energy counter. NVML's power reading is itself an average the driver
# keeps, so sampling faster would mostly read the same value again.
SAMPLE_S = 0.05
# The longest wait for the counter to move (before the warm-up, and after the window): a counter that stays
# still this long is not one to time by.
COUNTER_WAIT_S = 2.0


@dataclass(frozen=True)
class PowerReading:
    """What the board drew over one timed window; both figures None (and `note` saying why) when not measured."""

    power_w: float | None
    energy_j: float | None
    note: str = ""  # empty when measured


def not_measured(note: str) -> PowerReading:
    return PowerReading(power_w=None, energy_j=None, note=note)


def trapezoid_j(samples: list[tuple[float, float]]) -> float:
    """Joules under (seconds, watts) samples in time order: the area of the trapezoids between them."""
    return sum((t1 - t0) * (w0 + w1) / 2.0 for (t0, w0), (t1, w1) in zip(samples, samples[1:]))


def on_line(p: tuple[float, float], q: tuple[float, float], t: float) -> float:
    """The value at time `t` on the straight line through two (time, value) points."""
    (tp, vp), (tq, vq) = p, q
    return vq + (vq - vp) * (t - tq) / (tq - tp)


def counter_at(moves: list[tuple[float, float]], t: float) -> float | None:
    """A counter's value at time `t`, from two of its (time, value) moves on one side of `t`: its last two
    before, else its first two after; None with neither."""
    before = [m for m in moves if m[0] <= t]
    after = [m for m in moves if m[0] > t]
    if len(before) >= 2:
        return on_line(before[-2], before[-1], t)
    if len(after) >= 2:
        return on_line(after[0], after[1], t)
    return None


class Poller:
    """Reads a value every `every_s` on a background thread until `halt`, keeping (time, value) pairs: every
    reading, or with `moves_only` only those where the value changed (the first reading is kept either way)."""

    def __init__(self, read: Callable[[], float], every_s: float, moves_only: bool = False) -> None:
        self.read, self.every_s, self.moves_only = read, every_s, moves_only
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="benchlab-power", daemon=True)

    def sample(self) -> None:
        t, value = perf_counter(), self.read()
        if not (self.moves_only and self.samples and value == self.samples[-1][1]):
            self.samples.append((t, value))

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def halt(self) -> None:
        """Stop the thread, if it runs."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def wait_for_move_after(self, t: float, timeout_s: float) -> bool:
        """Wait until a kept reading (past the first) is later than `t`; False after `timeout_s`."""
        deadline = perf_counter() + timeout_s
        while perf_counter() < deadline:
            if len(self.samples) > 1 and self.samples[-1][0] > t:
                return True
            time.sleep(self.every_s)
        return False


class EnergyMeter:
    """Measures the board's energy between `start` and `stop`; a context manager, so that NVML is shut down and its
    thread stopped however the run ends. Made before the warm-up: it waits (up to 0.2 s on the H200) for the energy
    counter's first two moves, and reads it through the warm-up, so that its rate is known when the window opens.

    On a CPU, or where NVML cannot read this board, `stop` returns the note that says why and nothing else runs.
    """

    def __init__(self, device: torch.device) -> None:
        self.nvml: ModuleType | None = None
        self.handle: Any = None
        self.note = ""
        self.counter: Poller | None = None  # reads the energy counter (mJ) during the warm-up
        self.moves: list[tuple[float, float]] = []  # its moves before the window
        self.sampler: Poller | None = None  # power samples (W), over the window only
        self._t0 = 0.0
        if device.type != "cuda":
            self.note = f"{device.type.upper()}: no board power reading"
            return
        nvml = nvml_board.start()
        if isinstance(nvml, str):
            self.note = nvml
            return
        self.nvml = nvml
        self.handle = self._handle(device)
        if self.handle is None:
            return
        name = torch.cuda.get_device_name(device)
        if self._reads(self._energy_mj):
            self.counter = self._watch_counter(moves=2)  # two moves before the window: its opening edge's line
            if self.counter is None:
                self.note = f"the energy counter of {name} did not move in {COUNTER_WAIT_S:g} s"
        elif self._reads(self._power_w):
            self.sampler = Poller(self._power_w, SAMPLE_S)
        else:
            self.note = f"the driver reports no power for {name}"

    def _handle(self, device: torch.device) -> Any | None:
        assert self.nvml is not None
        name = torch.cuda.get_device_name(device)
        try:
            handle = nvml_board.find_handle(self.nvml, device)
        except self.nvml.NVMLError as err:
            self.note = f"NVML cannot find {name} ({err}): no board power reading"
            return None
        if handle is None:
            self.note = f"NVML cannot tell which GPU is {name} (torch gives no PCI address): no board power reading"
        return handle

    def _watch_counter(self, moves: int) -> Poller | None:
        """A thread reading the energy counter's moves, once it has seen `moves` of them; None if it does not."""
        counter = Poller(self._energy_mj, POLL_S, moves_only=True)
        counter.start()
        for _ in range(moves):
            if not counter.wait_for_move_after(counter.samples[-1][0], COUNTER_WAIT_S):
                counter.halt()
                return None
        return counter

    def _reads(self, read: Callable[[], float]) -> bool:
        """Whether the driver answers this reading for this board (the energy counter: Volta and newer, and not
        every virtual machine)."""
        try:
            read()
        except self.nvml.NVMLError:  # type: ignore[union-attr]
            return False
        return True

    def _power_w(self) -> float:
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0  # type: ignore[union-attr]  # mW

    def _energy_mj(self) -> float:
        return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))  # type: ignore[union-attr]

    @property
    def measuring(self) -> bool:
        return not self.note

    def start(self) -> None:
        """Open the window (after the device has synchronized: the warm-up's work is done)."""
        if not self.measuring:
            return
        if self.sampler is not None:
            self.sampler.start()  # its first sample: the opening edge
            return
        self._t0 = perf_counter()
        assert self.counter is not None
        self.counter.halt()
        self.moves = self.counter.samples[1:]  # the first reading is not a move: when it was set is unknown

    def stop(self) -> PowerReading:
        """Close the window (after the device has synchronized) and read what the board drew over it."""
        if not self.measuring:
            return not_measured(self.note)
        if self.sampler is not None:
            self.sampler.halt()
            self.sampler.sample()  # the closing edge
            energy_j: float | None = trapezoid_j(self.sampler.samples)
            seconds = self.sampler.samples[-1][0] - self.sampler.samples[0][0]
        else:
            t1 = perf_counter()
            energy_j, seconds = self._counter_j(self._t0, t1), t1 - self._t0
        if energy_j is None or seconds <= 0 or energy_j <= 0:
            return not_measured(f"no energy read around the {seconds:.3f} s window: no board power reading")
        return PowerReading(power_w=energy_j / seconds, energy_j=energy_j)

    def _counter_j(self, t0: float, t1: float) -> float | None:
        """Joules between t0 (the warm-up's moves before it) and t1 (two moves after it, waited for now)."""
        after = self._watch_counter(moves=2)
        if after is None:
            return None
        after.halt()
        start_mj = counter_at([m for m in self.moves if m[0] <= t0], t0)
        end_mj = counter_at(after.samples[1:], t1)
        if start_mj is None or end_mj is None:
            return None
        return (end_mj - start_mj) / 1000.0

    def close(self) -> None:
        for poller in (self.counter, self.sampler):
            if poller is not None:
                poller.halt()
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
            self.nvml = None

    def __enter__(self) -> "EnergyMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def combine(readings: list[PowerReading]) -> PowerReading:
    """One job's reading from its ranks' (one GPU each): the boards' energies and mean powers add up, over windows
    that coincide (every rank times the same steps). Any rank not measured makes the job's not measured."""
    missing = next((r for r in readings if r.energy_j is None or r.power_w is None), None)
    if missing is not None:
        return not_measured(missing.note or "a rank's board power was not read")
    return PowerReading(power_w=sum(r.power_w for r in readings),  # type: ignore[misc]
                        energy_j=sum(r.energy_j for r in readings))  # type: ignore[misc]
