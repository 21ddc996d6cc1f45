"""core/record: which memory figure a row is compared by, the tail mean of a loss curve, the ratio reference with
its fallbacks, and the metric key lists, each decided once for every reader of results."""

import pytest
import yaml

from benchlab.core.record import (
    ALLOCATED,
    ALLOCATED_COMPARABLE,
    MEMORY_KEYS,
    METRIC_KEYS,
    REFERENCE_SEEDS,
    RESERVED,
    RSS,
    SUMMARY_KEYS,
    Memory,
    Result,
    compared_memory,
    numbers,
    ratio_reference,
    tail_loss,
)
from tests.conftest import ROOT

GPU = {"peak_mem_allocated_mb": 900.0, "peak_mem_reserved_mb": 1200.0, "peak_rss_mb": None,
       "peak_mem_allocated_comparable": True}
CPU = {"peak_mem_allocated_mb": None, "peak_mem_reserved_mb": None, "peak_rss_mb": 450.0,
       "peak_mem_allocated_comparable": True}


def test_a_gpu_row_is_compared_by_its_allocated_peak() -> None:
    assert Memory.of(GPU).compared_key() == ALLOCATED and compared_memory(GPU) == 900.0
    assert not Memory.of(GPU).by_reserved


def test_a_cpu_row_is_compared_by_its_resident_set() -> None:
    assert Memory.of(CPU).compared_key() == RSS and compared_memory(CPU) == 450.0
    assert Memory.of({"peak_rss_mb": 450.0}).compared() == 450.0  # a record from before the comparable flag


def test_a_cuda_graph_row_is_compared_by_its_reserved_peak() -> None:
    graphs = Memory.of({**GPU, "peak_mem_allocated_mb": 50.0, "peak_mem_allocated_comparable": False})
    assert graphs.compared_key() == RESERVED and graphs.compared() == 1200.0 and graphs.by_reserved
    assert Memory.of({**GPU, "peak_mem_allocated_comparable": None}).compared() == 900.0  # only False says so


def test_a_run_memory_dict_has_no_comparable_flag_and_reads_as_comparable() -> None:
    assert Memory.of({"peak_mem_allocated_mb": 7.0}).compared() == 7.0  # a Measurement's memory: harness.peaks' keys
    assert Memory.of({}).compared() is None


def test_an_oom_row_reached_its_reserved_peak_else_its_allocated_one() -> None:
    assert Memory.of({"peak_mem_allocated_mb": 23_100.0, "peak_mem_reserved_mb": 23_900.0}).reached() == 23_900.0
    assert Memory.of({"peak_mem_allocated_mb": 23_100.0}).reached() == 23_100.0
    assert Memory.of({}).reached() is None


def test_a_result_reads_its_record_and_missing_keys_are_unmeasured() -> None:
    res = Result.of({"variant": "recipe", "status": "ok", "tokens_per_sec": 5.0e5, **GPU, "env.gpu": "H200"})
    assert (res.variant, res.ok, res.message, res.tokens_per_sec, res.compared_memory()) == (
        "recipe", True, "", 5.0e5, 900.0)
    bare = Result.of({"variant": "tf32", "status": "skipped", "message": None})
    assert (bare.ok, bare.message, bare.tokens_per_sec, bare.compared_memory()) == (False, "", None, None)


def _results(**status: str) -> list[Result]:
    return [Result(name, s) for name, s in status.items()]


def test_the_ratio_reference_is_the_baseline_where_it_ran() -> None:
    assert ratio_reference(_results(fp32_baseline="ok", recipe="ok"), "fp32_baseline", ["recipe"]) == "fp32_baseline"


def test_the_ratio_reference_falls_back_in_order_to_the_first_that_ran() -> None:
    results = _results(fp32_baseline="oom", tf32="skipped", recipe="ok", lean="ok")
    assert ratio_reference(results, "fp32_baseline", ["gone", "tf32", "lean", "recipe"]) == "lean"
    assert ratio_reference(results, "fp32_baseline", ["tf32"]) is None
    assert ratio_reference(results, "fp32_baseline") is None
    assert ratio_reference([], "fp32_baseline", ["recipe"]) is None


def test_the_tail_mean_is_over_the_last_steps_or_all_of_a_short_run() -> None:
    assert tail_loss([9.0, 9.0, 3.0, 5.0], steps=2) == pytest.approx(4.0)
    assert tail_loss([2.0, 4.0], steps=50) == pytest.approx(3.0)
    assert tail_loss([1.0] * 10 + [2.0] * 50) == pytest.approx(2.0)  # the default window: 50 steps


def test_numbers_keep_the_figures_and_drop_text_none_and_bools() -> None:
    record = {"tokens_per_sec": 10.0, "world_size": 2, "val_loss": None, "env.gpu": "H200", "speedup_x": True}
    assert numbers(record, ("tokens_per_sec", "world_size", "val_loss", "env.gpu", "speedup_x", "absent")) == {
        "tokens_per_sec": 10.0, "world_size": 2}


def test_the_metric_lists_share_the_measured_figures_and_part_where_they_must() -> None:
    shared = set(METRIC_KEYS) & set(SUMMARY_KEYS)
    assert {ALLOCATED, RESERVED, RSS, "tokens_per_sec", "val_loss", "tokens_per_joule"} <= shared
    assert "speedup_x" in SUMMARY_KEYS and "speedup_x" not in METRIC_KEYS  # a ratio needs the other rows
    assert "final_train_loss" in METRIC_KEYS and "final_train_loss" not in SUMMARY_KEYS
    assert len(set(METRIC_KEYS)) == len(METRIC_KEYS) and len(set(SUMMARY_KEYS)) == len(SUMMARY_KEYS)


def test_the_names_decided_here_are_spelled_nowhere_else_in_benchlab() -> None:
    # The memory keys and the parity reference's file name: the harness and the run's record write them, the summary,
    # the report and the parity stage read them, all through these constants.
    names = [*MEMORY_KEYS, ALLOCATED_COMPARABLE, REFERENCE_SEEDS]
    spelled = {str(path.relative_to(ROOT)): [n for n in names if f'"{n}"' in path.read_text()]
               for path in (ROOT / "benchlab").rglob("*.py") if path != ROOT / "benchlab/core/record.py"}
    assert {path: found for path, found in spelled.items() if found} == {}


def test_the_parity_stages_write_and_read_the_reference_s_files_by_that_name() -> None:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    record, curve = f"metrics/parity/{REFERENCE_SEEDS}.json", f"plots/parity/{REFERENCE_SEEDS}.csv"
    assert [next(iter(out)) for out in stages["parity_reference"]["outs"]] == [record]
    assert [next(iter(plot)) for plot in stages["parity_reference"]["plots"]] == [curve]
    assert record in stages["parity"]["do"]["deps"]
