"""Behaviour checks added where mutation testing (docs/mutation.md) found a gap in the other unit tests.

Each test pins one thing a reader of the results relies on: an exact note, a boundary, a reference row.
"""

import math
from pathlib import Path

import pytest

from benchlab import stats
from benchlab.errors import LabError
from benchlab.report import check_one_env, check_one_source, load_results, markdown, summarize, to_csv, uncommitted
from tests.test_report import result

# --- report: the table's rows, notes and scaling -------------------------------------------------------------

def test_every_warning_reads_exactly_and_boundaries_are_inclusive() -> None:
    rows = summarize([
        result("fp32_baseline", 1000.0, 5.0, 100.0, (990, 1010)),
        # Gap 0.125 == tolerance and spread 0.02 == repeat_tolerance: both still within.
        result("odd", 2000.0, 5.125, None, (1900, 2100), peak_rss_mb=50.0, steady_state_ok=False,
               steady_gap_pct=7.25, leak_suspected=True, mem_growth_mb=12.5, fp16_skipped_steps=3,
               val_loss_repeat_spread=0.02, peak_mem_allocated_comparable=False, peak_mem_reserved_mb=150.0),
    ], "fp32_baseline", tolerance=0.125, repeat_tolerance=0.02)
    odd = rows[1]
    assert odd["notes"] == ("timed halves differ by 7.2%: not steady; memory grew 12.5 MiB over the timed steps; "
                            "CUDA graphs: allocated peak misses the graph pools; compare reserved memory; "
                            "GradScaler skipped 3 steps")
    assert odd["loss_ok"] == "yes" and odd["significant"] == "yes" and odd["speedup_x"] == 2.0
    assert odd["mem_change_pct"] == pytest.approx(50.0)  # reserved 150 against the baseline's 100
    assert odd["tokens_per_sec_pi95"] == "1,900 to 2,100" and odd["peak_rss_mb"] == 50.0
    assert rows[0]["notes"] == "" and rows[0]["tokens_per_sec_pi95"] == "990 to 1,010"


def test_memory_falls_back_to_rss_and_rows_without_a_figure_get_none() -> None:
    cpu = {"peak_mem_allocated_mb": None}
    rows = summarize([
        result("fp32_baseline", 100.0, 5.0, None, **cpu, peak_rss_mb=200.0),
        result("lean", 100.0, 5.0, None, **cpu, peak_rss_mb=150.0),
        result("unknown", 100.0, 5.0, None, **cpu),
        result("half_ci", 100.0, 5.0, 1.0, tokens_per_sec_pi95_low=1.0),
    ], "fp32_baseline", tolerance=0.1)
    assert rows[1]["mem_change_pct"] == pytest.approx(-25.0)
    assert rows[2]["mem_change_pct"] is None
    assert rows[3]["tokens_per_sec_pi95"] is None and rows[3]["significant"] is None  # one bound is no interval


def test_a_baseline_that_did_not_run_gives_no_comparisons() -> None:
    rows = summarize([{"variant": "fp32_baseline", "status": "oom", "message": "out of memory"},
                      result("fast", 200.0, 5.0, 1.0)], "fp32_baseline", tolerance=0.1)
    assert rows[1]["speedup_x"] is None and rows[1]["loss_ok"] is None and rows[1]["notes"] == ""
    assert rows[0]["notes"] == "out of memory"
    missing = summarize([result("fast", 200.0, 5.0, 1.0)], "fp32_baseline", tolerance=0.1)
    assert missing[0]["speedup_x"] is None


def test_interference_note_leaves_out_an_idle_cpu() -> None:
    rows = summarize([result("fp32_baseline", 1.0, 5.0, 1.0),
                      result("gpu_only", 1.0, 5.0, 1.0, interference_suspected=True, other_gpu_processes=[7],
                             cpu_busy_others_pct_max=0.0)], "fp32_baseline", 0.1)
    assert rows[1]["notes"] == "machine shared while timed: other GPU processes [7]"
    rows = summarize([result("fp32_baseline", 1.0, 5.0, 1.0),
                      result("cpu_only", 1.0, 5.0, 1.0, interference_suspected=True, cpu_busy_others_pct_max=0.5)],
                     "fp32_baseline", 0.1)
    assert rows[1]["notes"] == "machine shared while timed: others kept 0% of the CPU busy"


def _scaling_rows() -> list[dict]:
    return [
        # A failed one-process row with the same knobs must never be the reference.
        {**result("one_failed", 1.0, 9.0, 1.0), "status": "error"},
        result("fp32_baseline", 100.0, 5.0, 1.0, batch_size=16),
        result("one_b32", 150.0, 4.75, 1.0, batch_size=32),
        result("ddp_2", 180.0, 5.0, 1.0, batch_size=32, world_size=2, parallel="ddp", nproc=2, ddp_bucket_mb=50),
        result("fsdp_2_global", 120.0, 4.5, 1.0, batch_size=16, world_size=2, parallel="fsdp2", nproc=2),
        result("bf16_ddp_2", 400.0, 5.0, 1.0, batch_size=32, world_size=2, parallel="ddp", nproc=2,
               precision="bf16"),
        {**result("ddp_failed", 1.0, 5.0, 1.0, batch_size=32, world_size=2), "status": "error"},
    ]


def test_scaling_takes_the_same_per_rank_batch_first_and_the_loss_gap_at_the_same_global_batch() -> None:
    rows = {r["variant"]: r for r in summarize(_scaling_rows(), "fp32_baseline", tolerance=1.0)}
    ddp = rows["ddp_2"]
    assert ddp["scaling_efficiency_pct"] == pytest.approx(90.0)  # 180 / (2 x 100)
    assert ddp["scaling_ref"] == "fp32_baseline (same per-rank batch)"
    assert ddp["val_loss_gap_1proc"] == pytest.approx(0.25)  # against one_b32, which saw the same data
    glob = rows["fsdp_2_global"]
    assert glob["scaling_efficiency_pct"] == pytest.approx(60.0)  # 120 / (2 x 100)
    assert glob["scaling_ref"] == "fp32_baseline (same global batch)"
    assert glob["val_loss_gap_1proc"] == pytest.approx(-0.5)
    none = {"scaling_efficiency_pct": None, "scaling_ref": None, "val_loss_gap_1proc": None}
    for name in ("bf16_ddp_2", "ddp_failed", "fp32_baseline", "one_b32", "one_failed"):  # no counterpart / one process
        assert {k: rows[name][k] for k in none} == none, name


# --- report: markdown, CSV and the refusals, read exactly -------------------------------------------------------

def test_markdown_and_csv_read_exactly() -> None:
    rows = summarize([result("fp32_baseline", 1000.0, 5.0, 100.0), result("fast", 2000.0, 5.0, 50.5)],
                     "fp32_baseline", tolerance=0.1)
    for row in rows:  # keep the table narrow: the columns under test only
        for key in ("val_perplexity", "significant", "tokens_per_sec_pi95", "loss_ok"):
            row.pop(key)
    rows[1]["notes"] = ""
    table = markdown(rows, {"env.gpu": "NVIDIA H200", "env.driver": None, "env.cuda": "13.0"})
    assert table == (
        "Measured on gpu: NVIDIA H200, cuda: 13.0.\n\n"
        "| variant       | status   |   tokens/s |   speedup |   peak alloc MiB |   memory vs base % |   val loss |\n"
        "|---------------|----------|------------|-----------|------------------|--------------------|------------|\n"
        "| fp32_baseline | ok       |      1,000 |         1 |              100 |                0   |          5 |\n"
        "| fast          | ok       |      2,000 |         2 |               50 |              -49.5 |          5 |\n"
    )
    header, base, fast = to_csv(rows).split("\n")[:3]
    assert header.split(",")[:3] == ["variant", "status", "tokens_per_sec"] and len(header.split(",")) == 33
    assert base == "fp32_baseline,ok,1000.0,,,,,,,1.0,,,,,,,100.0,,,0.0,,,,5.0,,,,,,,,,fp32_baseline"
    assert fast.startswith("fast,ok,2000.0,") and "\r" not in to_csv(rows)
    assert to_csv([{**rows[0], "not_a_column": 1}]).count("\n") == 2  # extra keys are left out, not an error


def test_refusals_name_every_difference(tmp_path: Path) -> None:
    a = result("fp32_baseline", 1, 1, 1)
    b = result("fast", 2, 1, 1, **{"env.gpu": "A100", "env.cuda": "12.4"})
    with pytest.raises(LabError) as err:
        check_one_env([a, b, result("x", 1, 1, 1)], allow_mixed=False)
    assert str(err.value) == (
        "fast was measured in another environment than fp32_baseline "
        "({'env.gpu': ('NVIDIA H200', 'A100'), 'env.cuda': ('13.0', '12.4')}); "
        "rerun the matrix on one machine, or set aggregate.allow_mixed_env=true to compare anyway")
    src = "provenance.source_sha256"
    rows = [result("a", 1, 1, 1, **{src: "0123456789abcdef"}), result("b", 1, 1, 1, **{src: "0123456789abcdef"}),
            result("c", 1, 1, 1, **{src: "fedcba9876543210"})]
    with pytest.raises(LabError) as err:
        check_one_source(rows, allow_mixed=False)
    text = str(err.value)
    assert "0123456789ab: a, b" in text and "fedcba987654: c" in text and "0123456789abc" not in text
    assert text.endswith("(`dvc repro -f` the stale ones), or set aggregate.allow_mixed_source=true to compare anyway")
    dirty = [result(n, 1, 1, 1, **{src: "s", "provenance.tree_clean": clean}) for n, clean in (("a", False),
                                                                                                  ("b", True))]
    check_one_source(dirty, allow_mixed=False)  # one code, uncommitted: flagged, not refused
    assert uncommitted(dirty) == ["a"]
    with pytest.raises(LabError) as err:
        load_results(tmp_path, ["gone"])
    assert str(err.value) == f"{tmp_path / 'gone.json'} is missing; run `dvc repro bench@gone`"


# --- stats: boundaries --------------------------------------------------------------------------------------------

def test_touching_intervals_are_not_separated_in_either_order() -> None:
    assert stats.separated((0.0, 1.0), (1.0, 2.0)) is False
    assert stats.separated((1.0, 2.0), (0.0, 1.0)) is False
    assert stats.separated((1.0, 2.0), (0.0, 0.5)) is True
    assert stats.separated(None, (0.0, 1.0)) is None and stats.separated((0.0, 1.0), None) is None


# --- results: every key of a measured record, on a GPU and on a CPU -----------------------------------------------

def _gpu_runs() -> list:
    from benchlab.runner import RunRecord
    common = {"status": "ok", "lrs": [1e-3] * 5, "warmup_steps": 1, "world_size": 2}
    r1 = RunRecord(**common, losses=[6, 5, 4, 3, 2.5], step_ms=[50, 10, 10, 10, 10], warmup_s=0.05, first_step_ms=50.0,
                   window_wall_ms=50.0, memory={"peak_mem_allocated_mb": 500.0, "peak_mem_reserved_mb": 600.0},
                   skipped_steps=0, val_loss=3.0, rank_peak_mb=[100.0, 90.0], power_w=300.0, energy_j=15.0,
                   neighbours={"other_gpu_processes": [42], "cpu_busy_others_pct": 5.0, "cpu_busy_ours_pct": 50.0})
    r2 = RunRecord(**common, losses=[6, 5, 4, 3, 2], step_ms=[60, 20, 20, 20, 20], warmup_s=0.06, first_step_ms=60.0,
                   window_wall_ms=100.0, memory={"peak_mem_allocated_mb": 400.0, "peak_mem_reserved_mb": 650.0},
                   mem_growth_mb=10.0, skipped_steps=1, val_loss=3.5, rank_peak_mb=[80.0, 95.0],
                   power_w=400.0, energy_j=40.0,
                   neighbours={"other_gpu_processes": None, "cpu_busy_others_pct": 20.0, "cpu_busy_ours_pct": 40.0})
    return [r1, r2]


def test_measured_record_on_a_gpu_key_by_key() -> None:
    from benchlab.results import measured_record
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
        "steady_gap_pct": 0.0, "steady_state_ok": True,
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
    from benchlab.results import measured_record, neighbours
    from benchlab.runner import RunRecord
    from model.gpt import GPTConfig
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=128)
    base = {"tokens_per_step": 100, "block_size": 16, "device": "cpu", "compile_mode": "default"}
    run = RunRecord(status="ok", losses=[3.0] * 5, lrs=[1e-3] * 5, step_ms=[9, 10, 10, 11, 11], warmup_steps=1,
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
    bad = RunRecord(status="diverged", message="loss became nan at step 3", diverged_step=3, losses=[1.0, 2.0, math.nan])
    failed = measured_record(base, [bad], cfg, 1000, 0.05)
    assert failed == {**base, "repeats": 1, "steps": 3, "warmup_steps": 0, "status": "diverged",
                      "message": "loss became nan at step 3", "diverged_step": 3}
    # Exactly the threshold of others' CPU share, and no other GPU process: not suspected.
    quiet = RunRecord(status="ok", neighbours={"other_gpu_processes": [], "cpu_busy_others_pct": 20.0,
                                               "cpu_busy_ours_pct": 1.0})
    assert neighbours([quiet]) == {"other_gpu_processes": [], "cpu_busy_others_pct_max": 20.0,
                                   "cpu_busy_ours_pct_max": 1.0, "interference_suspected": False}


def test_steps_csv_marks_the_timed_steps() -> None:
    from benchlab.results import steps_csv
    from benchlab.runner import RunRecord
    run = RunRecord(status="ok", losses=[6.0, 5.0, 4.5], lrs=[1e-4, 5e-4, 1e-3], step_ms=[50.0, 10.0], warmup_steps=1)
    assert steps_csv(run) == ("step,loss,lr,step_ms,timed\n0,6.000000,0.0001,50.0000,0\n"
                              "1,5.000000,0.0005,10.0000,1\n2,4.500000,0.001,,1\n")


def test_base_and_skipped_records_carry_the_variant_s_own_settings() -> None:
    from benchlab.config import RunSettings, parse_params
    from benchlab.results import base_record, skipped_record
    from tests.conftest import micro_params
    p = parse_params(micro_params())
    settings = RunSettings(precision="bf16", batch_size=8)
    rec = base_record("bf16_b8", p, settings, "cpu", {"gpu": None, "torch": "2.13"}, {"provenance.tree_clean": True})
    assert rec["variant"] == "bf16_b8" and rec["device"] == "cpu" and rec["precision"] == "bf16"
    assert rec["model"] == p.model and rec["batch_size"] == 8 and rec["block_size"] == 32
    assert rec["tokens_per_step"] == 8 * 32 and rec["env.torch"] == "2.13" and rec["provenance.tree_clean"] is True
    assert rec["params.precision"] == "bf16" and rec["params.batch_size"] == 8  # the variant's, not the top level's
    assert rec["params.train.block_size"] == 32 and rec["params.seed"] == p.seed
    assert not any(k.startswith(("params.variants", "params.aggregate", "params.profile", "params.run")) for k in rec)
    skipped = skipped_record(rec, "needs a CUDA GPU")
    assert skipped == {**rec, "status": "skipped", "message": "needs a CUDA GPU", "repeats": 0}


def test_describe_of_one_two_and_zero_mean_samples() -> None:
    one = stats.describe([5.0])
    assert one["std"] == 0.0 and one["cv_pct"] == 0.0 and one["median"] == 5.0
    assert stats.describe([1.0, 3.0])["std"] == pytest.approx(math.sqrt(2))
    assert stats.describe([-1.0, 1.0])["cv_pct"] == 0.0  # no CV around a zero mean, rather than a division by it
    with pytest.raises(ValueError, match=r"^describe\(\) needs at least one value$"):
        stats.describe([])


@pytest.mark.parametrize("interval, widen", [(stats.t_interval, lambda n: 1 / math.sqrt(n)),
                                             (stats.prediction_interval, lambda n: math.sqrt(1 + 1 / n))])
def test_the_t_table_s_last_row_and_the_normal_quantile_past_it(interval, widen) -> None:
    for n, t in [(30, 2.045), (31, 2.042), (32, 1.96)]:  # 29 and 30 degrees of freedom from the table, then 1.96
        values = [10.0, 12.0] * (n // 2) + [11.0] * (n % 2)
        low, high = interval(values)
        s = stats.describe(values)["std"]
        assert (high - low) / 2 == pytest.approx(t * s * widen(n)), n


def test_halves_gap_splits_at_the_middle() -> None:
    assert stats.halves_gap([10.0, 20.0, 30.0, 40.0]) == pytest.approx(20.0 / 15.0)
    assert stats.halves_gap([10.0, 20.0]) == pytest.approx(1.0)
    assert stats.halves_gap([5.0]) == 0.0
    assert stats.halves_gap([0.0, 0.0, 1.0, 1.0]) == 0.0  # a zero first half: no ratio, rather than a division by 0


# --- second round: what the first round's survivors still showed ------------------------------------------------

def test_rows_without_optional_keys_read_as_no_warning_and_no_note() -> None:
    old = result("old_record", 100.0, 5.0, 1.0)
    del old["steady_state_ok"]  # records from before the steady-state check
    rows = summarize([result("fp32_baseline", 100.0, 5.0, 1.0), old, {"variant": "bare", "status": "skipped"}],
                     "fp32_baseline", 0.1)
    assert rows[1]["notes"] == "" and rows[2]["notes"] == ""
    table = markdown(rows, {})
    assert table.splitlines()[-1].startswith("| bare ") and "| –" in table  # a figure not measured is a dash
    both_bf16 = [result("one", 100.0, 5.0, 1.0, precision="bf16"),
                 result("ddp", 150.0, 5.0, 1.0, precision="bf16", world_size=2, parallel="ddp", nproc=2)]
    assert summarize(both_bf16, "one", 0.1)[1]["scaling_ref"] == "one (same global batch)"


def test_source_groups_are_listed_with_commas() -> None:
    src = "provenance.source_sha256"
    rows = [result("a", 1, 1, 1, **{src: "0123456789abcdef"}), result("c", 1, 1, 1, **{src: "fedcba9876543210"})]
    with pytest.raises(LabError) as err:
        check_one_source(rows, allow_mixed=False)
    assert str(err.value).split(" (")[1].split(")")[0] in ("0123456789ab: a, fedcba987654: c",
                                                           "fedcba987654: c, 0123456789ab: a")


def test_base_record_batch_falls_back_to_train_batch_size() -> None:
    from benchlab.config import RunSettings, parse_params
    from benchlab.results import base_record
    from tests.conftest import micro_params
    rec = base_record("plain", parse_params(micro_params()), RunSettings(), "cpu", {}, {})
    assert rec["batch_size"] == 4 and rec["tokens_per_step"] == 4 * 32


def test_unknown_gpu_processes_stay_unknown() -> None:
    from benchlab.results import neighbours
    from benchlab.runner import RunRecord
    run = RunRecord(status="ok", neighbours={"other_gpu_processes": None, "cpu_busy_others_pct": 1.0,
                                             "cpu_busy_ours_pct": 1.0})
    assert neighbours([run])["other_gpu_processes"] is None  # not [] (none seen): nvidia-smi could not tell
