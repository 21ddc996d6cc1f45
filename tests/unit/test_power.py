"""Board energy over the timed window (benchlab/run/power.py, the board found by benchlab/run/nvml_board.py), its
wiring into a run, and the result keys it gives.

NVML is replaced by a fake `pynvml` module, so the arithmetic and the fallbacks are checked without a GPU.
"""

import sys
import time
import types
from types import SimpleNamespace

import pytest
import torch

from benchlab.core.params import RunSettings
from benchlab.run import harness, nvml_board, power
from benchlab.run.launch import combine_ranks
from benchlab.run.power import EnergyMeter, PowerReading
from benchlab.run.records import measured_record
from benchlab.run.runner import Measurement, train_once
from model.gpt import GPTConfig

GPU = torch.device("cuda", 0)
CPU = torch.device("cpu")


class NVMLError(Exception):
    pass


def fake_nvml(energy_mj: object = None, power_mw: object = None) -> types.ModuleType:
    """A pynvml whose energy counter (mJ) and power reading (mW) call `energy_mj` and `power_mw` with the handle;
    a missing one raises NVMLError, as a driver that does not support it does."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    nvml.calls = []

    def unsupported(*_: object) -> float:
        raise NVMLError("Not Supported")

    nvml.nvmlInit = lambda: nvml.calls.append("init")
    nvml.nvmlShutdown = lambda: nvml.calls.append("shutdown")
    nvml.nvmlDeviceGetHandleByPciBusId = lambda bus: nvml.calls.append(("bus", bus)) or "handle"
    nvml.nvmlDeviceGetHandleByIndex = lambda index: nvml.calls.append(("index", index)) or "handle"
    nvml.nvmlDeviceGetTotalEnergyConsumption = energy_mj if energy_mj is not None else unsupported
    nvml.nvmlDeviceGetPowerUsage = power_mw if power_mw is not None else unsupported
    return nvml


@pytest.fixture()
def h200(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sees one H200 at PCI address 0000:3b:00.0."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(nvml_board, "pci_address", lambda device: "0000:3b:00.0")


def counter_mj(watts: float, step_s: float = 0.0):
    """A board drawing `watts` steadily, as its energy counter reads in mJ: moving at every read, or in steps of
    `step_s` (the driver's update period) holding the energy at each step's start."""
    base = time.perf_counter()

    def read(handle: object) -> float:
        t = time.perf_counter() - base
        if step_s:
            t = step_s * int(t / step_s)
        return 5_000_000.0 + watts * 1000.0 * t

    return read


def test_energy_over_the_window_is_the_counters_difference_over_its_length(monkeypatch, h200) -> None:
    nvml = fake_nvml()
    nvml.nvmlDeviceGetTotalEnergyConsumption = counter_mj(300.0)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(power, "POLL_S", 0.001)
    with EnergyMeter(GPU) as meter:
        meter.start()
        time.sleep(0.2)
        reading = meter.stop()
    assert reading.power_w == pytest.approx(300.0, rel=1e-3)
    assert reading.energy_j == pytest.approx(300.0 * 0.2, rel=0.25)  # the sleep's length, roughly
    assert reading.note == ""
    assert ("bus", "0000:3b:00.0") in nvml.calls  # the board torch uses, found by its PCI address
    assert nvml.calls[-1] == "shutdown"


def test_a_counter_that_moves_in_steps_is_interpolated_at_the_edges(monkeypatch, h200) -> None:
    # Steps of 100 ms around a 250 ms window: two plain reads would give 200 or 300 ms of energy, 240 or 360 W.
    nvml = fake_nvml()
    nvml.nvmlDeviceGetTotalEnergyConsumption = counter_mj(300.0, step_s=0.1)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(power, "POLL_S", 0.001)
    with EnergyMeter(GPU) as meter:
        time.sleep(0.03)  # the window opens between two steps
        meter.start()
        time.sleep(0.25)
        reading = meter.stop()
    assert reading.power_w == pytest.approx(300.0, rel=0.08)


def test_the_counter_at_an_edge_follows_its_two_nearest_moves_on_one_side() -> None:
    # Opening edge: the warm-up's last two moves (300 J/s), extended 50 ms past the last.
    assert power.counter_at([(0.9, 700.0), (1.0, 1000.0), (1.1, 1300.0)], 1.15) == pytest.approx(1450.0)
    # Closing edge: the first two moves after it (100 J/s idle), taken back 30 ms from the first.
    assert power.counter_at([(2.03, 5000.0), (2.13, 5010.0)], 2.0) == pytest.approx(4997.0)
    assert power.counter_at([(1.0, 1000.0)], 2.0) is None  # one move gives no rate


def test_without_an_energy_counter_sampled_power_is_integrated(monkeypatch, h200) -> None:
    # A fake clock that advances 0.1 s per read, and a power draw rising with it: 100 W + 1000 W/s * t. The
    # trapezoids are exact for a straight line, so the result is known whatever number of samples the thread took.
    now = {"t": 0.0}

    def tick() -> float:
        now["t"] += 0.1
        return now["t"]

    nvml = fake_nvml(power_mw=lambda h: (100.0 + 1000.0 * now["t"]) * 1000.0)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(power, "perf_counter", tick)
    monkeypatch.setattr(power, "SAMPLE_S", 0.001)
    with EnergyMeter(GPU) as meter:
        assert meter.sampler is not None
        meter.start()
        time.sleep(0.05)
        samples = list(meter.sampler.samples)
        reading = meter.stop()
    assert len(samples) >= 2
    t0, t1 = 0.1, now["t"]  # the opening edge's sample, the closing edge's
    energy = 100.0 * (t1 - t0) + 500.0 * (t1**2 - t0**2)
    assert reading.energy_j == pytest.approx(energy)
    assert reading.power_w == pytest.approx(energy / (t1 - t0))
    assert reading.note == ""


def test_trapezoids_between_power_samples() -> None:
    assert power.trapezoid_j([(0.0, 100.0), (1.0, 200.0), (3.0, 200.0)]) == pytest.approx(150.0 + 400.0)
    assert power.trapezoid_j([(0.0, 100.0)]) == 0.0


def test_on_a_cpu_nothing_is_read_and_the_note_says_why(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not even looked for
    with EnergyMeter(CPU) as meter:
        meter.start()
        assert meter.stop() == PowerReading(None, None, "CPU: no board power reading")


def test_without_nvidia_ml_py_the_note_names_the_install(monkeypatch, h200) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with EnergyMeter(GPU) as meter:
        meter.start()
        reading = meter.stop()
    assert reading == PowerReading(None, None, "nvidia-ml-py is not installed: pip install -r requirements-gpu.txt")


def test_a_driver_without_power_readings_is_named(monkeypatch, h200) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    with EnergyMeter(GPU) as meter:
        meter.start()
        assert meter.stop() == PowerReading(None, None, "the driver reports no power for NVIDIA H200")


def test_a_counter_that_never_moves_is_not_a_measurement(monkeypatch, h200) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(energy_mj=lambda handle: 1_000.0))
    monkeypatch.setattr(power, "COUNTER_WAIT_S", 0.05)
    with EnergyMeter(GPU) as meter:
        meter.start()
        reading = meter.stop()
    assert reading == PowerReading(None, None, "the energy counter of NVIDIA H200 did not move in 0.05 s")


def test_nvml_handle_by_pci_address_else_by_index_only_where_the_numbering_agrees(monkeypatch) -> None:
    nvml = fake_nvml()
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert nvml_board.pci_address(GPU) == "0000:3b:00.0"
    assert nvml_board.find_handle(nvml, GPU) == "handle" and nvml.calls[-1] == ("bus", "0000:3b:00.0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace())  # an older torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_board.find_handle(nvml, torch.device("cuda", 0)) == "handle" and nvml.calls[-1] == ("index", 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # CUDA's 0 is NVML's 3
    assert nvml_board.find_handle(nvml, torch.device("cuda", 0)) is None


def test_ranks_energies_and_powers_add_up_and_one_unread_rank_voids_them() -> None:
    def rank(power_w: float | None, energy_j: float | None, note: str = "") -> Measurement:
        return Measurement(status="ok", step_ms=[5.0, 5.0, 5.0], losses=[3.0, 2.0, 1.0], warmup_steps=1,
                         power_w=power_w, energy_j=energy_j, power_note=note)

    both = combine_ranks([rank(300.0, 30.0), rank(310.0, 31.0)])
    assert (both.power_w, both.energy_j, both.power_note) == (pytest.approx(610.0), pytest.approx(61.0), "")
    one = combine_ranks([rank(300.0, 30.0), rank(None, None, "the driver reports no power for NVIDIA H200")])
    assert (one.power_w, one.energy_j, one.power_note) == (None, None, "the driver reports no power for NVIDIA H200")


def _repeat(timed_ms: list[float], power_w: float | None, energy_j: float | None, note: str = "") -> Measurement:
    return Measurement(status="ok", step_ms=[50.0, *timed_ms], losses=[3.0] * (1 + len(timed_ms)), warmup_steps=1,
                     window_wall_ms=sum(timed_ms), val_loss=3.0, power_w=power_w, energy_j=energy_j, power_note=note)


def test_two_repeats_give_median_power_and_tokens_per_joule() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cuda"}
    # 4 timed steps of 1000 tokens each: 4000 tokens per 20 J and per 10 J.
    runs = [_repeat([10.0] * 4, 500.0, 20.0), _repeat([10.0] * 4, 250.0, 10.0)]
    rec = measured_record(base, runs, cfg, 10_000, steady_tolerance=0.05)
    assert rec["power_w_mean"] == pytest.approx(375.0)
    assert rec["tokens_per_joule"] == pytest.approx((200.0 + 400.0) / 2)
    assert rec["power_note"] == ""
    unread = [runs[0], _repeat([10.0] * 4, None, None, "CPU: no board power reading")]
    rec = measured_record(base, unread, cfg, 10_000, steady_tolerance=0.05)
    assert (rec["power_w_mean"], rec["tokens_per_joule"], rec["power_note"]) == (
        None, None, "CPU: no board power reading")


def test_a_run_reads_the_meter_over_its_timed_window(monkeypatch, params, tokens) -> None:
    # The window opens once, at the first timed step, after warm-up, and its reading lands in the record.
    events: list[str] = []

    class Meter:
        def __init__(self, device: torch.device) -> None:
            events.append("open")

        def __enter__(self) -> "Meter":
            return self

        def __exit__(self, *exc: object) -> None:
            events.append("close")

        def start(self) -> None:
            events.append(f"start after {len(clock_stops)} steps")

        def stop(self) -> PowerReading:
            events.append(f"stop after {len(clock_stops)} steps")
            return PowerReading(power_w=123.0, energy_j=4.5)

    clock_stops: list[None] = []  # one per step: StepClock.stop is called once a step
    original = harness.StepClock.stop
    monkeypatch.setattr(harness.StepClock, "stop", lambda self: (clock_stops.append(None), original(self))[1])
    monkeypatch.setattr(power, "EnergyMeter", Meter)
    rec = train_once(params, RunSettings(), tokens, CPU, steps=5, warmup=2)
    assert events == ["open", "start after 2 steps", "stop after 5 steps", "close"]
    assert (rec.power_w, rec.energy_j, rec.power_note) == (123.0, 4.5, "")


def test_a_cpu_run_records_no_power_and_says_why(params, tokens) -> None:
    rec = train_once(params, RunSettings(), tokens, CPU, steps=4, warmup=2)
    assert (rec.power_w, rec.energy_j, rec.power_note) == (None, None, "CPU: no board power reading")


def test_a_repeat_with_power_but_no_energy_voids_the_figures_and_a_note_says_so() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cuda"}
    runs = [_repeat([10.0] * 4, 500.0, 20.0), _repeat([10.0] * 4, 250.0, 0.0)]
    rec = measured_record(base, runs, cfg, 10_000, steady_tolerance=0.05)
    assert (rec["power_w_mean"], rec["tokens_per_joule"], rec["power_note"]) == (None, None, "board power was not read")
