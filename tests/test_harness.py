"""The harness's statistics, MFU and leak/steady-state checks, against numbers worked by hand."""

import math
from pathlib import Path

import pytest
import torch

from benchlab import stats
from benchlab.config import RunSettings
from benchlab.harness import StepClock
from benchlab.mfu import flops_per_token, mfu_pct, peak_tflops
from benchlab.results import TAIL_STEPS, measured_record, tail_loss
from benchlab.runner import RunRecord, repeat_in_fresh_process
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
    assert fpt / 1e6 == pytest.approx(854, abs=1)  # shared/GPU.md: about 854 MFLOP/token
    # 488.5K tokens/s on an H200 is about 42% MFU (shared/GPU.md).
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


def _record(step_ms: list[float], growth: float = 0.0, warmup: int = 2, wall_ms: float | None = None) -> RunRecord:
    return RunRecord(status="ok", losses=[5.0] * len(step_ms), lrs=[1e-3] * len(step_ms), step_ms=step_ms,
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
    bad = RunRecord(status="diverged", message="loss became nan at step 3", diverged_step=3, losses=[1.0, math.nan])
    rec = measured_record({"tokens_per_step": 1, "block_size": 16}, [bad], cfg, 1, 0.05)
    assert rec["status"] == "diverged" and rec["diverged_step"] == 3 and "tokens_per_sec" not in rec
    assert RunSettings().precision == "fp32"


def test_process_age_counts_from_the_process_start() -> None:
    import subprocess
    import sys

    from benchlab.harness import process_age_s
    code = "import time; time.sleep(1.0); from benchlab.harness import process_age_s; print(process_age_s())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.0 <= age < 30.0  # the sleep, plus the interpreter's start
    mine = process_age_s()
    assert mine is not None and mine > age - 30.0


def test_a_repeat_line_names_where_its_wall_time_went() -> None:
    from stages.bench import repeat_cost
    rec = RunRecord(status="ok", setup_s=9.04, warmup_s=2.5, window_wall_ms=3600.0, eval_s=0.44)
    assert repeat_cost(rec, 16.6) == ("16.6 s, start-up and build 9.0 s, warm-up and compile 2.5 s, timed 3.6 s, "
                                      "evaluation 0.4 s")
    rec = RunRecord(status="ok", setup_s=9.04, startup_s=6.12, init_s=1.27, apply_s=1.65, warmup_s=2.5,
                    window_wall_ms=3600.0, eval_s=0.44, exit_s=5.96)
    assert repeat_cost(rec, 22.6) == ("22.6 s, start-up and build 9.0 s (of which interpreter, imports and device "
                                      "6.1 s, the model's seeded init 1.3 s, the knobs applied 1.6 s), warm-up and "
                                      "compile 2.5 s, timed 3.6 s, evaluation 0.4 s, exit 6.0 s")
    rec = RunRecord(status="ok", setup_s=2.0, init_s=0.5)  # in-process: no start-up of its own
    assert repeat_cost(rec, 2.5) == "2.5 s, start-up and build 2.0 s (of which the model's seeded init 0.5 s)"
    assert repeat_cost(RunRecord(status="oom"), 3.0) == "3.0 s"


def test_a_repeat_process_s_exit_is_timed_by_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in repeat: it writes its record, then takes 0.5 s to exit, as a process tearing down CUDA would.
    (tmp_path / "slow_exit.py").write_text(
        "import sys, time\n"
        "open(sys.argv[sys.argv.index('--record-to') + 1], 'w').write('{\"status\": \"ok\", \"setup_s\": 1.5}')\n"
        "time.sleep(0.5)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    rec = repeat_in_fresh_process(["slow_exit"])
    assert rec.status == "ok" and rec.setup_s == 1.5
    assert rec.exit_s is not None and 0.45 < rec.exit_s < 5.0


class FakeClock:
    """time.time and time.perf_counter that only a stand-in repeat moves forward."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("seconds_left, ran", [(1000.0, 3), (100.0, 1), (130.0, 2)])
def test_a_deadline_stops_repeats_that_would_end_past_it(seconds_left: float, ran: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Repeats of 60, 50 and 50 s: the next one is judged by the shortest so far.
    import stages.bench as bench
    from benchlab.config import parse_params
    from tests.conftest import micro_params

    clock, walls = FakeClock(), iter([60.0, 50.0, 50.0])

    def repeat(argv: list[str], nproc: int = 1) -> RunRecord:
        clock.now += next(walls)
        return RunRecord(status="ok")

    monkeypatch.setattr(bench, "time", clock)
    monkeypatch.setattr(bench, "repeat_in_fresh_process", repeat)
    monkeypatch.setenv("BENCHLAB_DEADLINE", str(clock.now + seconds_left))
    p = parse_params(micro_params(bench__repeats=3))
    assert len(bench.run_repeats(p, "recipe", ["d", "r", "s"])) == ran


def test_a_passed_or_garbled_deadline_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import stages.bench as bench
    from benchlab.config import parse_params
    from benchlab.errors import LabError
    from tests.conftest import micro_params

    p = parse_params(micro_params(bench__repeats=3))
    monkeypatch.setattr(bench, "repeat_in_fresh_process", lambda *a, **k: pytest.fail("no repeat may start"))
    monkeypatch.setenv("BENCHLAB_DEADLINE", "1")  # 1970
    with pytest.raises(LabError, match="BENCHLAB_DEADLINE passed before its first repeat; nothing recorded"):
        bench.run_repeats(p, "recipe", ["d", "r", "s"])
    monkeypatch.setenv("BENCHLAB_DEADLINE", "in ten minutes")
    with pytest.raises(LabError, match="BENCHLAB_DEADLINE='in ten minutes' is not a Unix time in seconds"):
        bench.run_repeats(p, "recipe", ["d", "r", "s"])
    monkeypatch.delenv("BENCHLAB_DEADLINE")
    assert bench.deadline_from_env() is None
