"""results: every key of a measured record (GPU, CPU, failed), steps_csv, base and skipped records, and the
neighbours summary."""

import math

import pytest


def _gpu_runs() -> list:
    from benchlab.run.runner import Measurement
    common = {"status": "ok", "lrs": [1e-3] * 5, "warmup_steps": 1, "world_size": 2}
    r1 = Measurement(**common, losses=[6, 5, 4, 3, 2.5], step_ms=[50, 10, 10, 10, 10], warmup_s=0.05, first_step_ms=50.0,
                   window_wall_ms=50.0, memory={"peak_mem_allocated_mb": 500.0, "peak_mem_reserved_mb": 600.0},
                   skipped_steps=0, val_loss=3.0, rank_peak_mb=[100.0, 90.0], power_w=300.0, energy_j=15.0,
                   neighbours={"other_gpu_processes": [42], "cpu_busy_others_pct": 5.0, "cpu_busy_ours_pct": 50.0})
    r2 = Measurement(**common, losses=[6, 5, 4, 3, 2], step_ms=[60, 20, 20, 20, 20], warmup_s=0.06, first_step_ms=60.0,
                   window_wall_ms=100.0, memory={"peak_mem_allocated_mb": 400.0, "peak_mem_reserved_mb": 650.0},
                   mem_growth_mb=10.0, skipped_steps=1, val_loss=3.5, rank_peak_mb=[80.0, 95.0],
                   power_w=400.0, energy_j=40.0,
                   neighbours={"other_gpu_processes": None, "cpu_busy_others_pct": 20.0, "cpu_busy_ours_pct": 40.0})
    return [r1, r2]


def test_measured_record_on_a_gpu_key_by_key() -> None:
    from benchlab.run.records import measured_record
    from model.gpt import GPTConfig
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=128)
    base = {"tokens_per_step": 1000, "block_size": 16, "device": "cuda", "env.cuda_available": True,
            "env.gpu": "NVIDIA H200", "compile_mode": "reduce-overhead"}
    rec = measured_record(base, _gpu_runs(), cfg, 10_000, steady_tolerance=0.05)
    t, s = 12.706, math.sqrt(2) * 25_000  # t(1); sample std of 100k and 50k tokens/s
    fpt = 6 * 10_000 + 12 * 2 * 64 * 16
    expected = {
        **base, "repeats": 2, "steps": 5, "warmup_steps": 1, "status": "ok", "message": "", "timed_steps": 4,
        "tokens_per_sec": 75_000.0, "world_size": 2, "tokens_per_sec_per_gpu": 37_500.0,
        "peak_mem_per_rank_mb": [100.0, 95.0],  # each rank's own maximum over the repeats
        "tokens_per_sec_mean": 75_000.0,
        "tokens_per_sec_pi95_low": 75_000 - t * s * math.sqrt(1.5), "tokens_per_sec_pi95_high": 75_000 + t * s * math.sqrt(1.5),
        "tokens_per_sec_ci95_low": 75_000 - t * s / math.sqrt(2), "tokens_per_sec_ci95_high": 75_000 + t * s / math.sqrt(2),
        "tokens_per_sec_cv_pct": 100 * s / 75_000, "repeat_tokens_per_sec": [100_000.0, 50_000.0],
        "tokens_per_sec_wall": 60_000.0,  # medians of 4000 tokens / 50 ms and / 100 ms
        "host_overhead_pct": 20.0, "step_ms_median": 15.0, "step_ms_ci95_low": 15 - t * 5, "step_ms_ci95_high": 15 + t * 5,
        "step_ms_p10": 10.0, "step_ms_p90": 20.0, "step_ms_cv_pct": 100 * math.sqrt(8 * 25 / 7) / 15,
        "steady_gap_pct": 0.0, "steady_state_ok": True, "stalled_steps": 0, "stall_ms_max": 0.0,
        "stall_outside_steps_ms": 0.0,
        "peak_mem_allocated_mb": 500.0, "peak_mem_reserved_mb": 650.0, "peak_rss_mb": None,
        "peak_mem_allocated_comparable": False,  # reduce-overhead: CUDA graphs' pools
        "mem_growth_mb": 10.0, "leak_suspected": False,  # 10 MiB is not above 2% of a 500 MiB peak
        "other_gpu_processes": [42], "cpu_busy_others_pct_max": 20.0, "cpu_busy_ours_pct_max": 50.0,
        "interference_suspected": True, "first_step_ms": 50.0, "warmup_s": 0.05,
        "flops_per_token": float(fpt), "peak_tflops": 989.0, "mfu_pct": 100 * 75_000 * fpt / 989e12,
        "final_train_loss": 2.5, "val_loss": 3.0, "val_perplexity": math.exp(3.0), "val_loss_repeat_spread": 0.5,
        "repeat_val_loss": [3.0, 3.5], "repeat_tail_train_loss": [4.1, 4.0],  # 5 steps, fewer than the window: all
        "fp16_skipped_steps": 0,
        # Medians over repeats: of 300 and 400 W; of 4 timed steps' 4000 tokens per 15 J and per 40 J.
        "power_w_mean": 350.0, "tokens_per_joule": (4000 / 15 + 4000 / 40) / 2, "power_note": "",
    }
    assert rec.keys() == expected.keys()
    for key, value in expected.items():
        assert rec[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    # Not on a GPU the torch build can see: no datasheet peak, no MFU.
    assert measured_record({**base, "env.cuda_available": False}, _gpu_runs(), cfg, 10_000, 0.05)["mfu_pct"] is None
    # The leak threshold is strict and scales with the peak: 10 MiB over 8 MiB on a 100 MiB peak is a leak.
    runs = _gpu_runs()
    for r in runs:
        r.memory["peak_mem_allocated_mb"] = 100.0
    assert measured_record(base, runs, cfg, 10_000, 0.05)["leak_suspected"] is True


def test_measured_record_of_one_cpu_run_and_of_a_failed_one() -> None:
    from benchlab.run.records import measured_record, neighbours
    from benchlab.run.runner import Measurement
    from model.gpt import GPTConfig
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=128)
    base = {"tokens_per_step": 100, "block_size": 16, "device": "cpu", "compile_mode": "default"}
    run = Measurement(status="ok", losses=[3.0] * 5, lrs=[1e-3] * 5, step_ms=[9, 10, 10, 11, 11], warmup_steps=1,
                    memory={"peak_rss_mb": 300.0}, val_loss=2.0)
    rec = measured_record(base, [run], cfg, 1000, steady_tolerance=0.1)  # halves 10 and 11: a gap of exactly 0.1
    assert rec["steady_state_ok"] is True and rec["steady_gap_pct"] == pytest.approx(10.0)
    assert rec["tokens_per_sec_cv_pct"] is None and rec["tokens_per_sec_pi95_low"] is None
    assert rec["step_ms_ci95_low"] is None and rec["tokens_per_sec_wall"] is None and rec["host_overhead_pct"] is None
    assert rec["mem_growth_mb"] == 0.0 and rec["leak_suspected"] is None and rec["peak_rss_mb"] == 300.0
    assert rec["peak_mem_per_rank_mb"] is None and rec["interference_suspected"] is None
    assert "cpu_busy_others_pct_max" not in rec and rec["peak_mem_allocated_comparable"] is True
    # Every mode that captures CUDA graphs hides their pools from the allocated peak; autotuning alone does not.
    for mode, comparable in (("max-autotune", False), ("max-autotune-no-cudagraphs", True), ("reduce-overhead", False)):
        assert measured_record({**base, "compile_mode": mode}, [run], cfg, 1000, 0.1)["peak_mem_allocated_comparable"] \
            is comparable, mode
    bad = Measurement(status="diverged", message="loss became nan at step 3", diverged_step=3, losses=[1.0, 2.0, math.nan])
    failed = measured_record(base, [bad], cfg, 1000, 0.05)
    assert failed == {**base, "repeats": 1, "steps": 3, "warmup_steps": 0, "status": "diverged",
                      "message": "loss became nan at step 3", "diverged_step": 3}
    # Exactly the threshold of others' CPU share, and no other GPU process: not suspected.
    quiet = Measurement(status="ok", neighbours={"other_gpu_processes": [], "cpu_busy_others_pct": 20.0,
                                               "cpu_busy_ours_pct": 1.0})
    assert neighbours([quiet]) == {"other_gpu_processes": [], "cpu_busy_others_pct_max": 20.0,
                                   "cpu_busy_ours_pct_max": 1.0, "interference_suspected": False}


def test_a_stall_in_the_timed_window_marks_the_record_not_steady() -> None:
    """Issue 46: a `kill -STOP` of 20 s in the timed window gave `ok`, steady_state_ok true, and nothing else."""
    from benchlab.run.records import measured_record
    from benchlab.run.runner import Measurement
    from model.gpt import GPTConfig
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=128)
    base = {"tokens_per_step": 100, "block_size": 16, "device": "cpu", "compile_mode": "default"}
    timed = [10.0] * 60 + [20_010.0] + [10.0] * 59  # one step stopped for 20 s, the halves' medians the same

    def record(step_ms: list[float], wall_ms: float) -> dict:
        run = Measurement(status="ok", losses=[3.0] * 121, lrs=[1e-3] * 121, step_ms=[50.0, *step_ms], warmup_steps=1,
                        window_wall_ms=wall_ms, memory={"peak_rss_mb": 300.0}, val_loss=2.0)
        return measured_record(base, [run], cfg, 1000, steady_tolerance=0.05)

    inside = record(timed, wall_ms=sum(timed) + 50.0)
    assert inside["steady_gap_pct"] == 0.0 and inside["steady_state_ok"] is False
    assert (inside["stalled_steps"], inside["stall_ms_max"], inside["stall_outside_steps_ms"]) == (1, 20_000.0, 0.0)
    assert inside["tokens_per_sec"] == pytest.approx(10_000.0)  # the median's figure stays; the record says why not trust it
    between = record([10.0] * 120, wall_ms=1_200.0 + 20_000.0)  # stopped between two steps: no step saw it
    assert between["steady_state_ok"] is False and between["stalled_steps"] == 0
    assert between["stall_ms_max"] == 0.0 and between["stall_outside_steps_ms"] == pytest.approx(20_000.0)
    quiet = record([10.0] * 120, wall_ms=1_300.0)
    assert quiet["steady_state_ok"] is True and quiet["stall_ms_max"] == 0.0
    # A stop across a step's end (seen in CI: 898 ms in the step, the rest in the gap after it): both parts held.
    split = Measurement(status="ok", losses=[3.0] * 121, lrs=[1e-3] * 121, step_ms=[50.0, *[10.0] * 60, 908.0,
                        *[10.0] * 59], warmup_steps=1, window_wall_ms=3_500.0, gap_ms=[1.0] * 60 + [1_103.0] + [1.0] * 58,
                        memory={"peak_rss_mb": 300.0}, val_loss=2.0)
    rec = measured_record(base, [split], cfg, 1000, steady_tolerance=0.05)
    assert (rec["stall_ms_max"], rec["stall_outside_steps_ms"], rec["steady_state_ok"]) == (898.0, 1_102.0, False)


def test_steps_csv_marks_the_timed_steps() -> None:
    from benchlab.run.records import steps_csv
    from benchlab.run.runner import Measurement
    run = Measurement(status="ok", losses=[6.0, 5.0, 4.5], lrs=[1e-4, 5e-4, 1e-3], step_ms=[50.0, 10.0], warmup_steps=1)
    assert steps_csv(run) == ("step,loss,lr,step_ms,timed\n0,6.000000,0.0001,50.0000,0\n"
                              "1,5.000000,0.0005,10.0000,1\n2,4.500000,0.001,,1\n")


def test_base_and_skipped_records_carry_the_variant_s_own_settings() -> None:
    from benchlab.core.params import RunSettings, parse_params
    from benchlab.run.records import base_record, skipped_record
    from tests.conftest import micro_params
    p = parse_params(micro_params())
    settings = RunSettings(precision="bf16", batch_size=8)
    rec = base_record("bf16_b8", p, settings, "cpu", {"gpu": None, "torch": "2.13"}, {"provenance.tree_clean": True})
    assert rec["variant"] == "bf16_b8" and rec["device"] == "cpu" and rec["precision"] == "bf16"
    assert rec["model"] == p.model and rec["batch_size"] == 8 and rec["block_size"] == 32
    assert rec["tokens_per_step"] == 8 * 32 and rec["env.torch"] == "2.13" and rec["provenance.tree_clean"] is True
    assert rec["params.precision"] == "bf16" and rec["params.batch_size"] == 8  # the variant's, not the top level's
    assert rec["params.shape.block_size"] == 32 and rec["params.seed"] == p.seed
    assert not any(k.startswith(("params.variants", "params.aggregate", "params.profile", "params.run")) for k in rec)
    skipped = skipped_record(rec, "needs a CUDA GPU")
    assert skipped == {**rec, "status": "skipped", "message": "needs a CUDA GPU", "repeats": 0}


def test_base_record_batch_falls_back_to_train_batch_size() -> None:
    from benchlab.core.params import RunSettings, parse_params
    from benchlab.run.records import base_record
    from tests.conftest import micro_params
    rec = base_record("plain", parse_params(micro_params()), RunSettings(), "cpu", {}, {})
    assert rec["batch_size"] == 4 and rec["tokens_per_step"] == 4 * 32


def test_unknown_gpu_processes_stay_unknown() -> None:
    from benchlab.run.records import neighbours
    from benchlab.run.runner import Measurement
    run = Measurement(status="ok", neighbours={"other_gpu_processes": None, "cpu_busy_others_pct": 1.0,
                                             "cpu_busy_ours_pct": 1.0})
    assert neighbours([run])["other_gpu_processes"] is None  # not [] (none seen): nvidia-smi could not tell
