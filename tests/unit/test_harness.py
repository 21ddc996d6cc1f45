"""The harness's statistics, MFU and leak/steady-state checks, against numbers worked by hand."""

import math

import pytest
import torch

from benchlab.core import stats
from benchlab.core.params import RunSettings
from benchlab.run import harness
from benchlab.run.harness import StepClock
from benchlab.run.mfu import flops_per_token, mfu_pct, peak_tflops
from benchlab.run.records import TAIL_STEPS, measured_record, tail_loss
from benchlab.run.runner import Measurement
from model.gpt import GPT, GPTConfig


def test_describe_matches_hand_computed_values() -> None:
    d = stats.describe([1.0, 2.0, 3.0, 4.0, 10.0])
    assert d["median"] == 3.0 and d["mean"] == 4.0 and d["min"] == 1.0 and d["max"] == 10.0
    assert d["p10"] == pytest.approx(1.4) and d["p90"] == pytest.approx(7.6)  # linear interpolation
    assert d["std"] == pytest.approx(math.sqrt(12.5))  # sample variance: 50 / 4
    assert d["cv_pct"] == pytest.approx(100 * math.sqrt(12.5) / 4)


def test_t_interval_uses_the_student_quantile() -> None:
    low, high = stats.t_interval([10.0, 12.0, 14.0])  # mean 12, s = 2, n = 3, t(2) = 4.303
    half = 4.303 * 2 / math.sqrt(3)
    assert (low, high) == pytest.approx((12 - half, 12 + half))
    assert stats.t_interval([5.0]) is None


def test_prediction_interval_is_wider_than_the_mean_s_by_sqrt_n_plus_one() -> None:
    low, high = stats.prediction_interval([10.0, 12.0, 14.0])  # s = 2, n = 3, t(2) = 4.303
    half = 4.303 * 2 * math.sqrt(1 + 1 / 3)
    assert (low, high) == pytest.approx((12 - half, 12 + half))
    ci = stats.t_interval([10.0, 12.0, 14.0])
    assert (high - low) / (ci[1] - ci[0]) == pytest.approx(2.0)  # sqrt(n + 1) = 2 for n = 3
    assert stats.prediction_interval([5.0]) is None


def test_interval_separation_and_steady_state() -> None:
    assert stats.separated((1, 2), (3, 4)) is True
    assert stats.separated((1, 3), (2, 4)) is False
    assert stats.separated(None, (1, 2)) is None
    assert stats.halves_gap([10, 10, 10, 10]) == 0.0
    assert stats.halves_gap([10, 10, 12, 12]) == pytest.approx(0.2)


def test_mfu_formula_against_a_hand_count_for_gpt2_124m() -> None:
    cfg = GPTConfig.from_name("gpt2_124m")
    with torch.device("meta"):
        n = GPT(cfg).num_params()  # position embeddings excluded
    # By hand: token embedding (tied output) 50304*768, per layer 12*768^2 in
    # the matmuls plus two LayerNorm weights, plus the final LayerNorm.
    by_hand = 50304 * 768 + 12 * (12 * 768 * 768 + 2 * 768) + 768
    assert n == by_hand
    fpt = flops_per_token(cfg, n, 1024)
    assert fpt == 6 * by_hand + 12 * 12 * 768 * 1024
    assert fpt / 1e6 == pytest.approx(854, abs=1)  # docs/measurement.md: about 854 MFLOP/token
    # 488.5K tokens/s on an H200 (989 TFLOP/s dense bf16) is about 42% MFU.
    assert mfu_pct(488_500, fpt, peak_tflops("NVIDIA H200")) == pytest.approx(42.2, abs=0.2)


def test_peak_table_knows_datacenter_gpus_and_nothing_else() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA GeForce RTX 3060 Laptop GPU") is None
    assert peak_tflops(None) is None and mfu_pct(1e6, 1e9, None) is None


def test_cpu_clock_measures_wall_time() -> None:
    clock = StepClock(torch.device("cpu"))
    for _ in range(3):
        clock.start()
        sum(range(20_000))
        clock.stop()
    times = clock.times_ms()
    assert len(times) == 3 and all(0 < t < 1000 for t in times)


def _record(step_ms: list[float], growth: float = 0.0, warmup: int = 2, wall_ms: float | None = None) -> Measurement:
    return Measurement(status="ok", losses=[5.0] * len(step_ms), lrs=[1e-3] * len(step_ms), step_ms=step_ms,
                     warmup_steps=warmup, warmup_s=1.0, first_step_ms=step_ms[0], window_wall_ms=wall_ms,
                     memory={"peak_mem_allocated_mb": 1000.0, "peak_mem_reserved_mb": 1100.0, "peak_rss_mb": None},
                     mem_growth_mb=growth, val_loss=4.0)


def test_measured_record_statistics_across_repeats() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cpu"}
    runs = [_record([500, 400, 100, 100, 100, 100]), _record([500, 400, 200, 200, 200, 200])]
    rec = measured_record(base, runs, cfg, 10_000, steady_tolerance=0.05)
    assert rec["timed_steps"] == 4 and rec["repeats"] == 2
    assert rec["repeat_tokens_per_sec"] == pytest.approx([10_000, 5_000])  # 1000 tokens / 0.1 s, / 0.2 s
    assert rec["tokens_per_sec"] == pytest.approx(7_500)  # median of two
    assert rec["tokens_per_sec_ci95_low"] < 7_500 < rec["tokens_per_sec_ci95_high"]
    assert rec["step_ms_median"] == pytest.approx(150) and rec["steady_state_ok"] is True
    assert rec["mfu_pct"] is None  # CPU: no sourced peak
    assert rec["val_perplexity"] == pytest.approx(math.exp(4.0))
    assert rec["tokens_per_sec_pi95_low"] < rec["tokens_per_sec_ci95_low"]  # the next run's interval is wider


def test_each_repeats_validation_loss_and_tail_training_loss_are_kept_for_parity() -> None:
    # Two bf16 runs of one configuration part run to run, so a parity verdict wants every repeat's losses.
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cpu"}
    steps = TAIL_STEPS + 10
    runs = [_record([10.0] * steps), _record([10.0] * steps)]
    runs[0].losses = [9.0] * 10 + [3.0] * TAIL_STEPS  # the first 10 steps lie outside the window
    runs[1].losses = [9.0] * 10 + [4.0] * (TAIL_STEPS - 1) + [4.0 + TAIL_STEPS]
    runs[1].val_loss = 4.5
    rec = measured_record(base, runs, cfg, 10_000, steady_tolerance=0.05)
    assert rec["repeat_val_loss"] == [4.0, 4.5]
    assert rec["repeat_tail_train_loss"] == pytest.approx([3.0, 5.0])  # the last step adds TAIL_STEPS / TAIL_STEPS
    assert rec["val_loss"] == 4.0 and rec["val_loss_repeat_spread"] == pytest.approx(0.5)
    assert tail_loss([1.0, 2.0, 3.0], steps=2) == pytest.approx(2.5)
    assert tail_loss([1.0, 2.0]) == pytest.approx(1.5)  # fewer steps than the window: all of them


def test_warmup_steps_stay_out_of_every_timing_statistic() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cpu"}
    # Three slow warm-up steps outnumber the two timed ones: any leak of them moves the median.
    rec = measured_record(base, [_record([900, 900, 900, 100, 100], warmup=3)], cfg, 10_000, 0.05)
    assert rec["step_ms_median"] == 100 and rec["step_ms_p90"] == 100 and rec["timed_steps"] == 2
    assert rec["tokens_per_sec"] == pytest.approx(10_000)


def test_wall_clock_throughput_and_the_host_gap() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cpu"}
    # Four timed steps of 100 ms on the clock, in a window of 500 ms: 100 ms of host work between steps.
    rec = measured_record(base, [_record([5, 5, 100, 100, 100, 100], wall_ms=500.0)], cfg, 10_000, 0.05)
    assert rec["tokens_per_sec"] == pytest.approx(10_000) and rec["tokens_per_sec_wall"] == pytest.approx(8_000)
    assert rec["host_overhead_pct"] == pytest.approx(20.0)


def test_unsteady_timing_and_memory_growth_are_flagged() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cuda"}
    rec = measured_record(base, [_record([9, 9, 10, 10, 20, 20], growth=300.0)], cfg, 10_000, 0.05)
    assert rec["steady_state_ok"] is False and rec["steady_gap_pct"] == pytest.approx(100.0)
    assert rec["leak_suspected"] is True and rec["mem_growth_mb"] == 300.0
    steady = measured_record(base, [_record([9, 9, 10, 10, 10, 10], growth=1.0)], cfg, 10_000, 0.05)
    assert steady["steady_state_ok"] is True and steady["leak_suspected"] is False
    on_cpu = measured_record({**base, "device": "cpu"}, [_record([9, 9, 10, 10, 10, 10], growth=300.0)], cfg, 1, 0.05)
    assert on_cpu["leak_suspected"] is None and on_cpu["mem_growth_mb"] == 300.0  # recorded, not judged


def test_failed_repeat_fails_the_variant() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    bad = Measurement(status="diverged", message="loss became nan at step 3", diverged_step=3, losses=[1.0, math.nan])
    rec = measured_record({"tokens_per_step": 1, "block_size": 16}, [bad], cfg, 1, 0.05)
    assert rec["status"] == "diverged" and rec["diverged_step"] == 3 and "tokens_per_sec" not in rec
    assert RunSettings().precision == "fp32"


def test_process_age_counts_from_the_process_start() -> None:
    import subprocess
    import sys

    from benchlab.run.harness import process_age_s
    code = "import time; time.sleep(1.0); from benchlab.run.harness import process_age_s; print(process_age_s())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.0 <= age < 30.0  # the sleep, plus the interpreter's start
    mine = process_age_s()
    assert mine is not None and mine > age - 30.0


# --- the CPU side, and the GPU-process look-up with nvidia-smi faked (from the mutation rounds) ------------

def test_cpu_memory_figures_come_from_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    import torch

    from benchlab.run import harness
    cpu = torch.device("cpu")
    peak = harness.peaks(cpu)
    assert peak["peak_mem_allocated_mb"] is None and peak["peak_mem_reserved_mb"] is None
    assert peak["peak_rss_mb"] == pytest.approx(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rel=0.05)
    before = harness.current_mb(cpu)
    block = bytearray(64 * 1024 * 1024)
    block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page so it is resident
    assert 50 < harness.current_mb(cpu) - before < 80
    assert 30 < before < peak["peak_rss_mb"] + 1
    harness.reset_peaks(cpu)
    harness.sync(cpu)  # no-ops on a CPU, and no CUDA call


def test_cpu_jiffies_count_idle_and_iowait_as_not_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from benchlab.run import harness
    monkeypatch.setattr(harness, "open", lambda path: io.StringIO("cpu  10 20 30 40 50 60 70\ncpu0 1 2 3 4\n"),
                        raising=False)
    assert harness._cpu_jiffies() == (190, 280)
    monkeypatch.setattr(harness, "open", lambda path: io.StringIO("cpu  10 20 30 40\n"), raising=False)
    assert harness._cpu_jiffies() == (60, 100)


def test_gpu_processes_parses_nvidia_smi_and_says_none_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import types

    from benchlab.run import harness
    seen = []

    def fake_run(cmd, **kw):
        seen.append((cmd, kw))
        return types.SimpleNamespace(stdout="123, GPU-aa-01\n456, GPU-BB-02\n789, GPU-aa-01\nNo running processes found\n")

    monkeypatch.setattr(harness.subprocess, "run", fake_run)
    assert harness.gpu_processes() == [123, 456, 789]
    assert harness.gpu_processes("AA-01") == [123, 789]  # torch's UUID lacks the GPU- prefix; case differs
    assert harness.gpu_processes("GPU-bb-02") == [456]
    assert harness.gpu_processes("cc-03") == []
    cmd, kw = seen[0]
    assert cmd == ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"]
    assert kw["capture_output"] and kw["text"] and kw["check"] and kw["timeout"] == 10

    def missing(cmd, **kw):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(harness.subprocess, "run", missing)
    assert harness.gpu_processes() is None

    def fails(cmd, **kw):
        raise subprocess.CalledProcessError(9, cmd)

    monkeypatch.setattr(harness.subprocess, "run", fails)
    assert harness.gpu_processes() is None


def test_neighbours_on_a_gpu_leave_out_our_own_pids(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import torch

    from benchlab.run import harness
    monkeypatch.setattr(harness, "device_uuid", lambda device: "GPU-ours")
    asked: list = []
    monkeypatch.setattr(harness, "gpu_processes", lambda uuid: (asked.append(uuid), [7, os.getpid(), os.getppid()])[1])
    jiffies = iter([(100, 1000), (150, 1100)])
    monkeypatch.setattr(harness, "_cpu_jiffies", lambda: next(jiffies))
    n = harness.Neighbours(torch.device("cuda"))
    n.start()
    assert asked == ["GPU-ours"]  # only processes on our own GPU count
    monkeypatch.setattr(harness, "gpu_processes", lambda uuid: [9])
    facts = n.finish()
    assert facts["other_gpu_processes"] == [7, 9] and facts["cpu_busy_pct"] == pytest.approx(50.0)
    assert facts["cpu_busy_others_pct"] == pytest.approx(50.0 - facts["cpu_busy_ours_pct"])
    monkeypatch.setattr(harness, "gpu_processes", lambda uuid: None)  # nvidia-smi gone: we cannot tell
    jiffies = iter([(0, 0), (0, 0)])
    n = harness.Neighbours(torch.device("cuda"))
    n.start()
    facts = n.finish()
    assert facts["other_gpu_processes"] is None and facts["cpu_busy_pct"] == 0.0


def test_neighbours_on_a_cpu_count_our_own_busy_share(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import types

    import torch

    from benchlab.run import harness
    monkeypatch.setattr(harness, "gpu_processes", lambda: pytest.fail("no nvidia-smi on a CPU run"))
    monkeypatch.setattr(harness.os, "cpu_count", lambda: 2)

    def clocks(wall: list[float], ours: list[float]) -> types.SimpleNamespace:
        """This process's clocks as the harness reads them: wall time and its own CPU time, in seconds."""
        return types.SimpleNamespace(perf_counter=iter(wall).__next__, process_time=iter(ours).__next__)

    # One of two cores busy for the whole second: 50% of the machine is ours, of 90% busy.
    monkeypatch.setattr(harness, "time", clocks([10.0, 11.0], [3.0, 4.0]))
    jiffies = iter([(0, 1000), (900, 2000)])  # 90% of the machine busy
    monkeypatch.setattr(harness, "_cpu_jiffies", lambda: next(jiffies))
    n = harness.Neighbours(torch.device("cpu"))
    assert n.ours == {os.getpid(), os.getppid()} and n.seen == set() and n.known is True
    n.start()
    facts = n.finish()
    assert facts["other_gpu_processes"] is None
    assert facts["cpu_busy_ours_pct"] == pytest.approx(50.0)
    assert facts["cpu_busy_others_pct"] == pytest.approx(40.0)
    # The machine less busy than we were (10% against our 50%): others are never negative.
    monkeypatch.setattr(harness, "time", clocks([0.0, 1.0], [0.0, 1.0]))
    jiffies = iter([(0, 1000), (100, 2000)])
    n = harness.Neighbours(torch.device("cpu"))
    n.start()
    assert n.finish()["cpu_busy_others_pct"] == 0.0


class _FakeTime:
    """perf_counter and process_time read from lists, for exact busy shares and step times."""

    def __init__(self, perf: list[float], process: list[float]) -> None:
        self._perf, self._process = iter(perf), iter(process)

    def perf_counter(self) -> float:
        return next(self._perf)

    def process_time(self) -> float:
        return next(self._process)


def test_cpu_clock_and_busy_shares_with_a_fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from benchlab.run import harness
    monkeypatch.setattr(harness, "time", _FakeTime([1.0, 1.25], []))
    clock = harness.StepClock(torch.device("cpu"))
    clock.start()
    clock.stop()
    assert clock.times_ms() == [250.0]
    jiffies = iter([(0, 1000), (800, 2000)])
    monkeypatch.setattr(harness, "_cpu_jiffies", lambda: next(jiffies))
    monkeypatch.setattr(harness.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(harness, "time", _FakeTime([10.0, 12.0], [5.0, 6.0]))  # 1 s of CPU over 2 s on 2 cores
    n = harness.Neighbours(torch.device("cpu"))
    n.start()
    assert n.finish() == {"pid": harness.os.getpid(), "other_gpu_processes": None, "cpu_busy_pct": 80.0,
                          "cpu_busy_ours_pct": 25.0, "cpu_busy_others_pct": 55.0}
    jiffies = iter([(0, 1000), (800, 2000)])
    monkeypatch.setattr(harness.os, "cpu_count", lambda: None)  # unknown: count one core
    monkeypatch.setattr(harness, "time", _FakeTime([10.0, 12.0], [5.0, 6.0]))
    n = harness.Neighbours(torch.device("cpu"))
    n.start()
    assert n.finish()["cpu_busy_ours_pct"] == 50.0
    jiffies = iter([(0, 1000), (800, 2000)])
    monkeypatch.setattr(harness, "time", _FakeTime([10.0, 10.0], [5.0, 6.0]))  # no wall time: no share
    n = harness.Neighbours(torch.device("cpu"))
    n.start()
    assert n.finish()["cpu_busy_ours_pct"] == 0.0


def test_proc_stat_and_rusage_are_read_in_their_units(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import types

    import torch

    from benchlab.run import harness

    def fake_open(path):
        assert path == "/proc/stat"
        return io.StringIO("cpu  10 20 30 40 50\n")

    monkeypatch.setattr(harness, "open", fake_open, raising=False)
    assert harness._cpu_jiffies() == (60, 150)  # idle 40 + iowait 50
    monkeypatch.setattr(harness.resource, "getrusage", lambda who: types.SimpleNamespace(ru_maxrss=3072))
    assert harness.peaks(torch.device("cpu"))["peak_rss_mb"] == 3.0  # KiB on Linux


# --- the CUDA side, with torch.cuda's calls recorded instead of made (no GPU here) -----------------------------------

class FakeEvent:
    """A CUDA event: `record` stamps it with the next tick of a shared fake clock (ms)."""

    ticks = iter(range(0, 10**6, 5))
    log: list = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.timing, self.at = enable_timing, None

    def record(self) -> None:
        self.at = next(FakeEvent.ticks)

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.timing and end.timing, "elapsed_time needs events made with enable_timing=True"
        return float(end.at - self.at)


def test_a_gpu_clock_brackets_each_step_with_timing_events_and_syncs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list = []
    monkeypatch.setattr(FakeEvent, "ticks", iter([0, 7, 10, 12, 20, 35]))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(a))
    clock = StepClock(torch.device("cuda"))
    for _ in range(3):
        clock.start()
        clock.stop()
    assert syncs == []  # the queue is never stalled while stepping
    assert clock.times_ms() == [7.0, 2.0, 15.0]
    assert syncs == [()]  # one synchronize, when the times are read


def test_a_gpu_s_memory_comes_from_torch_s_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list = []
    gpu = torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: log.append(("now", d)) or 3 * harness.MB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: log.append(("peak", d)) or 5 * harness.MB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: log.append(("reserved", d)) or 8 * harness.MB)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: log.append(("sync", d)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: log.append(("reset", d)))
    assert harness.current_mb(gpu) == 3.0
    assert harness.peaks(gpu) == {"peak_mem_allocated_mb": 5.0, "peak_mem_reserved_mb": 8.0, "peak_rss_mb": None}
    harness.reset_peaks(gpu)
    harness.sync(gpu)
    assert log == [("now", gpu), ("peak", gpu), ("reserved", gpu), ("sync", gpu), ("reset", gpu), ("sync", gpu)]
    harness.reset_peaks(torch.device("cpu"))
    harness.sync(torch.device("cpu"))
    assert len(log) == 6  # nothing to wait for or reset on a CPU


def test_a_gpu_is_named_by_the_uuid_of_the_card_it_means(monkeypatch: pytest.MonkeyPatch) -> None:
    class Props:
        def __init__(self, index: int) -> None:
            self.uuid = f"uuid-of-{index}"

    monkeypatch.setattr(torch.cuda, "get_device_properties", Props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert harness.device_uuid(torch.device("cuda", 1)) == "uuid-of-1"
    assert harness.device_uuid(torch.device("cuda")) == "uuid-of-3"  # `cuda` alone: the current card
    assert harness.device_uuid(torch.device("cpu")) is None


def test_nvidia_smi_lines_without_a_numeric_pid_are_not_processes() -> None:
    out = "123, GPU-aaa\n[Not Supported], GPU-bbb\nNo running processes found\n 77 , GPU-ccc \n"
    assert harness._apps(out) == [("123", "GPU-aaa"), ("77", "GPU-ccc")]
